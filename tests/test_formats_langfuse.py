"""Langfuse ingestion events and trace exports: detection, joins, the records against the fixtures' numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachectl.errors import InputError
from cachectl.inputs import parse_request
from cachectl.inputs.formats import langfuse, log_values, shape_of
from cachectl.inputs.usage import parse_usage

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "fixtures" / "logs"
EVENTS = LOGS / "langfuse_events.jsonl"
MINE = ("langfuse_events.jsonl", "langfuse_litellm_batch.jsonl", "langfuse_trace_autogen.json",
        "langfuse_trace_langgraph.json")


def _values(path) -> list:
    return list(log_values(str(path)))


def test_detected_on_its_fixtures_and_not_on_the_others():
    for name in MINE:
        assert shape_of(str(LOGS / name)) == "langfuse", name
    others = [p for p in (*LOGS.glob("*.json*"), *(ROOT / "fixtures" / "prompts").glob("*.jsonl"))
              if p.name not in MINE]
    assert others
    for p in others:
        try:
            assert shape_of(str(p)) != "langfuse", p
        except InputError:
            pass


def test_events_joined_by_id_and_trace():
    values = _values(EVENTS)
    assert [n for n, _ in values] == [1, 6, 8]  # three generations; the span and the score are not calls
    (_, g1), (_, g2), (_, g3) = values
    # gen-1: created at line 1, its usage in the update at line 2, its trace created after it at line 3
    assert g1["usage"] == {"input_tokens": 14, "cache_creation_input_tokens": 402, "cache_read_input_tokens": 0,
                           "output_tokens": 21}
    assert (g1["session"], g1["user"], g1["trace"], g1["request_id"]) == ("sess-a", "user-ana", "trace-a", "gen-1")
    assert g1["timestamp"] == "2026-01-01T00:00:00.000Z" and g1["output_tokens"] == 21
    assert (g2["usage"]["input_tokens"], g2["usage"]["cache_read_input_tokens"]) == (30, 402)
    assert g2["session"] == "sess-a"
    # usageDetails is additive: input 172 + cached 1152 = the 1324 prompt tokens OpenAI bills
    assert g3["usage"] == {"prompt_tokens": 1324, "completion_tokens": 17, "prompt_tokens_details": {"cached_tokens": 1152}}
    assert (g3["session"], g3["user"]) == ("sess-b", "user-ben")


def test_bodies_follow_the_provider():
    (n1, g1), _, (n3, g3) = _values(EVENTS)
    r1 = parse_request(g1, source="x", line=n1)
    assert r1.provider == "anthropic" and g1["body"]["system"][0]["type"] == "text"
    assert g1["body"]["tools"][0]["input_schema"]["required"] == ["query"]
    r3 = parse_request(g3, source="x", line=n3)
    assert r3.provider == "openai" and g3["body"]["messages"][0]["role"] == "system"


def test_billed_usage_reaches_the_reconciliation():
    got = [parse_usage(v["usage"], source="x", line=n, model=v["model"]) for n, v in _values(EVENTS)]
    assert [(u.style, u.prompt_tokens, u.cache_read_tokens, u.cache_write_tokens) for u in got] == [
        ("anthropic", 416, 0, 402), ("anthropic", 432, 402, 0), ("openai-chat", 1324, 1152, 0)]


def test_real_exports_and_batch():
    autogen = _values(LOGS / "langfuse_trace_autogen.json")
    [(n, v)] = autogen
    assert (v["session"], v["user"], v["model"]) == ("session_abc", "user_123", "gpt-4o")
    assert v["usage"]["prompt_tokens"] == 41 and v["output_tokens"] == 3
    assert v["body"]["messages"][0]["content"].startswith("system: You are a helpful AI assistant")
    graph = _values(LOGS / "langfuse_trace_langgraph.json")
    assert [v["usage"]["prompt_tokens"] for _, v in graph] == [60, 108]
    for n, v in graph:
        parse_request(v, source="x", line=n)  # a tool's structured result is sent as JSON text
    [(n, b)] = _values(LOGS / "langfuse_litellm_batch.jsonl")
    assert b["model"] == "gpt-3.5-turbo" and b["usage"]["prompt_tokens"] == 10 and b["output_tokens"] == 20


def _log(tmp_path, *events) -> str:
    p = tmp_path / "events.jsonl"
    p.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(p)


def _gen(gid="g", **body):
    return {"id": "e-" + gid, "type": "generation-create", "timestamp": "2026-01-01T00:00:00Z",
            "body": {"id": gid, "traceId": "t", "startTime": "2026-01-01T00:00:00Z", "model": "gpt-4o",
                     "input": [{"role": "user", "content": "hi"}], **body}}


def test_litellm_written_generations_count_cache_reads_once(tmp_path):
    g = _gen(metadata={"hidden_params": {}}, model="claude-sonnet-4-5",
             usageDetails={"input": 1010, "output": 5, "cache_read_input_tokens": 1000,
                           "cache_creation_input_tokens": 0})
    [(_, v)] = _values(_log(tmp_path, g))
    assert (v["usage"]["input_tokens"], v["usage"]["cache_read_input_tokens"]) == (10, 1000)


def test_unknown_counter_names_file_line_and_field(tmp_path):
    ok = _gen("a", usageDetails={"input": 3, "output": 1, "input_audio": 0, "mystery": 0})
    bad = _gen("b", usageDetails={"input": 3, "mystery_tokens": 7})
    assert len(_values(_log(tmp_path, ok))) == 1  # empty unknown counters are not an error
    with pytest.raises(InputError) as exc:
        _values(_log(tmp_path, ok, bad))
    assert exc.value.line == 2 and exc.value.field == "body.usageDetails.mystery_tokens"


def test_a_bad_counter_names_the_line_of_the_update_that_logged_it(tmp_path):
    """A generation's usage comes in its update event, lines after the event that opened it: a bad counter there is
    named at that line and its path in it, not at the opening line."""
    update = {"id": "e-u", "type": "generation-update", "timestamp": "2026-01-01T00:00:01Z",
              "body": {"id": "g", "usageDetails": {"input": 3, "output": -7}}}
    with pytest.raises(InputError) as exc:
        _values(_log(tmp_path, _gen(), update))
    assert (exc.value.line, exc.value.field) == (2, "body.usageDetails.output")


@pytest.mark.parametrize("huge", [10**20, 1e300, 2**31])
def test_a_counter_past_32_bits_is_refused_where_it_is_logged(tmp_path, huge):
    """A counter no request can hold (it reached the JSON output as an int past 64 bits before, an internal
    error) is refused, named at its line and field."""
    with pytest.raises(InputError, match="expected a token count") as exc:
        _values(_log(tmp_path, _gen(usageDetails={"input": 3, "output": 1, "cache_read_input_tokens": huge})))
    assert (exc.value.line, exc.value.field) == (1, "body.usageDetails.cache_read_input_tokens")


def test_a_line_in_no_shape_is_named(tmp_path):
    p = tmp_path / "events.jsonl"
    p.write_text(json.dumps(_gen()) + "\n{\"hello\": 1}\n")
    with pytest.raises(InputError) as exc:
        _values(p)
    assert exc.value.line == 2


def test_memory_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(langfuse, "WINDOW", 3)
    events = [_gen(f"g{i}", usageDetails={"input": 1, "output": 1}) for i in range(10)]
    late = {"id": "late", "type": "trace-create", "timestamp": "2026-01-01T00:00:00Z",
            "body": {"id": "t", "sessionId": "s"}}
    values = _values(_log(tmp_path, *events, late))
    assert len(values) == 10
    assert "session" not in values[0][1]  # emitted before the late trace came
    assert values[-1][1]["session"] == "s"


def test_detector_never_raises():
    from cachectl.inputs.formats.base import Head, HeadLine

    def head(v, text=b""):
        return Head("x", (HeadLine(1, text, v),), text)

    assert langfuse.detect(head({"type": "trace-create"})).score == 1
    assert langfuse.detect(head({"model": "gpt-4o", "input": "hi"})).score == 0  # a Responses body
    assert langfuse.detect(head(None, b"{\n")).score == 0
    assert langfuse.detect(head(None, b'{\n  "trace": {\n')).score == 2


def test_a_claude_generations_malformed_message_is_named_in_its_event(tmp_path):
    """The Anthropic rebuild refuses a message that is no message object, named at the event's line and the
    message's path in it (it was rebuilt as the user text "null" before)."""
    g = _gen(model="claude-sonnet-4-5", input={"messages": [{"role": "user", "content": "hi"}, None]},
             usageDetails={"input": 3, "output": 1})
    with pytest.raises(InputError, match="expected a message object") as exc:
        _values(_log(tmp_path, g))
    assert (exc.value.line, exc.value.field) == (1, "body.input.messages[1]")
