"""The cause of each fork of the shared-prefix tree, and the fix offered for it (:class:`_Causes`): the branches'
text at the fork, compared by ``diff-tokens``' own proven causes (:func:`cachectl.engines.tokendiff.explain`: tools,
template causes, volatile values from :mod:`cachectl.volatile`, JSON key order), the line holding the divergence in
every branch (its distinct values; a value that repeats and that a log field predicts is a ``per_user_value``), and
whether the branches share anything after that line (``different_prompt`` when they do not: different apps, never
a fix). A fixable fork becomes a counterfactual (:mod:`.views`): its diverging line moved after the part the
branches share, or the tools put in one order. A line fork is offered a fix (FX001, FX007) only in the request's
head (tools, and the system and developer messages before the first turn), what ``fix`` rewrites: a turn of the
conversation is history in its later requests, kept append-only. Cause -> fix code: the fix registry's
(:func:`fix_codes`).
"""

from __future__ import annotations

import bisect
import heapq
import re
from array import array
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache
from itertools import groupby, repeat
from typing import Any

from ....tokenization import KeptOffsets, Tokenized
from ....volatile import classify_change
from ...tokendiff import common_prefix_length, explain
from .requests import _request_tools, _tool_identity
from .store import RequestStore
from .tree import PrefixTree, _below, _Edge
from .views import _LineMove, _Spans, _Tools, _View


@cache
def fix_codes() -> dict[str, str]:
    """Cause -> the fix code that removes it across requests, from the fix registry (each code's ``across``
    causes; a cause with none has nothing to rewrite)."""
    from ...repair.fixes import REGISTRY  # (not at import: the fix codes' package imports this module)

    return {cause: f.code for f in REGISTRY for cause in f.across}


#: causes that are about tools or the template: taken from diff-tokens as they are
_TOOL_CAUSES = ("tool_order", "tool_schema_key_order", "tools_changed")
_STRUCTURAL = _TOOL_CAUSES + ("doubled_bos", "bos_mismatch", "default_system_prompt", "think_stripped",
                              "message_relocated", "last_turn_closed_differently")
_TEXTUAL = ("json_key_order", "unicode_normalization", "whitespace", "token_boundary")
_LINE_CAUSES = ("date_time", "volatile_id", "counter", "per_user_value")

#: text the branches must share, line-aligned, after the diverging line, for a fork to be movable
MIN_SHARED_CHARS = 64
#: lines after the diverging one that may differ too before the shared part (a block of per-request lines)
MAX_SKIPPED_LINES = 8
#: a diverging line longer than this in any branch is not a value to move (it is the text the branches share)
MAX_VALUE_CHARS = 300


class _Causes:
    """The forks of a tree, told apart: each fork's representatives (one request per branch), the token and the
    line where they split, each request's value there, and from those the fork's cause, the fix code that removes
    it and the counterfactual that would fix it (whose cost :mod:`.cost` measures). ``view(k, plan)``: request
    ``k`` under a plan; ``ids(k, plan)``: its token IDs alone (the view's)."""

    def __init__(self, view: Callable[[int, Sequence[Any]], _View], reqs: RequestStore, *, tokenizer: Any,
                 user_fields: Sequence[str], max_forks: int, max_values: int,
                 ids: Callable[[int, Sequence[Any]], Sequence[int]]):
        self.view, self.ids, self.reqs, self.tok = view, ids, reqs, tokenizer
        self.user_fields = tuple(user_fields)
        self.max_forks, self.max_values = max_forks, max_values

    def forks_of(self, tree: PrefixTree, plan: list[Any], drafts: dict[tuple, dict]) -> list[Any]:
        """Classify the tree's new forks; the counterfactuals of the new fixable ones. A fork below one that gets a
        counterfactual in this pass waits for the next pass (its prefix changes once that one is moved)."""
        nodes = tree.forks()[:self.max_forks]
        if not nodes:
            return []
        took = tree.branches(nodes)
        sites = [site for node in nodes if (site := self._site(node, took[node.key], plan)) is not None]
        # a tools fork needs no line of each request (its values are the tools' orders), nor does a fork below one
        # whose tools this pass puts in one order (it waits for the next pass): those are found first, so that the
        # requests are read for the others only
        ordered: set[tuple[int, int]] = set()
        tools: list[Any] = []
        for site in sites:
            if site.key in drafts or _below(site.node, ordered):
                continue
            cid = self._explained(site)[3]
            site.valued = cid not in _TOOL_CAUSES
            t = None if site.valued else self._classify(site)[1]   # (classified again below, with the orders)
            if t is not None and not _planned(t, plan + tools):
                tools.append(t)
                ordered.add(site.node.key)
        self._values([site for site in sites if site.valued is not None], plan)
        added: list[Any] = []
        moved: set[tuple[int, int]] = set()
        for site in sites:
            if site.key in drafts or _below(site.node, moved):
                continue
            if site.valued is None:  # (below a tools fork this pass left as it was: read now)
                site.valued = True
                self._values([site], plan)
            dr, t = self._classify(site)
            if t is not None and _planned(t, plan + added):
                t = None
            dr["plan"] = t
            dr["node"] = site.node.key
            drafts[site.key] = dr
            if t is not None:
                added.append(t)
                moved.add(site.node.key)
        return added

    def _site(self, node: _Edge, took: array, plan: Sequence[Any]) -> _Site | None:
        """A fork's representatives (one request per branch), the token where they split, and the line there."""
        children = sorted(node.children, key=lambda c: -c.n)[:self.max_values]
        # the first branch against each other one in turn (their IDs: a fork of a value on every request has a branch
        # a request): the shortest common prefix, with the first branch that has it
        first = self.view(children[0].rep, plan)
        d, other = -1, children[0].rep
        for kid in children[1:]:
            cp = common_prefix_length(first.ids, self.ids(kid.rep, plan))
            if d < 0 or cp < d:
                d, other = cp, kid.rep
        site = _Site(node, took, d, first.ids[:d], first, first if other == children[0].rep else self.view(other, plan))
        a = first.tokenized()
        if a is None or a.text is None:
            return site
        vstarts = a.encoding.starts if isinstance(a.encoding, KeptOffsets) else first.starts
        assert vstarts is not None
        c = vstarts[d] if d < len(vstarts) else len(a.text)
        ls = a.text.rfind("\n", 0, c) + 1
        holder = next((sp for sp in a.spans if sp.start <= c < sp.end), None)
        if holder is not None:
            ls = max(ls, holder.start)
        site.mover = _LineMove(d, max(bisect.bisect_right(vstarts, ls) - 1, 0), site.prefix, "", "",
                               found=_Spans(site.took))
        return site

    def _values(self, sites: Sequence[_Site], plan: Sequence[Any]) -> None:
        """Each request's diverging value at each fork it passes through (one pass over those requests): the line
        at the fork, or the order of its tools."""
        # the requests in log order, each with the sites it passes through (in their order): a site sees its own
        # requests in log order, its values kept in arrays beside them (16 bytes a request and site)
        tagged = heapq.merge(*(zip(site.took, repeat(k)) for k, site in enumerate(sites)))
        for r, group in groupby(tagged, key=lambda x: x[0]):
            mine = [sites[k] for _, k in group]
            v = self.view(r, plan) if any(s.mover is not None and s.valued for s in mine) else None
            order = self.reqs.tool_order(r)
            for site in mine:
                site.orders.add(order)  # (None: a request without tools, one value of a tools fork)
                val = None
                if site.mover is not None and site.valued and v is not None:
                    sp = site.mover.span(v)
                    val = _value_text(v, sp) if sp is not None else None
                site.values.append(site.distinct.add(val) if val is not None else -1)

    def _classify(self, site: _Site) -> tuple[dict, Any]:
        node, d = site.node, site.d
        requests = len(site.took)
        distinct = len(site.distinct)
        base: dict[str, Any] = {"shared_tokens": d, "branches": len(node.children), "requests": requests,
                                "distinct_values": distinct, "keep": True}
        a, b, loc, cid, cause = self._explained(site)
        if a is None or b is None:
            return {**base, "path": None, "char": None, "cause": "unexplained", "fixable": None, "keep": False,
                    "message": "token IDs only: no text to compare"}, None
        path = loc.field
        if path is not None and re.search(r"(^|\.)tools\[\d+\]$", path):
            path = re.sub(r"\[\d+\]$", "", path)
        char = loc.char_offset if loc.char_offset is not None else loc.rendered_char_offset
        if path is None and loc.in_template and cid in _TOOL_CAUSES:  # (tools the template wrote its own way)
            path, char = "tools", None
        base.update(path=path if path is not None else ("<template>" if loc.in_template else None), char=char)
        detail = cause.message if cause is not None else ""
        if cid in _STRUCTURAL:
            code = fix_codes().get(cid)
            assert site.a.req is not None
            ref = _request_tools(self.reqs[site.a.req.index]) if code in ("FX002", "FX003") else None
            tools = _Tools(tuple(sorted(_tool_identity(x) for x in ref)), ref, code, cid) if ref and code else None
            if cid in _TOOL_CAUSES:
                base["distinct_values"] = len(site.orders)
            return {**base, "cause": cid, "fixable": code, "message": detail}, tools
        base["examples"] = tuple(_short(x) for x in site.distinct.texts[:3])
        mover = site.mover
        if mover is None or not _shares_after(mover, site.a, site.b):
            return {**base, "cause": "different_prompt", "fixable": None,
                    "keep": sum(1 for c in node.children if c.n >= 2) >= 2,
                    "message": "the branches share nothing after the fork (different apps or prompts): legitimate, "
                               "nothing to move"}, None
        kept = self._shared_text(site, mover)
        moving = [t for t in site.distinct.texts if t not in kept]
        if kept:
            # some branches hold the shared text itself at the fork (a line inserted above it in the others): only
            # the inserted lines are values, and only their requests move
            distinct = len(moving)
            requests = sum(1 for at in site.values if at >= 0 and site.distinct.texts[at] not in kept)
            base.update(distinct_values=distinct, requests=requests, examples=tuple(_short(x) for x in moving[:3]))
            pair = classify_change(moving[0], moving[1]) if len(moving) >= 2 else None
            if pair is not None:
                va = pair[0]
                cid = "date_time" if va.is_date_time else "counter" if va.kind == "counter" else "volatile_id"
        if any(len(v) > MAX_VALUE_CHARS for v in moving):
            # the line at the fork is a paragraph in some branch (a line inserted in the others, or text that is
            # not a value): moving it would move what the branches share
            return {**base, "cause": cid or "unexplained", "fixable": None, "keep": False, "message": detail}, None
        predictor = self._predictor(site, kept)
        repeats = distinct < requests
        if predictor is not None:
            final = "per_user_value"
        elif cid in ("date_time", "volatile_id") or (cid == "counter" and not repeats) or cid in _TEXTUAL:
            final = cid
        elif repeats and distinct >= 2:
            final = "per_user_value"
        else:
            final = cid or "unexplained"
        code = fix_codes().get(final)
        if code in ("FX001", "FX007") and not _in_head(a, loc):
            # a line of the conversation's turns: history in the later requests of its conversation, which FX001
            # and FX007 keep append-only (they move lines of the request's head only): no fix to offer
            return {**base, "cause": final, "fixable": None, "predicted_by": predictor,
                    "message": _message(final, distinct, requests, predictor, detail, head=False)}, None
        # (the spans the site's move found are this one's; where some lines are kept where they are, each request's
        # value tells whether it moves)
        found = None
        if mover.found is not None and code in ("FX001", "FX007"):
            found = mover.found.moving(len(self.reqs), site.values,
                                       (lambda at: site.distinct.texts[at] in kept) if kept else None)
        move = replace(mover, code=code, cause=final, keep=kept, found=found) if code in ("FX001", "FX007") else None
        return {**base, "cause": final, "fixable": code, "predicted_by": predictor,
                "message": _message(final, distinct, requests, predictor, detail)}, move

    def _explained(self, site: _Site) -> tuple[Any, Any, Any, str | None, Any]:
        """The site's representatives' :class:`~cachectl.tokenization.Tokenized`, the location of the fork in the
        first, and diff-tokens' cause there (its id, and itself), found once per site (None where a representative
        is token IDs only)."""
        if site.explained is None:
            a, b = site.a.tokenized(), site.b.tokenized()
            if a is None or b is None:
                site.explained = (a, b, None, None, None)
            else:
                loc = a.location(site.d)
                cause = explain(a, b, site.d, self.tok)
                site.explained = (a, b, loc, cause.id if cause is not None else None, cause)
        return site.explained

    def _shared_text(self, site: _Site, mover: _LineMove) -> frozenset[str]:
        """The lines at a fork that are the text the branches share, not values: a branch's line that the other
        representative holds a few lines further on (:data:`MAX_SKIPPED_LINES`), where lines were inserted above
        it (a clock line on top of some requests' system prompt). Empty when every value would be one."""
        out: set[str] = set()
        for v in (site.a, site.b):
            sp = mover.span(v)
            if sp is None or v.text is None:
                continue
            own = _value_text(v, sp)
            after = set(v.text[sp[3]:sp[3] + 20000].split("\n")[:MAX_SKIPPED_LINES])
            out.update(t for t in site.distinct.texts if t != own and t.strip() and t in after)
        return frozenset(out) if len(out) < len(site.distinct) else frozenset()

    def _predictor(self, site: _Site, kept: frozenset[str] = frozenset()) -> str | None:
        """The coarsest log field whose value decides the diverging value (every request has it, each of its
        values goes with one diverging value, and it repeats), or None. The requests that hold a line of
        ``kept`` there are left out."""
        best: tuple[int, int, str] | None = None
        for rank, name in enumerate(self.user_fields):
            seen: dict[Any, str] = {}
            ok = True
            for r, at in zip(site.took, site.values):
                v = site.distinct.texts[at] if at >= 0 else None
                if v is not None and v in kept:
                    continue
                fv = dict(self.reqs.fields(r)).get(name)
                if v is None or fv is None or seen.setdefault(fv, v) != v:
                    ok = False
                    break
            if ok and len(seen) < len(site.took) and len(set(seen.values())) > 1:
                cand = (len(seen), rank, name)
                best = cand if best is None or cand < best else best
        return best[2] if best is not None else None


class _Site:
    """A fork under analysis: its node, the requests that go on into one of its children, the token where the
    branches split, two representatives that split there, the line move that would fix it, each request's value."""

    def __init__(self, node: _Edge, took: array, d: int, prefix: array, a: _View, b: _View):
        self.node, self.took, self.d, self.prefix, self.a, self.b = node, took, d, prefix, a, b
        self.key = (d, hash(prefix.tobytes()))
        self.mover: _LineMove | None = None
        #: whether each request's line at the fork is read (False: a tools fork, whose values are the tools' orders;
        #: None: not read, the fork being below one this pass puts the tools of in one order)
        self.valued: bool | None = None
        #: :meth:`_Causes._explained`'s, once found
        self.explained: tuple | None = None
        #: beside ``took`` (the requests, in log order): each one's line at the fork, as an index into the distinct
        #: ones (-1: none); and the distinct orders of their tools
        self.values = array("i")
        self.distinct = _Distinct()
        self.orders: set[str | None] = set()


class _Distinct:
    """Distinct texts in the order first seen, each numbered."""

    __slots__ = ("_at", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._at: dict[str, int] = {}

    def add(self, text: str) -> int:
        k = self._at.get(text)
        if k is None:
            k = self._at[text] = len(self.texts)
            self.texts.append(text)
        return k

    def __len__(self) -> int:
        return len(self.texts)


def _planned(t: Any, plan: Sequence[Any]) -> bool:
    """Whether a tools counterfactual ``t`` is in ``plan`` already (one with the same tools)."""
    return isinstance(t, _Tools) and any(isinstance(x, _Tools) and x.identities == t.identities for x in plan)


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _value_text(v: _View, sp: tuple[int, int, int, int]) -> str:
    assert v.text is not None
    return v.text[sp[2]:sp[3]].rstrip("\n")


def _shares_after(mover: _LineMove, va: _View, vb: _View) -> bool:
    """Whether the branches share text after the diverging line: from some line on (within
    :data:`MAX_SKIPPED_LINES` lines after it in each branch: a block of per-request lines may come first, of
    another length in each), the next :data:`MIN_SHARED_CHARS` characters are the same."""
    sa, sb = mover.span(va), mover.span(vb)
    if sa is None or sb is None or va.text is None or vb.text is None:
        return False
    ra = va.text[sa[3]:sa[3] + 20000].split("\n")[:MAX_SKIPPED_LINES + 64]
    rb = vb.text[sb[3]:sb[3] + 20000].split("\n")[:MAX_SKIPPED_LINES + 64]
    for i in range(min(MAX_SKIPPED_LINES, len(ra))):
        x = "\n".join(ra[i:])[:MIN_SHARED_CHARS]
        for j in range(min(MAX_SKIPPED_LINES, len(rb))):
            if len(x) == MIN_SHARED_CHARS and "\n".join(rb[j:]).startswith(x):
                return True
    return False


def _in_head(t: Tokenized, loc: Any) -> bool:
    """Whether ``loc`` is in the request's head, what FX001 and FX007 rewrite: not in a message, or in a system or
    developer message before the first turn of the conversation."""
    if loc.message_index is None:
        return True
    msgs = t.prompt.messages or ()
    return all(isinstance(m, dict) and m.get("role") in ("system", "developer") for m in msgs[:loc.message_index + 1])


def _message(cause: str, distinct: int, requests: int, predictor: str | None, detail: str, head: bool = True) -> str:
    if not head and cause in _LINE_CAUSES:
        return (f"a value that differs between requests ({distinct} values over {requests} requests) sits in a turn "
                "of the conversation, not in its system prompt or tools: the turns are history in later requests, "
                f"so nothing is moved. {detail}").strip()
    if cause == "per_user_value":
        by = f", predicted by the log field {predictor!r}" if predictor else ""
        return (f"a value that differs between requests but repeats for the same user or tenant ({distinct} values "
                f"over {requests} requests{by}) sits inside a prefix they otherwise share: move it after the shared "
                "part (FX007)")
    if cause in ("date_time", "volatile_id", "counter"):
        return (f"a per-request value ({distinct} values over {requests} requests) sits inside a prefix they "
                f"otherwise share: move it after the shared part (FX001). {detail}").strip()
    return detail
