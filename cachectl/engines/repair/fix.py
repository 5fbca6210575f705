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
(safe).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ...errors import InputError, UsageError
from ...inputs import LogRecord
from .fixes import CODES, FIXES, REGISTRY, Fix, rewrite
from .groups import Grouping, LogLine, group_sessions, reparse
from .measure import Measure, measure

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
    #: measure tokens reused per fix code (one more rewrite and tokenization per code found)
    per_cause: bool = True


@dataclass(frozen=True)
class CauseGain:
    code: str
    name: str
    fixes: int
    reused_tokens: int          # pair-reuse tokens gained by this code, applied after the codes before it
    #: provider cache read tokens and dollars this code gains (same order); None when not simulated
    provider_read_tokens: int | None = None
    provider_saved_usd: float | None = None


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
    output: tuple[Any, ...] = field(default=(), repr=False)

    @property
    def applied(self) -> int:
        return sum(f.applied for f in self.fixes)

    @property
    def unsafe_skipped(self) -> int:
        return sum(1 for f in self.fixes if not f.applied and not f.safe)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(self)
        d.pop("output", None)
        d["applied"] = self.applied
        d["unsafe_skipped"] = self.unsafe_skipped
        return d


# ------------------------------------------------------------------------------------------------ entry


def fix_log(lines: Sequence[LogLine], options: FixOptions = FixOptions(), *, tokenizer: Any = None,
            table: Any = None, source: str = "", reuse: FixReport | None = None,
            progress: Callable[[int], None] | None = None) -> FixReport:
    """Find and apply the fixes on a log, and measure the log before and after (see the module docstring).

    ``reuse``: an earlier report on the same lines, tokenizer, table and options except ``unsafe`` and
    ``select``: its conversations and its measure of the log before the fixes are taken as they are (``cachectl
    report`` runs the safe and the full fix on one log). ``progress(n)``: called as lines are grouped, rewritten
    and measured (each pass over the log counts its lines again)."""
    if not lines:
        raise InputError("no requests", source=source)
    codes = tuple(options.select) if options.select else CODES
    unknown = [c for c in codes if c not in FIXES]
    if unknown:
        raise UsageError(f"unknown fix code(s) {', '.join(unknown)}; known: {', '.join(CODES)}")
    if options.model is not None:
        lines = [_with_model(ln, options.model) for ln in lines]
    grouping = (reuse.grouping if reuse is not None
                else group_sessions(_ticking(lines, progress), key=options.key, window_s=options.window_s,
                                    tokenizer=tokenizer))
    counter = None
    if tokenizer is not None:  # one counter (and its cache of position token IDs) for every measure
        from ..provider.cache import tokenizer_counter

        counter = tokenizer_counter(tokenizer)
    rw = rewrite(lines, grouping, codes, options.unsafe, tokenizer, table, options.model, counter, progress)
    values = rw.values
    # (dict equality ignores key order, which FX002 changes: every line is parsed again)
    fixed = [reparse(ln, v) for ln, v in zip(lines, values)]
    if options.model is not None:
        fixed = [_with_model(ln, options.model) for ln in fixed]
    notes = list(rw.notes)
    measured = partial(measure, grouping=grouping, tokenizer=tokenizer, table=table, block_size=options.block_size,
                       capacity_blocks=options.capacity_blocks, add_generation_prompt=options.add_generation_prompt,
                       source=source, memo={}, counter=counter, progress=progress)
    n1: list[str] = []
    if reuse is not None and reuse.before is not None:
        before = reuse.before
    else:
        before, n1 = measured(lines)
    after, n2 = measured(fixed)
    notes += list(dict.fromkeys(n1 + n2))
    if tokenizer is None:
        notes.append("no tokenizer: the vLLM hit rate and the tokens reused per cause need --tokenizer")
    per_cause: list[CauseGain] = []
    applied_codes = [c for c in codes if any(f.code == c and f.applied for f in rw.fixes)]
    if options.per_cause and tokenizer is not None and applied_codes:
        prev_reused = before.pair_reused_tokens or 0
        prev_provider = before.provider
        done: list[str] = []
        order = [f.code for f in REGISTRY if f.code in applied_codes]
        for c in order:
            done.append(c)
            if len(done) == len(order):
                m = after
            else:
                step = rewrite(lines, grouping, done, options.unsafe, tokenizer, table, options.model, counter,
                               progress)
                m = measured([reparse(ln, v) for ln, v in zip(lines, step.values)], causes=False)[0]
            reused = m.pair_reused_tokens or 0
            p0, p1 = prev_provider, m.provider
            per_cause.append(CauseGain(c, FIXES[c].name, sum(1 for f in rw.fixes if f.code == c and f.applied),
                                       reused - prev_reused,
                                       None if p0 is None or p1 is None else p1.cache_read_tokens - p0.cache_read_tokens,
                                       None if p0 is None or p1 is None else round(p0.cost_usd - p1.cost_usd, 10)))
            prev_reused, prev_provider = reused, p1
    fixes = tuple(sorted(rw.fixes, key=lambda f: (f.line, CODES.index(f.code))))
    return FixReport(source=source, requests=len(lines), grouping=grouping, fixes=fixes, before=before,
                     after=after, per_cause=tuple(per_cause), notes=tuple(notes), output=tuple(values))


def _ticking(lines: Iterable[LogLine], progress: Callable[[int], None] | None) -> Iterator[LogLine]:
    for ln in lines:
        if progress is not None:
            progress(1)
        yield ln


def _with_model(ln: LogLine, model: str) -> LogLine:
    if ln.request is None or ln.request.model is not None:
        return ln
    return replace(ln, request=replace(ln.request, model=model))


def to_records(lines: Sequence[LogLine]) -> list[LogRecord]:
    """The lines as diff-tokens' log records (its key, or the group number)."""
    return [LogRecord(line=ln.line, key=ln.key, prompt=ln.prompt) for ln in lines]
