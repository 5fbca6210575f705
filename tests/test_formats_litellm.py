"""LiteLLM's StandardLoggingPayload: detection, the records against the fixtures' own numbers, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachectl.errors import InputError
from cachectl.inputs import parse_request
from cachectl.inputs.formats import log_values, shape_of
from cachectl.inputs.usage import parse_usage

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "fixtures" / "logs"
PAYLOADS = LOGS / "litellm_payloads.jsonl"


def _values(path) -> list:
    return list(log_values(str(path)))


def test_detected_on_its_fixtures_and_not_on_the_others():
    assert shape_of(str(PAYLOADS)) == "litellm"
    assert shape_of(str(LOGS / "litellm_gcs_payload.jsonl")) == "litellm"
    others = [p for p in (*LOGS.glob("*.json*"), *(ROOT / "fixtures" / "prompts").glob("*.jsonl"))
              if not p.name.startswith("litellm")]
    assert others
    for p in others:
        try:
            assert shape_of(str(p)) != "litellm", p
        except InputError:
            pass


def test_records_against_the_fixture_numbers():
    values = _values(PAYLOADS)
    assert [n for n, _ in values] == [1, 2, 3, 5]  # line 4: served from LiteLLM's own cache, left out
    (_, a1), (_, a2), (_, o), (_, old) = values
    assert a1["timestamp"] == 1767225600.125 and a1["session"] == "sess-a" and a1["tenant"] == "team-research"
    assert a1["user"] == "user-ana" and a1["api_key"] == "research-key" and a1["request_id"] == "chatcmpl-1"
    # Anthropic: prompt_tokens 416 = 14 uncached + 402 written (today's LiteLLM counts the writes in it)
    assert a1["usage"]["input_tokens"] == 14 and a1["usage"]["cache_creation_input_tokens"] == 402
    assert a1["usage"]["cache_creation"] == {"ephemeral_5m_input_tokens": 402, "ephemeral_1h_input_tokens": 0}
    # prompt_tokens 432 = 30 + 402 read: not counted twice
    assert (a2["usage"]["input_tokens"], a2["usage"]["cache_read_input_tokens"]) == (30, 402)
    # LiteLLM 1.5x-1.7x: prompt_tokens 432 = 30 + 402 read, no writes in it
    assert (old["usage"]["input_tokens"], old["usage"]["cache_read_input_tokens"]) == (30, 402)
    assert o["usage"] == {"prompt_tokens": 1324, "completion_tokens": 17, "prompt_tokens_details": {"cached_tokens": 1152}}
    assert a1["output_tokens"] == 21 and o["output_tokens"] == 17


def test_anthropic_calls_become_anthropic_bodies_with_their_cache_markers():
    (n, a1), *_ = _values(PAYLOADS)
    body = a1["body"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert body["tools"][0]["name"] == "search_docs"
    req = parse_request(a1, source="x", line=n)
    assert req.provider == "anthropic" and req.model == "claude-sonnet-4-5-20250929"
    assert req.breakpoints  # the system block's and the tool's markers survive the rebuild
    _, _, (n3, o), _ = _values(PAYLOADS)
    assert parse_request(o, source="x", line=n3).provider == "openai"


def test_billed_usage_reaches_the_reconciliation():
    for n, v in _values(PAYLOADS):
        u = parse_usage(v["usage"], source="x", line=n, model=v["model"])
        raw = json.loads(PAYLOADS.read_text().splitlines()[n - 1])["response"]["usage"]
        assert u.prompt_tokens == raw["prompt_tokens"]  # uncached + reads + writes: each token once
        assert u.output_tokens == raw["completion_tokens"]
    (n, a1), *_ = _values(PAYLOADS)
    u = parse_usage(a1["usage"], source="x", line=n, model=a1["model"])
    assert (u.style, u.input_tokens, u.cache_write_tokens, u.write_5m_tokens) == ("anthropic", 14, 402, 402)


def test_the_real_payload_is_read():
    [(n, v)] = _values(LOGS / "litellm_gcs_payload.jsonl")
    assert v["body"] == {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello, world!"}]}
    assert v["usage"]["prompt_tokens"] == 10 and v["output_tokens"] == 20
    assert v["timestamp"] == "2025-01-24 09:20:46.847371"  # as logged: the run's timestamp rule judges it


def _line(tmp_path, payload) -> str:
    p = tmp_path / "log.jsonl"
    p.write_text(json.dumps(payload) + "\n")
    return str(p)


def _payload(**over):
    base = json.loads(PAYLOADS.read_text().splitlines()[0])
    base.update(over)
    return base


def test_bad_counter_names_file_line_and_field(tmp_path):
    bad = _payload()
    bad["response"]["usage"]["prompt_tokens"] = "many"
    with pytest.raises(InputError) as exc:
        _values(_line(tmp_path, bad))
    assert exc.value.line == 1 and exc.value.field == "response.usage.prompt_tokens"
    assert "log.jsonl" in str(exc.value)


def test_reads_exceeding_prompt_tokens_are_refused(tmp_path):
    bad = _payload()
    bad["response"]["usage"]["cache_read_input_tokens"] = 5000
    with pytest.raises(InputError, match="less than the cache reads"):
        _values(_line(tmp_path, bad))


def test_a_later_line_in_another_shape_is_named(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text(PAYLOADS.read_text().splitlines()[0] + "\n" + json.dumps({"model": "x", "messages": []}) + "\n")
    with pytest.raises(InputError) as exc:
        _values(p)
    assert exc.value.line == 2


def test_detector_never_raises_and_is_specific():
    from cachectl.inputs.formats import litellm
    from cachectl.inputs.formats.base import Head, HeadLine

    def head(v):
        return Head("x", (HeadLine(1, b"", v),))

    assert litellm.detect(head({"model": "gpt-4o", "messages": []})).score == 0  # a bare body
    assert litellm.detect(head({"call_type": "acompletion", "startTime": 1.0})).score == 1
    assert litellm.detect(head(None)).score == 0 and litellm.detect(head([1])).score == 0


def test_embeddings_and_failures(tmp_path):
    emb = _payload(call_type="aembedding")
    fail = _payload(status="failure", response=None)
    p = tmp_path / "log.jsonl"
    p.write_text(json.dumps(emb) + "\n" + json.dumps(fail) + "\n")
    [(n, v)] = _values(p)
    assert n == 2 and "usage" not in v and "body" in v


@pytest.mark.parametrize("bad, field, says", [
    (None, "messages[1]", "expected a message object"),
    ({"role": 5, "content": "hi"}, "messages[1].role", "missing or non-string 'role'"),
    ({"role": "user", "content": {"a": 1}}, "messages[1].content", "expected a string or a list of content parts"),
])
def test_a_claude_calls_malformed_message_is_refused_where_it_is(tmp_path, bad, field, says):
    """A Claude call's messages are rebuilt into the Anthropic body it was sent as: a message that is no message
    (null, a role that is a number, a content that is an object) is refused as the OpenAI reader refuses it. It was
    rebuilt as user text ("null", the object's JSON) before: a conversation split in two, its reuse lost unsaid."""
    payload = _payload()
    assert "claude" in payload["model"]
    payload["messages"] = [payload["messages"][0], bad, *payload["messages"][1:]]
    with pytest.raises(InputError, match=says) as exc:
        _values(_line(tmp_path, payload))
    assert (exc.value.line, exc.value.field) == (1, field)
