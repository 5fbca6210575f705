"""Codex CLI rollout files: ``~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl``.

Read from Codex's own code (github.com/openai/codex, ``codex-rs/protocol/src/protocol.rs`` as stored at commit
edb4efee49ae9f130636fab25f2e398a931dd987, and later versions quoted in public copies): every line is a
``RolloutLine`` ``{"timestamp", "type", "payload"}`` whose ``type`` is the ``RolloutItem`` variant:

- ``session_meta``: ``SessionMeta`` ``{id, timestamp, cwd, originator, cli_version, instructions, source,
  model_provider}``; newer versions log ``base_instructions: {text}`` instead of ``instructions``, and read an
  older ``id`` where a newer one writes ``session_id``;
- ``turn_context``: ``TurnContextItem`` ``{turn_id?, cwd, approval_policy, sandbox_policy, model, effort?,
  summary, base_instructions?, user_instructions?, developer_instructions?, ...}``: written before each model
  call of a turn;
- ``response_item``: a ``ResponseItem`` (``message`` with role user/developer/assistant, ``reasoning``,
  ``function_call`` and ``function_call_output``, ``custom_tool_call(_output)``, ``local_shell_call``,
  ``web_search_call``): the model-visible history, as Codex sends it back in each request's ``input``;
- ``event_msg``: an ``EventMsg``; the one read here is ``token_count`` ``{info: TokenUsageInfo | null,
  rate_limits}``, ``TokenUsageInfo = {total_token_usage, last_token_usage, model_context_window}``, each a
  ``TokenUsage {input_tokens, cached_input_tokens, output_tokens, reasoning_output_tokens, total_tokens}``;
- ``compacted``: ``CompactedItem {message, replacement_history?}``: the history is replaced.

Usage convention: Codex fills ``TokenUsage`` from the Responses API's usage (``input_tokens`` and
``input_tokens_details.cached_tokens``), and its own ``non_cached_input()`` is ``input_tokens -
cached_input_tokens``: ``input_tokens`` includes the cached ones, OpenAI Responses' inclusive convention. A record's
``usage`` is that Responses usage (``reasoning_output_tokens`` is ``output_tokens_details.reasoning_tokens``, a
part of ``output_tokens``).

One record per model call: a ``token_count`` whose ``total_token_usage`` moved. Codex writes the same
``token_count`` again (after rate-limit updates, at turn end) and ``info: null`` ones: a repeated total is the same
call, counted once. The call's usage is ``last_token_usage``; where only totals are logged (older versions, and
tools that strip the rest), the difference from the previous total.

The request is reconstructed: ``input`` is the history items logged before the call's first output item (its
reasoning, assistant message or tool call), ``instructions`` the session's or the turn's instructions where
logged, ``model`` the turn's. What a rollout never logs: the tool definitions (``tools``), the exact instructions
when neither ``session_meta`` nor ``turn_context`` carries them, and the request's other parameters; so no edit
can be written back (``body_path`` is None). Rollouts from before Codex logged ``RolloutItem`` lines (a flat first
line ``{id, timestamp, instructions}`` and bare ``ResponseItem`` lines) carry no token counts: they are refused
with that said.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ...errors import InputError
from .base import Head, LogShape, Record, Verdict

SHAPE = LogShape(
    "codex", "Codex CLI rollout files (~/.codex/sessions/.../rollout-*.jsonl)",
    "JSON lines `{timestamp, type, payload}` whose `type` is `session_meta`, `turn_context`, `response_item`, "
    "`event_msg` or `compacted`",
    "one record per model call (a `token_count` whose total moved, repeats counted once): its Responses usage "
    "(input including cached, cached, output), the model from `turn_context`, the session id as `session`, the "
    "request rebuilt from the logged history (`instructions` where logged, `input`; no tools)",
    ("prompt-cost", "report", "diff-tokens", "simulate-prefix", "semantic-probe dupes"),
    "fixtures/logs/codex_rollout.jsonl",
    "github.com/openai/codex codex-rs/protocol/src/protocol.rs (RolloutItem, TokenCountEvent, TokenUsageInfo)",
)

_TYPES = ("session_meta", "turn_context", "response_item", "event_msg", "compacted")
#: response items the model produced (they end a call's input)
_OUTPUTS = ("reasoning", "function_call", "custom_tool_call", "local_shell_call", "web_search_call",
            "image_generation_call", "tool_search_call")
_COUNTERS = ("input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens",
             "reasoning_output_tokens", "total_tokens")


def detect(head: Head) -> Verdict:
    values = [v for v in head.values if isinstance(v, dict)]
    if not values:
        return Verdict.no()
    if any(v.get("type") in _TYPES and isinstance(v.get("payload"), dict) for v in values):
        return Verdict.yes()
    first = values[0]
    if {"id", "timestamp", "instructions"} <= set(first) and any(
            "record_type" in v or (v.get("type") == "message" and "role" in v) for v in values[1:]):
        return Verdict.almost("is an old rollout (before Codex logged `{timestamp, type, payload}` lines): it "
                              "logs no token counts, so there is no usage to read")
    return Verdict.no()


def _is_output(item: dict) -> bool:
    kind = item.get("type")
    return kind in _OUTPUTS or (kind == "message" and item.get("role") == "assistant")


def _counters(obj: Any, source: str, line: int, path: str) -> dict[str, int] | None:
    """A ``TokenUsage`` as integers (absent counters 0); None when it holds nothing (``{}``, null)."""
    if obj is None or obj == {}:
        return None
    if not isinstance(obj, dict):
        raise InputError("expected a TokenUsage object", source=source, line=line, field=path)
    out: dict[str, int] = {}
    for key in _COUNTERS:
        value = obj.get(key)
        if value is None:
            out[key] = 0
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"expected a non-negative integer token count, got {value!r:.60}", source=source,
                             line=line, field=f"{path}.{key}")
        out[key] = value
    return out


def _responses_usage(u: dict[str, int], source: str, line: int, path: str) -> dict[str, Any]:
    """Codex's ``TokenUsage`` as the Responses API usage it was read from."""
    cached, written = u["cached_input_tokens"], u["cache_write_input_tokens"]
    if cached + written > u["input_tokens"]:
        raise InputError(f"cached_input_tokens ({cached}) exceed input_tokens ({u['input_tokens']}), which include "
                         "them in Codex's convention", source=source, line=line, field=f"{path}.cached_input_tokens")
    details: dict[str, int] = {"cached_tokens": cached}
    if written:
        details["cache_write_tokens"] = written
    return {"input_tokens": u["input_tokens"], "input_tokens_details": details, "output_tokens": u["output_tokens"],
            "output_tokens_details": {"reasoning_tokens": u["reasoning_output_tokens"]},
            "total_tokens": u["total_tokens"] or u["input_tokens"] + u["output_tokens"]}


def _text(value: Any) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str) and value["text"]:
        return value["text"]
    return None


def read(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[Record]:
    from ..files import parse_jsonl_line

    session: str | None = None
    instructions: str | None = None
    model: str | None = None
    turn: str | None = None
    items: list[Any] = []
    #: len(items) when the current call's first output item appeared (None: none yet since the last call)
    boundary: int | None = None
    sent_at: Any = None
    total: dict[str, int] | None = None
    compacted = False
    for n, raw in lines:
        value = parse_jsonl_line(raw, source, n)
        if not isinstance(value, dict):
            raise InputError("expected a rollout line {timestamp, type, payload}", source=source, line=n)
        kind, payload = value.get("type"), value.get("payload")
        if kind not in _TYPES:
            continue  # a variant this reader does not use (world_state, inter-agent messages, ...)
        if not isinstance(payload, dict):
            raise InputError("expected an object", source=source, line=n, field="payload")
        if kind == "session_meta":
            sid = payload.get("id", payload.get("session_id"))
            if isinstance(sid, str) and session is not None and sid != session:
                # another session's rollout follows (rollouts concatenated): its history and totals start afresh
                items, boundary, sent_at, total, compacted = [], None, None, None, False
                model = instructions = turn = None
            session = sid if isinstance(sid, str) else session
            instructions = _text(payload.get("instructions")) or _text(payload.get("base_instructions")) \
                or instructions
        elif kind == "turn_context":
            m = payload.get("model")
            if m is not None and not isinstance(m, str):
                raise InputError("expected a model name", source=source, line=n, field="payload.model")
            model = m or model
            turn = payload.get("turn_id") if isinstance(payload.get("turn_id"), str) else turn
            instructions = _text(payload.get("base_instructions")) or instructions
            if boundary is None:
                sent_at = value.get("timestamp", sent_at)
        elif kind == "response_item":
            if _is_output(payload):
                if boundary is None:
                    boundary = len(items)
            elif boundary is None:
                sent_at = value.get("timestamp", sent_at)
            items.append(payload)
        elif kind == "compacted":
            history = payload.get("replacement_history")
            items = list(history) if isinstance(history, list) else []
            compacted = not isinstance(history, list)
            boundary = None
        elif payload.get("type") == "token_count":
            info = payload.get("info")
            if info is None:
                continue  # rate limits only
            if not isinstance(info, dict):
                raise InputError("expected a TokenUsageInfo object or null", source=source, line=n,
                                 field="payload.info")
            now = _counters(info.get("total_token_usage"), source, n, "payload.info.total_token_usage")
            last = _counters(info.get("last_token_usage"), source, n, "payload.info.last_token_usage")
            if now is not None and now == total:
                continue  # the same call's count written again
            if last is None:
                if now is None:
                    continue
                prev = total or dict.fromkeys(_COUNTERS, 0)
                last = {k: now[k] - prev[k] for k in _COUNTERS}
                if any(v < 0 for v in last.values()):
                    raise InputError("total_token_usage went down and no last_token_usage says what this call "
                                     "used", source=source, line=n, field="payload.info.total_token_usage")
                path = "payload.info.total_token_usage"
            else:
                path = "payload.info.last_token_usage"
            total = now if now is not None else total
            usage = _responses_usage(last, source, n, path)
            sent = items[:boundary] if boundary is not None else list(items)
            # (no item logged before the count: the rollout kept the counts only, and the call's prompt is unknown)
            body: dict[str, Any] | None = {"input": sent} if sent else None
            if body is not None and model is not None:
                body = {"model": model, **body}
            if body is not None and instructions is not None:
                body["instructions"] = instructions
            missing = ["tools (a rollout does not log the tool definitions)"]
            if instructions is None:
                missing.append("instructions (not logged in this rollout)")
            if compacted:
                missing.append("the history before a compaction (only its summary is logged)")
            yield Record(shape=SHAPE.name, source=source, line=n, body=body, usage=usage,
                         timestamp=sent_at if sent_at is not None else value.get("timestamp"), model=model,
                         keys={"session": session, "turn": turn}, output_tokens=usage["output_tokens"],
                         missing=tuple(missing))
            boundary = None
            sent_at = None
