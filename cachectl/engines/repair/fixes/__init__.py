"""The fix codes of ``cachectl fix``, one module each (stable codes; ``FixOptions.unsafe`` turns on the unsafe
ones, as ruff's ``--unsafe-fixes``); each module's docstring says what its code does and when it is safe.

A new fix code is a new module here: a function ``apply(rw: Rewriter) -> None`` that rewrites ``rw.values`` and
records each rewrite with ``rw.record``, its :class:`FixCode`, and its line in :data:`REGISTRY`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def rewrite(lines: Sequence[LogLine], grouping: Grouping, codes: Sequence[str], unsafe: bool, tokenizer: Any,
            table: Any, model: str | None, counter: Any = None, forks: Any = None,
            progress: Callable[[int], None] | None = None,
            after: Callable[[str, Rewriter], None] | None = None) -> Rewriter:
    """The enabled fix codes applied to the whole log (a fresh deep copy), in :data:`REGISTRY`'s order; the
    rewritten values, the fixes and the notes are the returned rewriter's. ``forks``: the log's shared prefix
    across requests (:func:`cachectl.engines.repair.shared_prefix.log_forks`), for the cross-request fixes.
    ``after(code, rw)``: called when each enabled code has been applied, before the next one is."""
    rw = Rewriter(lines, grouping, unsafe, tokenizer, table, model, counter, forks, progress)
    for fix in REGISTRY:
        if fix.code in codes:
            fix.apply(rw)
            if after is not None:
                after(fix.code, rw)
    return rw


__all__ = ["CAUSES", "CODES", "FIXES", "REGISTRY", "Fix", "FixCode", "Rewriter", "rewrite"]
