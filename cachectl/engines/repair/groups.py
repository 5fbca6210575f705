"""A log's lines read as requests, and the conversation each belongs to.

``log_lines(records, *, source, key=None) -> list[LogLine]`` reads ``(line, value)`` pairs
(:func:`cachectl.inputs.iter_jsonl`); ``group_sessions(lines, *, key=None, window_s=1800.0, tokenizer=None) ->
Grouping`` is the automatic conversation grouping on its own (``fix_log`` calls it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...errors import InputError
from ...inputs import PromptInput, Request, compact, get_path, parse_request, prompt_from_value

# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class LogLine:
    """One line of a log as read: its JSON value (rewritten in place of itself), the prompt a tokenizer renders,
    the canonical request for request bodies, its conversation key (``None``: grouped automatically)."""

    line: int
    value: Any
    prompt: PromptInput
    request: Request | None
    key: Any = None
    timestamp: float | None = None


@dataclass(frozen=True)
class Grouping:
    """Which conversation each line belongs to."""

    groups: tuple[int, ...]       # group number per line, in log order, numbered from 0 by first appearance
    count: int
    how: str                      # "key FIELD" | "automatic"
    window_s: float | None = None


# --------------------------------------------------------------------------------------------- reading


def log_lines(records: Iterable[tuple[int, Any]], *, source: str, key: str | None = None,
              timestamps: Any = None) -> list[LogLine]:
    """:class:`LogLine` records from ``(line, value)`` pairs (:func:`cachectl.inputs.iter_jsonl`): request bodies
    and wrappers (through :func:`cachectl.inputs.parse_request`), chat lists, raw-text and token-ID prompts
    (through :func:`cachectl.inputs.prompt_from_value`). ``timestamps``: the run's
    :class:`~cachectl.inputs.TimestampReader`."""
    out: list[LogLine] = []
    for lineno, value in records:
        out.append(_log_line(lineno, value, source, key, timestamps))
    return out


def _log_line(lineno: int, value: Any, source: str, key: str | None, timestamps: Any = None) -> LogLine:
    k = None
    if key is not None:
        k = get_path(value, key) if isinstance(value, dict) else None
        if k is None:
            raise InputError("missing conversation key", source=source, line=lineno, field=key)
        if isinstance(k, (dict, list)):
            k = json.dumps(k, sort_keys=True)
    prompt = prompt_from_value(value, source=source, line=lineno, timestamps=timestamps)
    req = prompt.request
    if req is None and prompt.kind == "chat":
        req = parse_request({"messages": value}, source=source, line=lineno, provider="openai")
    ts = req.timestamp if req is not None else None
    if ts is None and isinstance(value, dict) and "timestamp" in value:
        from ...inputs import parse_timestamp

        try:
            ts = (timestamps or parse_timestamp)(value["timestamp"])
        except ValueError as exc:
            raise InputError(str(exc), source=source, line=lineno, field="timestamp") from None
    return LogLine(line=lineno, value=value, prompt=prompt, request=req, key=k, timestamp=ts)


def reparse(ln: LogLine, value: Any) -> LogLine:
    """The line after a rewrite, parsed again (a rewrite that no longer parses is a bug: it raises); a rewrite
    leaves the time alone, so the line keeps the timestamp it was read with (in the run's unit)."""
    return replace(_log_line(ln.line, value, ln.prompt.source, None, timestamps=lambda _: ln.timestamp), key=ln.key)


# -------------------------------------------------------------------------------------------- grouping

#: a reasoning block in a text: grouping leaves it out, FX005 drops it
THINK = re.compile(r"<think>.*?</think>\s*", re.S)


def _mask(text: str) -> str:
    from ...volatile import find_volatile

    out, last = [], 0
    for v in find_volatile(text):
        out.append(text[last:v.start])
        out.append("\x00")
        last = v.end
    out.append(text[last:])
    return "".join(out)


def _elements(ln: LogLine, bos: str | None = None) -> tuple[Any, int]:
    """What grouping compares, and where the last turn starts in it: for requests, the positions (tools as one
    set with sorted keys, volatile values masked, reasoning dropped); for raw text, the masked text; for token
    IDs, the IDs (these two must be extended whole)."""
    if ln.request is not None:
        req = ln.request
        tools = sorted(json.dumps(json.loads(p.content), sort_keys=True) for p in req.positions
                       if p.segment == "tools")
        out = [compact(tools)] if tools else []
        last_turn, last_msg = len(out), None
        for p in req.positions:
            if p.segment == "tools":
                continue
            if p.kind in ("thinking", "redacted_thinking"):
                continue
            m = _MSG_INDEX.match(p.path)
            if m is not None and m.group(1) != last_msg:
                last_msg, last_turn = m.group(1), len(out)
            out.append(f"{p.segment}:{p.role}:" + _mask(THINK.sub("", p.text)))
        return tuple(out), last_turn
    if ln.prompt.ids is not None:
        return tuple(ln.prompt.ids), len(ln.prompt.ids)
    text = ln.prompt.text or ""
    if bos and text.startswith(bos):  # a doubled BOS must not split a conversation
        text = text[len(bos):]
    text = _mask(text)
    return text, len(text)


_MSG_INDEX = re.compile(r"(?:messages|input)\[(\d+)\]")


def _extends(prev: Any, last_turn: int, cur: Any) -> int:
    """How much of ``prev`` ``cur`` repeats as its prefix when ``cur`` continues ``prev``'s conversation: all of
    ``prev``, or (a client that sends the newest turn with extra blocks and the history without them) all
    before ``prev``'s last turn and at least the first position of that turn; -1 when it does not."""
    if type(prev) is not type(cur):
        return -1
    if len(prev) <= len(cur) and cur[:len(prev)] == prev:
        return len(prev)
    if isinstance(prev, tuple) and prev and isinstance(prev[0], str):
        n = 0
        for x, y in zip(prev, cur):
            if x != y:
                break
            n += 1
        if n > last_turn:
            return n
    return -1


def group_sessions(lines: Sequence[LogLine], *, key: str | None = None, window_s: float | None = 1800.0,
                   tokenizer: Any = None) -> Grouping:
    """Conversation of each line: its key when ``key`` is given (the lines carry it), else automatic.

    Automatic: a request joins the open conversation whose last request it extends, i.e. shares its whole
    prefix (compared position by position, with volatile values masked, tool definitions as one set with
    sorted keys, and reasoning left out, so that the very causes ``fix`` repairs do not split a conversation),
    or all of it but the extra blocks of its last turn (a client that drops per-request context from the
    history); the longest such prefix wins, the most recent on a tie. A conversation is open while its last request is at
    most ``window_s`` seconds older (lines without a timestamp ignore the window). With ``tokenizer``, a raw-text
    prompt's leading BOS text is left out of the comparison.
    """
    ids: list[int] = []
    if key is not None:
        seen: dict[Any, int] = {}
        for ln in lines:
            ids.append(seen.setdefault(ln.key, len(seen)))
        return Grouping(tuple(ids), len(seen), f"key {key}")
    last: list[tuple[Any, int, float | None, int]] = []  # per group: elements, last turn, time, line index
    bos = getattr(tokenizer, "bos_token", None)
    for i, ln in enumerate(lines):
        el, turn = _elements(ln, bos)
        best, best_len, best_at = -1, -1, -1
        for g, (pel, pturn, pts, at) in enumerate(last):
            if window_s is not None and pts is not None and ln.timestamp is not None and ln.timestamp - pts > window_s:
                continue
            n = _extends(pel, pturn, el)
            if n <= 0:
                continue
            if n > best_len or (n == best_len and at > best_at):
                best, best_len, best_at = g, n, at
        if best < 0:
            best = len(last)
            last.append((el, turn, ln.timestamp, i))
        else:
            last[best] = (el, turn, ln.timestamp, i)
        ids.append(best)
    return Grouping(tuple(ids), len(last), "automatic", window_s)
