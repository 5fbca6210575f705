"""A request under a counterfactual (:class:`_View`, :func:`_view`): the fixes a fork analysis tries, each a
rewrite of the requests' served tokens. A line fork's (:class:`_LineMove`) moves the diverging line after the part
the branches share (to the end of the served tokens); a tools fork's (:class:`_Tools`) puts the tools in one order,
re-rendered (kept packed by the :class:`~.store.RequestStore`, in a :class:`~.store._RenderTable`).
"""

from __future__ import annotations

import bisect
import functools
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ....inputs import compact
from ....tokenization import KeptOffsets, Span, Tokenized
from .requests import (
    ForkRequest,
    _from_tokenized,
    _id_array,
    _request_tools,
    _tool_identity,
    canonical_tokens,
    exact_tools,
)
from .store import AS_GIVEN, Later, _RenderTable


class _View:
    """A request under a counterfactual: its base render (the request, or re-rendered with other tools) and the
    order of the base's tokens (segments of base token indices; moved spans at the end)."""

    __slots__ = ("base", "ids", "key", "moved", "req", "segs", "starts", "text", "tok", "tools")

    def __init__(self, req: ForkRequest | None, ids: Sequence[int], text: str | None, starts: Sequence[int] | None,
                 tok: Tokenized | None):
        self.req = req
        self.base = ids if isinstance(ids, array) else _id_array(ids)
        self.ids: array = self.base
        self.text, self.starts, self.tok = text, starts, tok
        self.segs: list[tuple[int, int]] | None = None
        #: the tools counterfactual this view is a re-render under (None: the request's own render)
        self.tools: _Tools | None = None
        #: the request's place in its analysis's store, while the view is its render (its own, or its re-render under
        #: ``tools``) with the line moves ``moved`` applied in order: a move's span found in it is kept under that
        #: place and that state (:class:`_Spans`)
        self.key: int | None = None
        self.moved: tuple[_LineMove, ...] = ()

    def orig(self, i: int) -> tuple[int, int]:
        """(base index of view token ``i``, end of its segment in base indices)."""
        at = 0
        for s, e in self.segs or ((0, len(self.ids)),):
            if i < at + e - s:
                return s + i - at, e
            at += e - s
        return len(self.ids), len(self.ids)

    def move(self, a: int, b: int, by: _LineMove | None = None) -> None:
        """Move view tokens [a, b) to the end (``by``: the line move whose span they are)."""
        if by is None:
            self.key = None
        else:
            self.moved += (by,)
        segs = self.segs or [(0, len(self.ids))]
        head: list[tuple[int, int]] = []
        mid: list[tuple[int, int]] = []
        at = 0
        for s, e in segs:
            n = e - s
            lo, hi = max(a - at, 0), min(b - at, n)
            if lo >= hi:
                head.append((s, e))
            else:
                if lo > 0:
                    head.append((s, s + lo))
                mid.append((s + lo, s + hi))
                if hi < n:
                    head.append((s + hi, e))
            at += n
        self.segs = head + mid
        base = self.base
        out = array(base.typecode)
        for s, e in self.segs:
            out.extend(base[s:e])
        self.ids = out

    def tokenized(self) -> Tokenized | None:
        """The view as a :class:`Tokenized` (text, offsets and spans spliced as the tokens were), for causes."""
        if self.tok is None or self.text is None or self.starts is None:
            return None
        if self.segs is None:
            return self.tok
        text, starts, tok = self.text, self.starts, self.tok
        n = len(starts)
        pieces: list[str] = []
        new_starts, new_ends = array("I"), array("I")
        char_map: list[tuple[int, int, int]] = []   # (base char start, base char end, view char start)
        at = 0
        for s, e in self.segs:
            cs = starts[s] if s < n else len(text)
            ce = starts[e] if e < n else len(text)
            char_map.append((cs, ce, at))
            for i in range(s, e):
                new_starts.append(starts[i] - cs + at)
                new_ends.append((starts[i + 1] if i + 1 < n else len(text)) - cs + at)
            pieces.append(text[cs:ce])
            at += ce - cs
        spans = []
        for sp in tok.spans:
            for cs, ce, vs in char_map:
                lo, hi = max(cs, sp.start), min(ce, sp.end)
                if lo < hi:
                    spans.append(Span(vs + lo - cs, vs + hi - cs, sp.field, sp.message_index, sp.role,
                                      sp.offset + lo - sp.start))
        spans.sort(key=lambda x: (x.start, x.end))
        return Tokenized(self.tok.prompt, self.ids, text="".join(pieces), encoding=KeptOffsets(new_starts, new_ends),
                         spans=spans, tokenizer=self.tok.tokenizer, render_opts=None)


@dataclass(frozen=True, eq=False)
class _LineMove:
    """Counterfactual of a line fork: a request whose view starts with ``prefix`` (the ``d`` tokens the branches
    share) has the line holding token ``d`` (view tokens from ``a``, the line's first, through its newline)
    moved to the end."""

    d: int
    a: int
    prefix: array
    code: str
    cause: str
    #: lines at the fork that are not values but the text the branches share (:meth:`~.causes._Causes._shared_text`):
    #: a request that holds one of them there is not moved
    keep: frozenset = frozenset()
    #: the spans this move found in the requests, by the state they were in (shared with a move made from this one)
    found: _Spans | None = field(default=None, repr=False, compare=False)

    def span(self, v: _View) -> tuple[int, int, int, int] | None:
        """(view token start, view token end, base char start, base char end) of the line in ``v``."""
        found, k = self.found, v.key
        if found is None or k is None:
            return self._span(v)
        state = (v.tools, v.moved)
        got = found.get(k, state)
        if got is _UNSEEN:
            got = self._span(v)
            found.put(k, state, got)
        return got

    def known(self, k: int, state: tuple) -> Any:
        """This move's span in request ``k`` in ``state`` (the tools counterfactual it is re-rendered under or None,
        the line moves applied before, in order) where it was found before; else :data:`_UNSEEN`."""
        return self.found.get(k, state) if self.found is not None else _UNSEEN

    def _span(self, v: _View) -> tuple[int, int, int, int] | None:
        if len(v.ids) <= self.d or v.ids[:self.d] != self.prefix or v.text is None or v.starts is None:
            return None
        od, seg_end = v.orig(self.d)
        starts, text = v.starts, v.text
        n = len(starts)
        c = starts[od]
        limit = starts[seg_end] if seg_end < n else len(text)
        field_end = _field_end(v, c)
        if field_end is not None:
            limit = min(limit, field_end)
        nl = text.find("\n", c, limit)
        end_char = limit if nl < 0 else nl + 1
        ls = starts[v.orig(self.a)[0]]
        if nl >= 0 and end_char < limit and text[end_char] == "\n" and _opens_field(v, ls):
            # the field's first line: the blank lines that set it apart go with it (what is left starts as the
            # branches that never had it do)
            while end_char < limit and text[end_char] == "\n":
                end_char += 1
        ob = bisect.bisect_left(starts, end_char, od, seg_end)
        if self.keep and text[ls:end_char].rstrip("\n") in self.keep:
            return None
        return self.a, self.d + (ob - od), ls, end_char

    def apply(self, v: _View) -> bool:
        sp = self.span(v)
        if sp is None or sp[1] <= sp[0]:
            return False
        v.move(sp[0], sp[1], self)
        return True


#: a request whose span a :class:`_Spans` has not found yet
_UNSEEN: Any = object()


class _Spans:
    """A line move's span in each request, by the state the request is in (its render: its own or a tools
    counterfactual's; the line moves applied before it), found once: a later tree pass or replay reads the move
    here, with the request's IDs alone. Kept for the requests of ``domain`` (a fork's candidate: the requests
    through the fork, ascending) or for every one of ``n`` (a move of the plan): 16 bytes each, for each state
    (at most :data:`MAX_STATES`)."""

    __slots__ = ("_at", "_domain", "_n")

    #: the states a move keeps spans in: those of the plan's passes (its own render, a tools re-render) come first;
    #: a state the plan less one counterfactual brings is asked for by one replay or two (on bench_forks.py's chat
    #: log, 2 kept as many views as 16)
    MAX_STATES = 4

    def __init__(self, domain: array | None = None, n: int = 0) -> None:
        self._domain = domain
        self._n = len(domain) if domain is not None else n
        #: (the tools counterfactual or None, the moves applied before) -> 4 ints a request: its span, or -1
        #: (nothing to move), -2 (not found yet)
        self._at: dict[tuple, array] = {}

    def _slot(self, k: int) -> int:
        d = self._domain
        if d is None:
            return k if 0 <= k < self._n else -1
        i = bisect.bisect_left(d, k)
        return i if i < len(d) and d[i] == k else -1

    def get(self, k: int, state: tuple) -> Any:
        at = self._at.get(state)
        i = 4 * self._slot(k) if at is not None else -4
        if i < 0 or at is None or at[i] == -2:
            return _UNSEEN
        return None if at[i] == -1 else (at[i], at[i + 1], at[i + 2], at[i + 3])

    def put(self, k: int, state: tuple, span: tuple[int, int, int, int] | None) -> None:
        i = 4 * self._slot(k)
        if i < 0 or (span is not None and not all(0 <= x < 2 ** 31 for x in span)):
            return  # (a request it keeps none for; past what a column of 32-bit ints holds: found again when asked)
        at = self._at.get(state)
        if at is None:
            if len(self._at) >= self.MAX_STATES:
                return
            at = self._at[state] = array("i", [-2]) * (4 * self._n)
        at[i:i + 4] = array("i", span) if span is not None else _NOTHING

    def moving(self, n: int, values: Sequence[int] | None = None, stays: Callable[[int], bool] | None = None
               ) -> _Spans:
        """These spans for the move of the plan made from this candidate, kept for each of the log's ``n`` requests.
        With ``stays`` (the move keeps some lines where they are: its ``keep``), ``values`` beside the domain (each
        request's line at the fork, numbered; -1: none): a request's span where ``stays(value)`` is false, nothing to
        move where it is true."""
        import numpy as np

        out = _Spans(n=n)
        if not self._n:
            return out
        rows = np.frombuffer(self._domain, np.int64) if self._domain is not None else np.arange(self._n)
        if stays is not None:  # (each request's value: none, or whether its line stays; the same in every state)
            assert values is not None and len(values) == self._n
            value = np.asarray(values, np.int32)
            by_value = np.array([stays(v) for v in range(int(value.max(initial=-1)) + 1)] or [False], dtype=bool)
            no_value, staying = value < 0, (value >= 0) & by_value[np.maximum(value, 0)]
        for state, at in self._at.items():
            got = np.frombuffer(at, np.int32).reshape(-1, 4).copy()
            if stays is not None:
                found = got[:, 0] >= 0
                got[found & no_value] = -2   # (found and no value: not the view its value was read in)
                got[found & staying] = -1
            new = np.full((n, 4), -2, np.int32)
            new[rows] = got
            out._at[state] = array("i", new.tobytes())
        return out


_NOTHING = array("i", (-1, -1, -1, -1))


def _opens_field(v: _View, c: int) -> bool:
    """Whether base char ``c`` is where a field's text starts (a system prompt's first line)."""
    tok = v.tok
    return tok is not None and any(sp.start == c and sp.offset == 0 for sp in tok.spans)


def _field_end(v: _View, c: int) -> int | None:
    """The end (base char) of the field that holds base char ``c``, when it ends before the next newline."""
    tok = v.tok
    if tok is None or v.text is None:
        return None
    nl = v.text.find("\n", c)
    for sp in tok.spans:  # the spans (an instrumented render of a chat prompt, once per request)
        if sp.start <= c < sp.end:
            return sp.end if nl < 0 or sp.end <= nl else None
    return None


@dataclass(frozen=True, eq=False)
class _Tools:
    """Counterfactual of a tools fork: requests with the same tools (as a set of values) list them in the
    reference order (``tool_order``), or serialized as the reference does (``tool_schema_key_order``)."""

    identities: tuple[str, ...]       # the sorted identities of the reference's tools
    reference: tuple[Any, ...]        # the reference's tools (dicts; Position values in canonical mode)
    code: str
    cause: str

    @functools.cached_property
    def exact(self) -> bytes:
        """The reference's :func:`~.requests.exact_tools` (a chat request whose tools have it renders as given)."""
        return exact_tools(self.reference)


_UNKNOWN: Any = object()


def _view(r: ForkRequest, tools: Sequence[_Tools], tokenizer: Any, memo: _RenderTable | None = None,
          ident: Any = _UNKNOWN, exact: Any = _UNKNOWN) -> _View:
    """``r`` under the tools counterfactuals in ``tools`` (re-rendered when one applies; ``memo`` keeps re-renders,
    packed by its store). ``ident``, ``exact``: the sorted identities of ``r``'s tools and their
    :func:`~.requests.exact_tools`, when known (its prompt is not read for them)."""
    if tools and ident is _UNKNOWN:
        mine = _request_tools(r)
        ident = tuple(sorted(_tool_identity(t) for t in mine)) if mine else None
    if tools and ident:
        for t in tools:
            if t.identities == ident:
                key = (r.index, id(t))
                got = memo.get(key) if memo is not None else None
                if got is AS_GIVEN:
                    break
                if got is None and r.request is None and (_as_given(r, t.reference) if exact is _UNKNOWN
                                                          else exact == t.exact):
                    if memo is not None:  # (known from now on without reading the prompt)
                        memo[key] = AS_GIVEN
                    break  # the re-render would be the request's own render: nothing to render
                if got is not None:
                    assert memo is not None
                    v = _View(r, *memo.store.unpack_render(got, Later(partial(_rendered_prompt, r, t))))
                else:
                    v = _rerendered(r, t.reference, tokenizer)
                    if memo is not None:
                        memo[key] = memo.store.pack_render(v.base, v.text, v.starts, v.tok)
                v.tools = t
                return v
    return _View(r, r.ids, r.text, r.starts, r.tokenized)


def _as_given(r: ForkRequest, reference: Sequence[Any]) -> bool:
    """Whether a chat request already lists ``reference``'s tools in its order, each serialized to the same bytes
    (key order and value types included): then the template reads the same tools and renders the same text."""
    mine = r.tokenized.prompt.tools if r.tokenized is not None else None
    if not mine or len(mine) != len(reference):
        return False
    return all(a is b or compact(a) == compact(b) for a, b in zip(mine, reference))


def _rendered_prompt(r: ForkRequest, t: _Tools) -> Any:
    """The prompt of ``r``'s re-render under ``t`` (what :func:`_rerendered` rendered)."""
    assert r.tokenized is not None
    return r.tokenized.prompt if r.request is not None else replace(r.tokenized.prompt, tools=tuple(t.reference))


def _rerendered(r: ForkRequest, tools: Sequence[Any], tokenizer: Any) -> _View:
    if r.request is not None:
        return _View(r, *canonical_tokens(r.request, _VOCAB, tools))
    assert r.tokenized is not None and tokenizer is not None
    p = r.tokenized.prompt
    opts = r.tokenized.render_opts or {"add_generation_prompt": True, "template_vars": {}}
    t = tokenizer.tokenize_many([replace(p, tools=tuple(tools))], add_generation_prompt=opts["add_generation_prompt"],
                                template_vars=opts["template_vars"])[0]
    fr = _from_tokenized(r.index, r.line, t)
    return _View(r, fr.ids, fr.text, fr.starts, fr.tokenized)


#: canonical re-renders share one vocabulary per process (ids only need to agree within a run)
_VOCAB: dict[str, int] = {}
