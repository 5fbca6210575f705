"""The fix codes of ``cachectl fix``, one module each (stable codes; ``FixOptions.unsafe`` turns on the unsafe
ones, as ruff's ``--unsafe-fixes``); each module's docstring says what its code does and when it is safe.

A new fix code is a new module here: a function ``apply(rw: Rewriter) -> None`` that rewrites ``rw.values`` and
records each rewrite with ``rw.record``, its :class:`FixCode`, and its line in :data:`REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..groups import Grouping, LogLine
from .fx001_volatile_to_end import FX001
from .fx002_tool_schema_sorted_keys import FX002
from .fx003_tool_order import FX003
from .fx004_doubled_bos import FX004
from .fx005_reasoning_consistent import FX005
from .fx006_cache_breakpoints import FX006
from .fx007_per_user_to_end import FX007
from .rewriter import Fix, FixCode, Rewriter

#: every fix code, in the order they are applied (each sees the log as the ones before it left it)
REGISTRY: tuple[FixCode, ...] = (FX004, FX002, FX003, FX005, FX001, FX007, FX006)
#: code -> its FixCode, by code
FIXES: dict[str, FixCode] = {f.code: f for f in sorted(REGISTRY, key=lambda f: f.code)}
CODES = tuple(FIXES)
#: the diff-tokens causes each fix addresses
CAUSES: dict[str, tuple[str, ...]] = {c: f.causes for c, f in FIXES.items()}


@dataclass(frozen=True)
class Start:
    """Where another run of the fix codes takes up a run (:func:`rewrite`'s ``then``): the codes of :data:`REGISTRY`
    through index ``cut`` did in that run what they would do in the other one, whose rewrites, fixes and notes
    they left are these (``values``: an :class:`~..edits.Edits` of its own)."""

    cut: int
    values: Any = field(repr=False)
    fixes: tuple[Fix, ...] = field(repr=False)
    notes: tuple[str, ...] = ()


def rewrite(lines: Sequence[LogLine], grouping: Grouping, codes: Sequence[str], unsafe: bool, tokenizer: Any,
            table: Any, model: str | None, counter: Any = None, forks: Any = None,
            progress: Callable[[int], None] | None = None,
            after: Callable[[str, Rewriter], None] | None = None, then: tuple[Collection[str], bool] | None = None,
            start: Start | None = None) -> Rewriter:
    """The enabled fix codes applied to the whole log (a fresh deep copy), in :data:`REGISTRY`'s order; the
    rewritten values, the fixes and the notes are the returned rewriter's. ``forks``: the log's shared prefix
    across requests (:func:`cachectl.engines.repair.shared_prefix.log_forks`), for the cross-request fixes.
    ``after(code, rw)``: called when each enabled code has been applied, before the next one is.

    ``then``: (codes, unsafe) of a run to come on the same lines: the rewriter's :attr:`~Rewriter.start` is where it
    may take up this one (None: nowhere), after the codes that do here what they would do there. A code both run
    does so where each fix it records is applied in both (safe, or both runs unsafe or neither); a code only this
    one runs, where it records no fix and rewrites nothing; a code only the other one runs ends it. ``start``: such
    a place (of a run with these very lines and options), taken up there: the codes through it are not applied
    again."""
    rw = Rewriter(lines, grouping, unsafe, tokenizer, table, model, counter, forks, progress)
    skip = -1
    if start is not None:
        rw.values, rw.fixes, rw.notes, skip = start.values, list(start.fixes), list(start.notes), start.cut
    others, others_unsafe = then if then is not None else ((), unsafe)
    taking = then is not None
    cut, at, fixes, notes = -1, None, [], []
    for k, fix in enumerate(REGISTRY):
        if k <= skip:
            continue
        if fix.code not in codes:
            taking = taking and fix.code not in others
            continue
        n_fixes, n_notes, n_writes = len(rw.fixes), len(rw.notes), rw.values.writes
        fix.apply(rw)
        if after is not None:
            after(fix.code, rw)
        if taking:
            new = rw.fixes[n_fixes:]
            if fix.code in others:
                taking = all(f.safe or unsafe == others_unsafe for f in new)
            else:
                taking = not new and rw.values.writes == n_writes
            if taking:
                if fix.code in others:
                    fixes += new
                    notes += rw.notes[n_notes:]
                cut, at = k, rw.values.snapshot()
    if at is not None and any(REGISTRY[k].code in others for k in range(cut + 1)):
        rw.start = Start(cut, rw.values.branch(at), tuple(fixes), tuple(notes))
    return rw


__all__ = ["CAUSES", "CODES", "FIXES", "REGISTRY", "Fix", "FixCode", "Rewriter", "Start", "rewrite"]
