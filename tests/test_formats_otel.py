"""OpenTelemetry GenAI spans (OTLP/JSON): detection, one record per model-call span with its messages built into
the provider's body, the usage convention (OTel's input includes the cache tokens), and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachectl.errors import InputError
from cachectl.inputs import parse_request
from cachectl.inputs.formats import log_values, shape_of
from cachectl.inputs.usage import parse_usage

from .conftest import values_and_records

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "fixtures" / "logs" / "otel_genai.jsonl"


def _values(path):
    return list(log_values(str(path)))


def test_found_by_itself_and_not_on_the_others():
    from cachectl.inputs.files import display_name, iter_raw_lines
    from cachectl.inputs.formats import _head, otel

    assert shape_of(str(EXAMPLE)) == "otel"
    others = [p for p in sorted((ROOT / "fixtures" / "logs").iterdir())
              if p != EXAMPLE and p.suffix != ".md" and p.is_file()]
    others += sorted((ROOT / "fixtures" / "prompts").glob("*.json*"))
    for p in others:
        head, _ = _head(iter_raw_lines(str(p)), display_name(str(p)))
        assert otel.detect(head).score == 0, p


def test_one_record_per_model_call_span():
    values = _values(EXAMPLE)
    # line 1: a chat span and an HTTP span; line 2: an invoke_agent span and two chat spans; line 3: one
    assert [n for n, _ in values] == [1, 2, 2, 3]
    for n, v in values:
        assert parse_request(v["body"], source="o", line=n) is not None
        parse_usage(v["usage"], source="o", line=n)


def test_newer_convention_openai():
    _, v = _values(EXAMPLE)[0]
    assert v["body"]["messages"] == [{"role": "system", "content": "You are a helpful bot"},
                                     {"role": "user", "content": "Tell me a joke about OpenTelemetry"}]
    assert v["usage"] == {"prompt_tokens": 52, "completion_tokens": 47}
    assert v["session"] == "conv_5j66UpCpwteGg4YSxUnt7lPY"
    assert v["timestamp"] == 1767225600.0 and v["model"] == "gpt-4o"


def test_anthropic_structured_messages_and_cache_tokens_taken_out_of_input():
    (_, a), (_, b) = _values(EXAMPLE)[1:3]
    # OTel's input_tokens 2100 includes the 2048 written to the cache: Anthropic's input_tokens is the rest
    assert a["usage"] == {"input_tokens": 52, "output_tokens": 30, "cache_read_input_tokens": 0,
                          "cache_creation_input_tokens": 2048}
    assert b["usage"]["input_tokens"] == 62 and b["usage"]["cache_read_input_tokens"] == 2048
    body = a["body"]
    assert body["system"][0]["text"].startswith("You are a weather assistant")
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["messages"][1]["content"][0] == {"type": "tool_use", "id": "toolu_01VSPygqKTWdrhaF",
                                                 "name": "get_weather", "input": {"location": "Paris"}}
    assert body["messages"][2]["content"][0]["type"] == "tool_result"
    assert a["session"] == b["session"] == "conv_7f3a91"


def test_older_convention_events_and_prompt_tokens():
    _, v = _values(EXAMPLE)[3]
    assert v["body"]["messages"] == [{"role": "system", "content": "You are a helpful bot"},
                                     {"role": "user", "content": "What is the capital of France?"}]
    assert v["usage"] == {"prompt_tokens": 24, "completion_tokens": 9}


def _line(tmp_path, attrs, events=(), start="1767225600000000000"):
    def val(v):
        return {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}
    span = {"traceId": "t", "spanId": "s", "name": "chat", "startTimeUnixNano": start,
            "attributes": [{"key": k, "value": val(v)} for k, v in attrs.items()], "events": list(events)}
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}) + "\n")
    return path


def test_exclusive_anthropic_input_is_kept_and_said(tmp_path):
    from cachectl.inputs.files import iter_raw_lines
    from cachectl.inputs.formats import otel

    path = _line(tmp_path, {"gen_ai.provider.name": "anthropic", "gen_ai.request.model": "claude-opus-4-5",
                            "gen_ai.usage.input_tokens": 200, "gen_ai.usage.cache_read.input_tokens": 600,
                            "gen_ai.usage.cache_creation.input_tokens": 200, "gen_ai.usage.output_tokens": 5,
                            "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "hi"})
    (rec,) = otel.read(((n, r) for n, r, _ in iter_raw_lines(str(path))), "spans.jsonl")
    assert rec.usage["input_tokens"] == 200 and rec.usage["cache_read_input_tokens"] == 600
    assert any("without the cache tokens" in m for m in rec.missing)
    assert rec.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_openllmetry_cache_names_and_no_content(tmp_path):
    path = _line(tmp_path, {"gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o",
                            "gen_ai.usage.prompt_tokens": 1500, "gen_ai.usage.cache_read_input_tokens": 1024,
                            "gen_ai.usage.completion_tokens": 3})
    (_, v), = _values(path)
    assert v["usage"] == {"prompt_tokens": 1500, "completion_tokens": 3,
                          "prompt_tokens_details": {"cached_tokens": 1024}}
    assert "body" not in v  # content capture off: no messages


def test_bad_lines_name_file_line_and_field(tmp_path):
    path = _line(tmp_path, {"gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": 1}, start="soon")
    with pytest.raises(InputError) as err:
        _values(path)
    assert err.value.line == 1 and err.value.field.endswith("startTimeUnixNano")
    path.write_text(EXAMPLE.read_text().splitlines()[0] + "\n{\"resourceSpans\": 3}\n")
    with pytest.raises(InputError) as err:
        _values(path)
    assert err.value.line == 2 and err.value.field == "resourceSpans"
    path.write_text(EXAMPLE.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(InputError) as err:
        _values(path)
    assert err.value.line == 2


#: what an attribute's value may be replaced by (odd values among them)
_ODD_VALUES = [{"stringValue": ""}, {"intValue": "12"}, {"intValue": "x"}, {"doubleValue": 3.0}, {"boolValue": True},
               {"stringValue": "claude-x"}, {"arrayValue": {"values": []}}, {"kvlistValue": {"values": []}}, None, 7]


def _mutated(rng, span: dict) -> dict:
    """``span`` with some attributes dropped or given other values, its events and start time sometimes gone (or
    a start time that is no number)."""
    attrs = []
    for kv in span.get("attributes", []):
        roll = rng.random()
        if roll < 0.15:
            continue
        attrs.append({"key": kv["key"], "value": rng.choice(_ODD_VALUES)} if roll < 0.3 else kv)
    out = {**span, "attributes": attrs}
    if rng.random() < 0.2:
        out.pop("events", None)
    roll = rng.random()
    if roll < 0.1:
        out.pop("startTimeUnixNano", None)
    elif roll < 0.12:
        out["startTimeUnixNano"] = "soon"  # refused, naming the span
    return out


def test_values_are_the_records_values():
    """OTel's ``values`` (what log_values reads, no record built) agree with ``read``'s records' values byte for
    byte (keys in the same order), errors included, on the example's spans mutated at random."""
    import random

    from cachectl.inputs.formats import otel

    docs = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    spans = [s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    rng = random.Random(3)

    for _ in range(300):
        lines = [(n, json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
            _mutated(rng, rng.choice(spans)) for _ in range(rng.randrange(1, 4))]}]}]}).encode() + b"\n")
            for n in range(1, rng.randrange(2, 5))]
        got, want = values_and_records(otel, lines, "s.jsonl")
        assert got == want


@pytest.mark.parametrize("value", [{"intValue": "-3"}, {"intValue": str(10**20)}, {"doubleValue": 1.5},
                                   {"stringValue": "many"}])
def test_a_counter_that_is_no_token_count_is_refused_at_its_attribute(tmp_path, value):
    """A usage attribute that is negative, past 32 bits, fractional or a word is refused at its line and at the
    span's attribute: not truncated (1.5 was read as 1), not left out, not named at an internal path."""
    path = _line(tmp_path, {"gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o",
                            "gen_ai.usage.prompt_tokens": 1500, "gen_ai.usage.completion_tokens": 3})
    doc = json.loads(path.read_text())
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"].append(
        {"key": "gen_ai.usage.cache_read_input_tokens", "value": value})
    path.write_text(json.dumps(doc) + "\n")
    with pytest.raises(InputError) as err:
        _values(path)
    assert err.value.line == 1
    assert err.value.field == "resourceSpans[0].scopeSpans[0].spans[0].attributes.gen_ai.usage.cache_read_input_tokens"
    assert "expected a token count" in err.value.message
