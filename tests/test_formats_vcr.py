"""VCR cassettes (vcrpy / pytest-recording): detection, the LLM calls' bodies and usage (plain, gzip, base64,
SSE streams), and the bad input refused in one line."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest

from cachectl.errors import InputError
from cachectl.inputs import parse_request
from cachectl.inputs.formats import log_values, shape_of
from cachectl.inputs.usage import parse_usage

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "fixtures" / "logs"
CASSETTES = sorted(LOGS.glob("vcr_*.yaml"))


def _values(path):
    return list(log_values(str(path)))


@pytest.mark.parametrize("path", CASSETTES, ids=lambda p: p.name)
def test_real_cassettes_are_found_by_themselves(path):
    assert shape_of(str(path)) == "vcr"


@pytest.mark.parametrize("path", sorted((ROOT / "fixtures" / "prompts").glob("*.json*")) + sorted(
    p for p in LOGS.glob("*.jsonl")), ids=lambda p: p.name)
def test_other_files_are_not_cassettes(path):
    from cachectl.inputs.files import display_name, iter_raw_lines
    from cachectl.inputs.formats import _head, vcr

    head, _ = _head(iter_raw_lines(str(path)), display_name(str(path)))
    assert vcr.detect(head).score == 0


def test_pydantic_ai_anthropic_cassette_carries_the_cache_counters():
    values = _values(LOGS / "vcr_anthropic_cache.yaml")
    assert [n for n, _ in values] == [2, 165]
    first, second = (v for _, v in values)
    assert first["usage"]["cache_read_input_tokens"] == 1111 and first["usage"]["output_tokens"] == 406
    assert second["usage"]["cache_creation_input_tokens"] == 418
    assert second["usage"]["cache_creation"]["ephemeral_5m_input_tokens"] == 418
    assert first["request_id"] == "msg_01UUPT9QdZnZSRzcQJkjG25U"
    assert "timestamp" not in first  # vcrpy records no time
    for n, v in values:
        req = parse_request(v["body"], source="c", line=n)
        assert req is not None
        parse_usage(v["usage"], source="c", line=n)
    assert second["body"]["messages"][-1]["content"][0]["text"] == "Can you summarize that in one sentence?"


def test_anthropic_stream_usage_is_message_start_updated_by_message_delta():
    (_, v), = _values(LOGS / "vcr_anthropic_stream.yaml")
    # message_start says input 1128, output 2; message_delta's cumulative counters replace them
    assert v["usage"]["input_tokens"] == 2411 and v["usage"]["output_tokens"] == 145
    assert "iterations" not in v["usage"]
    parse_usage(v["usage"], source="c", line=1)


def test_openai_stream_usage_is_the_final_chunks():
    values = _values(LOGS / "vcr_openai_stream.yaml")
    assert [v["usage"]["prompt_tokens"] for _, v in values] == [53, 78]
    assert [v["usage"]["completion_tokens"] for _, v in values] == [15, 9]
    assert values[0][1]["body"]["stream_options"] == {"include_usage": True}


def _cassette(tmp_path, interactions, name="c.yaml"):
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump({"interactions": interactions, "version": 1}))
    return path


def _anthropic_request(**extra):
    body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    return {"method": "POST", "uri": "https://api.anthropic.com/v1/messages", "headers": {},
            "body": json.dumps(body), **extra}


USAGE = {"input_tokens": 5, "cache_read_input_tokens": 2048, "cache_creation_input_tokens": 0, "output_tokens": 7}


def test_a_gzip_binary_body_is_inflated(tmp_path):
    raw = gzip.compress(json.dumps({"id": "msg_1", "usage": USAGE}).encode())
    path = _cassette(tmp_path, [{"request": _anthropic_request(), "response": {
        "status": {"code": 200, "message": "OK"}, "headers": {"Content-Encoding": ["gzip"]},
        "body": {"string": raw}}}])
    assert "!!binary" in path.read_text()
    (_, v), = _values(path)
    assert v["usage"]["cache_read_input_tokens"] == 2048


def test_a_base64_request_body_and_a_json_serialized_cassette(tmp_path):
    req = _anthropic_request()
    req["body"] = req["body"].encode()  # !!binary: base64 in the YAML
    path = _cassette(tmp_path, [{"request": req, "response": {"status": {"code": 200}, "headers": {},
                                                             "body": {"string": json.dumps({"usage": USAGE})}}}])
    (_, v), = _values(path)
    assert v["body"]["model"] == "claude-sonnet-4-5"
    jpath = tmp_path / "c.json"
    jpath.write_text(json.dumps({"version": 1, "interactions": [
        {"request": _anthropic_request(), "response": {"status": {"code": 200}, "headers": {},
                                                       "body": {"string": json.dumps({"usage": USAGE})}}}]}, indent=4))
    assert shape_of(str(jpath)) == "vcr"
    (n, v), = _values(jpath)
    assert n == 5 and v["usage"]["output_tokens"] == 7  # the interaction's "request" line


def test_old_httpx_layout_keeps_its_decoded_content_despite_the_gzip_header(tmp_path):
    path = _cassette(tmp_path, [{"request": _anthropic_request(), "response": {
        "status_code": 200, "http_version": "HTTP/1.1", "headers": {"Content-Encoding": ["gzip"]},
        "content": json.dumps({"usage": USAGE})}}])
    (_, v), = _values(path)
    assert v["usage"]["input_tokens"] == 5


def test_non_llm_interactions_are_skipped_and_typed_bodies_read(tmp_path):
    sse = ("event: message_start\ndata: " + json.dumps({"type": "message_start", "message": {
        "id": "msg_2", "model": "claude-sonnet-4-5", "usage": {**USAGE, "output_tokens": 1}}}) +
        "\n\nevent: message_delta\ndata: " + json.dumps({"type": "message_delta", "usage": {"output_tokens": 99}})
        + "\n\n")
    req = _anthropic_request()
    req["body"] = {"type": "json", "content": json.loads(req["body"])}
    path = _cassette(tmp_path, [
        {"request": {"method": "GET", "uri": "https://api.anthropic.com/v1/models", "body": None},
         "response": {"status": {"code": 200}, "body": {"string": "{}"}}},
        {"request": req, "response": {"status": {"code": 200}, "body": {"type": "text", "content": sse}},
         "recorded_at": "2026-03-06T19:26:02+00:00"}])
    (_, v), = _values(path)
    assert v["usage"]["output_tokens"] == 99 and v["usage"]["cache_read_input_tokens"] == 2048
    assert v["timestamp"] == "2026-03-06T19:26:02+00:00"


def test_a_python_tag_is_refused_in_one_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("interactions:\n- request:\n    body: !!python/object/apply:os.system ['echo pwned']\n"
                    "    method: POST\n    uri: https://api.openai.com/v1/chat/completions\n")
    with pytest.raises(InputError) as err:
        _values(path)
    msg = str(err.value)
    assert "python/object/apply:os.system" in msg and "\n" not in msg
    assert err.value.line == 3


def test_bad_cassettes_name_file_line_and_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("interactions:\n- request: [1, 2\n")
    with pytest.raises(InputError) as err:
        _values(path)
    assert "invalid YAML" in str(err.value)
    path = _cassette(tmp_path, [{"request": {"method": "POST", "uri": "https://api.openai.com/v1/chat/completions",
                                             "body": "not json"}}])
    with pytest.raises(InputError) as err:
        _values(path)
    assert err.value.field == "interactions[0].request.body"
    path = _cassette(tmp_path, [{"request": _anthropic_request(), "response": {
        "status": {"code": 200}, "body": {"string": b"\x1f\x8b\x08\x00broken"}}}])
    with pytest.raises(InputError, match="gzip"):
        _values(path)


def test_an_oversized_cassette_is_refused(tmp_path, monkeypatch):
    from cachectl.inputs.formats import vcr

    monkeypatch.setattr(vcr, "MAX_BYTES", 100)
    path = _cassette(tmp_path, [{"request": _anthropic_request()}])
    with pytest.raises(InputError, match="MiB"):
        _values(path)


def test_base64_helper_roundtrip_is_standard_yaml():
    import yaml

    assert yaml.safe_load("b: !!binary " + base64.b64encode(b"ab").decode()) == {"b": b"ab"}


def test_interaction_lines_are_those_of_a_line_by_line_scan():
    """The interactions' first lines, found from each newline by the regex engine, are those a match on each line
    finds: on the cassettes here and on random texts of the pieces that matter (indents, CR, form feeds)."""
    import random
    import re

    from cachectl.inputs.formats import vcr

    one_line = re.compile(r'^(?:(?:  )?- (?:recorded_at|request|response):|\s*"request": *\{)')

    def by_line(text: str, first: int, count: int) -> list[int]:
        starts = [first + i for i, line in enumerate(text.split("\n")) if one_line.match(line)]
        return starts if len(starts) == count else [first] * count

    root = ROOT / "fixtures"
    texts = [p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.yaml")) + sorted(root.rglob("*.json"))]
    rng = random.Random(3)
    pieces = ["\n", "- request:", "  - request:", ' \t"request": {', '"request":{', "x", " ", "\r", "\t",
              "- response:", "   - request:", "\x0c", "- recorded_at:"]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 10))) for _ in range(3000)]
    for text in texts:
        found = len([1 for line in text.split("\n") if one_line.match(line)])
        for count in {0, 1, 3, found}:
            assert vcr._interaction_lines(text, 4, count) == by_line(text, 4, count), repr(text[:80])


def test_plain_yaml_builds_what_the_safe_loader_builds():
    """The cassette loader's own pass over the parser's events gives the safe loader's document (types and key
    order included), and leaves to the loader what it does not build: anchors, merge keys, other tags, keys that
    are collections, several documents, bad YAML."""
    import datetime

    import yaml

    from cachectl.inputs.formats import vcr

    def same(a, b) -> bool:
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return a == b or (a != a and b != b)

    texts = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "fixtures").rglob("*.yaml"))]
    texts += [
        "a: 1\nb: 0x1f\nc: 1_000\nd: 1:30\ne: .5\nf: .inf\ng: -.nan\nh: ~\ni: null\nj: yes\nk: No\nl: 'yes'\n",
        "t: 2024-05-14 10:11:12.5+02:00\nd: 2024-05-14\nb: !!binary aGVsbG8=\ns: !!str 12\nn: !!null x\n",
        "a: b\na: c\n1: one\n1.0: float\ntrue: t\n~: none\n? [x]\n: y\n",
        "m: !!map {a: 1}\nq: !!seq [1, 2]\nx: ! 12\nempty:\n'': e\nlist: [a, [b, {c: d}], {}, []]\n",
        "base: &b {x: 1}\nuse: *b\n", "a: {<<: {x: 1}, y: 2}\n", "= : v\n", "s: !!set {a, b}\n",
        "o: !!omap [a: 1]\n", "p: !!python/name:os.system\n", "a: 1\n---\nb: 2\n", "", "---\n", "- 1\n- 2\n",
        "a: [1, 2\n", "a: !!binary '%%%'\n", "a: !!int x\n", "a: !!timestamp 2024-13-45\n", "scalar\n",
        "k: |\n  line one\n\n  line two\n", "k: >-\n  folded\n  text\n", "\"k\\u00e9\": \"\\t\"\n",
    ]
    for text in texts:
        try:
            expected: object = yaml.load(text, Loader=vcr._Loader)  # noqa: S506 - the safe loader
        except Exception as exc:  # what the loader raises (a ValueError for `!!int x`), raised by vcr too
            expected = type(exc)
        try:
            got: object = vcr._plain_yaml(text)
        except vcr._NotPlain:
            got = vcr._NotPlain
        except Exception as exc:
            got = type(exc)
        assert got is vcr._NotPlain or got is expected or same(got, expected), text
        if isinstance(expected, type):
            assert got is vcr._NotPlain or got is expected, text
    assert isinstance(vcr._plain_yaml("t: 2024-05-14 10:11:12\n")["t"], datetime.datetime)
    with pytest.raises(vcr._NotPlain):
        vcr._plain_yaml("base: &b {x: 1}\nuse: *b\n")


@pytest.mark.parametrize("brk", ["\u2028", "\u2029"])
def test_a_stream_event_whose_json_holds_a_unicode_line_break_is_read_whole(tmp_path, brk):
    """SSE breaks lines at \\r\\n, \\r and \\n only: a JSON string in an event's data may hold U+2028 or U+2029 as
    they are, and ``str.splitlines`` would cut the event there (its usage lost without a word)."""
    import yaml

    doc = yaml.safe_load((LOGS / "vcr_anthropic_stream.yaml").read_text(encoding="utf-8"))
    body = doc["interactions"][0]["response"]["body"]
    delta = '{"type":"message_delta","delta":{"stop_reason":"end_turn"'  # (its counters are the final ones)
    assert body["string"].count(delta) == 1
    body["string"] = body["string"].replace(delta, delta.replace("end_turn", f"end{brk}turn"))
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    (_, v), = _values(p)
    assert v["usage"]["input_tokens"] == 2411 and v["usage"]["output_tokens"] == 145


def test_yaml_aliases_read_until_they_expand_the_cassette_past_twice_its_size(tmp_path):
    """A loader keeps one object for an anchor and its aliases: a few shared headers (as PyYAML writes a cassette
    whose interactions share an object) are read; nine levels of ten aliases ("billion laughs", 10^9 strings from
    a file of a kilobyte) are refused in one line, without walking them."""
    import time

    import yaml

    doc = yaml.safe_load((LOGS / "vcr_anthropic_cache.yaml").read_text(encoding="utf-8"))
    shared = doc["interactions"][0]["request"]["headers"]
    for item in doc["interactions"]:
        item["request"]["headers"] = shared
    text = yaml.safe_dump(doc, allow_unicode=True)
    assert "*id001" in text
    p = tmp_path / "shared.yaml"
    p.write_text(text, encoding="utf-8")
    assert len(_values(p)) == len(_values(LOGS / "vcr_anthropic_cache.yaml"))

    laughs = ["interactions:", "- a0: &a0 [" + ", ".join(['"request"'] * 10) + "]"]
    laughs += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    p = tmp_path / "laughs.yaml"
    p.write_text("\n".join(laughs) + "\n", encoding="utf-8")
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=r"expand it past twice its size"):
        _values(p)
    assert time.perf_counter() - t0 < 5


def test_a_cassette_cut_inside_an_interaction_is_refused_at_it(tmp_path):
    """A cassette cut in its second interaction's request headers still parses as YAML: the cut request has no
    `method` or `uri` (vcrpy records both), and was left out as a non-LLM call, 1 request read of 2 without a word.
    It is refused at the interaction's line."""
    text = (LOGS / "vcr_anthropic_cache.yaml").read_text()
    second = text.index("- request:", text.index("- request:") + 1)
    cut = tmp_path / "cut.yaml"
    cut.write_text(text[:text.index("accept-encoding", second)])
    with pytest.raises(InputError, match="is the cassette cut") as exc:
        _values(cut)
    assert exc.value.field == "interactions[1].request"
    assert exc.value.line == text[:second].count("\n") + 1


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("bad", [-1, 1e20, 2.5, "lots"])
def test_a_usage_counter_that_is_no_token_count_is_named_at_the_response(tmp_path, bad, stream):
    """A recorded response's counter that is negative, past 32 bits, fractional or a word is refused at its
    interaction, naming the response body's counter (or, in an event stream, the body and the counter), not the
    internal ``usage.`` path the readers' records share."""
    usage = {**USAGE, "cache_read_input_tokens": bad}
    if stream:
        events = [{"type": "message_start", "message": {"id": "msg_1", "model": "claude-sonnet-4-5", "usage": usage}},
                  {"type": "message_stop"}]
        body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    else:
        body = json.dumps({"id": "msg_1", "usage": usage})
    ok = {"request": _anthropic_request(), "response": {"status": {"code": 200}, "headers": {},
                                                         "body": {"string": json.dumps({"id": "m", "usage": USAGE})}}}
    path = _cassette(tmp_path, [ok, {"request": _anthropic_request(), "response": {
        "status": {"code": 200}, "headers": {}, "body": {"string": body}}}])
    with pytest.raises(InputError, match="expected a token count") as exc:
        _values(path)
    text = path.read_text()
    assert exc.value.line == text[:text.index("- request:", text.index("- request:") + 1)].count("\n") + 1
    if stream:
        assert exc.value.field == "interactions[1].response.body"
        assert "usage.cache_read_input_tokens in its event stream" in exc.value.message
    else:
        assert exc.value.field == "interactions[1].response.body.usage.cache_read_input_tokens"
