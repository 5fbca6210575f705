"""What every fix code receives: the log being rewritten (a :class:`Rewriter`), and what it records there (a
:class:`Fix` per rewrite found); and what a fix code is (a :class:`FixCode`, one per module of this package)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ....errors import CachectlError
from ..edits import Edits
from ..groups import Grouping, LogLine, original_at, reparse_at
from ..store import store_of


@dataclass(frozen=True, slots=True)
class Fix:
    code: str
    name: str
    safe: bool
    applied: bool
    line: int
    path: str
    message: str
    before: str | None = None
    after: str | None = None


@dataclass(frozen=True)
class FixCode:
    """One fix code: its stable code and name, whether it is safe by default (the model sees the same content),
    what it does, the diff-tokens causes it addresses, the function that applies it to the whole log, and the
    causes of the log's shared-prefix forks it removes across requests (the fork analysis offers it for those:
    :func:`cachectl.engines.prefix.forks.fix_codes`)."""

    code: str
    name: str
    safe: bool
    description: str
    causes: tuple[str, ...]
    apply: Callable[[Rewriter], None]
    across: tuple[str, ...] = ()
    #: unsafe by default, but a rewrite it proves safe is applied without ``--unsafe-fixes`` (FX005: where the
    #: render is unchanged): a run of the safe fixes runs it too
    proves_safe: bool = False


class Rewriter:
    """The whole log as the fix codes rewrite it (``values``: ``values[i]`` a fresh copy of line ``i``'s value as
    rewritten so far, ``values[i] = new`` a rewrite: a code that changes a value sets it back), and the fixes and
    notes they record."""

    def __init__(self, lines: Sequence[LogLine], grouping: Grouping, unsafe: bool, tokenizer: Any, table: Any,
                 model: str | None, counter: Any = None, forks: Any = None,
                 progress: Callable[[int], None] | None = None):
        self.lines = lines if isinstance(lines, Sequence) else list(lines)
        self.grouping = grouping
        self.unsafe = unsafe
        self.tok = tokenizer
        self.table = table
        self.model = model
        self.fixes: list[Fix] = []
        self._strings: dict[str, str] = {}
        self.notes: list[str] = []
        #: the values being rewritten: a fresh copy of each line's value as asked for (a line store's values are read
        #: from its file), a rewrite kept as edits to it (:class:`~cachectl.engines.repair.edits.Edits`)
        self.values = _values(self.lines)
        self.counter = counter
        #: the log's shared prefix across requests (:class:`~cachectl.engines.repair.shared_prefix.LogForks`), or
        #: None: the cross-request fixes (FX001, FX007) read the lines to move from it
        self.forks = forks
        #: called with 1 each time a fix code reads a line as rewritten so far (a fix code's pass over the log)
        self.progress = progress
        #: where another run may take up this one (:func:`~cachectl.engines.repair.fixes.rewrite`'s ``then``)
        self.start: Any = None
        self._prices: dict[str, Any] = {}

    def price_of(self, model: str | None) -> Any:
        """The price entry of a line's model (``model``, else the run's ``model``); None without a price table or
        for a model the table does not know. Each name is looked up once a run (an unknown one's lookup looks for
        close names)."""
        name = model or self.model
        if name is None or self.table is None:
            return None
        if name not in self._prices:
            try:
                self._prices[name] = self.table.lookup(name)
            except CachectlError:  # an unknown model: no rule of its own
                self._prices[name] = None
        return self._prices[name]

    def allowed(self, safe: bool) -> bool:
        return safe or self.unsafe

    def record(self, fix: FixCode, ln: LogLine | int, path: str, message: str, before: Any = None,
               after: Any = None, *, safe: bool | None = None) -> bool:
        """Record one rewrite of ``fix`` on line ``ln`` (a line, or its number: :meth:`number`), safe as the code
        is by default unless ``safe`` says otherwise; whether it is applied."""
        safe = fix.safe if safe is None else safe
        applied = self.allowed(safe)
        same = self._strings  # one copy of a text many fixes repeat (a path, a message, a value moved)
        line = ln if isinstance(ln, int) else ln.line
        self.fixes.append(Fix(fix.code, fix.name, safe, applied, line, same.setdefault(path, path),
                              same.setdefault(message, message),
                              None if before is None else same.setdefault(b := _short(before), b),
                              None if after is None else same.setdefault(a := _short(after), a)))
        return applied

    def members(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.grouping.count)]
        for i, g in enumerate(self.grouping.groups):
            out[g].append(i)
        return out

    def number(self, i: int) -> int:
        """Line ``i``'s number in the log (a line store's, without parsing the line)."""
        store = store_of(self.lines)
        return store.line_number(i) if store is not None else self.lines[i].line

    def current(self, i: int) -> LogLine:
        """Line ``i`` as rewritten so far (parsed again only where a fix code rewrote it)."""
        if self.progress is not None:
            self.progress(1)
        if not self.values.changed(i):
            return original_at(self.lines, i)
        return reparse_at(self.lines, i, self.values[i])


def _values(lines: Sequence[LogLine]) -> Edits:
    store = store_of(lines)
    if store is not None:
        return Edits(len(store), store.value)
    return Edits(len(lines), lambda i: copy.deepcopy(lines[i].value))


def _short(x: Any) -> str:
    s = x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
    return s if len(s) <= 120 else s[:117] + "..."
