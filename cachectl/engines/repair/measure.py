"""A log measured before and after its fixes, by the existing engines: the vLLM prefix-cache replay, the provider
prompt-cache simulation, and the tokens each request shares with the previous request of its conversation.

``measure_versions(lines, versions, grouping, *, tokenizer=None, table=None, block_size=16, capacity_blocks=None,
...) -> [(Measure, notes), ...]``: versions of a log (as it is, as a fix pass left it) measured in one sweep;
``fix_log`` measures the log before and after (and as each fix code left it, for the tokens reused per cause).
"""

from __future__ import annotations

import queue
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain
from typing import Any

from ...errors import InputError, MalformedInput, UsageError
from ...inputs import cache_salt_of
from ..prefix.replay import InfiniteVersions
from ..prefix.trace import TraceRequest, hashable_salt
from .groups import Grouping, LogLine, line_facts
from .losses import by_model as summed_by_model
from .rows import AsPacked, line_versions, rendered, rows_later


@dataclass(frozen=True)
class VllmMeasure:
    policy: str
    block_size: int
    capacity_blocks: int | None
    requests: int
    query_tokens: int
    hit_tokens: float
    hit_rate: float | None
    #: the hit tokens by the model each request names (None where it names none), in the order the models first
    #: appear: for a log whose models are priced differently (``fix``'s cross-request dollars); None otherwise
    hit_tokens_by_model: tuple[tuple[str | None, float], ...] | None = None


@dataclass(frozen=True)
class ProviderMeasure:
    requests: int
    cache_read_tokens: int
    cache_write_tokens: int
    input_tokens: int
    cost_usd: float
    uncached_cost_usd: float
    hit_rate: float | None
    skipped: int = 0


@dataclass(frozen=True)
class Measure:
    """One log measured by the existing engines."""

    vllm: VllmMeasure | None
    provider: ProviderMeasure | None
    #: tokens each request shares as a prefix with the previous request of its conversation, summed
    pair_reused_tokens: int | None
    pair_tokens: int | None
    #: diff-tokens causes of the pairs that diverge, counted
    causes: dict = field(default_factory=dict)
    #: the no-eviction replay (the ceiling) beside ``vllm`` when that one runs at a capacity; None otherwise
    vllm_no_eviction: VllmMeasure | None = None
    #: what each pair could share at most (the shorter request's tokens), summed: the report's reusable tokens, so
    #: that ``pair_reused_tokens`` over it is the report's prefix reuse
    pair_reusable_tokens: int | None = None



#: lines swept at a time (the tokenizer runs a batch's prompts in parallel)
BATCH = 256


class _Fed:
    """``fn(items)`` run in a thread of its own over the items :meth:`put` hands it, a batch at a time: one sweep
    over a log feeds every engine that reads an iterable (each version's replays and provider simulation) and
    none of them reads the log again. An error of ``fn`` is raised by :meth:`result`."""

    _END = object()

    def __init__(self, fn: Callable[[Iterator[Any]], Any]) -> None:
        self._q: queue.Queue = queue.Queue(maxsize=4)
        self._done = False     # fn returned or raised: what is put from now on is dropped
        self._ended = False    # fn read the end
        self._closed = False   # the end was put
        self._out: Any = None
        self._err: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _items(self) -> Iterator[Any]:
        while True:
            batch = self._q.get()
            if batch is self._END:
                self._ended = True
                return
            yield from batch

    def _run(self, fn: Callable[[Iterator[Any]], Any]) -> None:
        try:
            self._out = fn(self._items())
        except BaseException as exc:  # noqa: BLE001 (raised again by result())
            self._err = exc
        finally:
            self._done = True
            while not self._ended and self._q.get() is not self._END:
                pass  # (the sweep goes on for the others: what it puts is let go)

    def put(self, batch: list) -> None:
        if batch and not self._done:
            self._q.put(batch)

    def close(self) -> None:
        """No more batches (again: nothing)."""
        if not self._closed:
            self._closed = True
            self._q.put(self._END)

    def result(self) -> Any:
        self.close()
        self._thread.join()
        if self._err is not None:
            raise self._err
        return self._out


class _Pushed:
    """A run fed in the sweep's own thread, with :class:`_Fed`'s calls (:meth:`put` a batch, :meth:`close`,
    :meth:`result`): ``add(item)`` takes each item as it is put, ``finish()`` gives the value at the end (a
    :class:`~cachectl.engines.provider.cache.CostRun`'s, a :class:`~cachectl.engines.prefix.curve.TraceKeyer`'s).
    An error of an item stops the feeding there (what is put from then on is dropped) and is raised by
    :meth:`result`. No thread: the sweep's engines hold the GIL in turn either way, and handing batches to threads
    cost ``fix --jobs 1`` about 2.5% on 5,000 requests (docs/benchmarks.md)."""

    def __init__(self, add: Callable[[Any], None], finish: Callable[[], Any]) -> None:
        self._add, self._finish = add, finish
        self._err: Exception | None = None

    def put(self, batch: Iterable[Any]) -> None:
        if self._err is None:
            try:
                for x in batch:
                    self._add(x)
            except Exception as exc:  # noqa: BLE001 (raised by result())
                self._err = exc

    def close(self) -> None:
        """(Nothing to let go: there is no thread.)"""

    def result(self) -> Any:
        if self._err is not None:
            raise self._err
        return self._finish()


class _Version:
    """One version of the log in a sweep: its replay at a capacity (fed as lines are tokenized; the no-eviction one
    is the sweep's, shared by the versions), the tokens each request shares with the previous one of its
    conversation, and its provider simulation (started at its first request)."""

    def __init__(self, block_size: int, capacity_blocks: int | None, source: str, causes: bool,
                 provider: Any, simulated: Callable[[], _Pushed] | None, by_model: bool = False) -> None:
        from ..prefix.replay import simulate

        self.causes = causes
        #: each request's hit tokens in the replay at a capacity, in the log's order (``by_model`` runs only)
        self.hits: array | None = array("q") if by_model and capacity_blocks is not None else None
        self.vllm = (_Fed(partial(_simulate_fed, simulate, "vllm", block_size, capacity_blocks, source, self.hits))
                     if capacity_blocks is not None else None)
        self.provider = provider
        self._simulated = simulated if provider is None else None
        self.provider_job: _Pushed | None = None
        self.last: dict[int, Any] = {}
        self.reused = self.tokens = self.reusable = 0
        self.cause_count: dict[str, int] = {}
        self.requests = 0
        self.trace: list = []
        self.reqs: list = []

    @property
    def simulates(self) -> bool:
        """Whether this version's requests are simulated in the sweep (not given simulated already)."""
        return self._simulated is not None

    def flush(self) -> None:
        if self.vllm is not None:
            self.vllm.put(self.trace)
        if self.reqs and self._simulated is not None:
            if self.provider_job is None:
                self.provider_job = self._simulated()
            self.provider_job.put(self.reqs)
        self.trace, self.reqs = [], []

    def close(self) -> None:
        for job in (self.vllm, self.provider_job):
            if job is not None:
                job.close()


def _simulate_fed(simulate: Callable[..., Any], policy: str, block_size: int, capacity_blocks: int | None,
                  source: str, hits: array | None, trace: Iterator[Any]) -> Any:
    return simulate(trace, policy=policy, block_size=block_size, capacity_blocks=capacity_blocks, source=source,
                    compact=True, hits_into=hits)


def _aliases(versions: Sequence[Sequence[Any] | None], n: int, given: Sequence[Any]) -> list[int]:
    """For each version, the first version with the same edits on every line (itself where none has): a rewrite
    that leaves the log as another one did (the safe fixes, and the full run after its safe codes) is measured
    once. The lines as they are (None) are no other version's, nor is a version ``given`` another provider
    measure."""
    k = len(versions)
    pairs = [(j, e) for j in range(k) for e in range(j)
             if versions[j] is not None and versions[e] is not None and given[j] is given[e]]
    for i in range(n):
        if not pairs:
            break
        sigs = {j: versions[j].signature(i) for j in {x for pair in pairs for x in pair}}  # type: ignore[union-attr]
        pairs = [(j, e) for j, e in pairs if sigs[j] == sigs[e]]
    alias = list(range(k))
    for j, e in sorted(pairs, reverse=True):
        alias[j] = e  # (the earliest last)
    return alias


def measure_versions(lines: Sequence[LogLine], versions: Sequence[Sequence[Any] | None], grouping: Grouping, *,
                     model: str | None = None, tokenizer: Any = None, table: Any = None, block_size: int = 16,
                     capacity_blocks: int | None = None, add_generation_prompt: bool = True, source: str = "",
                     causes: Sequence[bool] | None = None, counter: Any = None,
                     progress: Callable[[int], None] | None = None,
                     providers: Sequence[ProviderMeasure | Callable[[], ProviderMeasure | None] | None] | None = None,
                     pairs: Callable[[int, LogLine, Any, Any, int, str | None], None] | None = None,
                     every: float | None = None, by_model: bool = False,
                     packed: Any = None) -> list[tuple[Measure, list[str]]]:
    """Versions of a log measured by the existing engines in one sweep: each line read once, each of its distinct
    versions parsed once and each distinct prompt among them tokenized once, and every version's engines fed as
    the sweep goes: the vLLM replay (:func:`cachectl.engines.prefix.simulate`; with ``capacity_blocks`` None, no
    eviction; with one, the no-eviction ceiling beside it), the provider cache
    (:func:`cachectl.engines.provider.cache.simulate_requests`), and the token prefix each request shares with the
    previous one of its conversation (with the diff-tokens cause where they diverge, for the versions whose
    ``causes`` is true).

    ``versions``: None for ``lines`` as they are, or the values a fix pass left (:class:`~.edits.Edits` or a
    snapshot of it: a line it did not change is the line itself), read with ``model`` where a line names none.
    ``providers``: a version's provider cache already simulated over its very requests (:func:`provider_measure`),
    not simulated again, or a call that gives it once the sweep is done (a simulation fed as the sweep goes; None
    where it could not run: the version's requests are then simulated here, read again). ``progress(n)`` is called
    as each version of a line is measured. ``pairs(i, line, prev, tokens, common, cause)`` sees each line of the
    first version as it is measured: its index and line, the tokens of the previous request of its conversation
    (None for the first) and its own, the tokens they share as a prefix, and the diff-tokens cause where they
    diverge before either ends (``"unexplained"`` where no rule explains it; None where they do not diverge).
    ``by_model``: the vLLM replays' hit tokens are also summed by the model each line
    names (``model`` where it names none): :attr:`VllmMeasure.hit_tokens_by_model`. ``packed``: the log as it is,
    as its first read packed it for the fork analysis (a :class:`~cachectl.engines.prefix.forks.RequestStore`, a
    request a line): a line as it is (in any version) takes its token IDs from there, not rendered
    and tokenized again, nor parsed where no version that has it is simulated here (the same measures)."""
    from ...tokenization import encoder_beside
    from .. import tokendiff

    k = len(versions)
    want_causes = list(causes) if causes is not None else [True] * k
    if pairs is not None and tokenizer is None:
        raise UsageError("the pairs of a log are compared as tokens: pass `tokenizer`")
    given = list(providers) if providers is not None else [None] * k
    if tokenizer is None:
        return [_provider_only(lines, versions, j, model, table, source, g() if callable(g) else g, progress, every)
                for j, g in enumerate(given)]
    if counter is None and table is not None:
        from ..provider import cache as promptcache

        counter = promptcache.tokenizer_counter(tokenizer)
    simulated = partial(_provider_run, table, source, counter, every) if table is not None else None
    alias = _aliases(versions, len(lines), given)
    keep = sorted(set(alias))   # the distinct versions, measured; the others are given their measures
    weight = [alias.count(j) for j in keep]   # (versions a measured one stands for, in progress ticks)
    vs = [_Version(block_size, capacity_blocks, source,
                   any(want_causes[e] for e in range(k) if alias[e] == j) or (j == 0 and pairs is not None),
                   given[j], simulated, by_model) for j in keep]
    versions = [versions[j] for j in keep]
    k = len(keep)
    # every version's no-eviction replay in one (a request several versions send alike is replayed once)
    infinite = InfiniteVersions(k, block_size, labelled=by_model)
    # (the model each line names, where the hit tokens are summed by it: the line store's kept facts, not parsed)
    models = [line_facts(lines, i)[2] or model for i in range(len(lines))] if by_model else None
    ends = grouping.last_indices()
    # (the lines as they are: their tokens as the first read packed them)
    if packed is not None and len(packed) != len(lines):
        packed = None
    reads = [v.simulates for v in vs]
    starts = range(0, len(lines), BATCH)

    def rows(start: int) -> list[list[LogLine]]:
        return [line_versions(lines, versions, i, model, packed, reads)
                for i in range(start, min(len(lines), start + BATCH))]

    located = [j for j, v in enumerate(vs) if v.causes]  # (the versions whose diverging pairs are located)

    def tokenized(b: int) -> tuple[list[list[LogLine]], list[list[Any]]]:
        batch = rows(starts[b])
        return batch, rows_later(batch, tokenizer, add_generation_prompt, located)()

    # the provider simulations' position texts, a batch's together, encoded before they are asked for one at a time;
    # in one process the next batch is rendered and its encoding (and texts) started on a thread of its own before
    # this one is measured (the encoding releases the GIL: :func:`~cachectl.tokenization.encoder_beside`)
    simulating = [j for j, v in enumerate(vs) if v.simulates]
    prime = getattr(counter, "prime_requests", None) if simulating else None
    encoder, close = encoder_beside() if hasattr(tokenizer, "tokenize_later") else (None, lambda: None)
    begun: dict[int, tuple[list[list[LogLine]], Callable[[], list[list[Any]]]]] = {}

    def begin(b: int) -> tuple[list[list[LogLine]], Callable[[], list[list[Any]]]]:
        batch = rows(starts[b])
        if prime is not None and encoder is not None:
            encoder.submit(prime, [row[j].request for row in batch for j in simulating])
        return batch, rows_later(batch, tokenizer, add_generation_prompt, located, encoder)

    def pipelined(b: int) -> tuple[list[list[LogLine]], list[list[Any]]]:
        batch, done = begun.pop(b) if b in begun else begin(b)
        if b + 1 < len(starts):
            begun[b + 1] = begin(b + 1)
        return batch, done()

    try:
        for b, start in enumerate(starts):
            batch, toks = pipelined(b) if encoder else tokenized(b)
            if prime is not None and encoder is None:
                prime(row[j].request for row in batch for j in simulating)
            for i, row, tok in zip(range(start, start + len(batch)), batch, toks):
                g = grouping.groups[i]
                # (vLLM's cache_salt, which keys a request's blocks apart: the fixes leave it as it is)
                salts = [ln.salt if type(ln) is AsPacked else hashable_salt(cache_salt_of(ln.value), source=source,
                                                                             line=ln.line) for ln in row]
                # (id of a version's tokens, its salt) -> (the tokens, the salt, the mask of the versions that send them)
                alike: dict[tuple[int, Any], tuple[Any, Any, int]] = {}
                for j, (t, salt) in enumerate(zip(tok, salts)):
                    ids, _, mask = alike.get((id(t), salt), (t.ids, salt, 0))
                    alike[id(t), salt] = ids, salt, mask | 1 << j
                label = models[i] if models is not None else None
                for ids, salt, mask in alike.values():
                    infinite.add(ids, mask, salt, label)
                for j, (v, ln, t, salt, w) in enumerate(zip(vs, row, tok, salts, weight)):
                    if v.vllm is not None:
                        v.trace.append(TraceRequest(index=i, line=ln.line, prompt_tokens=len(t.ids), tokens=t.ids,
                                                    timestamp=ln.timestamp, salt=salt))
                    if ln.request is not None:
                        v.requests += 1
                        v.reqs.append(ln.request)
                    prev = v.last.pop(g, None)
                    if ends[g] != i:
                        v.last[g] = t
                    if progress is not None:
                        progress(w)
                    c, cid = 0, None
                    if prev is not None:
                        c = tokendiff.common_prefix_length(prev.ids, t.ids)
                        v.reused += c
                        v.tokens += len(t.ids)
                        v.reusable += min(len(prev.ids), len(t.ids))
                        if v.causes and c < min(len(prev.ids), len(t.ids)):  # (diff-tokens' cause, without windows)
                            cause = tokendiff.explain(rendered(prev), rendered(t), c, tokenizer)
                            cid = cause.id if cause is not None else "unexplained"
                            v.cause_count[cid] = v.cause_count.get(cid, 0) + 1
                    if j == 0 and pairs is not None:
                        pairs(i, ln, prev, t, c, cid)
            for v in vs:
                v.flush()
    finally:
        begun.clear()
        close()
        for v in vs:
            v.close()
    order = list(dict.fromkeys(models)) if models is not None else []   # (the models, as they first appear)
    got = [_measured(v, len(lines), infinite.totals(j), block_size,
                     partial(_simulated_again, lines, versions[j], model, simulated) if simulated else None,
                     (models, order, infinite.by_label(j)) if models is not None else None)
           for j, v in enumerate(vs)]
    out = []
    for j, e in enumerate(alias):
        m, notes = got[keep.index(e)]
        out.append((replace(m, causes=dict(m.causes) if want_causes[j] else {}), list(notes)))
    return out


def _simulated_again(lines: Sequence[LogLine], values: Sequence[Any] | None, model: str | None,
                     simulated: Callable[[], _Pushed]) -> tuple[Any, int] | None:
    """A version's provider cache simulated over its requests, read again from ``lines`` (no token is encoded): the
    simulation's report and the requests it read; None where it has none (as the sweep starts a simulation at its
    first request)."""
    n = [0]
    got = _requests(lines, values, model, n)
    first = next(got, None)
    if first is None:
        return None
    run = simulated()
    run.put(chain((first,), got))
    return run.result(), n[0]


def _requests(lines: Sequence[LogLine], values: Sequence[Any] | None, model: str | None, counted: list[int],
              progress: Callable[[int], None] | None = None) -> Iterator[Any]:
    """The requests of one version of the log (``values``: as :func:`measure_versions` reads them), its lines read
    again; ``counted[0]`` counts them (the lines without a request body are not requests)."""
    for i in range(len(lines)):
        ln = line_versions(lines, [values], i, model)[0]
        if progress is not None:
            progress(1)
        if ln.request is not None:
            counted[0] += 1
            yield ln.request


def _measured(v: _Version, n: int, totals: tuple[int, int, int], block_size: int,
              again: Callable[[], tuple[Any, int] | None] | None = None,
              by_model: tuple[list[str | None], list[str | None], dict[Any, int]] | None = None
              ) -> tuple[Measure, list[str]]:
    """One version's measures; ``by_model``: the model of each line, the models in the order they first appear,
    and the no-eviction hit tokens by model."""
    requests, query, hits = totals

    def split(got: dict[Any, Any] | None) -> tuple[tuple[str | None, float], ...] | None:
        return tuple((m, got.get(m, 0)) for m in by_model[1]) if by_model is not None and got is not None else None

    # without eviction (with a capacity: the ceiling, what the log's shared prefix is worth)
    infinite = VllmMeasure("infinite", block_size, None, requests, query, hits, hits / query if query else None,
                           split(by_model[2]) if by_model is not None else None)
    vllm, ceiling = infinite, None
    if v.vllm is not None:
        r = v.vllm.result()
        at_cap = (summed_by_model(zip(range(len(v.hits)), v.hits), by_model[0].__getitem__)
                  if by_model is not None and v.hits is not None and len(v.hits) == len(by_model[0])  # (a hit a line)
                  else None)
        vllm = VllmMeasure(r.policy, r.block_size, r.capacity_blocks, r.requests, r.query_tokens, r.hit_tokens,
                           r.hit_rate, split(at_cap))
        ceiling = infinite
    notes: list[str] = []
    provider = v.provider
    if callable(provider):  # (given once the sweep is done; where it is not, simulated from the lines read again)
        provider = provider()
        if provider is None and again is not None:
            try:
                got = again()
                provider = provider_measure(got[0], got[1], n - got[1]) if got is not None else None
            except MalformedInput:
                raise
            except (InputError, UsageError) as exc:
                notes.append(f"provider cache not simulated: {exc}")
    if v.provider_job is not None:
        try:
            provider = provider_measure(v.provider_job.result(), v.requests, n - v.requests)
        except MalformedInput:
            raise
        except (InputError, UsageError) as exc:
            notes.append(f"provider cache not simulated: {exc}")
    return Measure(vllm, provider, v.reused, v.tokens, v.cause_count, ceiling, v.reusable), notes


def _provider_run(table: Any, source: str, counter: Any, every: float | None = None) -> _Pushed:
    """A version's provider simulation (prompt-cost's, with the sweep's token counter), fed as the sweep goes."""
    from ..provider.cache import CostRun

    run = CostRun(table=table, source=source, text_counter=counter, every=every, token_source="tokenizer",
                  keep_requests=False)
    return _Pushed(run.add, run.report)


def _provider_only(lines: Sequence[LogLine], versions: Sequence[Sequence[Any] | None], j: int, model: str | None,
                   table: Any, source: str, provider: ProviderMeasure | None,
                   progress: Callable[[int], None] | None, every: float | None = None) -> tuple[Measure, list[str]]:
    """A version measured without a tokenizer: the provider cache alone, where the lines give token counts."""
    notes: list[str] = []
    counted = [0]  # the requests simulated (the lines without a request body are not)

    def reqs() -> Iterator[Any]:
        return _requests(lines, versions[j], model, counted, progress)

    any_req = provider is None and next(reqs(), None) is not None
    if any_req and table is not None and any(p.tokens is None for r in reqs() for p in r.positions):
        notes.append("the provider cache simulation needs token counts: pass `tokenizer`")
    elif any_req and table is not None:
        from ..provider import cache as promptcache

        try:
            counted[0] = 0
            rep = promptcache.simulate_requests(reqs(), table=table, source=source, text_counter=None,
                                                every=every, token_source="tokenizer", keep_requests=False)
        except MalformedInput:
            raise
        except (InputError, UsageError) as exc:
            notes.append(f"provider cache not simulated: {exc}")
        else:
            provider = provider_measure(rep, counted[0], len(lines) - counted[0])
    return Measure(None, provider, None, None, {}, None), notes


def provider_measure(rep: Any, requests: int, skipped: int = 0) -> ProviderMeasure:
    """A provider simulation's report (:func:`cachectl.engines.provider.cache.simulate_requests`) of ``requests``
    requests as a measure (``skipped``: the lines without a request body)."""
    t = rep.totals
    return ProviderMeasure(requests, int(t.get("cache_read_input_tokens", 0)), int(t.get("cache_creation_input_tokens", 0)),
                           int(t.get("input_tokens", 0)), rep.total_cost_usd, rep.uncached_cost_usd, rep.hit_rate,
                           skipped)
