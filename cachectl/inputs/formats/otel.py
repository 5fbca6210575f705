"""OpenTelemetry GenAI spans in OTLP/JSON, as the OpenTelemetry Collector's file exporter writes them: one
``{"resourceSpans": [{"resource": ..., "scopeSpans": [{"scope": ..., "spans": [...]}]}]}`` document a line.

Read from the OTLP/JSON encoding (attribute values ``{"stringValue" | "intValue" (a string) | "doubleValue" |
"boolValue" | "arrayValue": {"values"} | "kvlistValue": {"values"}}``, times ``startTimeUnixNano`` as strings)
and the GenAI semantic conventions (github.com/open-telemetry/semantic-conventions at 384d661, 2026-08:
``docs/registry/attributes/gen-ai.md``, ``model/gen-ai/deprecated/events-deprecated.yaml``; the JSON schemas
``docs/gen-ai/gen-ai-input-messages.json`` as of v1.41, before the conventions moved to
semantic-conventions-genai), and the names instrumentations used before them (OpenLLMetry's
``gen_ai.usage.prompt_tokens``/``completion_tokens``, ``gen_ai.usage.cache_read_input_tokens``/
``cache_creation_input_tokens`` and flattened ``gen_ai.prompt.N.role``/``.content``).

One record per GenAI span (a span with ``gen_ai.operation.name``, ``gen_ai.provider.name``/``gen_ai.system``,
a ``gen_ai.request.model`` or ``gen_ai.usage.*``); agent/tool spans without a model call (``invoke_agent``,
``execute_tool``, ``create_agent``, ``embeddings``) and non-GenAI spans are skipped and counted in the next
record's ``missing``. The request messages come from, in order: ``gen_ai.system_instructions`` +
``gen_ai.input.messages`` (JSON strings or structured values, with ``parts``), the older span events
``gen_ai.system.message``/``gen_ai.user.message``/``gen_ai.assistant.message``/``gen_ai.tool.message``, or
``gen_ai.prompt`` (a JSON string, or OpenLLMetry's flattened attributes). They are built into the provider's
body: Anthropic Messages when the provider is ``anthropic`` (or the model a Claude), else OpenAI Chat.

Usage: the convention says ``gen_ai.usage.input_tokens`` SHOULD include all input tokens, the cached ones
(``gen_ai.usage.cache_read.input_tokens``) and those written to the cache
(``gen_ai.usage.cache_creation.input_tokens``) among them. That is OpenAI's convention (``prompt_tokens`` with
``prompt_tokens_details.cached_tokens``); for Anthropic the cache counters are subtracted to get its uncached
``input_tokens``. Where ``input_tokens`` is smaller than the cache counters together, the instrumentation
reported Anthropic's own (exclusive) count: it is kept as it stands, and the record says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from ...errors import InputError
from ..files import parse_jsonl_line
from ._chat import count, counter
from .base import Head, LogShape, Record, Verdict, text_of, wrapper_value

SHAPE = LogShape(
    "otel", "OpenTelemetry GenAI spans (OTLP/JSON)",
    "a JSON object per line with `resourceSpans` whose spans carry `gen_ai.*` attributes",
    "each model call's messages (from `gen_ai.input.messages`/`gen_ai.system_instructions`, the older message "
    "events or `gen_ai.prompt`) built into an Anthropic or OpenAI body, the usage with the cache read and "
    "cache creation tokens, the model, the span's start time, `gen_ai.conversation.id` as the session key",
    ("prompt-cost", "report", "diff-tokens", "simulate-prefix", "semantic-probe dupes"),
    "fixtures/logs/otel_genai.jsonl",
    "https://github.com/open-telemetry/semantic-conventions/blob/v1.41.0/docs/gen-ai/gen-ai-spans.md ; "
    "https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding",
)

_NOT_CALLS = ("invoke_agent", "create_agent", "execute_tool", "embeddings")
_EVENT_ROLES = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
                "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}


def detect(head: Head) -> Verdict:
    try:
        first = head.first
        if not isinstance(first, dict) or "resourceSpans" not in first:
            return Verdict.no()
        if any(b'"gen_ai.' in h.raw for h in head.lines):
            return Verdict.yes()
        return Verdict.almost("its first spans carry no `gen_ai.*` attribute")
    except Exception:  # a detector never raises
        return Verdict.no()


def _value(v: Any) -> Any:
    """An OTLP/JSON AnyValue as a Python value (intValue's string as an int)."""
    if not isinstance(v, dict):
        return v
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        try:
            return int(v["intValue"])
        except (TypeError, ValueError):
            return v["intValue"]
    if "doubleValue" in v:
        return v["doubleValue"]
    if "boolValue" in v:
        return v["boolValue"]
    if "arrayValue" in v:
        return [_value(x) for x in _list(v["arrayValue"], "values")]
    if "kvlistValue" in v:
        return _attrs(_list(v["kvlistValue"], "values"))
    if "bytesValue" in v:
        return v["bytesValue"]
    return None


def _list(obj: Any, key: str) -> list:
    """``obj[key]`` where ``obj`` is an object and that is a list; else empty (a field OTLP/JSON leaves out, or
    one that holds something else: nothing to read there)."""
    got = obj.get(key) if isinstance(obj, dict) else None
    return got if isinstance(got, list) else []


def _attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs if isinstance(kvs, list) else []:
        if type(kv) is dict:
            key, v = kv.get("key"), kv.get("value")
            if type(key) is str:
                # most values are strings: taken here, without a call (``_value`` reads the others)
                out[key] = v["stringValue"] if type(v) is dict and "stringValue" in v else _value(v)
    return out


def _json(v: Any) -> Any:
    if isinstance(v, str) and v.lstrip()[:1] in ("[", "{"):
        try:
            return orjson.loads(v)
        except orjson.JSONDecodeError:
            return v
    return v


def _int(attrs: dict[str, Any], where: dict[str, Any], *names: str) -> int | None:
    """The first of ``names``'s counters the span sets; one that is not a token count is refused, named."""
    for n in names:
        v = attrs.get(n)
        if v is None or isinstance(v, bool):
            continue
        return counter(v, source=where["source"], line=where["line"], field=f"{where['span']}.attributes.{n}")
    return None


def _text(parts: Any) -> str:
    if isinstance(parts, str):
        return parts
    if isinstance(parts, list):
        return "".join(_piece(p.get("content") or p.get("text")) if isinstance(p, dict) else _piece(p)
                       for p in parts)
    return _piece(parts)


def _piece(x: Any) -> str:
    """One part's text: a string as it is, nothing for null, a number as written, anything else as its JSON."""
    if isinstance(x, str):
        return x
    if x is None:
        return ""
    return str(x) if isinstance(x, (int, float)) else orjson.dumps(x, default=str).decode()


def _id(x: Any) -> str:
    """A tool call's id: a string, stripped; anything else is none."""
    return x.strip() if isinstance(x, str) else ""


def _messages_from_parts(messages: Any) -> list[dict[str, Any]]:
    """``[{role, parts | content, tool_calls?}]`` (the convention's or a flattened prompt's) as
    ``[{role, content: str | [parts]}]`` kept close to the convention: text, tool calls and results."""
    out = []
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            continue
        role = m.get("role") or "user"
        parts = m.get("parts")
        if parts is None:
            content = m.get("content")
            parts = [{"type": "text", "content": _text(content)}] if not isinstance(content, list) else [
                {"type": "text", "content": _text([c])} for c in content]
            for tc in _list(m, "tool_calls"):
                if isinstance(tc, dict):
                    fn: dict[str, Any] = tc["function"] if isinstance(tc.get("function"), dict) else tc
                    parts.append({"type": "tool_call", "id": tc.get("id"), "name": fn.get("name"),
                                  "arguments": _json(fn.get("arguments"))})
            if role == "tool" and m.get("tool_call_id") is not None:
                parts = [{"type": "tool_call_response", "id": m.get("tool_call_id"), "result": _text(content)}]
        out.append({"role": role, "parts": [p for p in parts if isinstance(p, dict)]})
    return out


def _flattened(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenLLMetry's ``gen_ai.prompt.0.role`` / ``gen_ai.prompt.0.content`` attributes as messages."""
    found: dict[int, dict[str, Any]] = {}
    for k, v in attrs.items():
        if k.startswith(prefix):
            idx, _, field = k[len(prefix):].partition(".")
            if idx.isdigit() and field in ("role", "content", "tool_call_id"):
                found.setdefault(int(idx), {})[field] = v
    return [found[i] for i in sorted(found)]


def _input(attrs: dict[str, Any], events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """The input messages (convention-shaped) and where they came from."""
    system = _json(attrs.get("gen_ai.system_instructions"))
    msgs = _json(attrs.get("gen_ai.input.messages"))
    out: list[dict[str, Any]] = []
    if system is not None:
        out.append({"role": "system", "parts": [p for p in system if isinstance(p, dict)] if isinstance(system, list)
                    else [{"type": "text", "content": _text(system)}]})
    if isinstance(msgs, list):
        return out + _messages_from_parts(msgs), "gen_ai.input.messages"
    evs = [e for e in events if text_of(e, "name") in _EVENT_ROLES]
    if evs:
        ev_msgs = []
        for e in evs:
            a = e["attributes"]
            content = _json(a.get("content", a.get("gen_ai.event.content")))
            if isinstance(content, dict):  # the whole body as one JSON attribute
                ev_msgs.append({"role": content.get("role") or _EVENT_ROLES[e["name"]], **content})
            else:
                ev_msgs.append({"role": a.get("role") or _EVENT_ROLES[e["name"]], "content": content,
                                "tool_calls": _json(a.get("tool_calls")), "tool_call_id": a.get("id")})
        return out + _messages_from_parts(ev_msgs), "events"
    prompt = _json(attrs.get("gen_ai.prompt"))
    if isinstance(prompt, list):
        return out + _messages_from_parts(prompt), "gen_ai.prompt"
    flat = _flattened(attrs, "gen_ai.prompt.")
    if flat:
        return out + _messages_from_parts(flat), "gen_ai.prompt.N"
    if isinstance(prompt, str):
        return out + [{"role": "user", "parts": [{"type": "text", "content": prompt}]}], "gen_ai.prompt"
    return out, ""


def _output(attrs: dict[str, Any], events: list[dict[str, Any]]) -> str | None:
    """The text the model answered, where the span captured it: ``gen_ai.output.messages`` (the convention's
    parts), a ``gen_ai.choice`` event's message or content, or OpenLLMetry's ``gen_ai.completion.0.content``."""
    msgs = _json(attrs.get("gen_ai.output.messages"))
    if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict):
        texts = [p["content"] for p in _list(msgs[0], "parts")
                 if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("content"), str)]
        return "".join(texts) or None
    for e in events:
        if text_of(e, "name") == "gen_ai.choice":
            a = e["attributes"]
            message = _json(a.get("message"))
            got = message.get("content") if isinstance(message, dict) else _json(a.get("content"))
            return _text(got) or None  # (no content: "")
    flat = _flattened(attrs, "gen_ai.completion.")
    if flat and isinstance(flat[0].get("content"), str):
        return flat[0]["content"] or None
    return None


def _anthropic_body(model: str, messages: list[dict[str, Any]], attrs: dict[str, Any]) -> dict[str, Any]:
    system = [{"type": "text", "text": _text(p.get("content"))} for m in messages if m["role"] == "system"
              for p in m["parts"] if p.get("type", "text") == "text"]
    out_msgs: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "system":
            continue
        role = "assistant" if m["role"] == "assistant" else "user"
        blocks: list[dict[str, Any]] = []
        for p in m["parts"]:
            kind = p.get("type", "text")
            if kind == "tool_call":
                args = p.get("arguments")
                blocks.append({"type": "tool_use", "id": _id(p.get("id")), "name": p.get("name") or "",
                               "input": args if isinstance(args, dict) else {}})
            elif kind == "tool_call_response":
                blocks.append({"type": "tool_result", "tool_use_id": _id(p.get("id")),
                               "content": _text(p.get("result") if isinstance(p.get("result"), (str, list))
                                                else orjson.dumps(p.get("result")).decode())})
            elif kind in ("text", "reasoning"):
                blocks.append({"type": "text", "text": _text(p.get("content"))})
        if out_msgs and out_msgs[-1]["role"] == role:  # tool results follow as the user's turn
            out_msgs[-1]["content"].extend(blocks)
        else:
            out_msgs.append({"role": role, "content": blocks})
    body: dict[str, Any] = {"model": model, "max_tokens": count(attrs.get("gen_ai.request.max_tokens")) or 4096}
    if system:
        body["system"] = system
    body["messages"] = out_msgs
    return body


def _openai_body(model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    out = []
    for m in messages:
        texts, calls, results = [], [], []
        for p in m["parts"]:  # one pass: a part without a type is text
            kind = p.get("type", "text")
            if kind == "text":
                texts.append(p)
            elif kind == "tool_call":
                calls.append(p)
            elif kind == "tool_call_response":
                results.append(p)
        for r in results:
            res = r.get("result")
            out.append({"role": "tool", "tool_call_id": _id(r.get("id")),
                        "content": res if isinstance(res, str) else orjson.dumps(res).decode()})
        if results and not texts:
            continue
        msg: dict[str, Any] = {"role": m["role"] if m["role"] != "tool" else "tool",
                               "content": _text(texts) if texts or not calls else None}
        if calls:
            msg["tool_calls"] = [{"id": _id(c.get("id")), "type": "function",
                                  "function": {"name": c.get("name") or "", "arguments":
                                               c["arguments"] if isinstance(c.get("arguments"), str)
                                               else orjson.dumps(c.get("arguments") or {}).decode()}}
                                 for c in calls]
        out.append(msg)
    return {"model": model, "messages": out}


def _usage(anthropic: bool, attrs: dict[str, Any], where: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    inp = _int(attrs, where, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
    out = _int(attrs, where, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
    read = _int(attrs, where, "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens")
    write = _int(attrs, where, "gen_ai.usage.cache_creation.input_tokens",
                 "gen_ai.usage.cache_creation_input_tokens")
    if inp is None and out is None:
        return None, None
    note = None
    if anthropic:
        cached = (read or 0) + (write or 0)
        uncached = inp or 0
        if inp is not None and inp >= cached:
            uncached = inp - cached
        elif cached:
            note = "input_tokens reported without the cache tokens (Anthropic's count), kept as is"
        usage: dict[str, Any] = {"input_tokens": uncached, "output_tokens": out or 0}
        if read is not None:
            usage["cache_read_input_tokens"] = read
        if write is not None:
            usage["cache_creation_input_tokens"] = write
        return usage, note
    usage = {"prompt_tokens": inp or 0, "completion_tokens": out or 0}
    if read is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": read}
    return usage, note


#: a model call's span has one of these (all ``gen_ai.*``: such a span is a GenAI span)
_CALL_KEYS = ("gen_ai.request.model", "gen_ai.response.model", "gen_ai.usage.input_tokens",
              "gen_ai.usage.prompt_tokens", "gen_ai.input.messages")


def _is_call(attrs: dict[str, Any]) -> bool:
    if attrs.keys().isdisjoint(_CALL_KEYS):
        return False
    op = attrs.get("gen_ai.operation.name")
    return not (isinstance(op, str) and op in _NOT_CALLS)


def _spans(doc: Any, source: str, line: int) -> Iterator[tuple[dict[str, Any], tuple[int, int, int]]]:
    """Each span of a traces document, with its indices (its path is written only for an error)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
        raise InputError("not an OTLP/JSON traces document: no `resourceSpans` list", source=source, line=line,
                         field="resourceSpans")
    for i, rs in enumerate(doc["resourceSpans"]):
        for j, ss in enumerate(_list(rs, "scopeSpans")):
            for k, span in enumerate(_list(ss, "spans")):
                if isinstance(span, dict):
                    yield span, (i, j, k)


def _start(span: dict[str, Any], source: str, line: int, at: tuple[int, int, int]) -> float | None:
    """The span's start in epoch seconds (``startTimeUnixNano``)."""
    start = span.get("startTimeUnixNano")
    try:
        return int(start) / 1e9 if start is not None else None
    except (TypeError, ValueError):
        raise InputError(f"startTimeUnixNano {start!r} is not nanoseconds", source=source, line=line,
                         field="resourceSpans[{}].scopeSpans[{}].spans[{}].startTimeUnixNano".format(*at)) from None


def _fields(span: dict[str, Any], attrs: dict[str, Any], skipped: int, source: str, line: int,
            at: tuple[int, int, int]) -> dict[str, Any]:
    """The record's fields (:class:`Record`'s keywords but its origin) of one model call's span; ``skipped``: the
    non-call spans read since the last one."""
    events = [{"name": e.get("name"), "attributes": _attrs(e.get("attributes"))}
              for e in span.get("events") or [] if isinstance(e, dict)]
    provider = attrs.get("gen_ai.provider.name") or attrs.get("gen_ai.system")
    model = attrs.get("gen_ai.request.model") or attrs.get("gen_ai.response.model")
    anthropic = provider == "anthropic" or (
        provider in (None, "aws.bedrock", "gcp.vertex_ai") and "claude" in str(model).lower())
    messages, _origin = _input(attrs, events)
    missing: list[str] = []
    body = None
    if not isinstance(model, str):
        missing.append("no gen_ai.request.model")
    elif messages:
        body = _anthropic_body(model, messages, attrs) if anthropic else _openai_body(model, messages)
    else:
        missing.append("no input messages (content capture off)")
    usage, note = _usage(anthropic, attrs, {"source": source, "line": line,
                                            "span": "resourceSpans[{}].scopeSpans[{}].spans[{}]".format(*at)})
    if usage is None:
        missing.append("no gen_ai.usage")
    if note:
        missing.append(note)
    if skipped:
        missing.append(f"{skipped} non-call span(s) skipped before it")
    ts = _start(span, source, line, at)
    keys = {"session": attrs.get("gen_ai.conversation.id") or attrs.get("session.id"),
            "request_id": attrs.get("gen_ai.response.id"),
            "user": attrs.get("user.id") or attrs.get("enduser.id"),
            "trace_id": span.get("traceId"), "span_id": span.get("spanId")}
    return {"keys": {k: v for k, v in keys.items() if v}, "timestamp": ts, "body": body, "usage": usage,
            "model": model if isinstance(model, str) else None,
            "output_tokens": (usage or {}).get("output_tokens", (usage or {}).get("completion_tokens")),
            "missing": tuple(missing), "response": _output(attrs, events)}


def _calls(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, the record's fields)`` of each model call's span."""
    skipped = 0
    for n, raw in lines:
        for span, at in _spans(parse_jsonl_line(raw, source, n), source, n):
            attrs = _attrs(span.get("attributes"))
            if not _is_call(attrs):
                skipped += 1
                continue
            yield n, _fields(span, attrs, skipped, source, n, at)
            skipped = 0


def read(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[Record]:
    for n, fields in _calls(lines, source):
        yield Record(shape=SHAPE.name, source=source, line=n, **fields)


def values(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, record.value())`` of each record :func:`read` yields, without building the records."""
    for n, fields in _calls(lines, source):
        yield n, wrapper_value(fields["keys"], timestamp=fields["timestamp"], body=fields["body"],
                               usage=fields["usage"], model=fields["model"], output_tokens=fields["output_tokens"])
