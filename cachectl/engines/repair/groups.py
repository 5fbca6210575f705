"""A log's lines read as requests, and the conversation each belongs to.

``log_lines(records, *, source, key=None) -> list[LogLine]`` reads ``(line, value)`` pairs
(:func:`cachectl.inputs.iter_jsonl`); ``group_sessions(lines, *, key=None, window_s=1800.0, tokenizer=None) ->
Grouping`` is the automatic conversation grouping on its own (``fix_log`` calls it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from typing import Any

from ...errors import InputError, UnrenderablePart, plural
from ...inputs import PromptInput, Request, compact, get_path, parse_request, prompt_from_value
from ...inputs.prompt import conversation_key
from .store import LineStore, store_of

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

    def last_indices(self) -> list[int]:
        """The index of each conversation's last line, by conversation number."""
        ends = [0] * self.count
        for i, g in enumerate(self.groups):
            ends[g] = i
        return ends


# --------------------------------------------------------------------------------------------- reading


def log_lines(records: Iterable[tuple[int, Any]], *, source: str, key: str | None = None,
              timestamps: Any = None, each: Callable[[LogLine], None] | None = None,
              leave_out: bool = False) -> LineStore:
    """:class:`LogLine` records from ``(line, value)`` pairs (:func:`cachectl.inputs.iter_jsonl`): request bodies
    and wrappers (through :func:`cachectl.inputs.parse_request`), chat lists, raw-text and token-ID prompts
    (through :func:`cachectl.inputs.prompt_from_value`). ``timestamps``: the run's
    :class:`~cachectl.inputs.TimestampReader`.

    Every line is read and checked here (a bad line is an error now, not in a later pass); the lines are kept
    as a :class:`~.store.LineStore`: their values on disk, parsed again when read. ``each(line)`` sees every line
    as it is read, parsed (what else the run takes from this read: :class:`.fix.FirstRead`).

    ``leave_out``: a line whose request holds a part no tokenizer renders (an image, audio, a file:
    :class:`~cachectl.errors.UnrenderablePart`) is left out of the store, and kept in its ``left_out`` (``report``
    and ``fix`` say so: :func:`left_out_note`); a log of nothing else is that line's error."""
    out = LineStore(partial(_line_again, source))
    for lineno, value in records:
        try:
            ln = _log_line(lineno, value, source, key, timestamps)
        except UnrenderablePart as exc:
            if not leave_out:
                raise
            out.left_out.append(exc)
            continue
        out.append(ln)
        if each is not None:
            each(ln)
    if out.left_out and not len(out):
        raise out.left_out[0]
    return out


def left_out_note(lines: Any) -> str | None:
    """The note of the lines :func:`log_lines` left out (None where none was)."""
    left = getattr(store_of(lines) or lines, "left_out", None)
    if not left:
        return None
    first = left[0]
    return (f"{plural(len(left), 'line')} left out: a request holds a content part (image, audio, document or file) "
            f"that has no token IDs without the model's processor (the first: line {first.line}, "
            f"{first.field}); every figure is of the other requests")


def _line_again(source: str, value: Any, lineno: int, key: Any, ts: float | None) -> LogLine:
    """A line of a :class:`~.store.LineStore` parsed again: its key and time as first read."""
    return _log_line(lineno, value, source, None, lambda _: ts, known_key=key)


def _log_line(lineno: int, value: Any, source: str, key: str | None, timestamps: Any = None,
              known_key: Any = None) -> LogLine:
    k = known_key
    if key is not None:
        k = get_path(value, key) if isinstance(value, dict) else None
        if k is None:
            raise InputError("missing conversation key", source=source, line=lineno, field=key)
        k = conversation_key(k)
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


def line_facts(lines: Any, i: int) -> tuple[str, str | None, str | None]:
    """Line ``i``'s prompt kind, its request's provider and model (None, None without a request), unchanged by
    the fix codes' rewrites: from a line store without parsing the line (:meth:`~.store.LineStore.facts`)."""
    store = store_of(lines)
    if store is not None:
        return store.facts(i)
    ln = lines[i]
    req = ln.request
    return (ln.prompt.kind, req.provider, req.model) if req is not None else (ln.prompt.kind, None, None)


def line_meta(lines: Any, i: int) -> tuple[int, Any, float | None]:
    """Line ``i``'s number, conversation key and time, as its parse gives them: from a line store without parsing it
    (:meth:`~.store.LineStore.meta`)."""
    store = store_of(lines)
    if store is not None:
        return store.meta(i)
    ln = lines[i]
    return ln.line, ln.key, ln.timestamp


def log_models(lines: Any) -> list[str]:
    """The models the requests of ``lines`` name, in the order they first appear (a line store's kept facts)."""
    store = store_of(lines)
    if store is not None:
        return store.models()
    return list(dict.fromkeys(ln.request.model for ln in lines if ln.request is not None and ln.request.model))


def line_models(lines: Any) -> Callable[[int], str | None]:
    """The model the request on a line (by its number) names, None where it names none (a line store's kept facts;
    the lines read once, at the first call, where they are held in memory)."""
    store = store_of(lines)
    if store is not None:
        return lambda line: store.facts(store.index_of(line))[2]
    models: dict[int, str | None] = {}

    def of(line: int) -> str | None:
        if not models:
            models.update((ln.line, ln.request.model if ln.request is not None else None) for ln in lines)
        return models.get(line)
    return of


def reparse_at(lines: Any, i: int, value: Any) -> LogLine:
    """Line ``i`` of ``lines`` after a rewrite to ``value``, parsed again as :func:`reparse` does (a line store's
    line is not parsed first for its number, key and time)."""
    store = store_of(lines)
    if store is not None:
        return store.line_again(i, value)
    return reparse(lines[i], value)


def original_at(lines: Any, i: int) -> LogLine:
    """Line ``i`` of ``lines`` as :func:`reparse_at` gives it for its original value, without parsing it again where
    it is at hand: a line store's own line; the line under a :class:`~.store.Mapped` view (which
    :func:`reparse_at` reads the value of, not the view's changes)."""
    store = store_of(lines)
    if store is not None:
        return store[i]
    from .store import Mapped

    if isinstance(lines, Mapped) and lines.values_of is not None:
        return reparse(lines.values_of[i], lines.values_of[i].value)
    return lines[i]


def with_model(ln: LogLine, model: str) -> LogLine:
    """The line with ``model`` where its request names none."""
    if ln.request is None or ln.request.model is not None:
        return ln
    return replace(ln, request=replace(ln.request, model=model))


def reparse(ln: LogLine, value: Any) -> LogLine:
    """The line after a rewrite, parsed again (a rewrite that no longer parses is a bug: it raises); a rewrite
    leaves the time alone, so the line keeps the timestamp it was read with (in the run's unit)."""
    return _log_line(ln.line, value, ln.prompt.source, None, lambda _: ln.timestamp, known_key=ln.key)


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


@lru_cache(maxsize=1024)  # (a log's requests list the same few tools: each serialized once)
def _sorted_keys(content: str) -> str:
    """A tool's JSON with its keys sorted: the same tool however its keys are ordered."""
    return json.dumps(json.loads(content), sort_keys=True)


def _elements(ln: LogLine, bos: str | None = None) -> tuple[Any, int]:
    """What grouping compares, and where the last turn starts in it: for requests, the positions (tools as one
    set with sorted keys, volatile values masked, reasoning dropped); for raw text, the masked text; for token
    IDs, the IDs (these two must be extended whole)."""
    if ln.request is not None:
        req = ln.request
        tools = sorted(_sorted_keys(p.content) for p in req.positions if p.segment == "tools")
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


def _keys(lines: Iterable[LogLine]) -> Iterable[Any]:
    """Each line's conversation key (a line store's without parsing the lines)."""
    store = store_of(lines)
    if store is not None:
        return (store.meta(i)[1] for i in range(len(store)))
    return (ln.key for ln in lines)


_MSG_INDEX = re.compile(r"(?:messages|input)\[(\d+)\]")


def group_sessions(lines: Iterable[LogLine], *, key: str | None = None, window_s: float | None = 1800.0,
                   tokenizer: Any = None) -> Grouping:
    """Conversation of each line: its key when ``key`` is given (the lines carry it), else automatic.

    Automatic: a request joins the open conversation whose last request it extends, i.e. shares its whole
    prefix (compared position by position, with volatile values masked, tool definitions as one set with
    sorted keys, and reasoning left out, so that the very causes ``fix`` repairs do not split a conversation),
    or all of it but the extra blocks of its last turn (a client that drops per-request context from the
    history); the longest such prefix wins, the most recent on a tie. A conversation is open while its last request is at
    most ``window_s`` seconds older (lines without a timestamp ignore the window). With ``tokenizer``, a raw-text
    prompt's leading BOS text is left out of the comparison.

    Time linear in the log and memory in its conversations: each conversation is remembered by a few hashes of
    its last request (:class:`_Index`), looked up by the prefix it must share, never compared with every other.
    """
    if key is not None:
        ids: list[int] = []
        seen: dict[Any, int] = {}
        for k in _keys(lines):
            ids.append(seen.setdefault(k, len(seen)))
        return Grouping(tuple(ids), len(seen), f"key {key}")
    sessions = Sessions(window_s, tokenizer)
    for ln in lines:
        sessions.add(ln)
    return sessions.grouping()


class Sessions:
    """:func:`group_sessions`' automatic grouping, a line at a time (in log order): ``add(line)``, then
    ``grouping()``."""

    def __init__(self, window_s: float | None = 1800.0, tokenizer: Any = None):
        self._index = _Index(window_s)
        self._bos = getattr(tokenizer, "bos_token", None)
        self._ids: list[int] = []

    def add(self, ln: LogLine) -> None:
        self._ids.append(self._index.add(*_elements(ln, self._bos), ln.timestamp, len(self._ids)))

    def grouping(self) -> Grouping:
        return Grouping(tuple(self._ids), self._index.count, "automatic", self._index.window_s)


#: chunk length (characters of a raw text, IDs of a token list) of the prefix hashes: a conversation's last
#: raw-text or token-ID prompt is found under the hash of its chunks up to its length rounded down to this
_CHUNK = 64


class _Last:
    """What grouping remembers of a conversation's last request: where it is indexed, the hashes that decide
    whether a later request extends it, and when it was sent (a few ints; no text, no tokens)."""

    __slots__ = ("group", "bucket", "length", "full", "tail", "turn", "ts", "at")

    def __init__(self, group: int, bucket: tuple, length: int, full: int, tail: tuple[int, ...], turn: int,
                 ts: float | None, at: int):
        self.group, self.bucket, self.length, self.full = group, bucket, length, full
        self.tail, self.turn, self.ts, self.at = tail, turn, ts, at


def _positions_hashes(el: tuple) -> list[int]:
    """Prefix hashes of a request's positions: ``h[k]`` hashes ``el[:k]``."""
    out = [0]
    h = 0
    for x in el:
        h = hash((h, x))
        out.append(h)
    return out


def _chunk_hashes(el: Any) -> list[int]:
    """Prefix hashes of a raw text or a token-ID tuple at chunk boundaries: ``h[j]`` hashes ``el[:j * _CHUNK]``."""
    out = [0]
    h = 0
    for j in range(len(el) // _CHUNK):
        piece = el[j * _CHUNK:(j + 1) * _CHUNK]
        h = hash((h, piece))
        out.append(h)
    return out


class _Index:
    """Open conversations by the prefix a continuation must repeat, with the window applied as
    ``group_sessions`` describes (one lookup per position of a request, or per chunk of a text).

    A request (a tuple of position strings) with last turn starting at ``t`` is extended by any later request
    that repeats its first ``m = min(len, t + 1)`` positions (then the rest is compared by prefix hash); a raw
    text or token list only by one that repeats all of it. So each conversation is filed under the hash of that
    prefix (texts and token lists: of their chunks up to their length rounded down to the chunk, or of all of it
    when shorter than one chunk), and a request looks up the prefixes of its own that such a key could name.
    Conversations a request finds closed by the window move to a cold list that only lines earlier in time (or
    without a timestamp) still consult, so a long log does not keep scanning them."""

    def __init__(self, window_s: float | None):
        self.window_s = window_s
        self.count = 0
        self.hot: dict[tuple, dict[int, _Last]] = {}
        #: kind -> prefix length of a bucket -> conversations filed there (hot or cold)
        self.lengths: dict[str, dict[int, int]] = {"r": {}, "i": {}, "t": {}}
        self.cold: dict[tuple, dict[int, _Last]] = {}
        self.cold_since: float | None = None  # lines at or after this time skip the cold list

    def _closed(self, last: _Last, ts: float | None) -> bool:
        return self.window_s is not None and last.ts is not None and ts is not None and ts - last.ts > self.window_s

    def add(self, el: Any, turn: int, ts: float | None, at: int) -> int:
        kind = "r" if isinstance(el, tuple) and el and isinstance(el[0], str) else "t" if isinstance(el, str) else "i"
        if kind == "r":
            pre = _positions_hashes(el)
            cands = [(kind, m, pre[m]) for m in self.lengths[kind] if m <= len(el)]
        else:
            pre = _chunk_hashes(el)
            cands = []
            for m in self.lengths[kind]:
                if m > len(el):
                    continue
                if m < _CHUNK:
                    cands.append((kind, m, hash(el[:m])))
                elif m % _CHUNK == 0:
                    cands.append((kind, m, pre[m // _CHUNK]))
        best: _Last | None = None
        best_len = -1
        use_cold = self.cold and not (ts is not None and self.cold_since is not None and ts >= self.cold_since)
        for bucket in cands:
            for store in ((self.hot, self.cold) if use_cold else (self.hot,)):
                found = store.get(bucket)
                if not found:
                    continue
                for last in list(found.values()):
                    if self._closed(last, ts):
                        if store is self.hot:  # closed for this line and for every later one
                            self._move_cold(last, ts)
                        continue
                    n = self._extends(last, kind, el, pre)
                    if n <= 0:
                        continue
                    if best is None or n > best_len or (n == best_len and last.at > best.at):
                        best, best_len = last, n
        if best is None:
            group = self.count
            self.count += 1
        else:
            group = best.group
            self._remove(best)
        self._file(self._last(group, kind, el, pre, turn, ts, at))
        return group

    def _extends(self, last: _Last, kind: str, el: Any, pre: list[int]) -> int:
        """How much of the remembered request ``el`` repeats as its prefix when it continues that conversation
        (its bucket matched ``el``'s): all of it, or all before its last turn and at least the first position of
        that turn, the longest common prefix then; -1 when it does not."""
        n = last.length
        if n <= len(el):
            if kind == "r":
                if pre[n] == last.full:
                    return n
            else:
                k = n // _CHUNK
                if hash((pre[k], el[k * _CHUNK:n])) == last.full:
                    return n
        if kind != "r":
            return -1
        # all positions before the last turn and its first one repeated: the longest common prefix
        m = last.bucket[1]
        k = m
        for h in last.tail:
            if k + 1 >= len(pre) or pre[k + 1] != h:
                break
            k += 1
        return k if k > last.turn else -1

    def _last(self, group: int, kind: str, el: Any, pre: list[int], turn: int, ts: float | None, at: int) -> _Last:
        n = len(el)
        if kind == "r":
            m = min(n, turn + 1)
            return _Last(group, (kind, m, pre[m]), n, pre[n], tuple(pre[m + 1:]), turn, ts, at)
        k = n // _CHUNK
        bucket = (kind, n, hash(el)) if n < _CHUNK else (kind, k * _CHUNK, pre[k])
        return _Last(group, bucket, n, hash((pre[k], el[k * _CHUNK:n])), (), turn, ts, at)

    def _file(self, last: _Last) -> None:
        if last.length == 0:  # an empty prompt: extended by nothing
            return
        self.hot.setdefault(last.bucket, {})[last.group] = last
        lengths = self.lengths[last.bucket[0]]
        lengths[last.bucket[1]] = lengths.get(last.bucket[1], 0) + 1

    def _move_cold(self, last: _Last, ts: float | None) -> None:
        found = self.hot[last.bucket]
        del found[last.group]
        if not found:
            del self.hot[last.bucket]
        self.cold.setdefault(last.bucket, {})[last.group] = last
        assert ts is not None
        self.cold_since = ts if self.cold_since is None else max(self.cold_since, ts)

    def _remove(self, last: _Last) -> None:
        for store in (self.hot, self.cold):
            found = store.get(last.bucket)
            if found is not None and found.pop(last.group, None) is not None:
                if not found:
                    del store[last.bucket]
                break
        lengths = self.lengths[last.bucket[0]]
        lengths[last.bucket[1]] -= 1
        if not lengths[last.bucket[1]]:
            del lengths[last.bucket[1]]
