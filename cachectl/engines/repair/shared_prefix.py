"""The whole log's shared prefix, as ``fix``, ``report`` and ``diff-tokens --log`` use it: the fork analysis
(:func:`cachectl.engines.prefix.analyze_forks`) run once over a log's lines, the lines each fix moves out of
each request's shared prefix, and what the forks cost on top of the within-conversation loss.

``log_forks(lines, *, tokenizer=None, block_size=16, capacity_blocks=None, ...) -> (LogForks | None, notes)``;
``LogForks.spans(i, code)`` are the :class:`~cachectl.engines.prefix.forks.MoveSpan` of line ``i`` for
``FX001``/``FX007``; :func:`cross_request_loss` and :func:`shared_prefix_section` are the report's.

**The combined loss, counted once.** ``report``'s within-conversation loss is per request: the tokens of a
request's previous request (in its conversation) that it did not share as a prefix. The cross-request loss is
per request too: the no-eviction hit tokens the request gains when every fixable fork is fixed
(:attr:`ForkReport.request_gains`). Both count tokens of that one request's prompt that a cache could have
served, and one cause (a clock line at the top of a system prompt) often shows in both, so a request counts the
larger of the two, never their sum: the cross-request loss reported is ``sum(max(gain - pair_loss, 0))`` over
the requests, what the forks add beyond the within-conversation loss of the same requests.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...errors import CachectlError, InputError, MalformedInput, UsageError
from ...spool import Spool
from ..prefix.forks import Fork, ForkReport, ForkRequest, MoveSpan, RequestStore, TreeNode, analyze_forks, pack_requests
from ..prefix.forks.requests import ForkRecords
from .groups import LogLine
from .losses import LostTokenPrice, ModelOf, PairLosses, by_model, merged
from .store import store_of


class LogForks:
    """The fork analysis of one log (:attr:`report`) and its requests, packed, in log order (:attr:`requests`, a
    :class:`~cachectl.engines.prefix.forks.RequestStore`: what :meth:`spans` locates the moved lines in)."""

    __slots__ = ("_at", "_codes", "_moves", "_spool", "lines", "report", "requests")

    def __init__(self, report: ForkReport, requests: Sequence[ForkRequest], lines: Iterable[int]):
        self.report = report
        self.requests = requests if isinstance(requests, RequestStore) else pack_requests(requests)
        self.lines = array("q", lines)
        self._codes = {f.fixable for f in report.forks if f.fixable}
        #: the fix and its per-code measures ask for every line's spans again, code by code: each line's are found
        #: once (a re-render under a tools fix costs a tokenization) and kept, where there are any, in a spool on
        #: disk: per line, its index there (-1: nothing to move, -2: not asked yet), 4 bytes in memory
        self._at = array("i", [-2]) * len(self.lines)
        self._spool: Spool | None = None
        self._moves = {id(t): k for k, t in enumerate(report._plan)}  # a span's move, by its place in the plan

    @property
    def fixable(self) -> tuple[Fork, ...]:
        return tuple(f for f in self.report.forks if f.fixable)

    def spans(self, i: int, code: str) -> tuple[MoveSpan, ...]:
        """The lines fix ``code`` (``FX001``/``FX007``) moves out of line ``i``'s shared prefix."""
        if code not in self._codes:
            return ()
        at = self._at[i]
        if at == -2:
            tool_set = self.requests.tool_set(i)
            got = () if self.report.moves_nothing(i, tool_set) else \
                self.report.spans_to_move(self.requests[i], analysed=True, tool_set=tool_set)
            if got:
                if self._spool is None:
                    self._spool = Spool()
                at = self._spool.put(tuple((s.code, s.cause, s.path, s.start, s.end, s.text, self._moves[id(s.move)])
                                           for s in got))
            self._at[i] = at if got else -1
        elif at == -1:
            return ()
        else:
            assert self._spool is not None
            plan = self.report._plan
            got = tuple(MoveSpan(c, cause, path, start, end, text, plan[m])
                        for c, cause, path, start, end, text, m in self._spool.get(at))
        return tuple(s for s in got if s.code == code)

    def asked(self) -> set[int]:
        """The lines whose spans were asked for and that have some (kept on disk)."""
        return {i for i, at in enumerate(self._at) if at >= 0}

    def gains_by_line(self) -> dict[int, int]:
        """Line number -> the no-eviction hit tokens that request gains with the forks fixed (positive only)."""
        return {ln: g for ln, g in zip(self.lines, self.report.request_gains) if g > 0}


def log_forks(lines: Iterable[LogLine], *, tokenizer: Any = None, block_size: int = 16,
              capacity_blocks: int | None = None, add_generation_prompt: bool = True,
              source: str = "", progress: Callable[[int], None] | None = None,
              packed: ForkLines | None = None) -> tuple[LogForks | None, list[str]]:
    """The fork analysis of ``lines`` (served tokens rendered with ``tokenizer``, canonical positions without one);
    None and a note when the log cannot be analysed (raw-text lines without a tokenizer). ``lines`` is read once,
    in order, and no line is kept: the requests are kept packed (:class:`~cachectl.engines.prefix.forks.RequestStore`).
    ``packed``: the lines already packed as they were first read (:class:`ForkLines`, given the same tokenizer and
    options): ``lines`` is not read. ``progress(n)``: called as lines are packed and as the replays view them."""
    if packed is None:
        packed = ForkLines(tokenizer=tokenizer, add_generation_prompt=add_generation_prompt, source=source)
        for ln in lines:  # (each with the prompt its line was read as: not read from the value again)
            packed.add(ln)
            if progress is not None:
                progress(1)
    packed.finish()
    if packed.note is not None:
        return None, [packed.note]
    reqs = packed.requests
    try:
        if not reqs:
            return None, []
        rep = analyze_forks(reqs, tokenizer=tokenizer, block_size=block_size, capacity_blocks=capacity_blocks,
                            source=source, add_generation_prompt=add_generation_prompt, progress=progress)
    except MalformedInput:
        raise
    except (InputError, UsageError) as exc:
        return None, [_not_analysed(exc)]
    return LogForks(rep, reqs, packed.numbers), []


class ForkLines:
    """A log's lines packed for the fork analysis a line at a time, as they are read (``add(line)``): the requests
    (:attr:`requests`) and the lines' numbers. A line that cannot be packed ends it: :attr:`note` says why (the
    analysis is left out; the run goes on). ``encoder``: the executor a full batch's prompts are encoded on, a thread of this process,
    while the lines are read on (:func:`~cachectl.tokenization.encoder_beside`; the caller lets it go)."""

    def __init__(self, *, tokenizer: Any = None, add_generation_prompt: bool = True, source: str = "",
                 encoder: Any = None):
        self.requests = RequestStore()
        self.numbers = array("q")
        self.note: str | None = None
        self._records = ForkRecords(source=source, tokenizer=tokenizer, add_generation_prompt=add_generation_prompt,
                                    encoder=encoder)
        #: prompts tokenized at a time
        self.batch_size = self._records.batch_size
        self._done = False

    @property
    def waiting(self) -> int:
        """Lines added whose prompts are not packed yet (:meth:`known` has not their token IDs)."""
        return self._records.waiting if self.note is None else 0

    def add(self, ln: LogLine) -> None:
        if self.note is not None:
            return
        self.numbers.append(ln.line)
        try:
            for r in self._records.add((ln.line, ln.value, True, ln.prompt)):
                self.requests.add(r)
        except MalformedInput:
            raise
        except (InputError, UsageError) as exc:
            self._failed(exc)

    def known(self, prompt: Any, add_generation_prompt: bool) -> Sequence[int] | None:
        """The token IDs of a line's prompt (the object :meth:`add` was given) where its batch was packed last (the
        next reader of the same lines takes them, not tokenizing again; :class:`~.sections.OneRead`), else None."""
        return self._records.known(prompt, add_generation_prompt) if self.note is None else None

    def finish(self) -> None:
        """The last batch packed (:func:`log_forks` calls it before the analysis)."""
        if self._done or self.note is not None:
            return
        self._done = True
        try:
            for r in self._records.flush():
                self.requests.add(r)
        except MalformedInput:
            raise
        except (InputError, UsageError) as exc:
            self._failed(exc)

    def _failed(self, exc: CachectlError) -> None:
        self.note = _not_analysed(exc)
        self.requests = RequestStore()  # (what was packed is let go)


def _not_analysed(exc: CachectlError) -> str:
    return f"the shared prefix across requests was not analysed: {exc}"


def auto_records(lines: Sequence[LogLine], grouping: Any,
                 each: Callable[[LogLine], None] | None = None) -> Iterator[Any]:
    """The lines as diff-tokens' log records, each keyed by its conversation of ``grouping``
    (:func:`~cachectl.engines.repair.groups.group_sessions`; ``report`` and ``diff-tokens --log`` without ``--key``
    pair requests by them): by the key, or for conversations found automatically by the log's own id
    (:func:`conversation_names`). Made as they are read (one pass over ``lines``); ``each`` sees every line as it
    is read (what else the report reads of it)."""
    from ...inputs import LogRecord

    names = None if grouping.how != "automatic" else conversation_names(lines, grouping.groups)
    for i, ln in enumerate(lines):
        if each is not None:
            each(ln)
        yield LogRecord(line=ln.line, key=ln.key if names is None else names[i], prompt=ln.prompt)


#: the fields a log names its conversations by, when no --key says which (the log's own ids label what was found)
ID_FIELDS = ("session", "session_id", "conversation", "conversation_id", "chat_id", "thread_id")


def own_id(value: Any) -> Any:
    """The line's own conversation id: the first of :data:`ID_FIELDS` on it, or in its ``metadata``; else None."""
    for where in (value, value.get("metadata") if isinstance(value, dict) else None):
        if isinstance(where, dict):
            for f in ID_FIELDS:
                v = where.get(f)
                if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v):
                    return v
    return None


def conversation_names(lines: Sequence[LogLine], groups: Sequence[int]) -> list[Any]:
    """A name per line for conversations found automatically: the log's own id (its first line's ``session``, ...)
    where the lines carry one, ``auto-N`` where they do not; a second conversation of the same id is ``ID (2)``."""
    store = store_of(lines)
    first: dict[int, Any] = {}
    for i, g in enumerate(groups):  # only each conversation's first line is read (a store's value, not parsed)
        if g not in first:
            first[g] = own_id(store.value(i) if store is not None else lines[i].value)
    names: dict[int, Any] = {}
    seen: dict[str, int] = {}
    for g in sorted(first):
        own = first[g]
        if own is None:
            names[g] = f"auto-{g + 1}"
            continue
        seen[str(own)] = seen.get(str(own), 0) + 1
        names[g] = own if seen[str(own)] == 1 else f"{own} ({seen[str(own)]})"
    return [names[g] for g in groups]


def cross_request_loss(gains: Mapping[int, int], pair_lost: Mapping[int, int]) -> int:
    """The tokens the forks cost beyond the within-conversation loss (see the module docstring): per request
    (by line), its fork gain less its pair loss, where positive."""
    return sum(max(g - pair_lost.get(line, 0), 0) for line, g in gains.items())


@dataclass(frozen=True)
class SharedPrefixSection:
    """The report's view of the shared prefix across requests."""

    requests: int
    block_size: int
    #: no-eviction hits of the log as logged, and with every fixable fork fixed (the counterfactual replay)
    hit_tokens: int
    fixed_hit_tokens: int
    #: the tokens the forks cost beyond the within-conversation loss of the same requests (counted once)
    tokens_lost: int
    usd_lost: float | None
    #: forks with a fix (the forks themselves are the report's ``forks``)
    fixable_forks: int
    tree: tuple[TreeNode, ...]
    fixed_tree: tuple[TreeNode, ...]
    capacity_blocks: int | None = None
    hit_tokens_at_capacity: int | None = None
    fixed_hit_tokens_at_capacity: int | None = None
    notes: tuple[str, ...] = ()


def shared_prefix_section(forks: LogForks, pair_lost: Mapping[int, int], price: LostTokenPrice | None,
                          model_of: ModelOf | None = None) -> tuple[SharedPrefixSection, dict[str | None, int]]:
    """The section, with the cross-request loss combined with ``pair_lost`` (line -> within-conversation loss of
    that request) and priced at ``price`` (each request's model's, through ``model_of``, where it has no one rate),
    and that loss by model (empty at one rate)."""
    r = forks.report
    gains = forks.gains_by_line()
    lost = cross_request_loss(gains, pair_lost)
    models: dict[str | None, int] = {}
    if price is not None and price.rate is None and model_of is not None:
        models = by_model(((ln, max(g - pair_lost.get(ln, 0), 0)) for ln, g in gains.items()), model_of)
    section = SharedPrefixSection(requests=r.requests, block_size=r.block_size, hit_tokens=r.hit_tokens,
                                  fixed_hit_tokens=r.fixed_hit_tokens, tokens_lost=lost,
                                  usd_lost=None if price is None else price.dollars(lost, models),
                                  fixable_forks=len(forks.fixable), tree=r.tree, fixed_tree=r.fixed_tree,
                                  capacity_blocks=r.capacity_blocks, hit_tokens_at_capacity=r.hit_tokens_at_capacity,
                                  fixed_hit_tokens_at_capacity=r.fixed_hit_tokens_at_capacity, notes=r.notes)
    return section, models


def with_forks(r: Any, forks: Any, losses: PairLosses, price: LostTokenPrice | None,
               model_of: ModelOf | None = None) -> Any:
    """The report (:class:`.report.LogReport`) with the forks of the log's shared prefix (``forks``:
    :func:`.shared_prefix.log_forks`): listed, and the tokens they cost beyond each request's within-conversation
    loss (``losses``) joined to the headline, priced at ``price`` (each request's model's, through ``model_of``,
    where it has no one rate)."""
    shared, models = shared_prefix_section(forks, losses.of(forks.gains_by_line()), price, model_of)
    total = r.tokens_lost + shared.tokens_lost
    if price is not None and price.rate is None and model_of is not None:  # (with the within-conversation losses)
        models = merged([models, by_model(zip(losses.lines, losses.lost), model_of)])
    return replace(r, total_tokens_lost=total,
                   total_usd_lost=None if price is None or r.total_usd_lost is None else price.dollars(total, models),
                   forks=forks.report.forks, shared_prefix=shared)


@dataclass(frozen=True)
class CrossRequestGain:
    """``fix``'s before/after across requests: the forks found, the vLLM hits of the log before and after the fixes
    (measured by the same replays; no eviction, and at capacity when one is given), what the fork analysis
    predicted with every fixable fork fixed, and the gain in dollars at a model's input less cache-read price."""

    forks: tuple[Fork, ...]
    hit_tokens_before: float | None
    hit_tokens_after: float | None
    predicted_hit_tokens: int
    capacity_blocks: int | None = None
    hit_tokens_before_at_capacity: float | None = None
    hit_tokens_after_at_capacity: float | None = None
    usd_saved: float | None = None
    price_model: str | None = None
    #: the models whose prices turned the gain into dollars: ``price_model``, or, for a log that mixes models of
    #: different prices, each request's own model's (``price_model`` None)
    price_models: tuple[str, ...] = ()


def cross_request_gain(forks: LogForks, before: Any, after: Any, price: Any = None) -> CrossRequestGain:
    """``before``/``after``: :class:`~cachectl.engines.repair.measure.Measure` of the log and of the fixed log;
    ``price``: the dollars a token read from the cache saves (:class:`.losses.LostTokenPrice`): one model's, or each
    request's own model's, where the replays' hits are split by model (``hit_tokens_by_model``). No dollar figure
    where a gain falls on a request whose model has no price."""

    def no_evict(m: Any) -> Any:
        return getattr(m, "vllm_no_eviction", None) or (m.vllm if m is not None and m.vllm is not None
                                                        and m.vllm.capacity_blocks is None else None)

    def at_cap(m: Any) -> Any:
        v = m.vllm if m is not None else None
        return v if v is not None and v.capacity_blocks is not None else None

    def hits(v: Any) -> float | None:
        return v.hit_tokens if v is not None else None

    b, a = hits(no_evict(before)), hits(no_evict(after))
    cap = before.vllm.capacity_blocks if before is not None and before.vllm is not None else None
    usd = name = None
    models: tuple[str, ...] = ()
    if price is not None and b is not None and a is not None:
        v0, v1 = (at_cap(before), at_cap(after)) if cap is not None else (no_evict(before), no_evict(after))
        gained = v1.hit_tokens - v0.hit_tokens
        by: dict[Any, float] | None = None
        if price.rate is None and v0.hit_tokens_by_model is not None and v1.hit_tokens_by_model is not None:
            by = dict(v1.hit_tokens_by_model)
            for m, n in v0.hit_tokens_by_model:
                by[m] = by.get(m, 0) - n
        usd, name = price.dollars(gained, by), price.model
        models = price.models if usd is not None else ()
    return CrossRequestGain(forks=forks.report.forks, hit_tokens_before=b, hit_tokens_after=a,
                            predicted_hit_tokens=forks.report.fixed_hit_tokens, capacity_blocks=cap,
                            hit_tokens_before_at_capacity=hits(at_cap(before)),
                            hit_tokens_after_at_capacity=hits(at_cap(after)), usd_saved=usd, price_model=name,
                            price_models=models)


__all__ = ["CrossRequestGain", "LogForks", "SharedPrefixSection", "auto_records", "cross_request_gain",
           "cross_request_loss", "log_forks", "shared_prefix_section", "with_forks"]
