"""The shared-prefix tree (:class:`PrefixTree`): one streaming pass over the requests' chained block keys
(:func:`~cachectl.engines.prefix.trace.block_keys`) builds a radix tree of full blocks, kept in flat arrays: every
edge's keys one after another in one ``array('q')`` (8 bytes a distinct block), and each edge's fields in arrays
beside it (44 bytes an edge, its entry in the map of first keys included; a chat log makes about one edge a
request). A **fork** is a node with two or more children. The
same pass counts the blocks each request finds in the tree before it joins it: the log's no-eviction hits (the
tests hold them equal to :func:`~cachectl.engines.prefix.replay.simulate`'s ``infinite`` policy). Also the tree's
outline, for a picture (:class:`TreeNode`, :meth:`PrefixTree.outline`, :func:`_summary`).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import count
from typing import Any

from ....spool import KeyIndex
from ...tokendiff import common_prefix_length

_SERIAL = count()


class PrefixTree:
    """A radix tree over the chained block keys of a stream of requests (one insert each, in log order).

    Edge ``i`` (0 is the root, with no keys) holds ``keys[off[i]:off[i] + size[i]]``, the blocks from depth
    ``start[i]``, below edge ``parent[i]``; the first request to enter it is ``rep[i]`` (the branch's representative),
    and ``n[i]`` requests enter it (counted once the inserts are over). A node's child is found by its first key
    (a chained key names its whole prefix, so one map serves the tree; keys that are not chained fall back to a map
    by node and key). Splitting an edge is offset arithmetic: no key is copied. ``leaves`` keeps, per request, the
    edge where its path ends and ``depths`` its block depth (an edge split later still finds it: the walk up from
    there goes to the edge that holds that depth), 8 bytes a request; once the inserts are over, ``leaves`` holds
    that edge itself. Once :meth:`forks` (or anything that reads the children) has run, the tree takes no more
    requests."""

    def __init__(self) -> None:
        self.serial = next(_SERIAL)
        self.keys = array("q")
        self.off = array("q", [0])
        self.size = array("i", [0])
        self.start = array("i", [0])
        self.parent = array("i", [-1])
        self.n = array("i")  # (counted once the inserts are over: :meth:`_count`)
        self.rep = array("i", [-1])
        # where an edge sits among its parent's children: its own index, or for the upper half of a split, the
        # place of the edge it was cut from (children are listed in the order their branches appeared)
        self.order = array("i", [0])
        self._first = KeyIndex("int32")  # an edge's first key -> the edge (16 bytes an edge; a dict takes 100)
        self._clash: dict[tuple[int, int], int] = {}
        self.leaves = array("i")
        self.depths = array("i")
        self._kids: tuple[Any, Any] | None = None

    def __len__(self) -> int:
        """The edges, the root included."""
        return len(self.size)

    def insert(self, keys: Sequence[int], rep: int) -> int:
        """Add one request's keys; returns how many of its blocks an earlier request already had (the blocks a
        prefix cache that never evicts would hit, before vLLM's ``L - 1`` cap)."""
        if self._kids is not None:
            raise RuntimeError("this tree's children were read: it takes no more requests")
        if not isinstance(keys, array):
            keys = array("q", keys)
        off, size, tk = self.off, self.size, self.keys
        node = 0
        pos = 0
        total = len(keys)
        while pos < total:
            c = self._child(node, keys[pos])
            if c is None:
                self._set(node, keys[pos], self._new(node, pos, keys, pos, total - pos, rep))
                self._leaf(len(self.size) - 1, total)
                return pos
            o, m = off[c], size[c]
            seg = keys[pos:pos + m]
            if seg == tk[o:o + m]:
                node, pos = c, pos + m
                continue
            cut = common_prefix_length(seg, tk[o:o + m])
            if cut == len(seg):  # the request ends inside this edge
                self._leaf(c, total)
                return total
            # the upper ``cut`` blocks of ``c`` become an edge of their own, ``c`` keeps the rest below it
            upper = self._new(node, pos, None, o, cut, self.rep[c], self.order[c])
            self._swap(node, keys[pos], c, upper)
            off[c], size[c], self.start[c], self.parent[c] = o + cut, m - cut, pos + cut, upper
            self._set(upper, tk[o + cut], c)
            pos += cut
            self._set(upper, keys[pos], self._new(upper, pos, keys, pos, total - pos, rep))
            self._leaf(len(self.size) - 1, total)
            return pos
        self._leaf(node, total)
        return total

    def _new(self, parent: int, start: int, keys: array | None, at: int, size: int, rep: int,
             order: int = -1) -> int:
        """A new edge; its keys are ``keys[at:at + size]`` appended (``keys`` None: ``self.keys`` from ``at``)."""
        i = len(self.size)
        if keys is not None:
            self.off.append(len(self.keys))
            self.keys.extend(keys[at:at + size])
        else:
            self.off.append(at)
        self.size.append(size)
        self.start.append(start)
        self.parent.append(parent)
        self.rep.append(rep)
        self.order.append(i if order < 0 else order)
        return i

    def _child(self, node: int, key: int) -> int | None:
        c = self._first.get(key)
        if c is not None and self.parent[c] != node:
            return self._clash.get((node, key))
        return c

    def _set(self, node: int, key: int, edge: int) -> None:
        """``edge`` becomes ``node``'s child under ``key`` (it has none there)."""
        if self._first.get(key) is None:
            self._first.put((key,), (edge,), absent=True)
        else:
            self._clash[(node, key)] = edge

    def _swap(self, node: int, key: int, old: int, new: int) -> None:
        """``new`` takes ``old``'s place as ``node``'s child under ``key``."""
        if self._first.get(key) == old:
            self._first[key] = new
        else:
            self._clash[(node, key)] = new

    def _leaf(self, edge: int, depth: int) -> None:
        self.leaves.append(edge)
        self.depths.append(depth)

    # reading the tree ------------------------------------------------------------------------------------------
    def children(self, i: int) -> list[int]:
        """Edge ``i``'s children, in the order their branches appeared."""
        kids, at = self._children()
        return kids[at[i]:at[i + 1]].tolist()

    def _children(self) -> tuple[Any, Any]:
        """Every edge's children in one array, grouped by parent (``at[i]:at[i + 1]`` are ``i``'s)."""
        if self._kids is None:
            import numpy as np

            self._first, self._clash = KeyIndex("int32"), {}  # (inserts are over: only the children are read from here on)
            par = np.frombuffer(self.parent, np.int32)[1:]
            kids = np.lexsort((np.frombuffer(self.order, np.int32)[1:], par)).astype(np.int32) + 1
            at = np.zeros(len(self.size) + 1, np.int64)
            np.cumsum(np.bincount(par, minlength=len(self.size)), out=at[1:])
            self._kids = (kids, at)
            self._count()
        return self._kids

    def _count(self) -> None:
        """``n``: the requests that enter each edge, counted from where each path ends. (Counted while inserting,
        a split would leave in its lower half the requests that ended in its upper half before it.)"""
        import numpy as np

        parent, start = np.frombuffer(self.parent, np.int32), np.frombuffer(self.start, np.int32)
        end = np.frombuffer(self.leaves, np.int32).copy()
        depth = np.frombuffer(self.depths, np.int32)
        up = (end > 0) & (start[end] >= depth)
        while up.any():  # a path that ends above where its edge was split later: up to the edge that holds it
            end[up] = parent[end[up]]
            up = (end > 0) & (start[end] >= depth)
        # each path's own edge from now on (:meth:`branches` walks up from there); the depths have done their part
        self.leaves, self.depths = array("i", end.tobytes()), array("i")
        n = np.bincount(end, minlength=len(self.size))
        # deepest first, one depth at a time (an edge's parent starts above it): each edge's count into its parent's
        order = np.argsort(-start[1:], kind="stable") + 1
        for level in np.split(order, np.flatnonzero(np.diff(start[order])) + 1):
            np.add.at(n, parent[level], n[level])
        self.n = array("i", n.astype(np.int32).tobytes())

    def forks(self) -> list[_Edge]:
        """Nodes with two or more children, most requests first (then the shallowest)."""
        kids, at = self._children()
        cnt = self.n
        out = []
        stack = [0]
        while stack:
            e = stack.pop()
            a, b = at[e], at[e + 1]
            if b > a:
                mine = kids[a:b].tolist()
                if b - a > 1:
                    out.append((-sum(cnt[c] for c in mine), self.start[e] + self.size[e], e))
                stack.extend(mine)
        out.sort(key=lambda t: t[:2])  # (stable: ties keep the walk's order)
        return [_Edge(self, e) for _, _, e in out]

    def branches(self, forks: Sequence[_Edge]) -> dict[tuple[int, int], array]:
        """For each fork (by :attr:`_Edge.key`): the requests that take one of its children, ascending (8 bytes
        each)."""
        self._children()  # (the paths' ends resolved to the edges that hold them)
        want = {f.i: array("q") for f in forks}
        parent = self.parent
        for r, e in enumerate(self.leaves):
            while e > 0:
                e = parent[e]
                got = want.get(e)
                if got is not None:
                    got.append(r)
        return {(self.serial, i): got for i, got in want.items()}

    def outline(self, bs: int, max_nodes: int = 0) -> tuple[tuple[TreeNode, tuple[int, int] | None], ...]:
        """The branches that two or more requests share, most requests first (at most ``max_nodes``, default
        :data:`SUMMARY_NODES`), each node's single-request branches bundled into one; each with its edge's key
        (None for a bundle), for :func:`_summary` to mark the forks once they are known. Token positions: ``bs``
        tokens a block."""
        max_nodes = max_nodes or SUMMARY_NODES
        kids, at = self._children()
        cnt, start, size = self.n, self.start, self.size
        out: list[tuple[TreeNode, tuple[int, int] | None]] = []
        heap: list[tuple[int, int, int, int]] = []
        seq = 0

        def expand(e: int, parent: int) -> None:
            nonlocal seq
            mine = kids[at[e]:at[e + 1]].tolist()
            alone = [c for c in mine if cnt[c] < 2]
            if alone:
                end = (start[e] + size[e]) * bs
                out.append((TreeNode(parent, end, max(start[c] + size[c] for c in alone) * bs, len(alone),
                                     len(alone)), None))
            for c in mine:
                if cnt[c] >= 2:
                    heapq.heappush(heap, (-cnt[c], seq, parent, c))
                    seq += 1

        expand(0, -1)
        while heap and len(out) < max_nodes:
            _, _, parent, e = heapq.heappop(heap)
            out.append((TreeNode(parent, start[e] * bs, (start[e] + size[e]) * bs, cnt[e]), (self.serial, e)))
            expand(e, len(out) - 1)
        return tuple(out)


class _Edge:
    """A view of one edge of a :class:`PrefixTree`, made when asked for (forks and their branches)."""

    __slots__ = ("i", "tree")

    def __init__(self, tree: PrefixTree, i: int):
        self.tree, self.i = tree, i

    @property
    def key(self) -> tuple[int, int]:
        """The edge's identity across the trees of one analysis."""
        return (self.tree.serial, self.i)

    @property
    def n(self) -> int:
        return self.tree.n[self.i]

    @property
    def rep(self) -> int:
        return self.tree.rep[self.i]

    @property
    def end(self) -> int:
        return self.tree.start[self.i] + self.tree.size[self.i]

    @property
    def children(self) -> list[_Edge]:
        return [_Edge(self.tree, c) for c in self.tree.children(self.i)]


@dataclass(frozen=True)
class TreeNode:
    """One branch of the shared-prefix tree, for a picture: an edge of full blocks that ``requests`` requests
    share, from token ``start`` to token ``end``, below node ``parent`` (an index into the same tuple; -1: the
    root). ``alone`` > 0: a bundle of that many branches of one request each (``end``: the longest of them).
    ``fork``: the index in :attr:`ForkReport.forks` of the fork where this branch splits, if it is one."""

    parent: int
    start: int
    end: int
    requests: int
    alone: int = 0
    fork: int | None = None


#: the nodes a tree summary shows, at most
SUMMARY_NODES = 40


def _summary(outline: Sequence[tuple[TreeNode, tuple[int, int] | None]],
             fork_at: dict[tuple[int, int], int]) -> tuple[TreeNode, ...]:
    """A tree's outline (:meth:`PrefixTree.outline`) with each fork's index marked (``fork_at``: by edge key)."""
    return tuple(replace(node, fork=fork_at[key]) if key is not None and key in fork_at else node
                 for node, key in outline)


def _below(node: _Edge, marked: set[tuple[int, int]]) -> bool:
    """Whether an edge above ``node`` is one of ``marked`` (edge keys)."""
    tree, e = node.tree, node.tree.parent[node.i]
    while e >= 0:
        if (tree.serial, e) in marked:
            return True
        e = tree.parent[e]
    return False
