"""The results of a fork analysis: each :class:`Fork` (where requests that share a prefix split, its cause, the fix
code that removes it, what it costs) and the :class:`ForkReport` of a whole log, which also says, request by
request, what the fixable line forks move out of its shared prefix (:meth:`ForkReport.spans_to_move`, a
:class:`MoveSpan` each). Each fork's ``tokens_lost`` is what keeping that one fork costs when every other fixable
fork is fixed (all moved, minus all but this one moved, no eviction; at ``capacity_blocks`` as well when given), so
two forks in one block each cost the whole (fixing only one recovers nothing); ``fixed_hit_tokens`` is the hit count
with all of them fixed (measured by :mod:`.cost`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .requests import ForkRequest
from .store import AS_GIVEN
from .tree import TreeNode
from .views import _UNKNOWN, _UNSEEN, _LineMove, _Tools, _View, _view

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Fork:
    """One place where requests that share a prefix split."""

    #: JSON path of the position where the branches diverge (``messages[0].content``, ``system[0]``, ``tools``);
    #: ``<template>`` in text the chat template wrote itself; None for token IDs
    path: str | None
    #: character offset inside ``path`` (in the rendered prompt for ``<template>``); None where none is known (token
    #: IDs, or tools the template wrote its own way)
    char: int | None
    cause: str
    distinct_values: int
    requests: int
    #: tokens the counterfactual replay recovers under no eviction (see the module docstring)
    tokens_lost: int
    #: the fix code that removes it (``FX001``, ``FX007``, ``FX003``, ...), None when none applies
    fixable: str | None
    #: the log field that predicts a per-user value (``user``, ``metadata.tenant_id``), None when none does
    predicted_by: str | None = None
    #: the same counterfactual replayed at ``capacity_blocks`` (None without a capacity)
    tokens_lost_at_capacity: int | None = None
    #: tokens the branches share before the fork, and how many branches split there
    shared_tokens: int = 0
    branches: int = 0
    #: a few of the diverging values (the line at the fork), as seen in the log
    examples: tuple[str, ...] = ()
    message: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class MoveSpan:
    """What FX001/FX007 move out of one request's shared prefix: a line of a field, as characters of that field
    (``start``/``end`` count in the field's own text, the line's newline included)."""

    code: str
    cause: str
    path: str
    start: int
    end: int
    text: str
    move: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
class ForkReport:
    schema_version: int = SCHEMA_VERSION
    requests: int
    query_tokens: int
    block_size: int
    capacity_blocks: int | None
    forks: tuple[Fork, ...]
    #: no-eviction hits as logged, and with every fixable fork fixed
    hit_tokens: int
    fixed_hit_tokens: int
    #: the same at ``capacity_blocks`` (None without one)
    hit_tokens_at_capacity: int | None = None
    fixed_hit_tokens_at_capacity: int | None = None
    #: tree passes and replays run (each a pass over the requests)
    passes: int = 0
    replays: int = 0
    notes: tuple[str, ...] = ()
    #: per request (in log order): the no-eviction hit tokens it gains with every fixable fork fixed (negative
    #: where a move costs it some); they add up to ``fixed_hit_tokens - hit_tokens``
    request_gains: Sequence[int] = field(default=(), repr=False)
    #: the tree's top branches as logged, and with every fixable fork fixed (:func:`_summary`), for a picture
    tree: tuple[TreeNode, ...] = ()
    fixed_tree: tuple[TreeNode, ...] = ()
    _plan: tuple = field(default=(), repr=False, compare=False)
    _tokenizer: Any = field(default=None, repr=False, compare=False)
    #: (id of a fork, its line move)
    _moves: tuple = field(default=(), repr=False, compare=False)
    #: the analysis's re-renders under the plan's tools counterfactuals (a :class:`~.store._RenderTable`, with the
    #: store they are packed in), for :meth:`spans_to_move` on the analysed requests (None: re-rendered when asked)
    _rendered: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")
             and f.name != "request_gains"}
        d["forks"] = [f.to_dict() for f in self.forks]
        d["tree"] = [asdict(n) for n in self.tree]
        d["fixed_tree"] = [asdict(n) for n in self.fixed_tree]
        d["notes"] = list(self.notes)
        return d

    def moves_nothing(self, k: int, tool_set: Any) -> bool:
        """Whether the analysis found, as it replayed the log, that no line fork moves anything out of its request
        ``k`` (by index; ``tool_set`` as :meth:`spans_to_move` takes it): then :meth:`spans_to_move` gives nothing,
        and the request is not read. False where that is not known."""
        tools = None
        for t in self._plan:
            if isinstance(t, _Tools) and t.identities == tool_set:
                table = self._rendered
                got = table.given(k, t, table.store.tools_exact(k)) if table is not None else None
                if got is None:
                    return False
                tools = None if got is AS_GIVEN else t
                break
        for t in self._plan:
            if isinstance(t, _LineMove):
                sp = t.known(k, (tools, ()))
                if sp is _UNSEEN or (sp is not None and sp[1] > sp[0]):
                    return False
        return True

    def spans_to_move(self, request: ForkRequest, *, analysed: bool = False, tool_set: Any = _UNKNOWN
                      ) -> tuple[MoveSpan, ...]:
        """For one request of the analysed log, every line that a fixable line fork moves out of its shared
        prefix, in the order the analysis moved them, located in the request's own fields. ``analysed``: the
        request is the analysis's own (its store's, by index): its re-render under a tools fix is the analysis's.
        ``tool_set``: the sorted identities of its tools, where the store knows them
        (:meth:`~.store.RequestStore.tool_set`)."""
        tools = [t for t in self._plan if isinstance(t, _Tools)]
        v = _view(request, tools, self._tokenizer, self._rendered if analysed else None, tool_set)
        out = []
        for t in self._plan:
            if not isinstance(t, _LineMove):
                continue
            sp = t.span(v)
            if sp is None or sp[1] <= sp[0]:
                continue
            moved = _locate_chars(v, sp[2], sp[3], t)
            if moved is not None:
                out.append(moved)
            v.move(sp[0], sp[1])
        return tuple(out)


def _locate_chars(v: _View, start: int, end: int, t: _LineMove) -> MoveSpan | None:
    if v.tok is None or v.text is None:
        return None
    for sp in v.tok.spans:
        if sp.start <= start < sp.end:
            lo = start - sp.start + sp.offset
            hi = min(end, sp.end) - sp.start + sp.offset
            return MoveSpan(t.code, t.cause, sp.field, lo, hi, v.text[start:min(end, sp.end)], t)
    return None


def fork_span(report: ForkReport, fork: Fork, request: ForkRequest) -> MoveSpan | None:
    """The span ``fork`` moves out of ``request`` (None when the request does not pass through that fork or the
    fork is not a line fork)."""
    move = dict(report._moves).get(id(fork))
    if move is None:
        return None
    return next((s for s in report.spans_to_move(request) if s.move is move), None)
