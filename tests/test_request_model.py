"""The canonical request (one parser for every command) and the provider rules simulated on it.

Each case is the providers' documented behaviour (../shared/FACTS.md) on bodies built here; token counts
come from the project's own tokenizer (fixtures/tok), and the expected numbers are computed independently
from that tokenizer's IDs, not from the simulator.
"""

from __future__ import annotations

import copy
import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines.provider.cache import simulate_requests, tokenizer_counter
from cachectl.engines.provider.prices import PriceTable
from cachectl.errors import InputError
from cachectl.inputs import Locator, parse_request, read_request_document, read_requests
from cachectl.inputs.jsonpos import value_offsets

from .conftest import FIXTURES

SONNET = "claude-sonnet-4-5"     # minimum 1,024 tokens
CORPUS = (FIXTURES / "corpus.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


@pytest.fixture(scope="module")
def counter(tok):
    return tokenizer_counter(tok)


def long_text(seed: int, chars: int = 6000) -> str:
    """Project prose of about ``chars`` characters: the corpus's sentences in an order fixed by ``seed``
    (different seeds give different texts)."""
    import random

    from cachectl.volatile import find_volatile

    sentences = [s.strip() + "." for s in CORPUS.replace("\n", " ").split(".")
                 if s.strip() and not find_volatile(s + ".")]  # the corpus also holds dates and ids: leave them out
    rng = random.Random(seed)
    out: list[str] = []
    while sum(len(x) + 1 for x in out) < chars:
        rng.shuffle(sentences)
        out.extend(sentences)
    return " ".join(out)[:chars]


def run(table, counter, bodies, gap=60.0):
    reqs = [parse_request({**b, "timestamp": i * gap}, source="t.jsonl", line=i + 1) for i, b in enumerate(bodies)]
    return simulate_requests(reqs, table=table, source="t.jsonl", text_counter=counter)


def cc(ttl=None):
    return {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}


def anthropic_body(**over):
    body = {
        "model": SONNET, "max_tokens": 256,
        "tools": [{"name": "lookup", "description": long_text(0, 5000),
                   "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
                   "cache_control": cc()}],
        "system": [{"type": "text", "text": long_text(5000, 5000), "cache_control": cc()}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": long_text(10000, 5000),
                                                   "cache_control": cc()}]}],
    }
    body.update(over)
    return body


def cum_tokens(counter, body):
    """Token counts at the end of tools, system, and messages for ``anthropic_body``-shaped bodies."""
    req = parse_request(body)
    seg = {}
    total = 0
    for p in req.positions:
        total += counter.count(p.text)
        seg[p.segment] = total
    return seg


# ------------------------------------------------------------------------------------------- the parser


def test_positions_follow_the_provider_order_not_the_file_order(tmp_path):
    text = json.dumps({"messages": [{"role": "user", "content": "hi"}], "system": "be brief",
                       "tools": [{"name": "f", "input_schema": {}}], "model": SONNET}, indent=2)
    req = read_request_document(text, "b.json")
    assert [p.segment for p in req.positions] == ["tools", "system", "messages"]
    # line:col come from the parser, whatever order the keys stand in the file
    lines = text.splitlines()
    line, col = req.locate("system")  # a member is located at its key
    assert lines[line - 1][col - 1:].startswith('"system": "be brief"')
    line, col = req.locate("messages[0].content")
    assert lines[line - 1][col - 1:].startswith('"content": "hi"')
    line, col = req.locate("messages[0]")  # an array element at its value
    assert lines[line - 1][col - 1:].startswith('{')


def test_wrapper_keeps_timestamp_usage_and_prefixes_paths():
    line = {"timestamp": 12.5, "body": {"model": SONNET, "messages": [{"role": "robot", "content": "x"}]},
            "usage": {"input_tokens": 3, "output_tokens": 1}}
    with pytest.raises(InputError, match=r"log.jsonl:7: field 'body.messages\[0\].role': role must be"):
        parse_request(line, source="log.jsonl", line=7)
    line["body"]["messages"][0]["role"] = "user"
    req = parse_request(line, source="log.jsonl", line=7)
    assert (req.timestamp, req.usage["input_tokens"], req.body_path, req.provider) == (12.5, 3, "body.", "anthropic")


def test_openai_chat_and_responses_orders():
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    chat = parse_request({"model": "gpt-4o", "response_format": schema, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {}}}], "messages": [{"role": "system", "content": "s"},
                                                       {"role": "user", "content": [{"type": "text", "text": "u"}]}]})
    assert [(p.segment, p.path) for p in chat.positions] == [
        ("tools", "tools[0]"), ("schema", "response_format"), ("messages", "messages[0]"), ("messages", "messages[1]")]
    resp = parse_request({"model": "gpt-4o", "instructions": "be brief", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"}],
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}})
    assert (resp.api, [p.segment for p in resp.positions]) == ("responses", ["schema", "system", "messages",
                                                                             "messages", "messages"])
    assert [m["role"] for m in resp.chat.messages] == ["system", "user", "assistant", "tool"]
    assert resp.chat.messages[2]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


@pytest.mark.parametrize("body, match", [
    ({"model": SONNET, "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
     r"field 'messages\[0\].content\[0\].type': a content block needs a string 'type'"),
    ({"model": "gpt-4o", "messages": [{"role": "user"}]}, r"field 'messages\[0\]': missing 'content'"),
    ({"model": SONNET, "system": "x", "messages": [{"role": "user", "content": "a",}],
      "cache_control": {"type": "ephemeral", "ttl": "10m"}}, r"field 'cache_control.ttl'"),
    ({"model": "gpt-4o", "input": [{"type": "teleport"}]}, r"field 'input\[0\].type': unknown input item type"),
])
def test_bad_bodies_name_the_field(body, match):
    with pytest.raises(InputError, match=match):
        parse_request(body, source="b.json", line=1)


def test_gzip_logs_and_deep_nesting(tmp_path):
    p = tmp_path / "log.jsonl.gz"
    with gzip.open(p, "wt") as fh:
        fh.write(json.dumps({"model": SONNET, "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert [r.positions[0].text for r in read_requests(str(p))] == ["hi"]
    with pytest.raises(InputError, match="nested"):
        read_request_document("[" * 100_000 + "]" * 100_000, "deep.json")
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(InputError, match="bad.jsonl.gz: corrupt gzip"):
        list(read_requests(str(bad)))


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids,
                                                                                      max_size=4), max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(json_values, st.sampled_from([None, 2]), st.booleans())
def test_every_located_path_holds_its_value(value, indent, ascii_only):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    offsets = value_offsets(text)
    dec = json.JSONDecoder()

    def walk(v, path):
        got, _ = dec.raw_decode(text, offsets[path])
        assert got == v
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}" if path else k)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")

    if isinstance(value, dict) and len({k for k in value}) != len(value):
        return
    if any("." in k or "[" in k or not k for k in _keys(value)):
        return  # such keys make paths ambiguous; bodies never use them
    walk(value, "")
    assert Locator(text)("") == (1, 1)


def _keys(v):
    if isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _keys(x)
    elif isinstance(v, list):
        for x in v:
            yield from _keys(x)


# ------------------------------------------------------------------------------- OpenAI token prefix


def test_openai_caches_the_shared_token_prefix_not_whole_messages(table, counter, tok):
    """A timestamp deep inside a long system message: OpenAI still caches the tokens before it."""
    head, tail = long_text(0, 7000), long_text(7000, 2000)
    bodies = [{"model": "gpt-4o", "messages": [{"role": "system", "content": f"{head}\nNow: {ts}\n{tail}"},
                                              {"role": "user", "content": "hello"}]}
              for ts in ("2026-11-30T10:00:00Z", "2026-11-30T10:05:00Z")]
    r = run(table, counter, bodies)
    a = tok.backend.encode(bodies[0]["messages"][0]["content"], add_special_tokens=False).ids
    b = tok.backend.encode(bodies[1]["messages"][0]["content"], add_special_tokens=False).ids
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert shared >= 1024
    assert r.requests[1].cache_read_input_tokens == shared // 128 * 128
    assert r.requests[1].usage_reported["prompt_tokens_details"]["cached_tokens"] == shared // 128 * 128
    miss = r.requests[1].miss
    assert miss.code == "content_changed" and miss.path == "messages[0]" and miss.volatile == "iso_datetime"


def test_openai_schema_change_invalidates_from_the_start(table, counter):
    msgs = [{"role": "system", "content": long_text(0, 8000)}, {"role": "user", "content": "q"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}}}}
    fmt2 = copy.deepcopy(fmt)
    fmt2["json_schema"]["schema"]["properties"]["score"] = {"type": "number"}
    same = run(table, counter, [{"model": "gpt-4o", "messages": msgs, "response_format": fmt}] * 2)
    assert same.requests[1].cache_read_input_tokens > 1024
    changed = run(table, counter, [{"model": "gpt-4o", "messages": msgs, "response_format": fmt},
                                   {"model": "gpt-4o", "messages": msgs, "response_format": fmt2}])
    assert changed.requests[1].cache_read_input_tokens == 0
    assert changed.requests[1].miss.path == "response_format"


def test_prompt_cache_key_is_routing_not_content(table, counter):
    msgs = [{"role": "system", "content": long_text(0, 8000)}, {"role": "user", "content": "q"}]
    r = run(table, counter, [{"model": "gpt-4o", "messages": msgs, "prompt_cache_key": "a"},
                             {"model": "gpt-4o", "messages": msgs, "prompt_cache_key": "b"}])
    assert r.requests[1].cache_read_input_tokens > 1024
    assert any("prompt_cache_key" in n and "routed" in n for n in r.notes)


# --------------------------------------------------------------------------- Anthropic invalidation


@pytest.mark.parametrize("change, level", [
    ({"speed": "fast"}, "tools"),                                   # system and messages invalidated
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "system"),   # messages invalidated
    ({"tool_choice": {"type": "tool", "name": "lookup"}}, "system"),
    (None, "messages"),                                             # nothing changed: a full read
])
def test_invalidation_hierarchy(table, counter, change, level):
    first = anthropic_body()
    second = anthropic_body(**(change or {}))
    r = run(table, counter, [first, second])
    expect = cum_tokens(counter, first)[level]
    assert r.requests[1].cache_read_input_tokens == expect
    if change:
        assert r.requests[1].miss.code == "scope_changed"


def test_a_breakpoint_on_a_web_search_tool_caches_the_tools_before_it(table, counter):
    """The web search tool is not in the tools' cached prefix (toggling it invalidates system and messages only), but
    its ``cache_control`` is a breakpoint all the same: on the tool definitions before it, one of the 4 markers. It
    was dropped (no marker, nothing cached)."""
    tools = [{"name": "lookup", "description": long_text(0, 5000), "input_schema": {"type": "object"}},
             {"type": "web_search_20250305", "name": "web_search", "cache_control": cc()}]
    body = {"model": SONNET, "max_tokens": 8, "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    req = parse_request(body)
    assert [(p.path, p.ttl, p.markers, p.cache_path) for p in req.positions if p.segment == "tools"] == [
        ("tools[0]", "5m", 1, "tools[1].cache_control")]
    assert req.marker_count == 1
    r = run(table, counter, [body, body])
    assert r.requests[1].cache_read_input_tokens == cum_tokens(counter, body)["tools"] > 1000
    # on a tool that has its own marker: two of the 4 slots, one breakpoint
    tools[0]["cache_control"] = cc()
    assert parse_request(body).marker_count == 2
    # alone, it has no prefix to cache (left out with the tool, as before)
    assert parse_request({**body, "tools": tools[1:]}).marker_count == 0


def test_adding_an_image_invalidates_messages(table, counter):
    first = anthropic_body()
    second = anthropic_body()
    second["messages"] = copy.deepcopy(first["messages"]) + [
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                   "data": "iVBORw0KGgo="}}, {"type": "text", "text": "and this?"}]}]
    r = run(table, counter, [first, second])
    assert r.requests[1].cache_read_input_tokens == cum_tokens(counter, first)["system"]


def test_key_order_in_a_tool_definition_invalidates_everything(table, counter):
    first = anthropic_body()
    second = anthropic_body()
    tool = second["tools"][0]
    second["tools"] = [{"input_schema": tool["input_schema"], "name": tool["name"],
                        "description": tool["description"], "cache_control": tool["cache_control"]}]
    r = run(table, counter, [first, second])
    assert r.requests[1].cache_read_input_tokens == 0
    assert "another order" in r.requests[1].miss.detail and r.requests[1].miss.path == "tools[0]"


def test_key_order_in_a_tool_use_input_breaks_the_messages_after_it(table, counter):
    def conv(args):
        return anthropic_body(messages=[
            {"role": "user", "content": long_text(10000, 5000)},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": args}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42",
                                          "cache_control": cc()}]}])
    first, second = conv({"q": "a", "n": 1}), conv({"n": 1, "q": "a"})
    r = run(table, counter, [first, second])
    assert r.requests[1].cache_read_input_tokens == cum_tokens(counter, first)["system"]
    assert r.requests[1].miss.path == "messages[1].content[0]"


def test_each_model_has_its_own_cache(table, counter):
    r = run(table, counter, [anthropic_body(), anthropic_body(model="claude-opus-4-1")])
    assert r.requests[1].cache_read_input_tokens == 0 and r.requests[1].miss.code == "cold"


def test_five_markers_two_in_one_tool_use_run_are_refused_by_prompt_cost_and_lint(table, counter, cli, write):
    body = anthropic_body(messages=[
        {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": cc()}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "a", "name": "lookup", "input": {}, "cache_control": cc()},
            {"type": "tool_use", "id": "b", "name": "lookup", "input": {}, "cache_control": cc()}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"},
                                     {"type": "tool_result", "tool_use_id": "b", "content": "2"}]}])
    with pytest.raises(InputError, match="5 cache_control breakpoints"):
        run(table, counter, [body])
    path = write("five.json", json.dumps(body, indent=2))
    r = cli("lint", path, "-f", "json")
    assert "CC004" in {f["rule"] for f in json.loads(r.stdout)["findings"]}


# ------------------------------------------------------------------------ usage and reconciliation


def test_unknown_usage_counter_is_an_error_not_dropped(cli, write):
    path = write("resp.jsonl", json.dumps({"model": SONNET, "usage": {"input_tokens": 10, "output_tokens": 5,
                                                                      "cache_write": 900}}) + "\n")
    r = cli("prompt-cost", "--usage", path)
    assert r.exit_code == 2
    assert "resp.jsonl:1: field 'usage.cache_write': unknown usage counter 'cache_write'" in r.stderr


def test_reconciliation_names_each_disagreement(table):
    def line(t, read, write_, blocks):
        return {"timestamp": t, "model": SONNET, "output_tokens": 10,
                "body": {"blocks": blocks},
                "usage": {"input_tokens": 50, "cache_creation_input_tokens": write_, "cache_read_input_tokens": read,
                          "output_tokens": 10}}
    bp = [{"id": "sys", "tokens": 2000, "cache_control": cc()}, {"id": "q", "tokens": 50}]
    lines = [line(0, 0, 2000, bp),            # cold write: agrees
             line(60, 2000, 0, bp),           # read: agrees
             line(1000, 2000, 0, bp),         # 940 s later the 5m entry is gone; the bill says it was read
             line(2000, 0, 2000, bp)]         # expired again, billed a write: agrees, for the TTL reason
    reqs = [parse_request(v, source="log", line=i + 1) for i, v in enumerate(lines)]
    r = simulate_requests(reqs, table=table, source="log")
    recs = [q.reconciliation for q in r.requests]
    assert [x.agree for x in recs] == [True, True, False, True]
    assert "ttl_expired" in recs[2].reason and "billed more read" in recs[2].reason
    assert recs[3].reason.startswith("ttl_expired")
    assert (r.reconciled, r.agreed) == (4, 3)
    codes = {f.code for f in r.findings}
    assert "ttl_gap" in codes


def test_findings_write_never_read_and_volatile_before_breakpoint(table, counter):
    bodies = [anthropic_body(system=[{"type": "text", "text": f"Request id req_{i}9f8e7d6c. " + long_text(5000, 5000),
                                      "cache_control": cc()}]) for i in range(3)]
    r = run(table, counter, bodies)
    codes = {f.code: f for f in r.findings}
    assert codes["write_never_read"].count >= 3
    assert codes["breakpoint_after_volatile"].count == 2
    assert r.requests[1].miss.volatile == "request_id" and r.requests[1].miss.path == "system[0]"


# -------------------------------------------------------------------------------------------- lint


def lint_json(cli, path, *extra):
    r = cli("lint", path, "-f", "json", *extra)
    return r, [(f["rule"], f["severity"], f["line"]) for f in json.loads(r.stdout)["findings"]] if r.stdout else []


def test_lint_checks_openai_bodies(cli, write):
    body = {"model": "gpt-4o", "messages": [
        {"role": "system", "content": "Session 3f2a1c9e-1b2c-4d5e-8f90-0123456789ab.\n" + long_text(0, 6000)},
        {"role": "user", "content": "hi"}]}
    _, found = lint_json(cli, write("oa.json", json.dumps(body, indent=2)))
    assert [(r, s) for r, s, _ in found] == [("CC010", "warning")]
    resp = {"model": "gpt-4o", "instructions": "Today is 2026-11-30. " + long_text(0, 6000), "input": "hi"}
    _, found = lint_json(cli, write("resp.json", json.dumps(resp, indent=2)))
    assert [r for r, _, _ in found] == ["CC010"]


def test_lint_reads_wrappers_and_top_level_cache_control(cli, write):
    body = anthropic_body()
    for t in body["tools"] + body["system"]:
        t.pop("cache_control")
    body["messages"][0]["content"][0].pop("cache_control")
    wrapped = {"timestamp": 1, "body": body}
    _, found = lint_json(cli, write("w.json", json.dumps(wrapped, indent=2)))
    assert [r for r, _, _ in found] == ["CC009"]
    body["cache_control"] = cc()
    _, found = lint_json(cli, write("w2.json", json.dumps(wrapped, indent=2)))
    assert found == []


def test_lint_severity_follows_evidence(cli, write):
    body = anthropic_body()
    body["system"][0]["text"] = "Knowledge cutoff: 2024-06-01. " + body["system"][0]["text"]
    _, found = lint_json(cli, write("const.json", json.dumps(body, indent=2)))
    # one body cannot show that the date changes: warnings, on its own breakpoint and on the one after it
    assert {(r, s) for r, s, _ in found} == {("CC008", "warning"), ("CC002", "warning")}
    body = anthropic_body()
    body["system"][0]["text"] = "Answer in the form {answer}. " + body["system"][0]["text"]
    assert lint_json(cli, write("braces.json", json.dumps(body, indent=2)))[1] == []


def test_lint_tail_breakpoint_of_a_conversation_is_not_flagged(cli, write):
    body = anthropic_body(messages=[
        {"role": "user", "content": "What happened on 2026-11-29?"},
        {"role": "assistant", "content": "A release."},
        {"role": "user", "content": [{"type": "text", "text": "Tell me more.", "cache_control": cc()}]}])
    assert lint_json(cli, write("conv.json", json.dumps(body, indent=2)))[1] == []


def test_lint_locations_when_messages_come_before_system(cli, write):
    body = anthropic_body()
    body["system"][0]["text"] = "Now: 2026-11-30T10:00:00Z. " + body["system"][0]["text"]
    text = json.dumps({"messages": body["messages"], "system": body["system"], "tools": body["tools"],
                       "model": SONNET}, indent=2)
    path = write("order.json", text)
    _, found = lint_json(cli, path)
    lines = text.splitlines()
    for rule, _, line in found:
        assert '"cache_control"' in lines[line - 1], (rule, line)
    rules = dict((r, ln) for r, _, ln in found)
    assert rules["CC008"] < rules["CC002"] or lines[rules["CC008"] - 1] != lines[rules["CC002"] - 1]


def test_lint_refuses_a_json_list(cli, write):
    r = cli("lint", write("list.json", json.dumps([{"role": "user", "content": "x"}])))
    assert r.exit_code == 2 and "list.json: not a request body" in r.stderr


# ------------------------------------------------------------------------------- the README's logs


def test_openai_log_of_the_readme(cli, tok):
    """fixtures/prompts/openai_requests.jsonl: a time line deep in the system prompt; each later request reads
    the token prefix before it, rounded down to 128."""
    from .conftest import PROMPTS

    lines = [json.loads(x) for x in (PROMPTS / "openai_requests.jsonl").read_text().splitlines()]
    r = cli("prompt-cost", PROMPTS / "openai_requests.jsonl", "--tokenizer", FIXTURES / "tok", "-f", "json")
    assert r.exit_code == 0, r.stderr
    got = json.loads(r.stdout)
    for prev, cur, row in zip(lines, lines[1:], got["requests"][1:]):
        a = tok.backend.encode(prev["body"]["messages"][0]["content"], add_special_tokens=False).ids
        b = tok.backend.encode(cur["body"]["messages"][0]["content"], add_special_tokens=False).ids
        shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        assert row["cache_read_input_tokens"] == shared // 128 * 128 > 1024
        assert row["miss"]["code"] == "content_changed" and row["miss"]["volatile"] == "iso_datetime"


def test_billed_log_of_the_readme_is_reconciled(cli):
    from .conftest import PROMPTS

    r = cli("prompt-cost", PROMPTS / "anthropic_billed.jsonl", "--tokenizer", FIXTURES / "tok", "-f", "json")
    assert r.exit_code == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["reconciled"], got["agreed"]) == (5, 4)
    bad = [q for q in got["requests"] if not q["reconciliation"]["agree"]]
    assert [q["line"] for q in bad] == [4] and "billed less read" in bad[0]["reconciliation"]["reason"]
    assert got["requests"][4]["miss"]["code"] == "ttl_expired"
    text = cli("prompt-cost", PROMPTS / "anthropic_billed.jsonl", "--tokenizer", FIXTURES / "tok").stdout
    assert "4 of 5 requests agree" in text and "disagree at line 4" in text


def test_engine_errors_name_parameters_and_the_cli_shows_its_flags(cli, write):
    """Engines speak of their parameters (`default_model`); the CLI's one table turns them into flags."""
    with pytest.raises(InputError, match="pass `default_model`"):
        simulate_requests([parse_request({"messages": [{"role": "user", "content": "x"}]})], table=PriceTable.load(),
                          source="mem")
    path = write("nomodel.jsonl", json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    r = cli("prompt-cost", path)
    assert r.exit_code == 2 and "nomodel.jsonl:1: no model on this line; pass --model" in r.stderr
    r = cli("prompt-cost", "--usage", write("u.jsonl", json.dumps({"model": "claude-sonnet-9", "usage": {
        "input_tokens": 1}}) + "\n"))
    assert "--list-models" in r.stderr and "--prices FILE" in r.stderr and "`" not in r.stderr


def test_deepseek_counters_are_mapped_not_dropped():
    from cachectl.inputs.usage import parse_usage

    u = parse_usage({"prompt_tokens": 100, "completion_tokens": 5, "prompt_cache_hit_tokens": 64,
                     "prompt_cache_miss_tokens": 36}, source="d", line=1)
    assert (u.cache_read_tokens, u.input_tokens, u.style) == (64, 36, "openai-chat")
    with pytest.raises(InputError, match="field 'usage.prompt_cache_hit_tokens'"):
        parse_usage({"prompt_tokens": 100, "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 30},
                    source="d", line=1)


def test_a_library_user_builds_a_request_in_memory_and_calls_the_engines(tok, table):
    """No files: one parsed request feeds the token diff and the prompt-cache simulation."""
    from cachectl.engines.tokendiff import diff_tokens
    from cachectl.inputs import prompt_from_request

    a = parse_request({"model": SONNET, "system": "You are terse.", "messages": [{"role": "user", "content": "hi"}]})
    b = parse_request({"model": SONNET, "system": "You are terse. Now: 2026-11-30T10:00:00Z",
                       "messages": [{"role": "user", "content": "hi"}]})
    d = diff_tokens(tok.tokenize(prompt_from_request(a)), tok.tokenize(prompt_from_request(b)))
    assert d.kind == "mismatch" and d.first_diff_index > 0
    r = simulate_requests([a, b], table=table, source="memory", text_counter=tokenizer_counter(tok), every=1.0)
    assert len(r.requests) == 2


# ------------------------------------------------------------------------ compact: the exact content, fast


_JSON_LEAVES = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
_JSON = st.recursive(_JSON_LEAVES, lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text(max_size=6), kids, max_size=4), max_leaves=20)


@settings(max_examples=600, deadline=None)
@given(_JSON)
def test_compact_writes_what_json_writes(value):
    """compact() takes orjson's path where orjson writes json's bytes; floats, NaN, big integers and lone
    surrogates (all generated here) must still come out as json writes them."""
    from cachectl.inputs.request import compact

    assert compact(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("value", [1e-05, -1e-05, 1e-07, 1e16, float("nan"), float("-inf"), [None, 0.5],
                                   {"n": 2**64}, "\ud800", {1: "key not a string"}, "a:1.5,b"])
def test_compact_on_what_orjson_writes_otherwise(value):
    from cachectl.inputs.request import compact

    assert compact(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@settings(max_examples=300, deadline=None)
@given(st.lists(_JSON, min_size=1, max_size=6), st.booleans(), st.booleans(), st.sampled_from([None, 2, 4]))
def test_dumps_alike_writes_what_json_dumps_writes_for_each_value(values, sort_keys, ensure_ascii, indent):
    """dumps_alike() keeps json.dumps' text by the value's exact content: asked again, in any order, for values
    that differ only where json.dumps shows it (a NaN and a null, 1 and 1.0 and true, key order), each gets its
    own text."""
    from cachectl.inputs.request import dumps_alike

    tricky = [{"a": float("nan")}, {"a": None}, [1], [1.0], [True], {"x": 1, "y": 2}, {"y": 2, "x": 1},
              {1: "k"}, {"1": "k"}, {"s": "\u00e9"}]
    for v in values + tricky + values[::-1] + tricky:
        try:
            want = json.dumps(v, sort_keys=sort_keys, ensure_ascii=ensure_ascii, indent=indent)
        except TypeError:  # (sort_keys over keys of mixed types: refused alike)
            with pytest.raises(TypeError):
                dumps_alike(v, sort_keys=sort_keys, ensure_ascii=ensure_ascii, indent=indent)
            continue
        assert dumps_alike(v, sort_keys=sort_keys, ensure_ascii=ensure_ascii, indent=indent) == want


@pytest.mark.parametrize("body, path", [
    ({"system": [{"type": "text", "text": "", "cache_control": {"type": "ephemeral"}}],
      "messages": [{"role": "user", "content": "hi"}]}, r"system\[0\].cache_control"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                {"type": "text", "text": "", "cache_control": {"type": "ephemeral"}}]}]},
     r"messages\[0\].content\[1\].cache_control"),
])
def test_a_cache_control_on_an_empty_text_block_is_the_apis_400(body, path):
    """The API answers 400 'cache_control cannot be set for empty text blocks' (agents' logs show it:
    anthropics/claude-code#50082); such a body was priced as if cached."""
    with pytest.raises(InputError, match=rf"field '{path}': the API refuses a cache_control on an empty text block"):
        parse_request({"model": SONNET, "max_tokens": 8, **body})
    empty_unmarked = copy.deepcopy(body)
    empty_unmarked["messages"][0]["content"] = "hi"
    parse_request({"model": SONNET, "max_tokens": 8, **{k: v for k, v in empty_unmarked.items() if k != "system"}})
