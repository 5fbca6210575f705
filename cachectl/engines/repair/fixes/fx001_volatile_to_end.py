"""``FX001 volatile_to_end`` (unsafe): a value that changes per request is moved out of the cached prefix, with
the line that holds it, to the end of the request. Where it is found: by the shared detector
(:mod:`cachectl.volatile`), confirmed by two consecutive requests of a conversation differing there; and across
requests, by the log's shared-prefix tree (:mod:`cachectl.engines.prefix.forks`): a fork of cause ``date_time``,
``volatile_id`` or ``counter`` where requests that otherwise share a prefix split (in the request's head only:
tools, and the system and developer messages before its first turn). Where it goes: appended to the last user
turn when the request ends with one; otherwise a trailing system message (OpenAI Chat, Responses: the provider
allows system messages anywhere) or a text block after the tool results (Anthropic, whose messages have no system
role); a request that ends with an assistant prefill has it at the end of the user turn before the prefill,
which the model continues. The same rewritten turn is carried into the later requests of the conversation, where
it is history, so the conversation stays append-only. In a list of text blocks (an Anthropic ``system`` of blocks, an OpenAI or
Responses message's content parts) the line is cut from its own block, and a block that held nothing else is
removed whole (its ``cache_control``, if any, goes to the block before it): an empty text block is not a valid
request."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from ....inputs import Request
from ..groups import line_facts, reparse_at
from .body import (
    apply_carry,
    body_of,
    drop_emptied_parts,
    get_at,
    messages_of,
    path_prefix,
    put_body,
    set_at,
    text_parts,
    with_messages,
)
from .rewriter import FixCode, Rewriter


def apply(rw: Rewriter) -> None:
    heads = Heads()  # each line read so far: the paths of its cached prefix
    confirmed, spans = _confirmed(rw, heads)
    # across requests: the lines the shared-prefix tree found holding a per-request value where requests that
    # otherwise share a prefix split (moved by the same rules; slots of the request's head only)
    for (i, slot), found in cross_spans(rw, FX001.code, heads).items():
        spans.setdefault((i, slot), []).extend(found)
        confirmed.setdefault(slot, set())
    if not confirmed:
        return
    move_lines(rw, FX001, confirmed, spans,
               lambda moved: f"{moved} changes per request inside the cached prefix", heads)


def _confirmed(rw: Rewriter, heads: Heads
               ) -> tuple[dict[str, set[str]], dict[tuple[int, str], list[tuple[int, int]]]]:
    """Slots (body paths) where consecutive requests of a conversation differ in a volatile value, with the
    families seen there, and the spans of those values per (line index, slot). ``heads`` gets the prefix paths
    of each line read (:func:`_head`)."""
    from ....volatile import classify_change

    # 1. confirm: consecutive requests of a conversation whose prefix positions differ in a volatile value
    confirmed: dict[str, set[str]] = {}                 # position path -> families
    spans: dict[tuple[int, str], list[tuple[int, int]]] = {}  # (line index, slot path) -> char spans
    for members in rw.members():
        lb = None
        for a, b in zip(members, members[1:]):
            la, lb = lb if lb is not None else rw.current(a), rw.current(b)  # (each line parsed once)
            _head(heads, a, la.request)
            _head(heads, b, lb.request)
            if la.request is None or lb.request is None:
                continue
            pa, pb = _prefix_positions(la.request), _prefix_positions(lb.request)
            for x, y in zip(pa, pb):
                if x.identity == y.identity:
                    continue
                if x.path != y.path or x.segment != y.segment:
                    break
                for slot, ta, tb in _slot_pairs(rw.values[a], rw.values[b], x.path):
                    if ta == tb:
                        continue
                    pair = classify_change(ta, tb)
                    if pair is None:
                        continue
                    va, vb = pair
                    fam = _family(va)
                    confirmed.setdefault(slot, set()).add(fam)
                    spans.setdefault((a, slot), []).append((va.start, va.end))
                    spans.setdefault((b, slot), []).append((vb.start, vb.end))
                break  # the first differing position is where the prefix ends
    return confirmed, spans


def move_lines(rw: Rewriter, fix: FixCode, confirmed: dict[str, set[str]],
               spans: dict[tuple[int, str], list[tuple[int, int]]], what: Callable[[str], str],
               heads: Heads | None = None) -> None:
    """Every request that holds a value of a confirmed family in a confirmed slot of its prefix (or a span given
    in ``spans``): the line moved to the end of the request, the rewritten turn carried into the later requests
    of its conversation. ``what`` says what the moved lines are, for the fix's message. ``heads``: the prefix
    paths of lines read before (:func:`_head`), for a line whose value nothing changed since: not parsed again."""
    from ....volatile import find_volatile

    # with no value family to look for (FX007 moves only the spans it is given), a line without a span has
    # nothing to move: it is not parsed, and only takes the turns carried from earlier in its conversation
    searched = any(confirmed.values())
    for members in rw.members():
        carry: list[tuple[int, str, Any]] = []   # (message index, original message json, rewritten messages)
        for i in members:
            value = rw.values[i]
            msgs = messages_of(value)
            if msgs is not None and carry:
                msgs = apply_carry(msgs, carry)
                value = with_messages(value, msgs)
            if not searched and not any((i, slot) in spans for slot in confirmed):
                rw.values[i] = value
                continue
            moved: list[str] = []
            edits: list[tuple[str, str, str]] = []
            carried_in = msgs is not None and bool(carry)  # (the value read differs from the line's own)
            if heads is not None and not carried_in and i in heads:
                prefix_paths = heads.prefix(i)
            else:
                prefix_paths = _paths(reparse_at(rw.lines, i, value).request)
            if prefix_paths is None:
                rw.values[i] = value
                continue
            for slot, fams in confirmed.items():
                if not any(slot == pp or slot.startswith(pp + ".") or slot.startswith(pp + "[")
                           for pp in prefix_paths):
                    continue
                try:
                    text = get_at(body_of(value)[0], slot)
                except (KeyError, IndexError, TypeError):
                    continue
                if not isinstance(text, str):
                    continue
                found = [(v.start, v.end) for v in find_volatile(text, weekdays=True) if _family(v) in fams] if fams else []
                found += spans.get((i, slot), [])
                if not found:
                    continue
                new_text, lines_out = _cut_lines(text, found)
                if not lines_out:
                    continue
                edits.append((slot, text, new_text))
                moved.extend(lines_out)
            if not edits:
                rw.values[i] = value
                continue
            note = "\n".join(dict.fromkeys(moved))
            number = rw.number(i)
            where, new_value, carried = _append_note(value, note, line_facts(rw.lines, i)[1] == "anthropic")
            if where is None:
                rw.notes.append(f"line {number}: a {'per-user' if fix.code == 'FX007' else 'volatile'} value was "
                                "found but the request has no place after its prefix to move it to")
                rw.values[i] = value
                continue
            new_body = body_of(new_value)[0]
            for slot, _old, new in edits:
                set_at(new_body, slot, new)
            # a text block that held only the moved lines goes with them (an empty block is not a valid request)
            drop_emptied_parts(new_body, [slot for slot, _old, new in edits if not new.strip()])
            for slot, _old, _new in edits:
                rw.record(fix, number, path_prefix(value) + slot,
                          f"{what(', '.join(repr(x) for x in dict.fromkeys(moved)))}: moved to {where}", note, where)
            if rw.allowed(fix.safe):
                rw.values[i] = new_value
                if carried is not None:
                    carry.append(carried)
            else:
                rw.values[i] = value


def cross_spans(rw: Rewriter, code: str, heads: Heads | None = None
                ) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """(line index, slot) -> char spans of the lines that the log's shared-prefix tree moves with ``code``
    (``rw.forks``), located in each line's current value; only slots of the request's head (tools, and the
    system and developer messages before its first turn), so that history stays append-only. ``heads`` gets the
    prefix paths of each line read (:func:`_head`)."""
    out: dict[tuple[int, str], list[tuple[int, int]]] = {}
    forks = rw.forks
    if forks is None:
        return out
    for i in range(len(rw.lines)):
        todo = forks.spans(i, code)
        if not todo:
            continue
        value = rw.values[i]
        body, pre = body_of(value)[0], path_prefix(value)
        parts = heads.get(i, _UNREAD) if heads is not None else _UNREAD  # (a line read before is not parsed again)
        if parts is _UNREAD:
            req = rw.current(i).request
            parts = _head(heads, i, req) if heads is not None else _parts(req)
        if parts is None:
            continue
        head = parts[1]
        for ms in todo:
            slot = ms.path[len(pre):] if pre and ms.path.startswith(pre) else ms.path
            try:
                text = get_at(body, slot)
            except (KeyError, IndexError, TypeError):
                continue
            found = _in_parts(text, slot, ms.start, ms.text) if isinstance(text, list) else (
                [(slot, _locate(text, ms.start, ms.text))] if isinstance(text, str) else [])
            for at_slot, at in found:
                if at is not None and any(at_slot == pp or at_slot.startswith((pp + ".", pp + "[")) for pp in head):
                    out.setdefault((i, at_slot), []).append(at)
                    break
    return out


def _in_parts(parts_value: list, slot: str, start: int, piece: str) -> list[tuple[str, tuple[int, int] | None]]:
    """A line of a list of text blocks (an Anthropic system, an OpenAI message's content parts), which the analysis
    counts in their texts joined by newlines: ``(block slot, span in that block)`` where it is found, the block
    where it starts first, then any other block holding it at a line start (an earlier fix may have removed a
    block above it)."""
    parts = text_parts(parts_value) or []
    at = next((k for k in range(len(parts) - 1, -1, -1) if parts[k][1] <= start), None)
    order = ([at] if at is not None else []) + [k for k in range(len(parts)) if k != at]
    out: list[tuple[str, tuple[int, int] | None]] = []
    for k in order:
        sub, s0, text = parts[k]
        local = start - s0 if k == at else 0
        bit = piece[:max(len(text) - local, 0)] if k == at else piece.rstrip("\n")
        out.append((slot + sub, _locate(text, local, bit)))
    return out


def _locate(text: str, start: int, piece: str) -> tuple[int, int] | None:
    """Where ``piece`` (a line found at ``start`` in the original) is in ``text`` now (earlier fixes may have cut
    lines above it): at ``start``, else the occurrence at a line start nearest to it."""
    if not piece.strip():
        return None
    if text[start:start + len(piece)] == piece:
        return start, start + len(piece)
    best = None
    k = text.find(piece)
    while k >= 0:
        if (k == 0 or text[k - 1] == "\n") and (best is None or abs(k - start) < abs(best - start)):
            best = k
        k = text.find(piece, k + 1)
    return None if best is None else (best, best + len(piece))


class Heads(dict):
    """Line index -> the paths of its cached prefix and of its head (tools, and the system and developer messages
    before its first turn), as :func:`_head` keeps them (None: no request): one pair of frozensets for each distinct
    pair, shared by the lines that have it (a frozenset a line took 12.6 MB at once, on 20,000 requests of the bench
    log)."""

    __slots__ = ("_same",)

    def __init__(self) -> None:
        super().__init__()
        self._same: dict[tuple, tuple] = {}

    def same(self, parts: tuple[frozenset[str], frozenset[str]]) -> tuple[frozenset[str], frozenset[str]]:
        return self._same.setdefault(parts, parts)

    def prefix(self, i: int) -> frozenset[str] | None:
        got = self[i]
        return None if got is None else got[0]


#: a line :func:`_head` has not read
_UNREAD: Any = object()


def _paths(req: Request | None) -> frozenset[str] | None:
    """The paths of a request's cached prefix (None without a request)."""
    return None if req is None else frozenset(p.path for p in _prefix_positions(req))


def _parts(req: Request | None) -> tuple[frozenset[str], frozenset[str]] | None:
    """The paths of a request's cached prefix and of its head (None without a request)."""
    if req is None:
        return None
    head = []
    for p in req.positions:
        if p.segment == "messages" and p.role not in ("system", "developer"):
            break
        head.append(p.path)
    return frozenset(p.path for p in _prefix_positions(req)), frozenset(head)


def _head(heads: Heads, i: int, req: Request | None) -> tuple[frozenset[str], frozenset[str]] | None:
    """The paths of line ``i``'s cached prefix and head (None without a request), kept in ``heads``."""
    got = _parts(req)
    got = heads[i] = None if got is None else heads.same(got)
    return got


def _prefix_positions(req: Request) -> list:
    """The positions before the last user turn's start: the cached prefix a volatile value must leave."""
    pos = list(req.positions)
    last_user = max((k for k, p in enumerate(pos) if p.segment == "messages" and p.role == "user"), default=None)
    return pos[:last_user] if last_user is not None else pos


def _slot_pairs(va: Any, vb: Any, path: str) -> list[tuple[str, str, str]]:
    """The strings at or under ``path`` in both bodies: ``(slot path, text a, text b)``."""
    ba, bb = body_of(va)[0], body_of(vb)[0]
    try:
        xa, xb = get_at(ba, path), get_at(bb, path)
    except (KeyError, IndexError, TypeError):
        return []
    out: list[tuple[str, str, str]] = []

    def walk(x: Any, y: Any, p: str) -> None:
        if isinstance(x, str) and isinstance(y, str):
            out.append((p, x, y))
        elif isinstance(x, dict) and isinstance(y, dict):
            for k in x:
                if k in y and k not in ("type", "cache_control", "role"):
                    walk(x[k], y[k], f"{p}.{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for j, (u, w) in enumerate(zip(x, y)):
                walk(u, w, f"{p}[{j}]")

    walk(xa, xb, path)
    return out


def _family(v: Any) -> str:
    return "date_time" if v.is_date_time else v.kind


def _cut_lines(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[str]]:
    """``text`` without the lines that hold the spans (a long line: only the sentence), and the cut pieces."""
    lines = text.split("\n")
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    cut: dict[int, tuple[int, int]] = {}      # line number -> (start, end) within the line
    for s, e in spans:
        n = max(k for k, st in enumerate(starts) if st <= s)
        line = lines[n]
        ls, le = s - starts[n], min(e - starts[n], len(line))
        if len(line) <= 300:
            lo, hi = 0, len(line)
        else:  # the sentence around the value
            lo = max(line.rfind(". ", 0, ls) + 2, 0) if line.rfind(". ", 0, ls) >= 0 else 0
            dot = line.find(". ", le)
            hi = dot + 1 if dot >= 0 else len(line)
        old = cut.get(n)
        cut[n] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)
    pieces: list[str] = []
    out_lines: list[str | None] = list(lines)
    for n in sorted(cut):
        lo, hi = cut[n]
        piece = lines[n][lo:hi].strip()
        if not piece:
            continue
        pieces.append(piece)
        rest = (lines[n][:lo] + lines[n][hi:]).strip() if (lo, hi) != (0, len(lines[n])) else ""
        if rest:
            out_lines[n] = (lines[n][:lo].rstrip() + " " + lines[n][hi:].lstrip()).strip()
        else:
            out_lines[n] = None
            # a blank line on both sides: keep one
            if n > 0 and n + 1 < len(lines) and not lines[n - 1].strip() and not lines[n + 1].strip():
                out_lines[n + 1] = None if out_lines[n + 1] == "" else out_lines[n + 1]
    # a text whose first lines were cut starts where the rest starts, not with the blank lines that set them apart
    # (as the requests that never had them do)
    k = 0
    while k < len(out_lines) and out_lines[k] is None:
        k += 1
    if k:
        while k < len(out_lines) and out_lines[k] == "":
            out_lines[k] = None
            k += 1
    kept = [x for x in out_lines if x is not None]
    return "\n".join(kept), pieces



def _append_note(value: Any, note: str, anthropic: bool) -> tuple[str | None, Any, tuple[int, str, Any] | None]:
    """The request with ``note`` at its end: ``(where, new value, carry)`` (``anthropic``: its provider's)."""
    value = copy.deepcopy(value)
    body, bp = body_of(value)
    key = "messages" if "messages" in body else "input" if isinstance(body.get("input"), list) else None
    if key is None:
        if isinstance(body.get("input"), str):
            body["input"] = body["input"] + "\n\n" + note
            return "the end of the input", put_body(value, body, bp), None
        return None, value, None
    msgs = body[key]
    if not msgs:
        return None, value, None
    idx = len(msgs) - 1
    prefill = (len(msgs) >= 2 and isinstance(msgs[-1], dict) and msgs[-1].get("role") == "assistant"
               and isinstance(msgs[-2], dict) and msgs[-2].get("role") == "user")
    if prefill:  # an assistant prefill ends the request: the note goes to the user turn before it
        idx -= 1
    last = msgs[idx]
    original = json.dumps(last, sort_keys=True)
    if isinstance(last, dict) and last.get("role") == "user":
        new = dict(last)
        c = new.get("content")
        only_results = isinstance(c, list) and c and all(isinstance(b, dict) and b.get("type") == "tool_result"
                                                         for b in c)
        if isinstance(c, str):
            new["content"] = c + "\n\n" + note
        elif isinstance(c, list):
            part = {"type": "text", "text": note} if anthropic or key == "messages" else {"type": "input_text",
                                                                                          "text": note}
            new["content"] = [*c, part]
        else:
            return None, value, None
        msgs[idx] = new
        where = ("a text block after the tool results of the last user turn" if only_results
                 else "the end of the last user turn") + (", before the assistant's prefill" if prefill else "")
        return where, put_body(value, body, bp), (idx, original, [new])
    if anthropic:
        return None, value, None
    role = "system"
    sysmsg = {"role": role, "content": note}
    msgs.append(sysmsg)
    return "a trailing system message", put_body(value, body, bp), (idx, original, [copy.deepcopy(last), sysmsg])


FX001 = FixCode("FX001", "volatile_to_end", safe=False,
                description="move a per-request value out of the cached prefix to the end",
                causes=("date_time", "counter", "volatile_id", "system_prompt_changed"), apply=apply,
                across=("date_time", "volatile_id", "counter"))
