"""What provider prompt caching costs and saves.

Three entry points, one result type (:class:`CostReport`):

- :func:`audit_usage` prices logged responses exactly, from the usage counters the API reported
  (Anthropic's additive counters, OpenAI's inclusive ones).
- :func:`simulate_requests` replays canonical requests (:class:`cachectl.inputs.Request`) through a model of
  the provider's cache and predicts the counters each request would report. Anthropic: breakpoints, the
  minimum cacheable length, TTL expiry and refresh, the 20-position lookback, the invalidation hierarchy
  (tools -> system -> messages, with speed/web search/citations scoping system and messages, and
  tool_choice/images/thinking scoping messages), exact content identity, one cache per model. OpenAI before
  GPT-5.6: automatic caching of the token prefix (tools and structured-output schema first), at least 1,024
  tokens, in 128-token steps. OpenAI GPT-5.6 and later: an implicit breakpoint on the newest eligible message
  (``prompt_cache_options.mode = "implicit"``, the default) plus explicit ``prompt_cache_breakpoint`` markers,
  at most four writes a request (the implicit one and the latest three explicit ones; four explicit ones in
  explicit mode), reads that match a breakpoint exactly (no shorter unmarked prefix, no rounding) among the
  latest 80 breakpoints, the 30-minute TTL, writes at 1.25x input. Each request that misses says why; when the log carries the usage that was billed,
  each request is reconciled against it.
- :func:`what_if` builds a synthetic log (a fixed prefix, a varying suffix, N calls every D seconds).
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import math
import re
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import CachectlError, InputError, UsageError
from ...inputs.request import Position, Request, layout_request, unknown_block_note
from ...inputs.usage import LoggedUsage, find_usage, parse_usage, record_model
from .prices import (
    ModelPrice,
    PriceTable,
    Usage,
    call_day,
    cost_usd,
    priced_at,
    uncached_cost_usd,
    undated_note,
)

SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class MissReason:
    """Why a request read less than it could have."""

    code: str          # cold | content_changed | ttl_expired | lookback_exceeded | breakpoint_moved |
    #                    below_minimum | concurrent | no_breakpoint | scope_changed |
    #                    implicit_breakpoint_after_change | breakpoint_limit (OpenAI GPT-5.6+) |
    #                    thinking_stripped (Anthropic: a model that keeps only the last turn's thinking)
    detail: str
    path: str | None = None
    #: for content_changed: the kind of volatile value that changed there (date, id, counter ...), if any
    volatile: str | None = None


@dataclass(frozen=True, kw_only=True)
class Reconciliation:
    """Predicted counters beside the billed ones for one request."""

    billed: dict
    billed_cost_usd: float
    agree: bool
    predicted_outcome: str   # read | write | read+write | none
    billed_outcome: str
    reason: str | None = None


@dataclass(frozen=True, kw_only=True)
class RequestCost:
    index: int
    line: int | None
    model: str
    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens: int
    cache_creation: dict
    cost_usd: float
    uncached_cost_usd: float
    timestamp: float | None = None
    #: the counters in the provider's own convention (OpenAI: prompt_tokens includes cached_tokens)
    usage_reported: dict = field(default_factory=dict)
    note: str | None = None
    miss: MissReason | None = None
    reconciliation: Reconciliation | None = None


@dataclass(frozen=True)
class Finding:
    """A cache problem the simulation itself sees across requests."""

    code: str          # write_never_read | ttl_gap | breakpoint_after_volatile
    message: str
    count: int
    lines: tuple[int, ...] = ()
    tokens: int = 0
    cost_usd: float = 0.0


@dataclass(frozen=True, kw_only=True)
class CostReport:
    schema_version: int = SCHEMA_VERSION
    mode: str                      # audit | simulate | what-if
    estimate: bool                 # token counts came from a tokenizer or count_tokens, not a bill
    token_source: str
    requests: tuple[RequestCost, ...]   # empty when simulated with keep_requests=False
    total_cost_usd: float
    uncached_cost_usd: float
    savings_usd: float
    hit_rate: float | None         # cache-read share of all prompt tokens
    totals: dict
    models: tuple[str, ...]
    notes: tuple[str, ...] = ()
    break_even_reads: int | None = None
    findings: tuple[Finding, ...] = ()
    #: with logged usage: how many requests were reconciled, and how many of them agree
    reconciled: int = 0
    agreed: int = 0
    billed_cost_usd: float | None = None
    #: ``(miss code, requests, their input_tokens)`` per miss code, most requests first (then by code): the
    #: misses in a few numbers, kept when the rows are not (``keep_requests=False``)
    miss_tallies: tuple[tuple[str, int, int], ...] = ()


class _FloatSum:
    """A running float sum equal to the builtin ``sum`` of the same floats in the same order: plain addition up
    to Python 3.11, Neumaier's compensated addition from 3.12 (as ``sum`` does there). A streamed total is then
    the very total of the rows."""

    __slots__ = ("hi", "lo")

    def __init__(self) -> None:
        self.hi = 0.0
        self.lo = 0.0

    def add(self, x: float) -> None:
        if sys.version_info < (3, 12):
            self.hi += x
            return
        t = self.hi + x
        if abs(self.hi) >= abs(x):
            self.lo += (self.hi - t) + x
        else:
            self.lo += (x - t) + self.hi
        self.hi = t

    @property
    def value(self) -> float:
        return self.hi + self.lo if self.lo and math.isfinite(self.lo) else self.hi


class _Notes(dict):
    """Notes in the order first said, each once (a note said on every request is kept once)."""

    def append(self, note: str) -> None:
        self[note] = None


_TOTALS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")


class _Tally:
    """What a report sums over its rows, one row at a time: the rows themselves need not be kept."""

    def __init__(self, keep_requests: bool = True) -> None:
        self.rows: list[RequestCost] | None = [] if keep_requests else None
        self.count = 0
        self.totals = dict.fromkeys((*_TOTALS, "ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens"), 0)
        self.cost = _FloatSum()
        self.uncached = _FloatSum()
        self.billed = _FloatSum()
        self.models: dict[str, None] = {}
        self.reconciled = 0
        self.agreed = 0
        self.misses: dict[str, list[int]] = {}
        self.first_model: str | None = None
        self.scope_changed = False

    def add(self, r: RequestCost) -> None:
        if self.rows is not None:
            self.rows.append(r)
        if self.first_model is None:
            self.first_model = r.model
        self.count += 1
        t = self.totals
        for k in _TOTALS:
            t[k] += getattr(r, k)
        t["ephemeral_5m_input_tokens"] += r.cache_creation.get("ephemeral_5m_input_tokens", 0)
        t["ephemeral_1h_input_tokens"] += r.cache_creation.get("ephemeral_1h_input_tokens", 0)
        self.cost.add(r.cost_usd)
        self.uncached.add(r.uncached_cost_usd)
        self.models[r.model] = None
        if r.reconciliation is not None:
            self.reconciled += 1
            self.agreed += r.reconciliation.agree
            self.billed.add(r.reconciliation.billed_cost_usd)
        if r.miss is not None:
            m = self.misses.setdefault(r.miss.code, [0, 0])
            m[0] += 1
            m[1] += r.input_tokens
            self.scope_changed = self.scope_changed or r.miss.code == "scope_changed"

    @property
    def disagreed(self) -> bool:
        return self.agreed < self.reconciled

    def report(self, mode: str, *, estimate: bool, token_source: str, notes: Iterable[str] = (),
               break_even: int | None = None, findings: Iterable[Finding] = ()) -> CostReport:
        totals = dict(self.totals)
        prompt = totals["input_tokens"] + totals["cache_creation_input_tokens"] + totals["cache_read_input_tokens"]
        total, uncached = self.cost.value, self.uncached.value
        tallies = tuple((code, n, tokens) for code, (n, tokens) in
                        sorted(self.misses.items(), key=lambda kv: (-kv[1][0], kv[0])))
        return CostReport(mode=mode, estimate=estimate, token_source=token_source,
                          requests=tuple(self.rows) if self.rows is not None else (),
                          total_cost_usd=round(total, 10), uncached_cost_usd=round(uncached, 10),
                          savings_usd=round(uncached - total, 10),
                          hit_rate=(totals["cache_read_input_tokens"] / prompt) if prompt else None, totals=totals,
                          models=tuple(self.models), notes=tuple(dict.fromkeys(notes)),
                          break_even_reads=break_even, findings=tuple(findings), reconciled=self.reconciled,
                          agreed=self.agreed,
                          billed_cost_usd=round(self.billed.value, 10) if self.reconciled else None,
                          miss_tallies=tallies)


def _row(index: int, line: int | None, price: ModelPrice, usage: Usage, *, timestamp: float | None = None,
         reported: dict | None = None, note: str | None = None, miss: MissReason | None = None,
         reconciliation: Reconciliation | None = None, batch: bool = False) -> RequestCost:
    return RequestCost(
        index=index, line=line, model=price.model, input_tokens=usage.input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens, output_tokens=usage.output_tokens,
        cache_creation={"ephemeral_5m_input_tokens": usage.cache_write_5m_tokens,
                        "ephemeral_1h_input_tokens": usage.cache_write_1h_tokens},
        cost_usd=round(cost_usd(price, usage, batch=batch), 10),
        uncached_cost_usd=round(uncached_cost_usd(price, usage, batch=batch), 10), timestamp=timestamp, usage_reported=reported or {}, note=note, miss=miss, reconciliation=reconciliation)


def _openai_reported(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cache_read_input_tokens,
                                      "cache_write_tokens": usage.cache_creation_input_tokens}}


def _as_usage(u: LoggedUsage) -> Usage:
    return Usage(u.input_tokens, u.cache_write_tokens, u.cache_read_tokens, u.output_tokens, u.write_5m_tokens,
                 u.write_1h_tokens)


# ----------------------------------------------------------------------------------------------- audit


def _is_request_line(value: dict) -> bool:
    """A request body, bare or in a ``{timestamp, body}`` wrapper, that carries no response or usage."""
    from ...inputs import is_request_body, unwrap

    if "usage" in value or isinstance(value.get("response"), dict):
        return False
    body, _, _ = unwrap(value)
    return is_request_body(body) or any(k in value for k in ("messages", "blocks", "input"))


def usage_from_record(value: Any, *, default_model: str | None, table: PriceTable, source: str,
                      line: int | None, model_as: str | None = None,
                      notes: list[str] | _Notes | None = None) -> tuple[ModelPrice, LoggedUsage]:
    """Read one logged response (Anthropic, OpenAI chat or Responses, a wrapper, or a bare usage object)."""
    where: dict[str, Any] = {"source": source, "line": line}
    if not isinstance(value, dict):
        raise InputError("expected a JSON object (a response or its usage)", **where)
    if _is_request_line(value):
        raise InputError("this is a request, not a response: `usage` audits logged responses; simulate "
                         "request logs with `requests`", **where)
    usage, path, rec = find_usage(value)
    if usage is None:
        raise InputError("neither a response nor a usage object (no 'usage' field)", **where)
    model_name, field = record_model(value, rec)
    model_name = model_name or default_model
    if not model_name:
        raise InputError("no model on this line; pass `default_model`", **where)
    if not isinstance(model_name, str):
        raise InputError("expected a string", field=field, **where)
    price = _lookup(table, model_name, source, line, model_as, notes)
    logged = parse_usage(usage, source=source, line=line, path=path, model=price.model,
                         style_of=lambda m: price.usage_style)
    return price, logged


def _lookup(table: PriceTable, model: str, source: str, line: int | None, model_as: str | None = None,
            notes: list[str] | _Notes | None = None) -> ModelPrice:
    """The price entry of a line's model; an unknown model is an error located at the line, or, with
    ``model_as``, priced as that model with a note."""
    from .prices import UnknownModelError

    try:
        return table.lookup(model)
    except UnknownModelError as exc:
        if model_as is None:
            raise InputError(str(exc), source=source, line=line, field="model") from None
    price = table.lookup(model_as)
    if notes is not None:
        shown = model if len(model) <= 80 else f"{model[:60]}... ({len(model):,} characters)"
        notes.append(f"{shown!r} is not in the price table: priced as {price.model}, with its cache rules "
                     "(`model_as`)")
    return price


def _dated(price: ModelPrice, when: float | None, notes: list[str] | _Notes) -> ModelPrice:
    """The rates in force on the day of a call (:func:`~.prices.priced_at`), with a note when they are not
    today's, or when a call without a date is priced at today's rates of a model whose price changed."""
    dated, note = priced_at(price, when)
    if note is not None:
        notes.append(note)
    elif price.price_sets and call_day(when) is None:
        notes.append(undated_note(price))
    return dated


def record_time(value: Any, timestamps: Callable[[Any], float | None] | None = None) -> float | None:
    """When a logged response was made: its line's ``timestamp`` (a log wrapper's, read by ``timestamps``: the
    run's reader, with its ``--time-unit`` and ``--time-zone``), else the response's own ``created_at`` (Responses
    API) or ``created`` (Chat Completions), epoch seconds; None when it gives none that can be read (the call is
    then priced at today's rates, with a note)."""
    from ...inputs.timestamps import parse_timestamp

    _, _, rec = find_usage(value)
    for key in ("timestamp", "created_at", "created"):
        if rec.get(key) is not None:
            try:
                return (timestamps if timestamps is not None and key == "timestamp" else parse_timestamp)(rec[key])
            except ValueError:
                return None
    return None


def is_batch_line(value: Any) -> bool:
    """A call made through a provider's Batch API: a record a batch shape marked (``"batch": true``), an OpenAI
    Batch output line (``custom_id`` with a ``response``) or input line (``custom_id``, ``url`` and a ``body``
    object: ``fix`` reads those as they stand)."""
    return isinstance(value, dict) and (value.get("batch") is True or (
        "custom_id" in value and isinstance(value.get("response"), dict)) or (
        isinstance(value.get("body"), dict) and _batch_input(value)))


def is_batch_request(req: Request) -> bool:
    """:func:`is_batch_line` for a parsed request (its ``meta``: the wrapper's keys and the body's)."""
    meta = req.meta
    return meta.get("batch") is True or (req.body_path == "body." and _batch_input(meta))


def _batch_input(wrapper: Any) -> bool:
    """The keys of an OpenAI Batch input line around its ``body`` (the shape's own test:
    :mod:`cachectl.inputs.formats.openai_batch_input`)."""
    return "custom_id" in wrapper and "url" in wrapper


def _batch_note(price: ModelPrice) -> str:
    if price.batch_discount is None:
        return (f"{price.model}: Batch API calls priced at the standard rates: the price table has no batch rate "
                "for it (add batch_discount with `prices`)")
    return (f"{price.model}: Batch API calls priced at {price.batch_discount:g}x the standard rates (cache reads "
            "and writes included)")


_SPLIT_NOTE = ("some lines report cache writes without the cache_creation split: priced as 5-minute writes "
               "(1-hour writes cost 2x base input, not 1.25x)")


def audit_usage(records: Iterable[tuple[int, Any]], *, source: str, table: PriceTable,
                default_model: str | None = None, model_as: str | None = None, keep_requests: bool = True,
                on_request: Callable[[RequestCost], None] | None = None,
                timestamps: Callable[[Any], float | None] | None = None) -> CostReport:
    """Price logged responses exactly from their usage counters (writes at the model's write rate: OpenAI's
    ``cache_write_tokens`` at 1.25x input on GPT-5.6+). ``model_as``: the model to price a line's unknown model
    as (said in a note), instead of an error. ``on_request`` sees each row as it is priced; with
    ``keep_requests=False`` the report keeps none (its ``requests`` is empty, all else the same). ``timestamps``:
    the run's reader of the lines' times, which date the prices (:func:`record_time`)."""
    tally = _Tally(keep_requests)
    notes = _Notes()
    for index, (line, value) in enumerate(records):
        price, logged = usage_from_record(value, default_model=default_model, table=table, source=source,
                                          line=line, model_as=model_as, notes=notes)
        price = _dated(price, record_time(value, timestamps), notes)
        if not logged.split_known:
            notes.append(_SPLIT_NOTE)
        batch = is_batch_line(value)
        if batch:
            notes.append(_batch_note(price))
        row = _row(index, line, price, _as_usage(logged), reported=logged.reported, batch=batch)
        tally.add(row)
        if on_request is not None:
            on_request(row)
    if not tally.count:
        raise InputError("no responses", source=source)
    return tally.report("audit", estimate=False, token_source="usage counters", notes=notes)


# --------------------------------------------------------------------------------------------- durations

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")


def parse_duration(text: str) -> float:
    """``90``, ``30s``, ``2m``, ``1h`` -> seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise UsageError(f"cannot read duration {text!r} (examples: 30s, 2m, 1h)")
    n = float(m.group(1))
    return n * {"ms": 0.001, "s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]


# ------------------------------------------------------------------------------------------ token counts


#: about how many bytes :class:`TextTokens` spends on memoized token IDs (the texts seen last). ``report``
#: simulates the provider cache twice, far apart: its provider section, then the sweep over the fixed versions,
#: whose unchanged texts are the section's (in one process; with two, each keeps its own memo). At 8 MB with the
#: texts themselves kept, 20,000 requests of the bench's log (about 40,000 distinct texts) encoded every text
#: twice (79,607 encodes, 41,018 at 32 MB; docs/benchmarks.md). A text is now kept by its digest: 16 MB hold
#: more texts than 32 did.
TEXT_TOKENS_MEMO_BYTES = 16 << 20


class TextTokens:
    """Token counts (and IDs, for OpenAI's token-prefix caching) of position texts from a local tokenizer.

    The IDs of the texts seen last are memoized (a conversation's history comes back on every turn) in about
    ``memo_bytes`` (its IDs at 4 bytes each, and 200 bytes of bookkeeping each: a text is kept by a 16-byte
    digest of it, not itself), the least recently used dropped first: memory bounded however long the log. One
    counter may serve several threads (a sweep's provider simulations share one): the memo is read and changed
    under a lock, texts are encoded outside it."""

    def __init__(self, tokenizer: Any, memo_bytes: int = TEXT_TOKENS_MEMO_BYTES) -> None:
        self._tok = tokenizer
        self._cache: OrderedDict[bytes, array] = OrderedDict()
        self._held = 0
        self._limit = memo_bytes
        self._lock = threading.Lock()
        #: texts encoded (a memo miss each)
        self.encoded = 0

    @staticmethod
    def _size(ids: array) -> int:
        return 4 * len(ids) + 200

    @staticmethod
    def _digest(text: str) -> bytes:
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def ids(self, text: str) -> Sequence[int]:
        key = self._digest(text)
        with self._lock:
            got = self._cache.get(key)
            if got is not None:
                self._cache.move_to_end(key)
                return got
        got = array("I", self._tok.backend.encode(text, add_special_tokens=False).ids)
        with self._lock:
            self._keep(key, got)
        return got

    def _keep(self, key: bytes, got: array) -> None:
        """Count a text encoded and keep its IDs, the least recently used let go past the bound (under the lock)."""
        self.encoded += 1
        size = self._size(got)
        if size <= self._limit // 8:  # a huge text is counted, not kept
            if key not in self._cache:  # (another thread may have kept it meanwhile)
                self._cache[key] = got
                self._held += size
            while self._held > self._limit:
                _, old = self._cache.popitem(last=False)
                self._held -= self._size(old)

    def count(self, text: str) -> int:
        return len(self.ids(text))

    def prime_requests(self, requests: Iterable[Request | None]) -> None:
        """:meth:`prime` with the texts a simulation of ``requests`` asks for: their positions without a token count
        (a request given twice, once; None skipped)."""
        distinct = {id(req): req for req in requests if req is not None}
        self.prime(p.text for req in distinct.values() for p in req.positions if p.tokens is None)

    def prime(self, texts: Iterable[str]) -> None:
        """Encode, in one batch, those of ``texts`` the memo does not hold yet, and keep them there: a sweep that
        is about to simulate many requests asks for their position texts first. The tokenizer encodes a batch of
        the bench log's position texts in about 30 us a text against 46 one at a time (docs/benchmarks.md). The
        IDs are the same as :meth:`ids` gives; a text too large to keep is left to it."""
        todo: dict[bytes, str] = {}
        with self._lock:
            for text in texts:
                key = self._digest(text)
                if key not in self._cache and key not in todo and 4 * len(text) + 200 <= self._limit // 8:
                    todo[key] = text
        if not todo:
            return
        encoded = self._tok.backend.encode_batch(list(todo.values()), add_special_tokens=False)
        with self._lock:
            for key, enc in zip(todo, encoded):
                self._keep(key, array("I", enc.ids))


def tokenizer_counter(tokenizer: Any) -> TextTokens:
    return TextTokens(tokenizer)


#: the most tokens a count_tokens answer may give (the largest context windows hold some 10**7)
MAX_API_COUNT = 10**9


def api_counter(client: Any) -> Callable[[Request, int, str], int]:
    """Cumulative token counts from ``client.messages.count_tokens`` on the request cut after a position.

    A cut inside tools or system has no messages; the API needs one, so a one-character user message is
    added and its own count (measured once per model) subtracted. Counts are memoized per prefix key.
    """
    memo: dict[tuple[str, int, str], int] = {}
    baseline: dict[str, int] = {}
    filler = [{"role": "user", "content": "."}]

    def call(model: str, **kwargs) -> int:
        try:
            answer = client.messages.count_tokens(model=model, **kwargs)
        except ValueError as exc:  # (the SDK reading an answer that is not JSON; its own errors pass through)
            raise CachectlError(f"the count_tokens API answered what is not a token count ({type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:120]})") from None
        got = getattr(answer, "input_tokens", None)
        if type(got) is not int or not 0 <= got <= MAX_API_COUNT:  # (the SDK's model takes any JSON value there)
            raise CachectlError(f"the count_tokens API answered input_tokens {got!r:.60}, not a token count (an "
                                f"integer from 0 to {MAX_API_COUNT:,}): is ANTHROPIC_BASE_URL the Anthropic API?")
        return got

    def count(req: Request, k: int, key: str) -> int:
        model = str(req.model)
        memo_key = (model, k, key)
        if memo_key in memo:
            return memo[memo_key]
        body = req.body
        n_tools = sum(1 for p in req.positions if p.segment == "tools")
        n_system = sum(1 for p in req.positions if p.segment == "system")
        kwargs: dict[str, Any] = {}
        tools = body.get("tools") or []
        system = body.get("system")
        if isinstance(system, str):
            system = [{"type": "text", "text": system}] if system else []
        if k < n_tools:
            kwargs["tools"] = tools[:k + 1]
        else:
            if tools:
                kwargs["tools"] = tools
            if system:
                kwargs["system"] = system[:max(0, k + 1 - n_tools)]
        if k < n_tools + n_system:
            if model not in baseline:
                baseline[model] = call(model, messages=filler)
            n = call(model, messages=filler, **kwargs) - baseline[model]
        else:
            kwargs["messages"] = _messages_upto(body["messages"], req.positions[k])
            for param in ("tool_choice", "thinking"):
                if body.get(param) is not None:
                    kwargs[param] = body[param]
            n = call(model, **kwargs)
        memo[memo_key] = n
        return n

    return count


_MSG_PATH = re.compile(r"messages\[(\d+)\](?:\.content\[(\d+)\])?")


def _messages_upto(messages: list, pos: Position) -> list:
    """The messages up to and including position ``pos`` (a whole run of tool_use/tool_result blocks)."""
    m = _MSG_PATH.match(pos.last_path or pos.path)
    assert m is not None
    i = int(m.group(1))
    out = [dict(x) for x in messages[:i + 1]]
    if m.group(2) is not None and isinstance(out[i].get("content"), list):
        out[i]["content"] = out[i]["content"][:int(m.group(2)) + 1]
    return out


# ------------------------------------------------------------------------------------------- hashing


def _h(*parts: str) -> str:
    return hashlib.blake2b("\x00".join(parts).encode(), digest_size=16).hexdigest()


#: the kinds of Anthropic position that hold a thinking block
THINKING_KINDS = ("thinking", "redacted_thinking")


def as_the_model_sees_it(req: Request, price: ModelPrice) -> Request:
    """``req`` as ``price.model`` holds it in its context, and so in its cached prefix: for a model that keeps only
    the last assistant turn's thinking (``prior_thinking`` "last_turn": Opus 4.1 and earlier, Sonnet 4.5 and
    earlier, Haiku through 4.5), without the thinking blocks before the last user block that is not a tool result
    (the API strips them: the provider's extended-thinking and prompt-caching pages); ``req`` itself otherwise."""
    if price.prior_thinking != "last_turn" or req.provider != "anthropic":
        return req
    ps = req.positions
    last = -1
    for i, p in enumerate(ps):
        if p.segment == "messages" and p.role == "user" and p.kind != "tool_result":
            last = i
    drop = {i for i in range(last) if ps[i].kind in THINKING_KINDS and ps[i].role == "assistant"}
    if not drop:
        return req
    return replace(req, positions=tuple(p for i, p in enumerate(ps) if i not in drop),
                   stripped_thinking=tuple(ps[i] for i in sorted(drop)))


def chain_keys(model: str, req: Request) -> list[str]:
    """The key of each position's prefix: a hash chain over exact content, with the Anthropic scopes folded
    in where their level starts (system scope before the first non-tool position, messages scope before the
    first message position), so that a scope change invalidates that level and everything after it."""
    keys = []
    h = _h("model", model)
    system_done = messages_done = False
    for p in req.positions:
        if not system_done and p.segment != "tools":
            h = _h(h, "scope-system", req.scope_system)
            system_done = True
        if not messages_done and p.segment == "messages":
            h = _h(h, "scope-messages", req.scope_messages)
            messages_done = True
        h = _h(h, p.identity)
        keys.append(h)
    return keys


# ------------------------------------------------------------------------------------------ simulation


@dataclass(slots=True)
class _Entry:
    expires: float
    ttl: float
    available_from: float
    line: int | None
    path: str
    tokens: int
    written_cost: float = 0.0
    reads: int = 0
    #: the deadline of its item in the simulator's expiry heap (at most ``expires``)
    heaped: float = 0.0


@dataclass
class _Seen:
    """The last request of a model: its keys and positions, to say where the next one diverged."""

    keys: list[str]
    positions: tuple[Position, ...]
    line: int | None
    writes: list[int]        # indices where it wrote entries
    scope_system: str = ""
    scope_messages: str = ""
    #: OpenAI GPT-5.6+: breakpoints the write limit left unwritten, and where the implicit breakpoint sat
    dropped: tuple[int, ...] = ()
    implicit_at: int | None = None
    marked: tuple[int, ...] = ()


class CacheSimulator:
    """A provider's prompt cache: entries keyed by the hash chain of the prefix, one namespace per model.

    Its memory is the live entries: :meth:`advance` (called before each request) drops every entry whose TTL ran
    out, keeping only when it expired (for the ``ttl_expired`` miss reason) and, for a write never read, a
    count, its tokens and its line."""

    def __init__(self, table: PriceTable, source: str | None = None):
        self.table = table
        self.source = source
        self.entries: dict[str, _Entry] = {}
        self.expired: dict[str, float] = {}      # key -> when it expired (for the TTL miss reason)
        self.last: dict[str, _Seen] = {}
        #: explicit writes (with a path) that expired unread: how many, their tokens, their lines
        self.never_read = 0
        self.never_read_tokens = 0
        self.never_read_lines: array = array("q")
        self._deadlines: list[tuple[float, str]] = []   # (expiry, key): one per live entry, a heap

    def _put(self, key: str, entry: _Entry) -> None:
        old = self.entries.get(key)
        if old is not None and old.heaped <= entry.expires:
            entry.heaped = old.heaped  # the old item comes up first, and moves on to the new deadline
        else:
            entry.heaped = entry.expires
            heapq.heappush(self._deadlines, (entry.expires, key))
        self.entries[key] = entry
        self.expired.pop(key, None)

    def _expire(self, key: str, e: _Entry) -> None:
        del self.entries[key]
        self.expired[key] = e.expires
        if e.reads == 0 and e.path:
            self.never_read += 1
            self.never_read_tokens += e.tokens
            if e.line is not None:
                self.never_read_lines.append(e.line)

    def advance(self, t: float) -> None:
        """Drop the entries expired by time ``t``."""
        heap = self._deadlines
        while heap and heap[0][0] <= t:
            when, key = heapq.heappop(heap)
            e = self.entries.get(key)
            if e is None or e.heaped != when:
                continue  # the item of an entry gone or replaced
            if e.expires <= t:
                self._expire(key, e)
            else:  # refreshed since: it stays, under its new deadline
                e.heaped = e.expires
                heapq.heappush(heap, (e.expires, key))

    def _previous(self, req: Request, keys: list[str]) -> tuple[_Seen | None, int]:
        """The previous request of ``req``'s model, and how many leading positions it shares with ``req``."""
        prev = self.last.get(str(req.model))
        if prev is None:
            return None, 0
        same = 0
        while same < min(len(keys), len(prev.keys)) and keys[same] == prev.keys[same]:
            same += 1
        return prev, same

    def _alive(self, key: str, t: float) -> _Entry | None:
        e = self.entries.get(key)
        if e is None:
            return None
        if e.expires <= t:
            self._expire(key, e)
            return None
        # readable only once the writing request has started (parallel twins both miss)
        return e if e.available_from < t else None

    # ---------------------------------------------------------------------------- Anthropic (explicit)

    def explicit(self, req: Request, price: ModelPrice, keys: list[str], cum: Sequence[int],
                 t: float) -> tuple[Usage, str | None, MissReason | None, list[int]]:
        bps = [(i, p.ttl) for i, p in enumerate(req.positions) if p.ttl is not None]
        if req.auto_ttl is not None and req.positions and (not bps or bps[-1][0] != len(req.positions) - 1):
            bps.append((len(req.positions) - 1, req.auto_ttl))  # automatic caching: the last block, one slot
        if req.marker_count > price.max_breakpoints:
            raise req.error(f"{req.marker_count} cache_control breakpoints; {price.model} allows at most "
                            f"{price.max_breakpoints} (the API rejects the request)")
        seen_5m = False
        for i, ttl in bps:
            if ttl == "5m":
                seen_5m = True
            elif seen_5m:
                raise req.error("a 1h cache_control breakpoint comes after a 5m one; 1h entries must come first",
                                req.positions[i].cache_path)
        total = cum[-1] if cum else 0
        cacheable = [(i, ttl) for i, ttl in bps if cum[i] >= price.min_cacheable_tokens]
        note = None
        if bps and not cacheable:
            note = (f"prefix at the breakpoint below {price.model}'s minimum of {price.min_cacheable_tokens} "
                    "tokens: nothing cached")
        hit = -1
        for i, _ in cacheable:  # each breakpoint looks back over at most `lookback` positions
            for j in range(i, max(-1, i - price.lookback_blocks), -1):
                e = self._alive(keys[j], t)
                if e is not None:
                    e.expires = t + e.ttl  # a hit refreshes the TTL for free
                    e.reads += 1
                    hit = max(hit, j)
                    break
        miss = None
        if not bps:
            miss = MissReason("no_breakpoint", "no cache_control breakpoint: nothing is written or read")
        elif not cacheable:
            miss = MissReason("below_minimum", note or "")
        elif hit < max(i for i, _ in cacheable):
            miss = self._why_explicit(req, price, keys, [i for i, _ in cacheable], hit, t)
        a = cum[hit] if hit >= 0 else 0
        after = [(i, ttl) for i, ttl in cacheable if cum[i] > a]
        b = max((cum[i] for i, ttl in after if ttl == "1h"), default=a)
        c = max((cum[i] for i, _ in after), default=a)
        written = []
        for i, ttl in after:
            secs = price.ttl_seconds(ttl)
            self._put(keys[i], _Entry(expires=t + secs, ttl=secs, available_from=t, line=req.line,
                                      path=req.positions[i].path, tokens=cum[i]))
            written.append(i)
        usage = Usage(input_tokens=total - max(a, c), cache_creation_input_tokens=c - a, cache_read_input_tokens=a,
                      output_tokens=req.output_tokens or 0, cache_write_5m_tokens=c - b, cache_write_1h_tokens=b - a)
        return usage, note, miss, written

    def _why_explicit(self, req: Request, price: ModelPrice, keys: list[str], bps: list[int], hit: int,
                      t: float) -> MissReason | None:
        """Why the last breakpoint was not read: the first rule of the provider's that explains it (None: it read
        all it shares with the previous request, and what it did not read is new)."""
        top = max(bps)
        for j in range(top, hit, -1):
            k = keys[j]
            e = self.entries.get(k)
            if e is not None and e.available_from >= t:
                return MissReason("concurrent", f"the entry at {req.positions[j].path} was written by a request that "
                                  f"started at the same time{'' if e.line is None else f' (line {e.line:,})'}: it is readable only once that "
                                  "response has begun", req.positions[j].path)
            if e is not None and e.expires > t:
                near = min((i for i in bps if i >= j), default=top)
                return MissReason("lookback_exceeded", f"an entry exists at {req.positions[j].path}, "
                                  f"{near - j + 1} positions before the breakpoint at {req.positions[near].path}: "
                                  f"beyond the {price.lookback_blocks}-position lookback", req.positions[j].path)
            if k in self.expired:
                gone = self.expired[k]
                return MissReason("ttl_expired", f"the entry at {req.positions[j].path} expired {t - gone:,.0f}s "
                                  "before this request (TTL ran out between requests)", req.positions[j].path)
        prev, same = self._previous(req, keys)
        if prev is None:
            return MissReason("cold", "first request for this model in the log: nothing cached yet")
        if same > top:  # the content up to the breakpoint is the previous request's: entries sit elsewhere
            where = ", ".join(prev.positions[w].path for w in prev.writes) or "nowhere"
            return MissReason("breakpoint_moved", f"the prefix up to {req.positions[top].path} is the same as line "
                              f"{prev.line}'s, but that request wrote its entries at {where} (entries are written "
                              "only at breakpoints)", req.positions[top].path)
        if hit >= 0 and same == len(prev.keys) and hit >= same - 1:
            return None  # a growing conversation: it read all of the previous request, and writes what is new
        return _changed(req, prev, same)

    # ---------------------------------------------------------------------------- OpenAI (automatic)

    def automatic(self, req: Request, price: ModelPrice, keys: list[str],
                  pieces: list[tuple[str, Sequence[int] | None, int]],
                  t: float) -> tuple[Usage, str | None, MissReason | None]:
        """Cached tokens = the longest stored token prefix, >= the minimum, in ``cache_granularity`` steps."""
        total = sum(n for _, _, n in pieces)
        g = max(1, price.cache_granularity)
        bounds = _token_keys(str(req.model), req, pieces, price.min_cacheable_tokens, g)
        cached = 0
        for n, k in reversed(bounds):
            if self._alive(k, t) is not None:
                cached = n
                break
        note = None if total >= price.min_cacheable_tokens else \
            f"prompt below {price.model}'s minimum of {price.min_cacheable_tokens} tokens: not cached"
        miss = None
        full = bounds[-1][0] if bounds else 0
        if total < price.min_cacheable_tokens:
            miss = MissReason("below_minimum", note or "")
        elif cached < full:
            miss = self._why_automatic(req, price, keys, bounds, cached, t)
        ttl = float(next(iter(price.ttls.values())))
        for n, k in bounds:
            e = self.entries.get(k)
            if e is not None and e.expires > t:
                e.expires = t + e.ttl  # refreshed by use
                if n <= cached:
                    e.reads += 1
            else:
                self._put(k, _Entry(expires=t + ttl, ttl=ttl, available_from=t, line=req.line, path="", tokens=n))
        return Usage(total - cached, 0, cached, req.output_tokens or 0, 0, 0), note, miss

    def _why_automatic(self, req: Request, price: ModelPrice, keys: list[str], bounds: list[tuple[int, str]],
                       cached: int, t: float) -> MissReason:
        for n, k in reversed(bounds):
            if n <= cached:
                break
            e = self.entries.get(k)
            if e is not None and e.available_from >= t:
                return MissReason("concurrent", f"the prefix of {n:,} tokens was written by a request that started "
                                  f"at the same time (line {e.line})")
            if k in self.expired:
                return MissReason("ttl_expired", f"the cached prefix of {n:,} tokens expired {t - self.expired[k]:,.0f}s "
                                  "before this request")
        prev, same = self._previous(req, keys)
        if prev is None:
            return MissReason("cold", "first request for this model in the log: nothing cached yet")
        if same >= len(keys):
            return MissReason("content_changed", "the request extends the previous one only past the cached prefix")
        return _changed(req, prev, same)

    # ----------------------------------------------------------------- OpenAI GPT-5.6+ (breakpoints)

    def breakpoints(self, req: Request, price: ModelPrice, keys: list[str], cum: Sequence[int],
                    t: float) -> tuple[Usage, str | None, MissReason | None, list[int], dict]:
        """One request under OpenAI's GPT-5.6+ rules. Returns the usage, a note, the miss reason, the positions
        written, and what :meth:`remember` keeps for the next request's miss reason."""
        mode = req.cache_mode or "implicit"
        layout = req.provider == "layout"
        explicit = [i for i, p in enumerate(req.positions)
                    if (p.ttl is not None if layout else p.cache_breakpoint is not None)]
        implicit = None
        if mode == "implicit":
            implicit = len(req.positions) - 1 if layout and req.positions else req.implicit_at
        default_ttl = req.cache_ttl or next(iter(price.ttls))

        def ttl_of(i: int) -> str:
            p = req.positions[i]
            given = p.cache_breakpoint or (p.ttl if layout and p.ttl in price.ttls else None)
            name = given or default_ttl
            if name not in price.ttls:
                raise req.error(f"cache TTL {name!r:.40}: {price.model} accepts {', '.join(price.ttls)} (the API "
                                "rejects the request)", p.cache_path or ("prompt_cache_options.ttl" if
                                                                           req.cache_ttl else None))
            return name

        marks = sorted(set(explicit) | ({implicit} if implicit is not None else set()))
        for i in marks:
            ttl_of(i)
        total = cum[-1] if cum else 0
        out = req.output_tokens or 0
        keep: dict = {"implicit_at": implicit, "marked": tuple(explicit)}
        if not marks:
            detail = ("prompt_cache_options.mode is \"explicit\" and no content block carries a "
                      "prompt_cache_breakpoint: nothing is cached (and nothing written)" if mode == "explicit" else
                      "no message for the implicit breakpoint and no prompt_cache_breakpoint: nothing is cached")
            return Usage(total, 0, 0, out), None, MissReason("no_breakpoint", detail), [], keep
        minimum = price.min_cacheable_tokens
        cacheable = [i for i in marks if cum[i] >= minimum]
        note = None
        if not cacheable:
            note = (f"prefix at every breakpoint below {price.model}'s minimum of {minimum:,} tokens: nothing "
                    "cached")
        # reads: the longest prefix written at a breakpoint, among the latest `lookback` breakpoints of the
        # conversation (this request's own, and those earlier requests wrote on the prefix it shares)
        known = sorted({*marks, *(j for j, k in enumerate(keys) if k in self.entries or k in self.expired)})
        window = known[-price.lookback_blocks:] if price.lookback_blocks else known
        hit = -1
        for j in reversed(window):
            if cum[j] < minimum:
                break
            e = self._alive(keys[j], t)
            if e is not None:
                if price.read_refreshes_ttl:
                    e.expires = max(e.expires, t + e.ttl)
                e.reads += 1
                hit = j
                break
        a = cum[hit] if hit >= 0 else 0
        miss = MissReason("below_minimum", note or "") if not cacheable else \
            self._why_breakpoints(req, price, keys, hit, t, window)
        # writes: this request's breakpoints past what it read, at most `max_breakpoints` of them: the implicit
        # one takes a slot, then the latest explicit ones
        new = [i for i in cacheable if cum[i] > a]
        slots = price.max_breakpoints
        chosen: list[int] = []
        if implicit is not None and implicit in new:
            chosen.append(implicit)
            slots -= 1
        rest = [i for i in new if i != implicit]
        keep_explicit = rest[len(rest) - slots:] if slots > 0 else []
        dropped = [i for i in rest if i not in keep_explicit]
        chosen += keep_explicit
        written = sorted(chosen)
        for i in written:
            secs = price.ttl_seconds(ttl_of(i))
            self._put(keys[i], _Entry(expires=t + secs, ttl=secs, available_from=t, line=req.line,
                                      path=req.positions[i].path, tokens=cum[i]))
        c = max((cum[i] for i in written), default=a)
        keep["dropped"] = tuple(dropped)
        usage = Usage(input_tokens=total - max(a, c), cache_creation_input_tokens=c - a, cache_read_input_tokens=a,
                      output_tokens=out, cache_write_5m_tokens=c - a, cache_write_1h_tokens=0)
        return usage, note, miss, written, keep

    def _why_breakpoints(self, req: Request, price: ModelPrice, keys: list[str], hit: int, t: float,
                         window: list[int]) -> MissReason | None:
        """Why a GPT-5.6+ request read less than the prefix it shares with the previous request (None: it read
        all of it)."""
        prev, same = self._previous(req, keys)
        if prev is None:
            return MissReason("cold", "first request for this model in the log: nothing cached yet") if hit < 0 \
                else None
        if hit >= 0 and hit >= same - 1:
            return None
        if hit >= 0 and same == len(keys) and not any(
                j in window or j in prev.dropped or j == prev.implicit_at for j in range(hit + 1, same)):
            # the request is the previous one (or a prefix of it) and read at its last breakpoint: what follows
            # was never a breakpoint of either request, so nothing was there to read (nothing changed)
            return None
        for j in range(same - 1, hit, -1):
            k, path = keys[j], req.positions[j].path
            e = self.entries.get(k)
            if e is not None and e.available_from >= t:
                return MissReason("concurrent", f"the entry at {path} was written by a request that started at the "
                                  f"same time (line {e.line}): it is readable only once that response has begun", path)
            if e is not None and e.expires > t and j not in window:
                return MissReason("lookback_exceeded", f"an entry exists at {path}, but a read considers only the "
                                  f"latest {price.lookback_blocks} breakpoints of the conversation", path)
            if k in self.expired:
                return MissReason("ttl_expired", f"the entry at {path} expired {t - self.expired[k]:,.0f}s before "
                                  "this request (the TTL is a minimum lifetime: OpenAI may have kept it longer)", path)
            if j in prev.dropped:
                return MissReason("breakpoint_limit", f"{_which(prev.line)} marked a breakpoint at {path}, but a "
                                  f"request writes at most {price.max_breakpoints} (the implicit one and the latest "
                                  "explicit ones): it was never written", path)
        if same == 0:
            return _changed(req, prev, same)
        stable = req.positions[same - 1]
        if prev.implicit_at is not None and prev.implicit_at >= same and not prev.marked:
            changed = req.positions[same].path if same < len(req.positions) else "its end"
            return MissReason("implicit_breakpoint_after_change",
                              f"{_which(prev.line)}'s implicit breakpoint sat at the end of "
                              f"{prev.positions[prev.implicit_at].path}, after the content that changed at {changed}: "
                              f"the stable prefix up to {stable.path} was never written (put a "
                              "prompt_cache_breakpoint at its end)", stable.path)
        if not prev.writes:
            return MissReason("no_breakpoint", f"{_which(prev.line)} wrote no breakpoint on the prefix this request "
                              "shares with it", stable.path)
        return _changed(req, prev, same)

    def remember(self, req: Request, keys: list[str], writes: list[int], dropped: Sequence[int] = (),
                 implicit_at: int | None = None, marked: Sequence[int] = ()) -> None:
        self.last[str(req.model)] = _Seen(keys, req.positions, req.line, writes, req.scope_system, req.scope_messages,
                                          tuple(dropped), implicit_at, tuple(marked))

    def finish(self) -> tuple[int, int, int, tuple[int, ...]]:
        """Explicit writes never read within the log (``path`` set: automatic caching has no write fee): how
        many, how many of them are still alive at the end, their tokens, and their lines."""
        live = [e for e in self.entries.values() if e.reads == 0 and e.path]
        lines = sorted({*self.never_read_lines, *(e.line for e in live if e.line is not None)})
        return (self.never_read + len(live), len(live), self.never_read_tokens + sum(e.tokens for e in live),
                tuple(lines))


def _which(line: int | None) -> str:
    return f"line {line}" if line is not None else "the previous request"


def _changed(req: Request, prev: _Seen, same: int) -> MissReason:
    """The first position where ``req`` differs from the previous request, named by path (and by what
    changed in it, through the shared volatile-value detector)."""
    from ...volatile import classify_change

    if same < len(req.positions) and same < len(prev.positions):
        a, b = prev.positions[same], req.positions[same]
        if a.kind in THINKING_KINDS and a.role == "assistant" and a in req.stripped_thinking:
            return MissReason("thinking_stripped", f"the thinking block at {a.path}, in the prefix {_which(prev.line)} "
                              f"cached, is stripped from this request: {req.model} keeps only the last assistant "
                              "turn's thinking, so a user turn after it removes it from the prompt and the cache "
                              "from there on (Opus 4.5+ and Sonnet 4.6+ keep it)", a.path)
        if a.identity == b.identity:  # same content, different chain: a scope changed before it
            if prev.scope_system != req.scope_system:
                return MissReason("scope_changed", f"a request parameter that scopes system and messages changed "
                                  f"(speed, web search or citations): {prev.scope_system} -> {req.scope_system}",
                                  b.path)
            return MissReason("scope_changed", "a request parameter that scopes messages changed (tool_choice, "
                              f"images or thinking): {prev.scope_messages} -> {req.scope_messages}", b.path)
        change = classify_change(a.text, b.text) if b.kind != "layout" else None  # layout ids are names
        what = ""
        if change is not None:
            what = f": {change[0].kind.replace('_', ' ')} {change[0].text!r} -> {change[1].text!r}"
        elif a.content != b.content and sorted_equal(a.content, b.content):
            what = ": same keys and values in another order (providers cache on exact content)"
        return MissReason("content_changed", f"content changed at {b.path} (vs line {prev.line}){what}", b.path,
                          volatile=change[0].kind if change is not None else None)
    if same < len(req.positions):
        return MissReason("content_changed", f"the request adds positions after line {prev.line}'s; no breakpoint "
                          "was written at the shared prefix", req.positions[same].path)
    return MissReason("content_changed", f"the request is a prefix of line {prev.line}'s; its breakpoint was never "
                      "written", None)


def sorted_equal(a: str, b: str) -> bool:
    """Whether two JSON texts hold the same value with keys in another order."""
    import json

    try:
        return json.loads(a) == json.loads(b)
    except ValueError:
        return False


def _token_keys(model: str, req: Request, pieces: list[tuple[str, Sequence[int] | None, int]], minimum: int,
                step: int) -> list[tuple[int, str]]:
    """``(n, key)`` for each cacheable token-prefix length n (minimum, minimum + step, ...) of the request.

    A piece with token IDs is hashed token by token, so two requests share every key up to the token where
    they diverge. A piece without IDs (a token layout) is one unit: a key inside it names the piece and the
    offset, so a changed piece shares nothing from its start on.
    """
    out: list[tuple[int, str]] = []
    h = hashlib.blake2b(digest_size=16)
    h.update(("model\x00" + model).encode())
    pos = 0
    nxt = minimum if minimum > 0 else step
    for identity, ids, n in pieces:
        if ids is None:
            h.update(b"\x01" + identity.encode())
            while nxt <= pos + n:
                k = h.copy()
                k.update(str(nxt - pos).encode())
                out.append((nxt, k.hexdigest()))
                nxt += step
            pos += n
            continue
        buf = array("I", ids)
        start = 0
        while nxt <= pos + n:
            cut = nxt - pos
            h.update(buf[start:cut].tobytes())
            start = cut
            out.append((nxt, h.copy().hexdigest()))
            nxt += step
        h.update(buf[start:].tobytes())
        pos += n
    return out


def _outcome(read: int, write: int) -> str:
    return "read+write" if read and write else "read" if read else "write" if write else "none"


def _reconcile(req: Request, price: ModelPrice, predicted: Usage, miss: MissReason | None, source: str,
               estimate: bool, *, batch: bool = False) -> Reconciliation | None:
    if req.usage is None:
        return None
    logged = parse_usage(req.usage, source=source, line=req.line, path="usage.", model=price.model,
                         style_of=lambda m: price.usage_style)
    billed = _as_usage(logged)
    po = _outcome(predicted.cache_read_input_tokens, predicted.cache_creation_input_tokens)
    bo = _outcome(billed.cache_read_input_tokens, billed.cache_creation_input_tokens)
    same_tokens = (predicted.cache_read_input_tokens == billed.cache_read_input_tokens
                   and predicted.cache_creation_input_tokens == billed.cache_creation_input_tokens)
    agree = po == bo and (same_tokens or estimate)
    reason = None
    if not agree:
        if po == bo:
            reason = (f"token counts differ: predicted {predicted.cache_read_input_tokens:,} read / "
                      f"{predicted.cache_creation_input_tokens:,} written, billed {billed.cache_read_input_tokens:,} / "
                      f"{billed.cache_creation_input_tokens:,}")
        elif predicted.cache_read_input_tokens > billed.cache_read_input_tokens:
            reason = ("billed less read than the rules predict: the entry was gone (evicted, or the request was "
                      "routed elsewhere: provider caching is best effort), or an earlier request it relies on is "
                      "missing from the log")
        else:
            reason = (f"billed more read than predicted ({miss.code}: {miss.detail})" if miss is not None else
                      "billed more read than predicted: an earlier request not in this log wrote the entry")
    elif bo in ("write", "none") and miss is not None:
        reason = f"{miss.code}: {miss.detail}"
    return Reconciliation(billed={"input_tokens": billed.input_tokens,
                                  "cache_creation_input_tokens": billed.cache_creation_input_tokens,
                                  "cache_read_input_tokens": billed.cache_read_input_tokens,
                                  "output_tokens": billed.output_tokens},
                          billed_cost_usd=round(cost_usd(price, billed, batch=batch), 10), agree=agree, predicted_outcome=po,
                          billed_outcome=bo, reason=reason)


def simulate_requests(requests: Iterable[Request], *, table: PriceTable, source: str,
                      text_counter: TextTokens | Callable[[str], int] | None = None, api: Any = None,
                      every: float | None = None, token_source: str = "layout",
                      model_as: str | None = None, keep_requests: bool = True,
                      on_request: Callable[[RequestCost], None] | None = None) -> CostReport:
    """Replay requests in order through the cache model and price what each would report. ``model_as``: the
    model to price (and simulate) a line's unknown model as, with a note, instead of an error.

    ``on_request`` sees each request's row as soon as it is simulated. With ``keep_requests=False`` the report
    keeps no rows (``requests`` is empty; totals, costs, findings, notes and ``miss_tallies`` are the same), and
    memory stays bounded by the live cache entries, not the length of the log. :class:`CostRun` is the same
    simulation fed one request at a time."""
    run = CostRun(table=table, source=source, text_counter=text_counter, api=api, every=every,
                  token_source=token_source, model_as=model_as, keep_requests=keep_requests, on_request=on_request)
    for req in requests:
        run.add(req)
    return run.report()


def _when(t: float) -> str:
    """A time as a message shows it: an instant in UTC (ISO 8601), or seconds where the log's times are small
    numbers (seconds from the log's start, not an epoch)."""
    if t >= 1e8:  # (1973 on: an epoch instant)
        from datetime import UTC, datetime

        return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{t:g} s"


class CostRun:
    """:func:`simulate_requests` fed by its caller, one request at a time (:meth:`add`), its report made at the end
    (:meth:`report`): a sweep that feeds several simulations as it reads a log runs them in its own thread, one
    request after the other, with no thread of their own to hand the requests to. The arguments are
    :func:`simulate_requests`'."""

    def __init__(self, *, table: PriceTable, source: str,
                 text_counter: TextTokens | Callable[[str], int] | None = None, api: Any = None,
                 every: float | None = None, token_source: str = "layout", model_as: str | None = None,
                 keep_requests: bool = True, on_request: Callable[[RequestCost], None] | None = None) -> None:
        self.table, self.source, self.text_counter, self.api = table, source, text_counter, api
        self.every, self.token_source, self.model_as, self.on_request = every, token_source, model_as, on_request
        self.sim = CacheSimulator(table, source)
        self.tally = _Tally(keep_requests)
        self.notes = _Notes()
        self.counter = api_counter(api) if api is not None else None
        self.index = 0
        self.last_t: float | None = None
        self.last_filled = False  # (the last request's time was filled in: ``every``)
        self.estimate = False
        self.unknown_output = 0
        self.routed = 0
        self.gaps = _Misses()
        self.gaps_1h = False
        self.volatile = _Misses()

    def add(self, req: Request) -> None:
        """Simulate and price ``req``, the next request of the log."""
        index, notes, sim, table, text_counter, counter = (self.index, self.notes, self.sim, self.table,
                                                           self.text_counter, self.counter)
        self.index += 1
        if not req.model:
            raise req.error("no model on this line; pass `default_model`")
        t = req.timestamp
        filled = t is None
        if t is None:
            if self.every is None and index > 0:
                raise InputError("no timestamp: cache entries expire (5 minutes or 1 hour), so TTL matters; "
                                 "add 'timestamp' (seconds or ISO 8601) or pass `every`",
                                 source=req.source, line=req.line)
            # (``every`` after the request before: in a log that gives some times, next to them)
            t = 0.0 if self.last_t is None or self.every is None else self.last_t + self.every
        if self.last_t is not None and t < self.last_t:
            if not self.last_filled:
                raise InputError(f"timestamp {_when(t)} is earlier than the previous request's "
                                 f"({_when(self.last_t)}); sort the log by time", source=req.source, line=req.line,
                                 field="timestamp")
            t = self.last_t  # (a time filled in before a logged one earlier than it: the two at once)
        self.last_t, self.last_filled = t, filled
        sim.advance(t)
        price = _dated(_lookup(table, req.model, req.source, req.line, self.model_as, notes), req.timestamp, notes)
        if req.provider == "anthropic" and price.provider != "anthropic":
            notes.append(f"{price.model} is not a Claude model but a request body is Anthropic-shaped: simulated "
                         f"with {price.model}'s rules")
        for btype in req.unknown_blocks:
            notes.append(unknown_block_note(btype))
        req = as_the_model_sees_it(req, price)
        keys = chain_keys(price.model, req)
        self.unknown_output += req.output_tokens is None
        self.routed += "prompt_cache_key" in req.params
        if any(p.tokens is None for p in req.positions):
            self.estimate = True
        written: list[int] = []
        keep: dict = {}
        _check_cache_params(req, price)
        if price.cache_mode == "automatic":
            pieces = _pieces(req, text_counter, counter)
            usage, note, miss = sim.automatic(req, price, keys, pieces, t)
        elif price.cache_mode == "none":
            cum = _cumulative(req, keys, text_counter, counter)
            usage = Usage(cum[-1] if cum else 0, 0, 0, req.output_tokens or 0)
            note, miss = f"{price.model} has no cached-input price: nothing is cached", None
        elif price.cache_mode == "breakpoints":
            cum = _cumulative(req, keys, text_counter, counter)
            usage, note, miss, written, keep = sim.breakpoints(req, price, keys, cum, t)
            if "prompt_cache_retention" in req.params and req.cache_ttl is None:
                notes.append(f"prompt_cache_retention is deprecated for {price.model} (GPT-5.6 and later) and does "
                             "not set its TTL: prompt_cache_options.ttl does (30m by default)")
        else:
            cum = _cumulative(req, keys, text_counter, counter)
            usage, note, miss, written = sim.explicit(req, price, keys, cum, t)
        if note:
            notes.append(note)
        if miss is not None and miss.code == "ttl_expired":
            self.gaps.add(req.line)
            self.gaps_1h = self.gaps_1h or "1h" in price.ttls  # (the advice to use it, where a model has it)
        if miss is not None and miss.code == "content_changed" and miss.volatile is not None:
            self.volatile.add(req.line, miss.path or "")
        batch = is_batch_request(req)
        if batch:
            notes.append(_batch_note(price))
        recon = _reconcile(req, price, usage, miss, self.source, self.estimate, batch=batch)
        reported = _openai_reported(usage) if price.usage_style == "openai" else {}
        row = _row(index, req.line, price, usage, timestamp=t, reported=reported, note=note, miss=miss,
                   reconciliation=recon, batch=batch)
        self.tally.add(row)
        if self.on_request is not None:
            self.on_request(row)
        sim.remember(req, keys, written, **keep)

    def report(self) -> CostReport:
        """The report of the requests added (an error where there were none)."""
        tally, notes, table, token_source = self.tally, self.notes, self.table, self.token_source
        if not tally.count:
            raise InputError("no requests", source=self.source)
        if self.unknown_output:
            notes.append(f"{self.unknown_output} request(s) give no output_tokens: their output is not priced "
                         "(add output_tokens to those lines)")
        if tally.disagreed:
            notes.append("predicted and billed counters disagree on some requests: each request's reconciliation says "
                         "why (the `disagree at line N` lines of prompt-cost, the `reconciliation` of its JSON)")
        if tally.first_model is not None and table.lookup(tally.first_model).provider == "anthropic" and \
                tally.scope_changed:
            notes.append("thinking and effort changes are predicted by the documented rule (they invalidate the "
                         "messages cache); their effect is model-dependent, and an effort change was observed to miss "
                         "the system cache too")
        if self.routed:
            notes.append(f"{self.routed} request(s) set prompt_cache_key: it steers which cache a request is routed "
                         "to and is not part of the cached prefix, so it changes no prediction here")
        if self.estimate:
            token_source = ("count_tokens API (an estimate)" if self.api is not None
                            else f"{token_source} (an estimate)")
        findings = _findings(self.sim, self.gaps, self.volatile, self.gaps_1h)
        return tally.report("simulate", estimate=self.estimate, token_source=token_source, notes=notes,
                            findings=findings)


def _check_cache_params(req: Request, price: ModelPrice) -> None:
    """What the API rejects before it caches anything: OpenAI's GPT-5.6 cache controls on an earlier model, and
    ``prompt_cache_options.ttl`` beside ``prompt_cache_retention`` (the TTL supersedes the retention; setting
    both is rejected)."""
    if req.provider != "openai":
        return
    marked = req.openai_breakpoints
    if price.cache_mode != "breakpoints":
        if "prompt_cache_options" in req.params or marked:
            what = "prompt_cache_options" if "prompt_cache_options" in req.params else "prompt_cache_breakpoint"
            where = "prompt_cache_options" if what == "prompt_cache_options" else req.positions[marked[0]].cache_path
            raise req.error(f"{what} is for GPT-5.6 and later models; {price.model} rejects it (the API answers "
                            "400)", where)
        return
    if req.cache_ttl is not None and "prompt_cache_retention" in req.params:
        raise req.error("both prompt_cache_options.ttl and prompt_cache_retention: the API rejects a request that "
                        "sets both (the TTL supersedes the retention on GPT-5.6 and later: drop "
                        "prompt_cache_retention)", "prompt_cache_retention")


class _Misses:
    """The requests that missed for one finding's cause: how many, their lines (8 bytes each), and the distinct
    paths where the cause sat."""

    def __init__(self) -> None:
        self.count = 0
        self.lines = array("q")
        self.paths: set[str] = set()

    def add(self, line: int | None, path: str = "") -> None:
        self.count += 1
        if line is not None:
            self.lines.append(line)
        if path:
            self.paths.add(path)


def _findings(sim: CacheSimulator, ttl_gaps: _Misses, volatile: _Misses, one_hour: bool = False) -> list[Finding]:
    out = []
    never, alive, tokens, lines = sim.finish()
    if never:
        out.append(Finding("write_never_read", f"{never} cache write(s) were never read within the log"
                           + (f" ({alive} still alive when it ends)" if alive else "")
                           + ": a write that is never read pays its premium for nothing", never, lines,
                           tokens=tokens))
    if ttl_gaps.count:
        out.append(Finding("ttl_gap", f"{ttl_gaps.count} request(s) missed because the entry expired between "
                           "requests: space them closer than the TTL" + (", or use the 1h TTL" if one_hour else ""),
                           ttl_gaps.count, tuple(ttl_gaps.lines)))
    if volatile.count:
        paths = sorted(volatile.paths)
        out.append(Finding("breakpoint_after_volatile", f"{volatile.count} request(s) missed because a value that "
                           f"changes per request (a date, time, id or counter) sits inside the cached prefix, at "
                           f"{', '.join(paths[:3])}: move it after the stable content (after the last breakpoint)",
                           volatile.count, tuple(volatile.lines)))
    return out


def _piece_count(p: Position, text_counter) -> int:
    if isinstance(text_counter, TextTokens):
        return text_counter.count(p.text)
    return text_counter(p.text)


def _located_request(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn(req, ...)`` with an input error it raises (a position's text too long to tokenize) naming the request's
    file and line where it names none: every caching mode counts through :func:`_pieces` or :func:`_cumulative`."""
    @functools.wraps(fn)
    def located(req: Request, *args: Any) -> Any:
        try:
            return fn(req, *args)
        except InputError as exc:
            exc.locate(req.source, req.line)
            raise

    return located


def _need_counts(req: Request) -> InputError:
    return InputError("request bodies need token counts: pass `tokenizer` (an estimate) or, for Claude models, "
                      "`count_with_api`", source=req.source, line=req.line)


@_located_request
def _pieces(req: Request, text_counter, api_count) -> list[tuple[str, Sequence[int] | None, int]]:
    """The request as token pieces for token-prefix caching (IDs where a tokenizer gives them)."""
    out: list[tuple[str, Sequence[int] | None, int]] = []
    for p in req.positions:
        if p.tokens is not None:
            out.append((p.identity, None, p.tokens))
        elif isinstance(text_counter, TextTokens):
            ids = text_counter.ids(p.text)
            out.append((p.identity, ids, len(ids)))
        elif text_counter is not None:
            out.append((p.identity, None, text_counter(p.text)))
        else:
            raise _need_counts(req)
    return out


@_located_request
def _cumulative(req: Request, keys: list[str], text_counter, api_count) -> list[int]:
    cum: list[int] = []
    total = 0
    for k, p in enumerate(req.positions):
        if p.tokens is not None:
            total += p.tokens
        elif api_count is not None and req.provider == "anthropic":
            total = api_count(req, k, keys[k])
        elif text_counter is not None:
            total += _piece_count(p, text_counter)
        else:
            raise _need_counts(req)
        cum.append(total)
    return cum


# -------------------------------------------------------------------------------------------- what-if


#: the largest what-if priced, for an answer within seconds: every call is simulated and listed (100,000 calls
#: of 5,000 tokens: 7 s and 370 MB on a 2-vCPU VM), and each call's prompt is laid out in cache blocks (100
#: gpt-4.1 calls of 10M tokens, 128-token blocks: 6 s)
MAX_WHAT_IF_CALLS = 100_000
MAX_WHAT_IF_TOKENS = 10_000_000
MAX_WHAT_IF_TOTAL = 1_000_000_000


def what_if(*, table: PriceTable, model: str, prefix_tokens: int, suffix_tokens: int, output_tokens: int,
            calls: int, every: float, ttl: str = "5m", model_as: str | None = None) -> CostReport:
    """N calls sharing a cached prefix, ``every`` seconds apart: cost with and without caching. Every call is
    simulated and kept in the report: at most :data:`MAX_WHAT_IF_CALLS` calls of at most
    :data:`MAX_WHAT_IF_TOKENS` tokens each, :data:`MAX_WHAT_IF_TOTAL` prompt tokens in all."""
    for name, v in (("prefix_tokens", prefix_tokens), ("suffix_tokens", suffix_tokens),
                    ("output_tokens", output_tokens)):
        if v < 0:
            raise UsageError(f"`{name}` must not be negative")
    if prefix_tokens + suffix_tokens > MAX_WHAT_IF_TOKENS or output_tokens > MAX_WHAT_IF_TOKENS:
        raise UsageError(f"a what-if call has at most {MAX_WHAT_IF_TOKENS:,} prompt tokens (`prefix_tokens` + "
                         f"`suffix_tokens`) and {MAX_WHAT_IF_TOKENS:,} `output_tokens`; got "
                         f"{prefix_tokens + suffix_tokens:,} and {output_tokens:,}")
    if not 1 <= calls <= MAX_WHAT_IF_CALLS:
        raise UsageError(f"`calls` must be from 1 to {MAX_WHAT_IF_CALLS:,} (every call is simulated and listed), "
                         f"got {calls:,}")
    if calls * (prefix_tokens + suffix_tokens) > MAX_WHAT_IF_TOTAL:
        raise UsageError(f"a what-if lays out at most {MAX_WHAT_IF_TOTAL:,} prompt tokens in all (`calls` x "
                         f"(`prefix_tokens` + `suffix_tokens`)), got {calls * (prefix_tokens + suffix_tokens):,}")
    priced_as: list[str] = []  # (``model_as``'s note, where it prices an unknown model)
    price = _lookup(table, model, "what-if", None, model_as, priced_as) if model_as else table.lookup(model)
    explicit = price.cache_mode == "explicit"
    # Anthropic: a cache_control breakpoint on the prefix; OpenAI GPT-5.6+: an explicit prompt_cache_breakpoint
    # there (the implicit one sits on the suffix, the last message)
    mark = ttl if explicit else next(iter(price.ttls)) if price.cache_mode == "breakpoints" else None
    reqs = [layout_request([("prefix", prefix_tokens, mark), (f"suffix-{i}", suffix_tokens, None)],
                           model=price.model, timestamp=i * every, output_tokens=output_tokens,
                           paths=["the shared prefix", "the suffix"])  # as the misses name them: no body to point at
            for i in range(calls)]
    report = simulate_requests(reqs, table=table, source="what-if", token_source="what-if")
    notes = priced_as + list(report.notes)
    if mark is not None:
        ttl_s = price.ttl_seconds(mark)
        if every >= ttl_s and calls > 1:
            notes.append(f"calls every {every:g}s outlive the {mark} TTL ({ttl_s}s): every call writes again")
    r = price.rates(prefix_tokens + suffix_tokens)
    if explicit:
        write = r.cache_write_1h if ttl == "1h" else r.cache_write_5m
    else:
        write = r.cache_write if mark is not None else r.input
    read = r.cache_read if r.cache_read is not None else r.input
    premium = (write or r.input) - r.input
    saving = r.input - read
    break_even = None
    if prefix_tokens >= price.min_cacheable_tokens and saving > 0:
        break_even = max(0, math.ceil(premium / saving - 1e-12))
    return replace(report, mode="what-if", notes=tuple(notes), break_even_reads=break_even, findings=())
