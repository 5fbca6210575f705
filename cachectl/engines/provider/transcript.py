"""The cache timeline of agent transcripts (Claude Code): per session, in time order, what each API response read
from, wrote to and sent past the provider's prompt cache, where the reads broke and why, what each break cost,
and what the 1-hour TTL would have billed.

Input: :class:`~cachectl.inputs.formats.base.Record` s with their usage (one per API response: the reader
counts a response written over several lines once), the session in ``keys["session"]``, the subagent in
``keys["agent"]``/``keys["sidechain"]``, compactions in ``keys["after_compaction"]``. Nothing here opens a file.

A thread is a session's main conversation or one of its subagents: each has its own prompt and so its own cache
timeline. Within a thread, a call should read what the previous call left cached (its cache reads plus its
cache writes: in Claude Code's transcripts exactly that, call after call). A **break** is a call that read at
least the model's minimum cacheable length less than that; its **cause**, where the transcript tells it:

- ``cold_start``: the thread's first call (nothing of it was cached yet; what it wrote is the price of starting);
- ``model_switch``: another model than the previous call's (each model has its own cache);
- ``compaction``: the conversation was compacted since the previous call (a new prompt after the system prompt);
- ``ttl_expired``: longer since the previous call than the cache's TTL (5 minutes, or 1 hour where the
  previous writes were 1-hour ones);
- ``unexplained``: none of these (a short gap, the same model, no compaction): the prompt was rewritten before
  the cached prefix ended, mid-session. ``after`` says what came just before, where the transcript tells it
  (``task-notification``: a background task's notice).

The cost of a break is what its lost tokens cost beyond a cache read: the part written at its write rate, the
rest at the input rate. The 1-hour what-if re-bills the same calls with every write at the 1-hour rate and every
break whose only cause is a gap between 5 minutes and 1 hour turned into a read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...errors import InputError
from ...inputs.formats.base import Record
from ...inputs.timestamps import parse_timestamp
from ...inputs.usage import parse_usage
from .cache import _lookup, _Notes
from .prices import PER_MTOK, ModelPrice, PriceTable, Usage, cost_usd

SCHEMA_VERSION = 1
TTL_5M = 300.0
TTL_1H = 3600.0
#: the causes, in the order the primary one is chosen
CAUSES = ("cold_start", "model_switch", "compaction", "ttl_expired", "unexplained")


@dataclass(frozen=True)
class Break:
    """One call whose cache reads fell short of what the previous call of its thread left cached."""

    source: str
    line: int
    timestamp: float | None
    thread: str
    cause: str                      # the first of CAUSES that applies
    causes: tuple[str, ...]         # every one that applies
    detail: str
    read_tokens: int
    #: what the previous call left cached (0 for a cold start)
    expected_read_tokens: int
    #: tokens written or sent uncached that a read would have served
    lost_tokens: int
    #: what the lost tokens cost beyond a read
    cost_usd: float
    gap_s: float | None
    ttl_s: float
    model: str
    previous_model: str | None = None
    #: a read under the 1-hour TTL (only cause: a gap between 5 minutes and 1 hour)
    saved_by_1h: bool = False
    after: str | None = None


@dataclass(frozen=True)
class Call:
    """One API response on its session's timeline."""

    source: str
    line: int
    timestamp: float | None
    thread: str
    model: str
    message_id: str | None
    request_id: str | None
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int
    output_tokens: int
    gap_s: float | None
    cost_usd: float
    cost_1h_usd: float
    break_cause: str | None = None


@dataclass(frozen=True)
class CauseTotal:
    cause: str
    breaks: int
    lost_tokens: int
    cost_usd: float


@dataclass(frozen=True)
class SessionAudit:
    session: str
    sources: tuple[str, ...]
    threads: tuple[str, ...]
    calls: tuple[Call, ...]
    breaks: tuple[Break, ...]
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    #: cache reads over all prompt tokens (None without any)
    hit_rate: float | None
    cost_usd: float
    cost_1h_usd: float
    break_cost_usd: float
    by_cause: tuple[CauseTotal, ...]


@dataclass(frozen=True)
class TranscriptAudit:
    schema_version: int
    sources: tuple[str, ...]
    sessions: tuple[SessionAudit, ...]
    calls: int
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    hit_rate: float | None
    cost_usd: float
    #: the same calls under the 1-hour TTL
    cost_1h_usd: float
    cheaper_with_1h: bool
    breaks: int
    #: what the breaks cost beyond reads, cold starts excluded (the exit code's finding)
    avoidable_break_cost_usd: float
    by_cause: tuple[CauseTotal, ...]
    #: responses seen twice (the same file given twice) or a subagent's replay of its parent's response: once
    duplicates_dropped: int = 0
    notes: tuple[str, ...] = field(default=())


def _rates(price: ModelPrice, prompt: int) -> tuple[float, float, float, float]:
    """``(input, read, 5m write, 1h write)`` per million tokens for a prompt of this length."""
    r = price.rates(prompt)
    read = r.cache_read if r.cache_read is not None else r.input
    w5 = r.cache_write_5m if r.cache_write_5m is not None else r.cache_write if r.cache_write is not None else r.input
    w1 = r.cache_write_1h if r.cache_write_1h is not None else w5 * 2.0 / 1.25
    return r.input, read, w5, w1


class _Thread:
    __slots__ = ("prev_cached", "prev_model", "prev_time", "ttl", "calls")

    def __init__(self) -> None:
        self.prev_cached: int | None = None
        self.prev_model: str | None = None
        self.prev_time: float | None = None
        self.ttl = TTL_5M
        self.calls = 0


def _thread_of(rec: Record) -> str:
    agent = rec.keys.get("agent")
    if agent is not None:
        return f"agent-{agent}"
    return "sidechain" if rec.keys.get("sidechain") else "main"


def audit_transcripts(records: Iterable[Record], *, table: PriceTable, model_as: str | None = None,
                      source: str | None = None) -> TranscriptAudit:
    """The cache timeline of every session in ``records`` (several files' records together: a session's subagent
    files beside its own). ``source``: what the records were read from, named when there is none."""
    notes = _Notes()
    seen: dict[tuple[Any, Any], bool] = {}
    main_ids: set[Any] = set()
    rows: list[tuple[float | None, int, Record]] = []
    dropped = 0
    sidechains: list[Record] = []
    for i, rec in enumerate(records):
        key = (rec.keys.get("message_id"), rec.keys.get("request_id"))
        if key[0] is not None and key in seen:
            dropped += 1
            continue
        seen[key] = True
        if rec.keys.get("sidechain"):
            sidechains.append(rec)
        else:
            main_ids.add(key[0])
        try:
            ts = parse_timestamp(rec.timestamp)
        except ValueError as exc:
            raise InputError(str(exc), source=rec.source, line=rec.line, field="timestamp") from None
        rows.append((ts, i, rec))
    # a subagent's file may replay its parent's response (same message id, another request id): counted once,
    # as the parent's (ccusage #913)
    replays = {id(r) for r in sidechains if r.keys.get("message_id") in main_ids}
    if replays:
        dropped += len(replays)
        rows = [row for row in rows if id(row[2]) not in replays]
    if not rows:
        raise InputError("no API responses in the transcript (no assistant line with usage)", source=source)
    rows.sort(key=lambda t: (t[2].keys.get("session") or "", t[0] if t[0] is not None else float("-inf"), t[1]))
    sessions: dict[str, list[tuple[float | None, Record]]] = {}
    for ts, _, rec in rows:
        sessions.setdefault(str(rec.keys.get("session")), []).append((ts, rec))
    audits = tuple(_session(name, calls, table, model_as, notes) for name, calls in sessions.items())
    by_cause = _by_cause(b for s in audits for b in s.breaks)
    tin = sum(s.input_tokens for s in audits)
    tread = sum(s.cache_read_tokens for s in audits)
    twrite = sum(s.cache_write_tokens for s in audits)
    prompt = tin + tread + twrite
    cost = round(sum(s.cost_usd for s in audits), 10)
    cost_1h = round(sum(s.cost_1h_usd for s in audits), 10)
    avoidable = round(sum(b.cost_usd for s in audits for b in s.breaks if b.cause != "cold_start"), 10)
    return TranscriptAudit(
        schema_version=SCHEMA_VERSION, sources=tuple(dict.fromkeys(r.source for _, _, r in rows)), sessions=audits,
        calls=sum(len(s.calls) for s in audits), input_tokens=tin, cache_read_tokens=tread,
        cache_write_tokens=twrite, output_tokens=sum(s.output_tokens for s in audits),
        hit_rate=tread / prompt if prompt else None, cost_usd=cost, cost_1h_usd=cost_1h,
        cheaper_with_1h=cost_1h < cost, breaks=sum(len(s.breaks) for s in audits),
        avoidable_break_cost_usd=avoidable, by_cause=by_cause, duplicates_dropped=dropped, notes=tuple(notes))


def _by_cause(breaks: Iterable[Break]) -> tuple[CauseTotal, ...]:
    acc: dict[str, list[Any]] = {}
    for b in breaks:
        a = acc.setdefault(b.cause, [0, 0, 0.0])
        a[0] += 1
        a[1] += b.lost_tokens
        a[2] += b.cost_usd
    return tuple(CauseTotal(c, acc[c][0], acc[c][1], round(acc[c][2], 10)) for c in CAUSES if c in acc)


def _session(name: str, rows: list[tuple[float | None, Record]], table: PriceTable, model_as: str | None,
             notes: _Notes) -> SessionAudit:
    threads: dict[str, _Thread] = {}
    calls: list[Call] = []
    breaks: list[Break] = []
    for ts, rec in rows:
        if rec.model is None:
            raise InputError("no model on this response", source=rec.source, line=rec.line, field="message.model")
        price = _lookup(table, rec.model, rec.source, rec.line, model_as, notes)
        u = parse_usage(rec.usage or {}, source=rec.source, line=rec.line, path="message.usage.", model=price.model,
                        style_of=lambda m: "anthropic")
        if not u.split_known:
            notes.append("some responses report cache writes without the 5m/1h split: priced as 5-minute writes")
        usage = Usage(u.input_tokens, u.cache_write_tokens, u.cache_read_tokens, u.output_tokens, u.write_5m_tokens,
                      u.write_1h_tokens)
        tname = _thread_of(rec)
        th = threads.setdefault(tname, _Thread())
        gap = ts - th.prev_time if ts is not None and th.prev_time is not None else None
        rin, rread, rw5, rw1 = _rates(price, usage.prompt_tokens)
        the_break: Break | None = None
        if th.prev_cached is None:
            lost = usage.cache_creation_input_tokens + usage.input_tokens
            causes: tuple[str, ...] = ("cold_start",)
            expected = 0
        else:
            expected = min(th.prev_cached, usage.prompt_tokens)
            lost = max(0, expected - usage.cache_read_input_tokens)
            causes = ()
            if lost >= max(1, price.min_cacheable_tokens):
                found = []
                if th.prev_model is not None and th.prev_model != price.model:
                    found.append("model_switch")
                if rec.keys.get("after_compaction") is not None:
                    found.append("compaction")
                if gap is not None and gap > th.ttl:
                    found.append("ttl_expired")
                causes = tuple(found) or ("unexplained",)
        if causes:
            # the lost tokens came as writes first (Claude Code writes all it sends), the rest as plain input
            lost_w = min(lost, usage.cache_creation_input_tokens)
            lost_i = min(lost - lost_w, usage.input_tokens)
            w_rate = rw1 if usage.cache_write_1h_tokens and not usage.cache_write_5m_tokens else rw5
            bcost = (lost_w * (w_rate - rread) + lost_i * (rin - rread)) / PER_MTOK
            saved = causes == ("ttl_expired",) and th.ttl <= TTL_5M and gap is not None and gap <= TTL_1H
            the_break = Break(
                source=rec.source, line=rec.line, timestamp=ts, thread=tname, cause=causes[0], causes=causes,
                detail=_detail(causes, gap, th.ttl, th.prev_model, price.model, rec, expected,
                               usage.cache_read_input_tokens),
                read_tokens=usage.cache_read_input_tokens, expected_read_tokens=expected, lost_tokens=lost_w + lost_i,
                cost_usd=round(bcost, 10), gap_s=gap, ttl_s=th.ttl, model=price.model, previous_model=th.prev_model,
                saved_by_1h=saved, after=rec.keys.get("after"))
            breaks.append(the_break)
        else:
            saved = False
        cost = cost_usd(price, usage)
        cost_1h = _cost_1h(price, usage, the_break if saved else None)
        calls.append(Call(
            source=rec.source, line=rec.line, timestamp=ts, thread=tname, model=price.model,
            message_id=rec.keys.get("message_id"), request_id=rec.keys.get("request_id"),
            input_tokens=usage.input_tokens, cache_read_tokens=usage.cache_read_input_tokens,
            cache_write_tokens=usage.cache_creation_input_tokens, cache_write_1h_tokens=usage.cache_write_1h_tokens,
            output_tokens=usage.output_tokens, gap_s=gap, cost_usd=round(cost, 10), cost_1h_usd=round(cost_1h, 10),
            break_cause=the_break.cause if the_break else None))
        th.prev_cached = usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        th.prev_model = price.model
        if ts is not None:
            th.prev_time = ts
        if usage.cache_creation_input_tokens:
            th.ttl = TTL_1H if usage.cache_write_1h_tokens and not usage.cache_write_5m_tokens else TTL_5M
    tin = sum(c.input_tokens for c in calls)
    tread = sum(c.cache_read_tokens for c in calls)
    twrite = sum(c.cache_write_tokens for c in calls)
    prompt = tin + tread + twrite
    return SessionAudit(
        session=name, sources=tuple(dict.fromkeys(c.source for c in calls)), threads=tuple(threads), calls=tuple(calls),
        breaks=tuple(breaks), input_tokens=tin, cache_read_tokens=tread, cache_write_tokens=twrite,
        output_tokens=sum(c.output_tokens for c in calls), hit_rate=tread / prompt if prompt else None,
        cost_usd=round(sum(c.cost_usd for c in calls), 10), cost_1h_usd=round(sum(c.cost_1h_usd for c in calls), 10),
        break_cost_usd=round(sum(b.cost_usd for b in breaks), 10), by_cause=_by_cause(breaks))


def _cost_1h(price: ModelPrice, usage: Usage, saved: Break | None) -> float:
    """The call under the 1-hour TTL: every write at the 1-hour rate; a break saved by it read instead."""
    inp, write, read = usage.input_tokens, usage.cache_creation_input_tokens, usage.cache_read_input_tokens
    if saved is not None:
        lost_w = min(saved.lost_tokens, write)
        lost_i = min(saved.lost_tokens - lost_w, inp)
        write -= lost_w
        inp -= lost_i
        read += lost_w + lost_i
    return cost_usd(price, Usage(inp, write, read, usage.output_tokens, 0, write))


def _minutes(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 5400 else f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def _detail(causes: tuple[str, ...], gap: float | None, ttl: float, prev_model: str | None, model: str, rec: Record,
            expected: int, read: int) -> str:
    parts = []
    for c in causes:
        if c == "cold_start":
            parts.append("the thread's first call")
        elif c == "model_switch":
            parts.append(f"model {prev_model} -> {model}")
        elif c == "compaction":
            parts.append(f"after a compaction ({rec.keys.get('after_compaction')})")
        elif c == "ttl_expired":
            parts.append(f"{_minutes(gap or 0.0)} since the previous call, past the {_minutes(ttl)} TTL")
        else:
            after = rec.keys.get("after")
            gap_s = f"{_minutes(gap)} after the previous call" if gap is not None else "no timestamp"
            parts.append(f"prefix rewritten mid-session: read {read:,} of {expected:,} cached tokens, {gap_s}, same "
                         "model, no compaction" + (f" (right after a {after})" if after else ""))
    return "; ".join(parts)


__all__ = ["CAUSES", "SCHEMA_VERSION", "Break", "Call", "CauseTotal", "SessionAudit", "TranscriptAudit",
           "audit_transcripts"]
