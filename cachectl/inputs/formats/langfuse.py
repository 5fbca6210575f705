"""Langfuse: the public ingestion API's events, and the observations of a trace export.

Read in langfuse/langfuse (main, 2026-08; MIT outside ``ee/``): ``packages/shared/src/server/ingestion/types.ts``
(the events ``{id, type, timestamp, body}``: ``trace-create`` bodies carry ``id``, ``sessionId``, ``userId``;
``generation-create`` / ``generation-update`` bodies carry ``id``, ``traceId``, ``startTime``, ``model``,
``input``, ``output``, ``usage`` (legacy ``{input, output, total, unit}`` or ``promptTokens``...) and
``usageDetails``; the legacy ``observation-create`` / ``-update`` with ``type: GENERATION`` the same), and
``fern/apis/server/definition/commons.yml`` (``TraceWithFullDetails``: a trace with its ``observations``; an
``Observation``'s ``usageDetails`` is "the sum of all (non-total) usage metrics", i.e. additive: Langfuse's
canonical keys are ``input`` (uncached), ``input_cached_tokens`` / ``input_cache_read``,
``input_cache_creation`` (``_5m``, ``_1h``), ``output``, ``output_reasoning_tokens``, and the Anthropic names
``cache_read_input_tokens`` / ``cache_creation_input_tokens``; see also ``worker/src/constants/
default-model-prices.json``).

A log is either JSONL of events (one event a line, or one ingestion request ``{"batch": [...]}`` a line), or a
trace export: ``{"trace": {...}, "observations": [...]}`` as the UI's download writes it, the API's
``TraceWithFullDetails`` or an observations page ``{"data": [...]}``, one a line or one JSON document over
several lines. Each GENERATION becomes one record: its ``generation-update`` events (same ``id``) are merged into
it (non-null fields win, as Langfuse merges them), and its trace's ``sessionId`` / ``userId`` come from the
``trace-create`` events of its ``traceId``, before or after it. Memory stays bounded: a generation is held until
:data:`WINDOW` lines have passed since its last event (an update or trace later than that is not joined), and
the traces' session and user ids are kept for the last :data:`MAX_TRACES` traces.

The body: ``input`` as a message list (OpenAI format, as Langfuse's OpenAI and LangChain integrations log it),
a dict with ``messages`` (and ``tools``), or text (taken as one user message, and said so). For a Claude model
the Anthropic Messages body is rebuilt from it (:mod:`._chat`), so that cachectl applies Anthropic's caching;
otherwise the OpenAI Chat body. ``modelParameters`` are not put into the body: Langfuse stores them as strings
(``"max_tokens": "inf"``, ``"stop_sequences": "{\\"arrayValue\\":{}}"``). The usage in the provider's own
convention. A generation written by LiteLLM's Langfuse logger (its metadata has ``hidden_params``) carries
LiteLLM's ``prompt_tokens`` as ``input``, which counts the cache reads: they are taken out once. OpenInference's
``prompt_details.*`` counters are parts of ``input`` and taken out likewise. The body is assembled, so ``fix``
cannot write an edit back.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from ...errors import InputError
from ._chat import anthropic_body, anthropic_usage, counter, is_claude, openai_usage, response_text
from .base import Head, LogShape, Record, Verdict, json_value, text_of

SHAPE = LogShape(
    "langfuse", "Langfuse ingestion events and trace exports",
    "a JSON object per line that is a Langfuse ingestion event (`type` `trace-create`, `generation-create`, ... "
    "and a `body`) or an ingestion `batch`, or a trace export (`trace` with `observations`, or a page of "
    "observations), one a line or one document",
    "each GENERATION (its create and update events joined by id): the request rebuilt from `input` (an Anthropic "
    "Messages body for Claude models), `usageDetails` (or the legacy `usage`) with cache reads and writes in the "
    "provider's convention, `startTime`, the model, and the trace's `sessionId` and `userId` as the keys "
    "`session` and `user`",
    ("prompt-cost", "report", "diff-tokens", "simulate-prefix", "semantic-probe dupes"),
    "fixtures/logs/langfuse_events.jsonl",
    "https://api.reference.langfuse.com/#tag/ingestion ; langfuse/langfuse packages/shared/src/server/ingestion/"
    "types.ts",
)

EVENT_TYPES = frozenset({
    "trace-create", "score-create", "event-create", "span-create", "span-update", "generation-create",
    "generation-update", "agent-create", "tool-create", "chain-create", "retriever-create", "evaluator-create",
    "embedding-create", "guardrail-create", "sdk-log", "dataset-run-item-create", "observation-create",
    "observation-update"})
_GENERATION_EVENTS = frozenset({"generation-create", "generation-update"})
_OBSERVATION_EVENTS = frozenset({"observation-create", "observation-update"})
#: lines a generation waits for its updates and its trace
WINDOW = 2000
#: traces whose session and user ids are remembered
MAX_TRACES = 100_000

_INPUT = ("input", "input_tokens", "prompt_tokens", "promptTokens")
_OUTPUT = ("output", "output_tokens", "completion_tokens", "completionTokens")
_TOTAL = frozenset({"total", "total_tokens", "totalTokens", "unit"})
_READ = frozenset({"input_cached_tokens", "input_cache_read", "cache_read_input_tokens", "input_cached_text_tokens",
                   "input_cached_audio_tokens", "input_cached_image_tokens"})
_WRITE = frozenset({"input_cache_creation", "cache_creation_input_tokens", "input_cache_write_tokens",
                    "input_cache_write"})
_W5 = frozenset({"input_cache_creation_5m", "ephemeral_5m_input_tokens"})
_W1 = frozenset({"input_cache_creation_1h", "ephemeral_1h_input_tokens"})
_PD_READ = frozenset({"prompt_details.cache_read", "prompt_details.cached_tokens"})
_PD_WRITE = frozenset({"prompt_details.cache_write", "prompt_details.cache_creation"})
_COSTS = frozenset({"inputCost", "outputCost", "totalCost"})
_DOC = re.compile(rb'^\s*\{\s*"(trace|observations|batch|data|id)"\s*:', re.S)


def _is_event(value: Any) -> bool:
    return text_of(value, "type") in EVENT_TYPES and isinstance(value.get("body"), dict)


def _is_observation(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("type"), str) and "traceId" in value
            and "startTime" in value and ("usageDetails" in value or "input" in value))


def _is_export(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    if isinstance(value.get("observations"), list) and (isinstance(value.get("trace"), dict) or "id" in value):
        return True
    data = value.get("data")
    return isinstance(data, list) and bool(data) and _is_observation(data[0])


def detect(head: Head) -> Verdict:
    first = head.first
    if _is_event(first) or _is_export(first) or _is_observation(first):
        return Verdict.yes()
    if isinstance(first, dict) and isinstance(first.get("batch"), list):
        batch = first["batch"]
        return Verdict.yes() if batch and _is_event(batch[0]) else Verdict.almost("its `batch` holds no event")
    if text_of(first, "type") in EVENT_TYPES:
        return Verdict.almost("has no `body` object")
    if first is None and head.lines and _DOC.match(head.text) and re.search(
            rb'"(trace|observations|batch)"\s*:', head.text):
        return Verdict.yes()  # one JSON document over several lines
    return Verdict.no()


# --------------------------------------------------------------------------------------------- the usage


def _usage(o: dict, claude: bool, litellm: bool, source: str, line: int, at: str = "") -> dict | None:
    """The usage a generation logged, as the request's native usage; ``line``, ``at``: the line that logged it and
    the path there of the object that holds it (an event's ``body.``), which its errors name."""
    details = o.get("usageDetails")
    path = f"{at}usageDetails."
    if not isinstance(details, dict) or not details:
        details, path = o.get("usage"), f"{at}usage."
        if not isinstance(details, dict) or not any(details.get(k) for k in (*_INPUT, *_OUTPUT)):
            return None
        if details.get("unit") not in (None, "TOKENS"):
            return None  # characters, images, seconds, ...: not tokens
    inp = out = read = write = w5 = w1 = pd_read = pd_write = extra_in = 0
    for key, raw in details.items():
        if key in _TOTAL or key in _COSTS or raw is None:
            continue
        n = counter(raw, source=source, line=line, field=f"{path}{key}")
        if key in _INPUT:
            inp += n
        elif key in _OUTPUT or key.startswith("output_"):
            out += n
        elif key in _READ:
            read += n
        elif key in _WRITE:
            write += n
        elif key in _W5:
            w5 += n
        elif key in _W1:
            w1 += n
        elif key in _PD_READ:
            pd_read += n
        elif key in _PD_WRITE:
            pd_write += n
        elif key.startswith("prompt_details.") or key.startswith("completion_details."):
            continue  # OpenInference: parts of input / output, already counted there
        elif key.startswith("input_"):
            extra_in += n  # Langfuse's additive input details (audio, image, text tokens)
        elif n:
            raise InputError(f"unknown usage counter {key!r}: not priced, so the bill would be wrong",
                             source=source, line=line, field=f"{path}{key}")
    if w5 or w1:  # the split, beside or instead of the aggregate
        write = write if write == w5 + w1 else write + w5 + w1
    read += pd_read
    write += pd_write
    uncached = inp + extra_in - pd_read - pd_write - (read if litellm else 0)
    if uncached < 0:
        raise InputError(f"input ({inp}) is less than the cached tokens ({read}) it counts",
                         source=source, line=line, field=f"{path}input")
    if claude:
        return anthropic_usage(uncached, write, read, out, w5 if w5 or w1 else None, w1 if w5 or w1 else None)
    return openai_usage(uncached + read + write, out, read, write)


# ---------------------------------------------------------------------------------------------- the body


def _content(msg: Any) -> Any:
    """A message as the OpenAI API took it: a tool's structured result (a dict, or a list that is not content
    parts, as LangChain logs it) was sent as its JSON text."""
    if not isinstance(msg, dict) or "content" not in msg:
        return msg
    content = msg["content"]
    parts = isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("type"), str)
                                              for p in content)
    if isinstance(content, (str, type(None))) or parts:
        return msg
    return {**msg, "content": orjson.dumps(content).decode()}


def _body(o: dict, model: str | None, claude: bool, where: dict | None = None, at: str = ""
          ) -> tuple[dict | None, str | None]:
    """``(body, what was assumed)`` from an observation's ``input`` (``where``, ``at``: the line it was logged on and
    the path there of the object that holds it, which a message the Anthropic rebuild refuses is named at)."""
    raw = o.get("input")
    if isinstance(raw, str):  # the export stores JSON-encoded strings for some integrations
        try:
            decoded = orjson.loads(raw) if raw[:1] in ("[", "{") else None
        except orjson.JSONDecodeError:
            decoded = None
        raw = decoded if decoded is not None else raw
    tools: Any = None
    note = None
    path = f"{at}input"
    if isinstance(raw, dict) and isinstance(raw.get("messages"), list):
        messages, tools, path = raw["messages"], raw.get("tools"), f"{at}input.messages"
    elif isinstance(raw, list) and raw and all(isinstance(m, dict) and "role" in m for m in raw):
        messages = raw
    elif isinstance(raw, list) and raw and all(isinstance(m, dict) for m in raw) and not claude:
        return {"model": model, "input": raw}, None  # Responses input items (OpenAI Agents)
    elif raw is None:
        return None, "no input logged"
    else:
        text = raw if isinstance(raw, str) else orjson.dumps(raw).decode()
        messages = [{"role": "user", "content": text}]
        note = "input logged as text, not messages: taken as one user message"
    if claude:
        return anthropic_body(model, messages, tools, path=path, where=where), note
    body: dict[str, Any] = {"model": model, "messages": [_content(m) for m in messages]}
    if isinstance(tools, list) and tools:
        body["tools"] = tools
    return body, note


# ------------------------------------------------------------------------------------------ the records


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.traces: OrderedDict[str, dict[str, str]] = OrderedDict()
        self.pending: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def trace(self, body: dict) -> None:
        tid = body.get("id")
        if not isinstance(tid, str):
            return
        known = self.traces.pop(tid, {})
        for key, field in (("session", "sessionId"), ("user", "userId")):
            if isinstance(body.get(field), str) and body[field]:
                known[key] = body[field]
        self.traces[tid] = known
        while len(self.traces) > MAX_TRACES:
            self.traces.popitem(last=False)

    def record(self, o: dict, line: int, timestamp: Any = None, trace: dict | None = None,
               usage_at: tuple[int, str] | None = None, at: str = "") -> Record:
        """One generation's record; ``at``: the path of ``o`` in ``line`` (an event's ``body.``); ``usage_at``: the
        line whose event logged its usage, and the path of the object that holds it there (its errors name them;
        else ``line``'s ``o``)."""
        model = o.get("model") if isinstance(o.get("model"), str) and o.get("model") else None
        claude = is_claude(model)
        meta = o.get("metadata")
        litellm = isinstance(meta, dict) and ("hidden_params" in meta or "litellm_response_cost" in meta)
        body, note = _body(o, model, claude, {"source": self.source, "line": line}, at)
        usage = _usage(o, claude, litellm, self.source, *(usage_at or (line, "")))
        tid = o.get("traceId")
        known = trace if trace is not None else self.traces.get(tid, {}) if isinstance(tid, str) else {}
        keys = {"request_id": o.get("id"), "trace": tid, **known}
        missing = tuple(m for m in (note, None if usage else "no token usage logged") if m)
        out = usage.get("output_tokens", usage.get("completion_tokens")) if usage else None
        return Record(SHAPE.name, self.source, line, body=body, usage=usage,
                      timestamp=o.get("startTime") or timestamp, model=model,
                      keys={k: v for k, v in keys.items() if isinstance(v, str) and v}, output_tokens=out,
                      missing=missing, response=response_text(o.get("output")))

    def flush(self, upto: int | None) -> Iterator[Record]:
        while self.pending:
            gid, state = next(iter(self.pending.items()))
            if upto is not None and state["last"] >= upto - WINDOW and len(self.pending) <= WINDOW:
                return
            del self.pending[gid]
            yield self.record(state["body"], state["line"], state["timestamp"], usage_at=state.get("usage_at"),
                              at="body.")

    def event(self, ev: dict, line: int) -> Iterator[Record]:
        etype, body = ev.get("type"), ev.get("body")
        if not isinstance(body, dict):
            raise InputError("expected an object", source=self.source, line=line, field="body")
        if etype == "trace-create":
            self.trace(body)
        elif etype in _GENERATION_EVENTS or (etype in _OBSERVATION_EVENTS and body.get("type") == "GENERATION"):
            gid = body.get("id")
            if not isinstance(gid, str) or not gid:
                raise InputError("a generation event needs a string id", source=self.source, line=line,
                                 field="body.id")
            state = self.pending.pop(gid, None)
            if state is None:
                state = {"line": line, "timestamp": ev.get("timestamp"), "body": {}}
            state["body"].update({k: v for k, v in body.items() if v is not None})
            if body.get("usageDetails") is not None or body.get("usage") is not None:
                state["usage_at"] = (line, "body.")   # (the event that logged the usage, last)
            state["last"] = line
            self.pending[gid] = state
        yield from self.flush(line)

    def value(self, value: Any, line: int) -> Iterator[Record]:
        if _is_event(value):
            yield from self.event(value, line)
        elif isinstance(value, dict) and isinstance(value.get("batch"), list):
            for i, ev in enumerate(value["batch"]):
                if not _is_event(ev):
                    raise InputError("not a Langfuse ingestion event (`type` and `body`)", source=self.source,
                                     line=line, field=f"batch[{i}]")
                yield from self.event(ev, line)
        elif _is_export(value):
            trace = value.get("trace") if isinstance(value.get("trace"), dict) else value
            if "observations" in value:
                self.trace(trace)
            for obs in value.get("observations") or value.get("data") or []:
                if isinstance(obs, dict) and obs.get("type") == "GENERATION":
                    tid = obs.get("traceId")
                    yield self.record(obs, line, trace=self.traces.get(tid) if isinstance(tid, str) else None)
        elif isinstance(value, list):
            for item in value:
                yield from self.value(item, line)
        elif _is_observation(value):
            if value.get("type") == "GENERATION":
                yield self.record(value, line)
        else:
            raise InputError("not a Langfuse ingestion event, batch or trace export", source=self.source,
                             line=line)


def read(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[Record]:
    reader = _Reader(source)
    it = iter(lines)
    first = next(it, None)
    if first is None:
        return
    n0, raw0 = first
    value = json_value(raw0)
    if value is None:  # one JSON document over several lines (a pretty-printed export)
        text = b"\n".join([raw0, *(raw for _, raw in it)])
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"invalid JSON document: {exc}", source=source, line=n0) from None
        yield from reader.value(value, n0)
    else:
        yield from reader.value(value, n0)
        for n, raw in it:
            value = json_value(raw)
            if value is None:
                raise InputError("invalid JSON: expected one Langfuse event, batch or export per line",
                                 source=source, line=n)
            yield from reader.value(value, n)
    yield from reader.flush(None)
