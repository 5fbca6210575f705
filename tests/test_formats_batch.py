"""OpenAI Batch API files: the output's usage joined to the input by custom_id, priced at batch rates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines.provider.cache import audit_usage
from cachectl.engines.provider.prices import PriceTable, Usage, cost_usd
from cachectl.errors import InputError
from cachectl.inputs.formats import log_values, shape_of
from cachectl.inputs.formats.openai_batch_output import join, usage_index

from .conftest import values_and_records

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
IN, OUT = str(LOGS / "openai_batch_input.jsonl"), str(LOGS / "openai_batch_output.jsonl")
VIN, VOUT = str(LOGS / "vllm_batch_input.jsonl"), str(LOGS / "vllm_batch_output.jsonl")


def test_detection():
    assert shape_of(IN) == shape_of(VIN) == "openai-batch-input"
    assert shape_of(OUT) == shape_of(VOUT) == "openai-batch-output"
    assert shape_of(str(LOGS / "openai_responses.jsonl")) == "native"


def test_output_records_skip_failed_requests():
    values = list(log_values(OUT))
    assert [v["custom_id"] for _, v in values] == ["request-2", "request-1"]  # request-3 expired: not billed
    assert all(v["batch"] is True for _, v in values)
    assert values[0][1]["request_id"] == "req_c187b3" and values[0][1]["usage"]["prompt_tokens"] == 24


@pytest.mark.parametrize("inp,out,expected", [(IN, OUT, {"request-1": 23, "request-2": 24, "request-3": None}),
                                              (VIN, VOUT, {"request-1": 25, "request-2": 27})])
def test_input_joined_to_output_by_custom_id(inp, out, expected):
    joined = list(join(log_values(inp), usage_index(out), source=inp, output=out))
    got = {v["custom_id"]: (v.get("usage") or {}).get("prompt_tokens") for _, v in joined}
    assert got == expected
    assert all(v["batch"] is True and v["body"]["messages"] for _, v in joined)


def test_join_refuses_another_batch_and_duplicates(tmp_path):
    other = tmp_path / "out.jsonl"
    other.write_text(json.dumps({"custom_id": "zzz", "response": {"status_code": 200, "body": {
        "model": "gpt-4o-mini", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}}}) + "\n")
    with pytest.raises(InputError, match="not the same batch"):
        list(join(log_values(IN), usage_index(str(other)), source=IN, output=str(other)))
    dup = tmp_path / "dup.jsonl"
    dup.write_text(Path(OUT).read_text().splitlines()[0] + "\n" + Path(OUT).read_text().splitlines()[0] + "\n")
    with pytest.raises(InputError) as e:
        usage_index(str(dup))
    assert e.value.line == 2 and e.value.field == "custom_id"


def test_batch_prices_half_the_standard():
    table = PriceTable.load()
    for model in ("gpt-4o-mini", "claude-sonnet-4-5"):
        price = table.lookup(model)
        u = Usage(1000, 2000, 30000, 500, cache_write_5m_tokens=2000)
        assert cost_usd(price, u, batch=True) == pytest.approx(cost_usd(price, u) / 2)
    report = audit_usage(log_values(OUT), source=OUT, table=table)
    p = table.lookup("gpt-4o-mini")
    standard = ((24 + 23) * p.input + (5 + 9) * p.output) / 1e6
    assert report.total_cost_usd == pytest.approx(standard / 2)
    assert any("Batch API" in n for n in report.notes)


def test_prompt_cost_joins_input_and_output(cli):
    tok = str(LOGS.parent / "tok")
    r = cli("prompt-cost", IN, "--usage", OUT, "-t", tok, "--every", "1s")
    assert r.exit_code == 0, r.stderr
    assert "2 of 2 requests agree" in r.stdout and "0.5x the standard rates" in r.stdout


_TEXT = st.text(max_size=3)
#: mostly what a batch output line holds, sometimes what one must not (each field one of a few odd values)
_ODD = st.sampled_from([None, 1, "x", [], {}])
_USAGE = st.one_of(st.fixed_dictionaries({"prompt_tokens": st.integers(0, 9)}), _ODD)
_BODY = st.one_of(st.fixed_dictionaries({"usage": _USAGE}, optional={"model": st.one_of(_TEXT, _ODD)}), _ODD)
_RESPONSE = st.one_of(
    st.fixed_dictionaries({"body": _BODY}, optional={"status_code": st.sampled_from([200, 400]),
                                                     "request_id": st.one_of(_TEXT, _ODD)}),
    st.fixed_dictionaries({"usage": _USAGE, "model": _TEXT}), _ODD)
_LINE = st.one_of(st.fixed_dictionaries({"custom_id": _TEXT, "response": _RESPONSE}),
                  st.fixed_dictionaries({"custom_id": st.one_of(_TEXT, _ODD), "response": _RESPONSE}), _ODD)


@settings(max_examples=400, deadline=None)
@given(st.lists(_LINE, min_size=1, max_size=6))
def test_values_are_the_records_values(lines):
    """The output's ``values`` (what log_values reads, no record built) agree with ``read``'s records' values,
    line for line, errors included."""
    from cachectl.inputs.formats import openai_batch_output as out

    raw = [(n, json.dumps(v).encode() + b"\n") for n, v in enumerate(lines, 1)]
    got, want = values_and_records(out, raw, "o.jsonl")
    assert got == want


def test_fix_rewrites_a_batch_input_file_and_both_commands_price_it_at_batch_rates(cli, tmp_path):
    """``fix`` rewrites an OpenAI Batch input file as it stands (its lines are the requests, the body at ``body``):
    where a tool was serialized with its keys in another order, each body that carries it is rewritten in place
    (its keys sorted), its ``custom_id``, ``method`` and ``url`` kept, and a line without it byte for byte. A Batch file has no timestamps: ``--every`` spaces
    its requests for the provider simulation, and ``report`` and ``fix`` then price them at the batch rates, half
    of what the same bodies cost as cachectl's own lines sent 30 s apart."""
    tool = {"type": "function", "function": {"name": "lookup", "description": "Look a word up in the glossary.",
                                             "parameters": {"type": "object",
                                                            "properties": {"word": {"type": "string"}}}}}
    shuffled = {"function": {"parameters": tool["function"]["parameters"], "name": "lookup",
                             "description": tool["function"]["description"]}, "type": "function"}
    system = "You answer questions about prompt caching. " * 40
    bodies = [{"model": "gpt-4o-mini", "messages": [{"role": "system", "content": system},
                                                    {"role": "user", "content": f"Question {n}: what is a prefix?"}],
               "tools": [shuffled if n == 2 else tool], "max_tokens": 100} for n in range(4)]
    del bodies[3]["tools"]
    batch, plain = tmp_path / "batch.jsonl", tmp_path / "plain.jsonl"
    batch.write_text("".join(json.dumps({"custom_id": f"request-{n}", "method": "POST", "url": "/v1/chat/completions",
                                         "body": b}) + "\n" for n, b in enumerate(bodies)), encoding="utf-8")
    plain.write_text("".join(json.dumps({"timestamp": 30 * n, "body": b}) + "\n" for n, b in enumerate(bodies)),
                     encoding="utf-8")
    assert shape_of(str(batch)) == "openai-batch-input"
    before = batch.read_bytes()
    fixed = tmp_path / "fixed.jsonl"
    r = cli("fix", batch, "-t", "fixtures/tok", "--every", "30s", "-o", fixed, "--format", "json")
    assert r.exit_code == 1, r.stderr
    assert batch.read_bytes() == before
    got = json.loads(r.stdout)
    assert {f["code"] for f in got["fixes"]} == {"FX002"} and got["changed_lines"] == [1, 2, 3]
    old, new = before.splitlines(keepends=True), fixed.read_bytes().splitlines(keepends=True)
    assert len(new) == 4 and new[3] == old[3]
    for n in range(3):
        rewritten = json.loads(new[n])
        assert {k: rewritten[k] for k in ("custom_id", "method", "url")} == {
            "custom_id": f"request-{n}", "method": "POST", "url": "/v1/chat/completions"}
        assert rewritten["body"]["tools"] == [tool] and rewritten["body"]["messages"] == bodies[n]["messages"]
        assert list(rewritten["body"]["tools"][0]["function"]) == ["description", "name", "parameters"]

    def costs(path: Path, *every: str) -> tuple[float, float]:
        rep = cli("report", path, "-t", "fixtures/tok", *every, "--format", "json")
        fx = cli("fix", path, "-t", "fixtures/tok", *every, "--format", "json")
        assert rep.exit_code in (0, 1) and fx.exit_code in (0, 1), rep.stderr + fx.stderr
        return json.loads(rep.stdout)["cost"]["total_usd"], json.loads(fx.stdout)["before"]["provider"]["cost_usd"]

    as_batch, as_plain = costs(batch, "--every", "30s"), costs(plain)
    assert as_plain[0] > 0 and as_plain[0] == pytest.approx(as_plain[1])
    assert as_batch == pytest.approx((as_plain[0] / 2, as_plain[1] / 2))
    r = cli("report", batch, "-t", "fixtures/tok", "--format", "json")   # (no --every: said, and the rest stands)
    assert r.exit_code in (0, 1) and json.loads(r.stdout)["cost"] is None
    assert any("pass `every`" in n for n in json.loads(r.stdout)["notes"])   # (the text output names --every)
    assert cli("fix", batch, "-t", "fixtures/tok", "--every", "soon").exit_code == 2


@pytest.mark.parametrize("second, field", [
    ({"body": {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}}, "custom_id"),  # a wrapper
    ({"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": "hi"}, "body"),
    ({"custom_id": 7, "method": "POST", "url": "/v1/chat/completions",
      "body": {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}}, "custom_id"),
])
def test_fix_refuses_the_batch_lines_report_refuses(cli, tmp_path, second, field):
    """``fix`` reads a Batch input file's lines as cachectl's own (the body is at ``body``); a line that is not a
    batch request (a cachectl wrapper after a Batch line, a custom_id that is not a string) is refused by both, at
    its field (``fix`` took it and wrote the log)."""
    first = json.loads(open(IN, encoding="utf-8").readline())
    log = tmp_path / "mixed.jsonl"
    log.write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    for args in (("report", log), ("fix", log, "-o", out)):
        r = cli(*args, "-t", "fixtures/tok")
        assert r.exit_code == 2, (args, r.stdout)
        assert r.stderr.strip().splitlines() == [f"cachectl: error: {log}:2: field '{field}': "
                                                 + ("expected a string" if field == "custom_id" else
                                                    "expected the request body (an object)")], (args, r.stderr)
    assert not out.exists()


def test_each_whole_log_command_names_what_reads_a_shape_it_cannot_use(cli):
    """A Batch output file holds responses, not requests: ``report``, ``fix`` and ``diff-tokens --log`` say that
    ``prompt-cost --usage`` audits it (``report`` said 'not a prompt' and ``fix`` that ``report`` reads it). A
    shape ``report`` reads and ``fix`` cannot rewrite (Langfuse events): ``fix`` names the commands the shape
    lists, and ``report`` says its fixes are made at the source, in the text and in the JSON's notes."""
    out = "fixtures/logs/openai_batch_output.jsonl"
    for args in (("report", out, "-t", "fixtures/tok"), ("fix", out, "-t", "fixtures/tok"),
                 ("diff-tokens", "--log", out, "-t", "fixtures/tok")):
        r = cli(*args)
        assert r.exit_code == 2 and "`cachectl prompt-cost --usage FILE` audits" in r.stderr, (args, r.stderr)
        assert "report` reads it" not in r.stderr and "Traceback" not in r.stderr
    events = "fixtures/logs/langfuse_litellm_batch.jsonl"
    r = cli("fix", events, "-t", "fixtures/tok")
    assert r.exit_code == 2 and "this is Langfuse" in r.stderr and "`cachectl report`" in r.stderr
    assert "`cachectl fix`" not in r.stderr
    text = cli("report", events, "-t", "fixtures/tok")
    assert text.exit_code in (0, 1) and "fixed at the source: vLLM hit rate" in text.stdout
    assert "cachectl fix: vLLM" not in text.stdout
    js = json.loads(cli("report", events, "-t", "fixtures/tok", "--format", "json").stdout)
    assert js["fixes"] is not None and any("`cachectl fix` rewrites logs whose lines are request bodies" in n
                                           and "not Langfuse" in n for n in js["notes"])
    native = cli("report", "fixtures/prompts/fix_log.jsonl", "-t", "fixtures/tok")
    assert "cachectl fix: vLLM hit rate" in native.stdout and "made where the requests are built" not in native.stdout
