"""The shared-prefix tree (:class:`PrefixTree`): one streaming pass over the requests' chained block keys
(:func:`~cachectl.engines.prefix.trace.block_keys`) builds a radix tree of full blocks whose edges hold their keys
in an ``array('q')`` (8 bytes a distinct block, plus one small object per edge: about two edges a request). A
**fork** is a node with two or more children. The same pass counts the blocks each request finds in the tree before
it joins it: the log's no-eviction hits (the tests hold them equal to :func:`~cachectl.engines.prefix.replay.simulate`'s
``infinite`` policy). Also the tree's summary, for a picture (:class:`TreeNode`, :func:`_summary`).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from ...tokendiff import common_prefix_length


class _Edge:
    """An edge of the radix tree of full blocks: its chained keys, the node it hangs from, the requests that
    enter it, and the first of them (the branch's representative)."""

    __slots__ = ("children", "keys", "n", "parent", "rep", "start")

    def __init__(self, parent: _Edge | None, start: int, keys: array, rep: int, n: int = 1):
        self.parent = parent
        self.start = start            # block depth of its first key
        self.keys = keys
        self.children: dict | None = None
        self.n = n
        self.rep = rep

    @property
    def end(self) -> int:
        return self.start + len(self.keys)


class PrefixTree:
    """A radix tree over the chained block keys of a stream of requests (one insert each, in log order).

    Memory: 8 bytes a distinct block (the edges' key arrays) and one edge object per branch. ``leaves`` keeps,
    per request, the edge where its path ends and ``depths`` its block depth (an edge split later still finds
    it: the walk up from there goes to the edge that holds that depth); 16 bytes a request."""

    def __init__(self) -> None:
        self.root = _Edge(None, 0, array("q"), -1, 0)
        self.leaves: list[_Edge] = []
        self.depths = array("q")

    def insert(self, keys: array, rep: int) -> int:
        """Add one request's keys; returns how many of its blocks an earlier request already had (the blocks a
        prefix cache that never evicts would hit, before vLLM's ``L - 1`` cap)."""
        node = self.root
        node.n += 1
        pos = 0
        n = len(keys)
        while pos < n:
            child = node.children.get(keys[pos]) if node.children is not None else None
            if child is None:
                new = _Edge(node, pos, keys[pos:], rep)
                if node.children is None:
                    node.children = {}
                node.children[keys[pos]] = new
                self._leaf(new, n)
                return pos
            m = len(child.keys)
            seg = keys[pos:pos + m]
            if seg == child.keys:
                child.n += 1
                node, pos = child, pos + m
                continue
            c = common_prefix_length(seg, child.keys)
            if c == len(seg):  # the request ends inside this edge
                child.n += 1
                self._leaf(child, n)
                return n
            upper = _Edge(node, pos, child.keys[:c], child.rep, child.n + 1)
            assert node.children is not None
            node.children[keys[pos]] = upper
            child.keys = child.keys[c:]
            child.start = pos + c
            child.parent = upper
            upper.children = {child.keys[0]: child}
            node, pos = upper, pos + c
            new = _Edge(upper, pos, keys[pos:], rep)
            upper.children[keys[pos]] = new
            self._leaf(new, n)
            return pos
        self._leaf(node, n)
        return n

    def release(self) -> None:
        """Unlink every edge from its parent, for a tree let go: reference counting then frees it at once. (An
        edge's parent link and its parent's ``children`` make a cycle that only the garbage collector finds, and
        a pass's tree lives long enough to reach its oldest generation: dead trees lingered until a full
        collection.)"""
        _unlink(self.root)

    def _leaf(self, edge: _Edge, depth: int) -> None:
        self.leaves.append(edge)
        self.depths.append(depth)

    def forks(self) -> list[_Edge]:
        """Nodes with two or more children, most requests first (then the shallowest)."""
        out = []
        stack = [self.root]
        while stack:
            e = stack.pop()
            if e.children:
                if len(e.children) > 1:
                    out.append(e)
                stack.extend(e.children.values())
        out.sort(key=lambda e: (-sum(c.n for c in e.children.values()), e.end))  # type: ignore[union-attr]
        return out

    def branches(self, forks: Sequence[_Edge]) -> dict[int, array]:
        """For each fork (by ``id``): the requests that take one of its children, ascending (8 bytes each)."""
        want = {id(f): f for f in forks}
        out: dict[int, array] = {k: array("q") for k in want}
        for r, (edge, depth) in enumerate(zip(self.leaves, self.depths)):
            e: _Edge | None = edge
            while e is not None and e.parent is not None and e.start >= depth:
                e = e.parent
            while e is not None and e.parent is not None:
                p = e.parent
                if id(p) in want:
                    out[id(p)].append(r)
                e = p
        return out


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


def _summary(tree: PrefixTree, bs: int, fork_at: dict[int, int], max_nodes: int = SUMMARY_NODES,
             expanded: list[_Edge] | None = None) -> tuple[TreeNode, ...]:
    """The tree's branches that two or more requests share, most requests first (at most ``max_nodes``), each
    node's single-request branches bundled into one. ``expanded``: the edges whose children it reads are appended
    there."""
    out: list[TreeNode] = []
    heap: list[tuple[int, int, int, _Edge]] = []
    seq = 0

    def children(e: _Edge, at: int) -> None:
        nonlocal seq
        if expanded is not None:
            expanded.append(e)
        kids = list(e.children.values()) if e.children else []
        alone = [c for c in kids if c.n < 2]
        if alone:
            out.append(TreeNode(at, e.end * bs, max(c.end for c in alone) * bs, len(alone), len(alone)))
        for c in kids:
            if c.n >= 2:
                heapq.heappush(heap, (-c.n, seq, at, c))
                seq += 1

    children(tree.root, -1)
    while heap and len(out) < max_nodes:
        _, _, parent, e = heapq.heappop(heap)
        out.append(TreeNode(parent, e.start * bs, e.end * bs, e.n, 0, fork_at.get(id(e))))
        children(e, len(out) - 1)
    return tuple(out)


def _prune_to_summary(tree: PrefixTree) -> None:
    """Cut the tree below the edges :func:`_summary` does not expand: the summary of what is left is the same
    (it reads the children of the edges it expands only, and the length and request count of those children), and
    the rest of the tree (most of it, on a long log) is freed."""
    expanded: list[_Edge] = []
    _summary(tree, 1, {}, expanded=expanded)
    keep = {id(e) for e in expanded}
    for e in expanded:
        for c in (e.children or {}).values():
            if id(c) not in keep:
                _unlink(c)
                c.children = None


def _unlink(edge: _Edge) -> None:
    """The edges below ``edge`` unlinked from their parents (see :meth:`PrefixTree.release`)."""
    stack = list(edge.children.values()) if edge.children else []
    while stack:
        e = stack.pop()
        e.parent = None
        if e.children:
            stack.extend(e.children.values())


def _below(node: _Edge, marked: set[int]) -> bool:
    e = node.parent
    while e is not None:
        if id(e) in marked:
            return True
        e = e.parent
    return False
