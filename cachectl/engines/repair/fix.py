"""Rewrite a logged workload so that its cacheable prefix is stable, and measure what that is worth.

Library entry (what ``cachectl fix`` and ``cachectl report`` call)::

    lines = log_lines(iter_jsonl(path), source=path, key="metadata.session")   # or key=None: grouped here
    report = fix_log(lines, FixOptions(unsafe=False), tokenizer=tok, table=PriceTable.load())
    report.fixes      # tuple[Fix, ...]: one per rewrite found (applied or not), each with code, name, safety
    report.before     # Measure: vLLM prefix hit rate, provider cache reads/writes and dollars, pair reuse
    report.after      # Measure of the rewritten log (its parts are None where they could not be measured)
    report.output     # tuple of the rewritten JSON values, one per input line, in the input's own shape
    report.grouping   # Grouping: which conversation each line belongs to, and how that was decided
    report.per_cause  # tuple[CauseGain, ...]: tokens reused per fix code (fixes applied one code at a time)

``fix_log(lines: Sequence[LogLine], options: FixOptions = FixOptions(), *, tokenizer: TokenizerHandle | None =
None, table: PriceTable | None = None, source: str = "") -> FixReport``; ``FixReport.to_dict()`` is the JSON of
``cachectl fix --format json`` (without ``output``). The lines and their conversations are
:mod:`.groups`' (``log_lines``, ``group_sessions``), the before/after measure is :mod:`.measure`'s.

Fix codes (stable; ``FixOptions.unsafe`` turns on the unsafe ones, as ruff's ``--unsafe-fixes``): one module
each in :mod:`.fixes`, whose docstring says what the code does and when it is safe: ``FX001 volatile_to_end``
(unsafe), ``FX002 tool_schema_sorted_keys`` (safe), ``FX003 tool_order`` (unsafe), ``FX004 doubled_bos`` (unsafe),
``FX005 reasoning_consistent`` (safe where a tokenizer shows the render unchanged), ``FX006 cache_breakpoints``
(safe), ``FX007 per_user_to_end`` (unsafe). FX001, FX007 and FX003 apply across requests too: the log's
shared-prefix tree (:mod:`.shared_prefix`, run once per log) names the lines that hold a per-request or per-user
value where requests that otherwise share a prefix split; FX003 puts the same tools in one order log-wide.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ...errors import InputError, UsageError
from .fixes import CODES, FIXES, REGISTRY, Fix, rewrite
from .groups import Grouping, LogLine, Sessions, group_sessions, left_out_note, log_models, with_model
from .losses import lost_token_prices, no_figure
from .measure import Measure, measure_versions
from .shared_prefix import CrossRequestGain, ForkLines, LogForks, cross_request_gain, log_forks
from .store import Mapped

if TYPE_CHECKING:
    from ...workers import Workers

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class FixOptions:
    unsafe: bool = False
    #: conversation key field (dotted path); None groups the lines automatically
    key: str | None = None
    window_s: float = 1800.0
    #: codes to consider (None: all)
    select: tuple[str, ...] | None = None
    block_size: int = 16
    #: vLLM capacity in blocks; None replays with no eviction (the ceiling)
    capacity_blocks: int | None = None
    #: price table model for lines that name none
    model: str | None = None
    add_generation_prompt: bool = True
    #: the provider simulations' time between requests where a line has no timestamp (a line without one is sent
    #: ``every`` s after the request before it)
    every: float | None = None
    #: measure tokens reused per fix code (one more rewrite and tokenization per code found)
    per_cause: bool = True
    #: without ``unsafe``, still run the unsafe codes to list what they would fix (``fix`` does); ``report``'s run
    #: of the safe fixes, which shows only what applies, does not (an unsafe code applies nothing there)
    list_unsafe: bool = True


@dataclass(frozen=True)
class CauseGain:
    code: str
    name: str
    fixes: int
    reused_tokens: int          # pair-reuse tokens gained by this code, applied after the codes before it
    #: provider cache read tokens and dollars this code gains (same order); None when not simulated
    provider_read_tokens: int | None = None
    provider_saved_usd: float | None = None
    #: vLLM hit tokens this code gains with no eviction (the same order): the cross-request gain shows here, where
    #: the tokens shared with the conversation's previous request do not move
    vllm_hit_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class FixReport:
    schema_version: int = SCHEMA_VERSION
    source: str
    requests: int
    grouping: Grouping
    fixes: tuple[Fix, ...]
    before: Measure | None
    after: Measure | None
    per_cause: tuple[CauseGain, ...] = ()
    notes: tuple[str, ...] = ()
    #: the rewritten values, one per line (a sequence read from disk for a long log: iterate it once, in order)
    output: Sequence[Any] = field(default=(), repr=False)
    #: across requests: the forks of the log's shared prefix, the vLLM hits before and after (None: no fork with
    #: a fix, or the log was not analysed)
    cross_request: CrossRequestGain | None = None
    #: the fork analysis itself (not in the JSON; ``cachectl report`` reuses it)
    forks: LogForks | None = field(default=None, repr=False, compare=False)
    #: ``fix_log(preview_unsafe=True)``: the same log with the unsafe fixes too (not in the JSON)
    unsafe_preview: FixReport | None = field(default=None, repr=False, compare=False)

    @property
    def applied(self) -> int:
        return sum(f.applied for f in self.fixes)

    @property
    def unsafe_skipped(self) -> int:
        return sum(1 for f in self.fixes if not f.applied and not f.safe)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(replace(self, output=(), forks=None, unsafe_preview=None))
        d.pop("output", None)
        d.pop("forks", None)
        d.pop("unsafe_preview", None)
        d["forks"] = [f.to_dict() for f in self.forks.report.forks] if self.forks is not None else []
        d["applied"] = self.applied
        d["unsafe_skipped"] = self.unsafe_skipped
        return d


# ------------------------------------------------------------------------------------------------ entry


def fix_log(lines: Sequence[LogLine], options: FixOptions = FixOptions(), *, tokenizer: Any = None,
            table: Any = None, source: str = "", preview_unsafe: bool = False,
            progress: Callable[[int], None] | None = None, workers: Workers | None = None,
            first_read: FirstRead | None = None, provider_read: Any = None) -> FixReport:
    """Find and apply the fixes on a log, and measure the log before and after (see the module docstring).

    ``preview_unsafe``: without ``options.unsafe``, where unsafe fixes were skipped, the log is rewritten with them
    too and measured in the same sweep: that report is ``unsafe_preview`` (what ``--unsafe-fixes`` would give).
    ``progress(n)``: called as lines are grouped, rewritten and measured (each pass over the log counts its lines
    again). ``workers`` (:class:`cachectl.workers.Workers`): the log before the fixes is measured in a child process
    while this one finds the forks and rewrites (the same report; pass ``workers.tick`` as ``progress``), with the
    token IDs ``first_read`` packed (:attr:`FirstRead.packed`: no prompt is rendered again there).
    ``first_read`` (:class:`FirstRead`): what the lines' first read found (the conversations, the requests packed for
    the forks), not read from them again. ``provider_read`` (:func:`.sections.provider_read`): the provider cache
    simulated over the lines as they were first read, which the measure of the log as it is takes (in one process:
    its lines are not parsed again for it)."""
    lines, grouping, counter, measured = started(
        lines, options, tokenizer=tokenizer, table=table, source=source, progress=progress, first_read=first_read,
        counter=provider_read.text_counter if provider_read is not None else None)
    before_job = None
    if workers is not None and workers.jobs > 1:
        # beside the forks analysis and the rewrite (the lines' token IDs as the first read packed them)
        before_job = workers.submit(measured, lines, [None],
                                    packed=first_read.packed if first_read is not None else None)
    forks, fork_notes, rewrite = forked(lines, grouping, options, tokenizer=tokenizer, table=table, counter=counter,
                                        source=source, progress=progress, first_read=first_read)
    full_options = replace(options, unsafe=True, per_cause=False)
    rws = rewrites(rewrite, options, full_options if preview_unsafe and not options.unsafe else None,
                   lambda rw: any(not f.applied and not f.safe for f in rw.fixes))
    # (the log as it is joins the sweep of its versions, unless a child measured it)
    passes, first = measured_pass(rws, measured, lines, before=before_job is None,
                                  packed=forks.requests if forks is not None else None,
                                  before_provider=(partial(provider_read.measure_before, len(lines))
                                                   if provider_read is not None and before_job is None else None))
    before, n1 = first if first is not None else before_job.result()[0]  # type: ignore[union-attr]
    report = assembled(lines, options, grouping, forks, fork_notes, before, n1, passes[0], table=table,
                       source=source, tokenizer=tokenizer)
    if len(passes) > 1:
        report = replace(report, unsafe_preview=assembled(lines, full_options, grouping, forks, (), before, (),
                                                          passes[1], table=table, source=source, tokenizer=tokenizer))
    return report


class FirstRead:
    """What ``fix`` and ``report`` take from the first read of the log's lines (pass :meth:`add` as
    :func:`.groups.log_lines`' ``each``), so that no later pass reads the lines again for it: the conversations found
    automatically (without ``options.key``) and the requests packed for the fork analysis (rendered and tokenized
    with ``tokenizer``: the sweep takes the lines' token IDs there). ``forks``: False
    leaves them to the analysis (``--ray`` renders the log on the cluster first). A thread encodes a batch while the
    next lines are read (:attr:`encoder`: :class:`.shared_prefix.ForkLines`' ``encoder``, and a reader's
    ``ahead``: :meth:`then`). :meth:`finish` ends the read (and lets the thread go)."""

    def __init__(self, options: FixOptions, *, tokenizer: Any = None, source: str = "", forks: bool = True):
        self.sessions = Sessions(options.window_s, tokenizer) if options.key is None else None
        #: the executor (one thread) the first read's batches are encoded on; None: none
        self.encoder: Any = None
        self._close: Callable[[], None] | None = None
        if forks and hasattr(tokenizer, "tokenize_later"):
            from ...tokenization import encoder_beside

            self.encoder, self._close = encoder_beside()
        self.forks = (ForkLines(tokenizer=tokenizer, add_generation_prompt=options.add_generation_prompt,
                                source=source, encoder=self.encoder) if forks else None)
        self.lines = 0
        self._then: list[Callable[[LogLine], None]] = []
        self._ahead: list[Callable[[LogLine], None]] = []
        self._held: deque[LogLine] = deque()   # lines read, not yet fed to ``_then``

    @property
    def packed(self) -> Any:
        """The requests packed for the fork analysis, a request a line (a
        :class:`~cachectl.engines.prefix.forks.RequestStore`: a sweep of the log as it is takes their token IDs there,
        in a child process too); None where none were (``forks`` False, a line that could not be packed)."""
        got = self.forks
        return got.requests if got is not None and got.note is None else None

    def then(self, feed: Callable[[LogLine], None], ahead: Callable[[LogLine], None] | None = None) -> None:
        """``feed(line)`` for every line, in order, once the requests of its batch are packed: a reader that takes
        their token IDs (:meth:`.shared_prefix.ForkLines.known`) finds them there. ``ahead(line)``: as each line is
        read, before its batch is handed to :attr:`encoder` (what it hands there first is done by the time the line
        is fed, unless the fork analysis was given up)."""
        self._then.append(feed)
        if ahead is not None:
            self._ahead.append(ahead)

    def add(self, ln: LogLine) -> None:
        self.lines += 1
        for ahead in self._ahead:
            ahead(ln)
        if self.sessions is not None:
            self.sessions.add(ln)
        if self.forks is not None:
            self.forks.add(ln)
        if self._then:
            self._held.append(ln)
            self._feed(len(self._held) - (self.forks.waiting if self.forks is not None else 0))

    def finish(self) -> None:
        """The last batch packed, every line fed and the encoding thread let go, the tokenizer set back (once;
        :func:`started` calls it)."""
        if self.forks is not None:
            self.forks.finish()
        self._feed(len(self._held))
        close, self._close, self.encoder = self._close, None, None
        if close is not None:
            close()

    def _feed(self, n: int) -> None:
        for _ in range(n):
            ln = self._held.popleft()
            for feed in self._then:
                feed(ln)


def prepared(lines: Sequence[LogLine], options: FixOptions, source: str = "") -> Sequence[LogLine]:
    """The options checked against the lines (no lines, unknown codes: an error), the lines with ``options.model``
    where they name none."""
    if not lines:
        raise InputError("no requests", source=source)
    codes = tuple(options.select) if options.select else CODES
    unknown = [c for c in codes if c not in FIXES]
    if unknown:
        raise UsageError(f"unknown fix code(s) {', '.join(unknown)}; known: {', '.join(CODES)}")
    if options.model is not None:
        lines = _modelled(lines, options.model)
    return lines


def started(lines: Sequence[LogLine], options: FixOptions, *, tokenizer: Any = None, table: Any = None,
            source: str = "", progress: Callable[[int], None] | None = None, first_read: FirstRead | None = None,
            counter: Any = None) -> tuple[Sequence[LogLine], Grouping, Any, Callable[..., list[tuple[Measure, list[str]]]]]:
    """What every run on a log starts with: the lines :func:`prepared`, their conversations (by
    ``options.key``, else found; ``first_read``: as the lines were first read), one provider token counter
    (``counter`` where the run has one already: :func:`measure_counter`), and the measure of versions of the log in
    one sweep (``measured(lines, versions, ...)``: :func:`.measure.measure_versions`)."""
    lines = prepared(lines, options, source)
    if first_read is not None and first_read.lines != len(lines):
        raise ValueError(f"the first read saw {first_read.lines} lines, not the {len(lines)} given")
    if first_read is not None:
        first_read.finish()
    if options.key is not None:  # (the keys are read without parsing the lines)
        grouping = group_sessions(lines, key=options.key)
        if progress is not None:
            progress(len(lines))
    elif first_read is not None and first_read.sessions is not None:
        grouping = first_read.sessions.grouping()
    else:
        grouping = group_sessions(_ticking(lines, progress), window_s=options.window_s, tokenizer=tokenizer)
    counter = counter if counter is not None else measure_counter(tokenizer)
    # (a log whose models are priced differently: the replays' hits split by model, for the gain's dollars)
    price, _ = lost_token_prices(table, log_models(lines), options.model, per_request=True)
    by_model = price is not None and price.rate is None
    return lines, grouping, counter, _measurer(grouping, options, tokenizer, table, source, counter, progress,
                                               by_model)


def measure_counter(tokenizer: Any) -> Any:
    """One provider token counter (and its cache of position token IDs) for every measure of a run."""
    if tokenizer is None:
        return None
    from ..provider.cache import tokenizer_counter

    return tokenizer_counter(tokenizer)


def _measurer(grouping: Grouping, options: FixOptions, tokenizer: Any, table: Any, source: str, counter: Any,
              progress: Callable[[int], None] | None, by_model: bool = False
              ) -> Callable[..., list[tuple[Measure, list[str]]]]:
    """``measured(lines, versions, causes=..., providers=...)``: versions of the log measured in one sweep
    (:func:`.measure.measure_versions`)."""
    return partial(measure_versions, grouping=grouping, model=options.model, tokenizer=tokenizer, table=table,
                   block_size=options.block_size, capacity_blocks=options.capacity_blocks,
                   add_generation_prompt=options.add_generation_prompt, source=source, counter=counter,
                   progress=progress, every=options.every, by_model=by_model)


def forked(lines: Sequence[LogLine], grouping: Grouping, options: FixOptions, *, tokenizer: Any = None,
           table: Any = None, counter: Any = None, source: str = "", progress: Callable[[int], None] | None = None,
           first_read: FirstRead | None = None) -> tuple[LogForks | None, list[str], Callable[..., Rewritten]]:
    """The forks of the log's shared prefix (:func:`.shared_prefix.log_forks`; ``first_read``: the requests packed as
    the lines were first read), their notes, and ``rewrite(options)``: :func:`rewritten` on these lines,
    conversations and forks."""
    forks, notes = log_forks(lines, tokenizer=tokenizer, block_size=options.block_size,
                             capacity_blocks=options.capacity_blocks,
                             add_generation_prompt=options.add_generation_prompt, source=source, progress=progress,
                             packed=first_read.forks if first_read is not None else None)
    return forks, list(notes), partial(rewritten, lines, grouping, forks, tokenizer=tokenizer, table=table,
                                       counter=counter, progress=progress)


@dataclass(frozen=True)
class Rewritten:
    """One rewrite of the log (the codes of one set of options), not measured yet."""

    fixes: tuple[Fix, ...]      # sorted by line and code
    notes: tuple[str, ...]      # the rewriter's
    values: Sequence[Any]       # the rewritten values (:class:`~.edits.Edits`)
    #: (code, fixes applied, the values as this code and those before it left them), the codes that applied a fix
    #: in the order they are applied (for the tokens reused per cause); the last one's values are ``values``
    steps: tuple[tuple[str, int, Sequence[Any]], ...] = ()
    applied: int = 0            # fixes applied
    unsafe_skipped: int = 0     # unsafe fixes found and not applied
    #: where the next rewrite may take up this one (:func:`rewritten`'s ``then``); let go once it did
    start: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class FixPass:
    """One rewrite of the log (:func:`rewritten`) and its measures (:func:`measured_pass`): what ``fix_log`` does once
    the conversations and the forks are known (``cachectl report`` runs two, the safe one and the full one)."""

    fixes: tuple[Fix, ...]      # sorted by line and code (``examples_only``: the first applied fix of each code)
    applied: int
    unsafe_skipped: int
    notes: tuple[str, ...]      # the rewriter's
    after: Measure
    after_notes: tuple[str, ...]
    #: (code, fixes applied, the log measured with this code's fixes and those of the codes before it), the codes
    #: that applied a fix in the order they are applied; the last one's measure is ``after``
    steps: tuple[tuple[str, int, Measure], ...]
    output: Sequence[Any] = field(default=(), repr=False)


def rewritten(lines: Sequence[LogLine], grouping: Grouping, forks: LogForks | None, options: FixOptions, *,
              tokenizer: Any = None, table: Any = None, counter: Any = None,
              progress: Callable[[int], None] | None = None, examples_only: bool = False,
              then: FixOptions | None = None, start: Any = None) -> Rewritten:
    """The codes of ``options`` applied to ``lines`` (as :func:`prepared` left them); with ``options.per_cause``
    and a tokenizer, the log as each code left it too (a version number each: nothing is copied).
    ``examples_only``: of the fixes, the first applied of each code (what a report shows), and their counts.
    ``then``: the options of the rewrite to come next (one without the log as each code left it): the result's
    ``start`` is where that one may take up this one (:func:`.fixes.rewrite`). ``start``: such a place, taken up
    (the codes through it are not applied again; the rewrite is the same)."""
    codes = _codes(options)
    per_cause_wanted = options.per_cause and tokenizer is not None
    after_this = None
    if then is not None and not (then.per_cause and tokenizer is not None):
        after_this = (frozenset(_codes(then)), then.unsafe)
    # the values as each code that applied a fix left them: what applying the codes one after another gives (a
    # code that applied nothing changed nothing)
    snaps: dict[str, Sequence[Any]] = {}
    seen = [0]  # fixes applied so far

    def _step(code: str, rw: Any) -> None:
        applied = sum(1 for f in rw.fixes if f.applied)
        if applied > seen[0]:
            seen[0] = applied
            snaps[code] = rw.values.snapshot()

    rw = rewrite(lines, grouping, codes, options.unsafe, tokenizer, table, options.model, counter, forks, progress,
                 after=_step if per_cause_wanted else None, then=after_this, start=start)
    applied_codes = [c for c in codes if any(f.code == c and f.applied for f in rw.fixes)]
    order = [f.code for f in REGISTRY if f.code in applied_codes] if per_cause_wanted else []
    steps = tuple((c, sum(1 for f in rw.fixes if f.code == c and f.applied), rw.values if c == order[-1] else snaps[c])
                  for c in order)
    fixes = tuple(sorted(rw.fixes, key=lambda f: (f.line, CODES.index(f.code))))
    applied = sum(f.applied for f in fixes)
    unsafe_skipped = sum(1 for f in fixes if not f.applied and not f.safe)
    if examples_only:  # (a Fix a rewrite, held through the sweep: about 220 bytes a request on 20,000 requests)
        fixes = _examples(fixes)
    return Rewritten(fixes=fixes, notes=tuple(rw.notes), values=rw.values, steps=steps, applied=applied,
                     unsafe_skipped=unsafe_skipped, start=rw.start)


def rewrites(rewrite: Callable[..., Rewritten], first: FixOptions, then: FixOptions | None,
             wanted: Callable[[Rewritten], bool] = lambda rw: True, **kw: Any) -> list[Rewritten]:
    """``rewrite(first)`` (:func:`forked`'s), and ``rewrite(then)`` where ``then`` is given and ``wanted`` of the first:
    the second takes up the first where the two part (:func:`rewritten`'s ``then``), the codes before that are not
    applied again."""
    one = rewrite(first, then=then, **kw)
    out = [replace(one, start=None)]
    if then is not None and wanted(one):
        out.append(rewrite(then, start=one.start, **kw))
    return out


def _codes(options: FixOptions) -> tuple[str, ...]:
    """The codes a rewrite with ``options`` runs."""
    codes = tuple(options.select) if options.select else CODES
    if not options.unsafe and not options.list_unsafe:
        codes = tuple(c for c in codes if FIXES[c].safe or FIXES[c].proves_safe)
    return codes


def measured_pass(rws: Sequence[Rewritten], measured: Callable[..., list[tuple[Measure, list[str]]]],
                  lines: Sequence[LogLine], *, before: bool = False, before_provider: Any = None,
                  examples_only: bool = False, pairs: Callable[..., None] | None = None,
                  packed: Any = None) -> tuple[list[FixPass], tuple[Measure, list[str]] | None]:
    """Rewrites of one log measured in one sweep (:func:`.measure.measure_versions`): of each, the log as each
    code but the last left it and the rewritten log (every line a code rewrote is parsed again: dict equality
    ignores key order, which FX002 changes). ``before``: the log as it is joins the sweep (with ``before_provider``,
    its provider figures already simulated) and its measure is returned beside the passes (None otherwise).
    ``examples_only``: each pass keeps the first applied fix of each code and no rewritten log (what a report
    shows). ``pairs``: sees each line of the log as it is as it is measured (:func:`.measure.measure_versions`'
    ``pairs``; with ``before``). ``packed``: the requests packed for the fork analysis (the analysis's
    ``LogForks.requests``, or :attr:`FirstRead.packed` in a child that measures the log as it is beside it), which
    give the sweep the lines as they are (their token IDs: :func:`.measure.measure_versions`' ``packed``)."""
    versions: list[Any] = [None] if before else []
    causes = [True] if before else []
    for rw in rws:
        steps = [v for _, _, v in rw.steps[:-1]]
        versions += [*steps, rw.values]
        causes += [False] * len(steps) + [True]
    providers = [before_provider] + [None] * (len(versions) - 1) if before else None
    got = measured(lines, versions, causes=causes, providers=providers, pairs=pairs if before else None,
                   packed=packed)
    first = got.pop(0) if before else None
    passes = []
    for rw in rws:
        n = max(0, len(rw.steps) - 1)
        passes.append(_passed(rw, got[:n], got[n], examples_only))
        del got[:n + 1]
    return passes, first


def _passed(rw: Rewritten, step_measures: list[tuple[Measure, list[str]]], after: tuple[Measure, list[str]],
            examples_only: bool) -> FixPass:
    stepped = [m for m, _ in step_measures] + [after[0]] if rw.steps else []
    measures = [(c, n, m) for (c, n, _), m in zip(rw.steps, stepped)]
    fixes = _examples(rw.fixes) if examples_only else rw.fixes  # (:func:`rewritten` may have kept only those)
    return FixPass(fixes=fixes, applied=rw.applied, unsafe_skipped=rw.unsafe_skipped, notes=rw.notes, after=after[0],
                   after_notes=tuple(after[1]), steps=tuple(measures), output=() if examples_only else rw.values)


def _examples(fixes: Sequence[Fix]) -> tuple[Fix, ...]:
    """The first applied fix of each code, in the order of ``fixes``."""
    first: dict[str, Fix] = {}
    for f in fixes:
        if f.applied:
            first.setdefault(f.code, f)
    return tuple(first.values())


def assembled(lines: Sequence[LogLine], options: FixOptions, grouping: Grouping, forks: LogForks | None,
              fork_notes: Sequence[str], before: Measure, before_notes: Sequence[str], done: FixPass, *,
              table: Any = None, source: str = "", tokenizer: Any = None) -> FixReport:
    """The report of one fix pass: the tokens reused per fix code against ``before``, the gain across requests."""
    notes = [n for n in (left_out_note(lines),) if n] + list(fork_notes) + list(done.notes)
    notes += list(dict.fromkeys(list(before_notes) + list(done.after_notes)))
    if tokenizer is None:
        notes.append("no tokenizer: the vLLM hit rate and the tokens reused per cause need --tokenizer")
    per_cause: list[CauseGain] = []
    prev_reused = before.pair_reused_tokens or 0
    prev_provider = before.provider
    prev_hits = _ceiling_hits(before)
    for c, n, m in done.steps:
        reused = m.pair_reused_tokens or 0
        p0, p1 = prev_provider, m.provider
        hits = _ceiling_hits(m)
        per_cause.append(CauseGain(c, FIXES[c].name, n, reused - prev_reused,
                                   None if p0 is None or p1 is None else p1.cache_read_tokens - p0.cache_read_tokens,
                                   None if p0 is None or p1 is None else round(p0.cost_usd - p1.cost_usd, 10),
                                   None if hits is None or prev_hits is None else int(hits - prev_hits)))
        prev_reused, prev_provider, prev_hits = reused, p1, hits
    cross = None
    if forks is not None and forks.fixable:
        price, why = lost_token_prices(table, log_models(lines), options.model, per_request=True)
        cross = cross_request_gain(forks, before, done.after, price)
        if price is not None and cross.usd_saved is None and cross.hit_tokens_before is not None:
            split = before.vllm is not None and before.vllm.hit_tokens_by_model is not None
            why = no_figure("the gain across requests", "the log's models are priced differently and "
                            + ("some requests name no model" if split else "its hits were not counted by model"))
        notes += [why] if why and why not in notes else []
    return FixReport(source=source, requests=len(lines), grouping=grouping, fixes=done.fixes, before=before,
                     after=done.after, per_cause=tuple(per_cause), notes=tuple(notes), output=done.output,
                     cross_request=cross, forks=forks)


def _ceiling_hits(m: Measure) -> float | None:
    """The no-eviction vLLM hit tokens of a measure (the replay itself when it ran without a capacity)."""
    v = m.vllm_no_eviction or (m.vllm if m.vllm is not None and m.vllm.capacity_blocks is None else None)
    return v.hit_tokens if v is not None else None


def _ticking(lines: Iterable[LogLine], progress: Callable[[int], None] | None) -> Iterator[LogLine]:
    for ln in lines:
        if progress is not None:
            progress(1)
        yield ln


def _modelled(lines: Sequence[LogLine], model: str) -> Sequence[LogLine]:
    """The lines, those that name no model given ``model`` (as they are read: nothing is copied)."""
    return Mapped(len(lines), lambda i: with_model(lines[i], model), values_of=lines)
