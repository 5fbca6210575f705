"""prompt-cost writes its rows as they are simulated: the JSON document is the one the whole report made
(parsed equal, laid out as emit_json lays it out), the text report the one a person saw, bounded on long logs."""

from __future__ import annotations

import json
import random

import orjson
import pytest

from cachectl.cli import prompt_cost
from cachectl.engines.provider import cache as pc
from cachectl.engines.provider.prices import PriceTable
from cachectl.inputs import iter_jsonl, read_requests
from cachectl.tokenization import load_tokenizer

from .conftest import PROMPTS, TOK_DIR
from .test_provider_stream import LOGS


def whole_report_document(path: str, every: float | None) -> dict:
    """What ``prompt-cost LOG --format json`` wrote when it built the whole report first: the report, rows and
    all, as emit_json serializes it (the fields it had then: no ``miss_tallies``)."""
    r = pc.simulate_requests(read_requests(path, default_model="gpt-4.1"), table=PriceTable.load(), source=path,
                             text_counter=pc.tokenizer_counter(load_tokenizer(str(TOK_DIR))), every=every,
                             token_source=f"tokenizer {TOK_DIR}")
    d = json.loads(orjson.dumps(r, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    del d["miss_tallies"]
    return d


def laid_out(d: dict) -> bytes:
    """``d`` as emit_json lays a document out, with the streamed key order."""
    head = {k: d[k] for k in ("schema_version", "mode", "requests")}
    return orjson.dumps({**head, **{k: v for k, v in d.items() if k not in head}},
                        option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


@pytest.mark.parametrize("name, every", LOGS)
def test_streamed_json_is_the_whole_report(cli, name, every):
    path = str(PROMPTS / name)
    args = ["prompt-cost", path, "-t", TOK_DIR, "-m", "gpt-4.1", "-f", "json"]
    r = cli(*args, *(["--every", f"{every:g}s"] if every else []))
    assert r.exit_code == 0, r.stderr
    want = whole_report_document(path, every)
    assert json.loads(r.stdout) == want
    assert r.stdout_bytes == laid_out(want)   # byte for byte emit_json's layout, rows after schema_version, mode


def layout_log(write, n: int, seed: int = 2):
    """A long log of layouts with breakpoints, TTL gaps and changing history (rows of a few hundred bytes)."""
    rng = random.Random(seed)
    lines, t = [], 0.0
    for i in range(n):
        t += rng.choice([1, 30, 400])
        blocks = [{"id": "sys", "tokens": 1500, "cache_control": {"type": "ephemeral"}},
                  *({"id": f"h{j}-{i % 7}", "tokens": 100} for j in range(rng.randint(0, 3))),
                  {"id": f"q{i}", "tokens": 50, "cache_control": {"type": "ephemeral"}}]
        lines.append({"timestamp": t, "model": "claude-sonnet-4-5", "blocks": blocks, "output_tokens": 3})
    return write("long.jsonl", "".join(json.dumps(x) + "\n" for x in lines))


def test_a_long_log_streams_past_what_is_held_back(cli, write):
    path = layout_log(write, 3000)
    r = cli("prompt-cost", path, "-f", "json")
    assert r.exit_code == 0, r.stderr
    assert len(r.stdout_bytes) > 2 * prompt_cost._JsonOut.HOLD
    got = json.loads(r.stdout)
    want = pc.simulate_requests(read_requests(str(path)), table=PriceTable.load(), source=str(path))
    assert len(got["requests"]) == 3000
    assert got == {k: v for k, v in json.loads(orjson.dumps(want)).items() if k != "miss_tallies"}


def test_an_input_error_early_in_the_log_leaves_stdout_empty(cli, write):
    rows = [{"timestamp": 5, "model": "claude-sonnet-4-5", "blocks": [{"id": "a", "tokens": 2000}]},
            {"timestamp": 1, "model": "claude-sonnet-4-5", "blocks": [{"id": "a", "tokens": 2000}]}]
    path = write("r.jsonl", "".join(json.dumps(x) + "\n" for x in rows))
    r = cli("prompt-cost", path, "-f", "json")
    assert r.exit_code == 2 and "r.jsonl:2" in r.stderr and r.stdout == ""


def test_audit_and_what_if_json_documents_are_the_whole_reports(cli):
    path = str(PROMPTS / "responses.jsonl")
    r = cli("prompt-cost", "--usage", path, "-f", "json")
    assert r.exit_code == 0, r.stderr
    want = pc.audit_usage(iter_jsonl(path), source=path, table=PriceTable.load())
    d = json.loads(orjson.dumps(want))
    del d["miss_tallies"]
    assert json.loads(r.stdout) == d and r.stdout_bytes == laid_out(d)
    w = cli("prompt-cost", "--prefix-tokens", "5000", "--calls", "60", "--every", "2m", "-m", "claude-sonnet-4-5",
            "-f", "json")
    d = json.loads(w.stdout)
    assert w.exit_code == 0 and d["mode"] == "what-if" and len(d["requests"]) == 60 and "miss_tallies" not in d


@pytest.mark.parametrize("name, every", LOGS)
def test_text_of_a_small_log_lists_every_miss(cli, name, every):
    path = str(PROMPTS / name)
    r = cli("prompt-cost", path, "-t", TOK_DIR, "-m", "gpt-4.1", *(["--every", f"{every:g}s"] if every else []))
    assert r.exit_code == 0, r.stderr
    rows = whole_report_document(path, every)["requests"]
    shown = [ln for ln in r.stdout.splitlines() if ln.startswith(("miss at ", "disagree at "))]
    misses = [q for q in rows if q["miss"] and q["miss"]["code"] != "cold"
              and (q["reconciliation"] is None or not q["reconciliation"]["agree"])]
    disagree = [q for q in rows if q["reconciliation"] and not q["reconciliation"]["agree"]]
    assert len(shown) == len(misses) + len(disagree) and "more request" not in r.stdout


def test_text_of_a_long_log_shows_its_ends_and_counts_the_rest(cli, write):
    path = layout_log(write, 400)
    r = cli("prompt-cost", path)
    assert r.exit_code == 0, r.stderr
    out = r.stdout.splitlines()
    rows = [ln.split() for ln in out if ln.split()[:1] and ln.split()[0].isdigit()]
    assert [int(x[0]) for x in rows] == [*range(1, 26), *range(376, 401)]   # line numbers of the rows shown
    assert any("350 more" in ln for ln in out)
    misses = [ln for ln in out if ln.startswith("miss at ")]
    assert len(misses) == prompt_cost._TextOut.DETAILED and misses[0].startswith("miss at line 2:")
    more = [ln for ln in out if ln.startswith("... and ")]
    assert len(more) == 1 and "more requests with a miss" in more[0]
    total = sum(1 for q in pc.simulate_requests(read_requests(str(path)), table=PriceTable.load(),
                                                source="x").requests
                if q.miss is not None and q.miss.code != "cold")
    assert more[0].startswith(f"... and {total - prompt_cost._TextOut.DETAILED:,} more")
    assert any(ln.startswith("total $") for ln in out)
