"""What each fork costs, measured by counterfactual replay (:class:`_Analyzer`, :func:`analyze_forks`): the tree
of the log is built (:mod:`.tree`) and its forks classified (:mod:`.causes`); each fixable fork's counterfactual
(:mod:`.views`) joins the plan, the moved log is replayed through the existing replays
(:func:`~cachectl.engines.prefix.replay.simulate`, policy ``infinite``, and vLLM's pool at ``capacity_blocks``, the
keys passed as pre-hashed ids), and its tree is built again (the next line of a system prompt that opens with three
per-request lines is a fork only once the first is moved), until no new fixable fork shows. Each fork's
``tokens_lost`` is then what keeping that one fork costs when every other fixable fork is fixed (:mod:`.report`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ....errors import InputError, UsageError
from ....spool import Spool
from ..replay import simulate
from ..trace import TraceRequest, block_keys
from .causes import _Causes
from .report import Fork, ForkReport
from .requests import USER_FIELDS, ForkRequest
from .store import AS_GIVEN, RequestStore, _RenderTable, pack_requests
from .tree import PrefixTree, _summary
from .views import _UNSEEN, _LineMove, _Tools, _View, _view


class _PlanKeys:
    """Each request's block keys under one plan (8 bytes a key, in a temporary file), its token count, and a bit
    per counterfactual of the plan that changed its view (8 bytes a request in memory, plus the count's 8)."""

    #: counterfactuals a record tells apart (a bit each); a longer plan is not recorded
    MAX_PLAN = 64

    def __init__(self) -> None:
        self._disk = Spool()
        self.tokens = array("q")
        self.masks = array("Q")

    def add(self, tokens: int, keys: Sequence[int], changed: Iterable[int]) -> None:
        self._disk.put_bytes(array("q", keys).tobytes())
        self.tokens.append(tokens)
        mask = 0
        for j in changed:
            mask |= 1 << j
        self.masks.append(mask)

    def keys(self, k: int) -> array:
        got = array("q")
        got.frombytes(self._disk.get_bytes(k))
        return got


class _Analyzer:
    def __init__(self, requests: RequestStore, *, tokenizer: Any, block_size: int,
                 capacity_blocks: int | None, user_fields: Sequence[str], max_forks: int, max_values: int,
                 progress: Callable[[int], None] | None = None):
        self.reqs = requests
        self.progress = progress
        self._viewed = 0  # requests viewed since the last progress call
        self.tok = tokenizer
        self.bs = block_size
        self.cap = capacity_blocks
        self.causes = _Causes(self.view, requests, tokenizer=tokenizer, user_fields=user_fields, max_forks=max_forks,
                              max_values=max_values, ids=self.ids)
        self.passes = 0
        self.replays = 0
        self.notes: list[str] = []
        #: tools counterfactuals re-render a request once (request index, counterfactual) -> view parts (packed)
        self.rendered = _RenderTable(requests)

    # one request under a plan ------------------------------------------------------------------------
    def view(self, k: int, plan: Sequence[Any], changed: list[int] | None = None) -> _View:
        """Request ``k`` under ``plan``; ``changed`` gets the index in ``plan`` of each counterfactual that changed
        it (the tools one it was re-rendered under, each line move that moved something)."""
        self._tick()
        tools = [t for t in plan if isinstance(t, _Tools)]
        v = _view(self.reqs[k], tools, self.tok, self.rendered, self.reqs.tool_set(k) if tools else None,
                  self.reqs.tools_exact(k) if tools else None)
        if changed is not None and v.tools is not None:
            changed.append(next(j for j, t in enumerate(plan) if t is v.tools))
        v.key = k  # (the moves' spans found in it are kept, by its place and its state)
        for j, t in enumerate(plan):
            if isinstance(t, _LineMove) and t.apply(v) and changed is not None:
                changed.append(j)
        return v

    def ids(self, k: int, plan: Sequence[Any], changed: list[int] | None = None) -> Sequence[int]:
        """Request ``k``'s token IDs under ``plan`` (its view's, without its text where the spans found before tell
        the moves: :meth:`_ids`); ``changed`` as :meth:`view` fills it."""
        if not plan:
            return self.reqs.ids(k)
        got = self._ids(k, plan, changed)
        return got if got is not None else self.view(k, plan, changed).ids

    def _ids(self, k: int, plan: Sequence[Any], changed: list[int] | None) -> array | None:
        """Request ``k``'s token IDs under ``plan`` from its stored IDs and the spans its line moves found in it
        before, in the same state (its text is not read); None where that is not enough: a tools re-render not made
        yet, or a move's span in it not known."""
        reqs = self.reqs
        mine = reqs.tool_set(k)
        # the tools counterfactual the request is re-rendered under: its place in the plan, itself, the re-render
        under: tuple[int, _Tools, Any] | None = None
        for j, t in enumerate(plan if mine is not None else ()):
            if isinstance(t, _Tools) and t.identities == mine:
                got = self.rendered.given(k, t, reqs.tools_exact(k))
                if got is None:   # (not rendered yet)
                    return None
                if got is not AS_GIVEN:
                    under = (j, t, got)
                break
        tools = under[1] if under is not None else None
        moves: list[tuple[int, Any]] = []
        moved: tuple[_LineMove, ...] = ()
        for j, t in enumerate(plan):
            if isinstance(t, _LineMove):
                sp = t.known(k, (tools, moved))
                if sp is _UNSEEN:
                    return None
                if sp is not None and sp[1] > sp[0]:
                    moves.append((j, sp))
                    moved += (t,)
        v = _View(None, reqs.ids(k) if under is None else reqs.render_ids(under[2]), None, None, None)
        if under is not None and changed is not None:
            changed.append(under[0])
        for j, sp in moves:
            v.move(sp[0], sp[1])
            if changed is not None:
                changed.append(j)
        self._tick()
        return v.ids

    def _tick(self) -> None:
        if self.progress is not None:
            self._viewed += 1
            if self._viewed >= 256:  # (a replay views every request: its progress, counted a batch at a time)
                self.progress(self._viewed)
                self._viewed = 0

    def _keys(self, plan: Sequence[Any], record: _PlanKeys | None = None,
              reuse: _PlanKeys | None = None, without: int = -1) -> Iterator[tuple[int, int, Sequence[int]]]:
        """Each request's token count and block keys under ``plan``. ``record`` (a fresh :class:`_PlanKeys`) keeps
        them and which counterfactuals changed each request. ``reuse`` (one recorded under a plan that is
        ``plan`` with the counterfactual at index ``without`` added back, or ``plan`` itself with ``without``
        -1) gives them for the requests that counterfactual did not change: its removal leaves their views as
        they were (the others apply in the same order to the same tokens)."""
        bs = self.bs
        reqs = self.reqs
        bit = 1 << without if without >= 0 else 0
        for k in range(len(reqs)):
            if reuse is not None and not reuse.masks[k] & bit:
                yield k, reuse.tokens[k], reuse.keys(k)
                continue
            changed: list[int] | None = [] if record is not None else None
            ids = self.ids(k, plan, changed)
            keys = block_keys(ids, bs, reqs.salt(k))
            if record is not None:
                record.add(len(ids), keys, changed or ())
            yield k, len(ids), keys

    def tree_pass(self, plan: Sequence[Any], per_request: array | None = None, record: _PlanKeys | None = None,
                  reuse: _PlanKeys | None = None) -> tuple[PrefixTree, int]:
        """The tree of the log under ``plan``, and its no-eviction hits (the blocks each request finds in the tree
        before it is added, capped at ``L - 1`` tokens as vLLM's lookup is: ``simulate``'s infinite policy,
        which the tests check it against); each request's hits appended to ``per_request`` when given.
        ``record``, ``reuse``: as :meth:`_keys` reads them (``reuse`` recorded under ``plan`` itself)."""
        self.passes += 1
        tree = PrefixTree()
        hits = 0
        bs = self.bs
        for k, n, keys in self._keys(plan, record, reuse):
            found = tree.insert(keys, k)
            h = min(found, (n - 1) // bs) * bs
            hits += h
            if per_request is not None:
                per_request.append(h)
        return tree, hits

    def replay(self, plan: Sequence[Any], capacity: bool = False, per_request: array | None = None,
               record: _PlanKeys | None = None, reuse: _PlanKeys | None = None, without: int = -1) -> int:
        """Hits of the log under ``plan`` through :func:`simulate`: no eviction, or vLLM's pool at capacity (each
        request's hits appended to ``per_request`` when given). ``record``, ``reuse``, ``without``: as
        :meth:`_keys` reads them."""
        self.replays += 1
        trace = (TraceRequest(index=k, line=self.reqs.line(k), prompt_tokens=n, hash_ids=keys, hash_block_size=self.bs)
                 for k, n, keys in self._keys(plan, record, reuse, without))
        if capacity:
            rep = simulate(trace, policy="vllm", block_size=self.bs, capacity_blocks=self.cap, hits_into=per_request)
        else:
            rep = simulate(trace, policy="infinite", block_size=self.bs, compact=True, hits_into=per_request)
        return int(rep.hit_tokens)

    # analysis ------------------------------------------------------------------------------------------
    def run(self, max_passes: int) -> ForkReport:
        plan: list[Any] = []
        drafts: dict[tuple, dict] = {}
        hits0 = 0
        base = array("q")
        outline0: tuple = ()  # the first tree's, summarized at the end (the tree itself is let go)
        # the keys of the last tree pass under a plan: the replays under that same plan read them back
        seen: tuple[tuple[Any, ...], _PlanKeys] | None = None
        for p in range(max_passes):
            rec_pass = _PlanKeys() if plan and len(plan) <= _PlanKeys.MAX_PLAN else None
            tree, hits = self.tree_pass(plan, base if p == 0 else None, record=rec_pass)
            seen = (tuple(plan), rec_pass) if rec_pass is not None else None
            added = self.causes.forks_of(tree, plan, drafts)
            if p == 0:  # the first tree is summarized at the end, its forks marked once they are known
                hits0, outline0 = hits, tree.outline(self.bs)
            del tree  # (not alive while the next pass builds its own)
            if not added:
                break
            plan.extend(added)
        else:
            self.notes.append(f"stopped after {max_passes} tree passes: forks below the last ones moved were not "
                              "looked at")
        if plan:
            self.notes.append("tokens_lost: what keeping that one fork costs with every other fixable fork fixed, so "
                              "forks in one block each count the whole; fixed_hit_tokens has them all fixed")
        bare = self.reqs.bare
        if bare:
            self.notes.append(f"{bare} request(s) are token IDs only: their forks have no cause and nothing to move")
        # a counterfactual that recovers nothing with the others applied (it moves a line the branches need, or
        # costs a conversation its own reuse) leaves the plan, and the rest is measured again without it
        # each replay without one counterfactual views again only the requests that one changed: the others' keys
        # are read back from the replay under the whole plan
        lost: dict[int, int] = {}
        fixed = hits0
        per_fixed = array("q")
        rec: _PlanKeys | None = None
        while plan:
            per_fixed = array("q")
            if seen is not None and len(seen[0]) == len(plan) and all(a is b for a, b in zip(seen[0], plan)):
                rec = seen[1]
                fixed = self.replay(plan, per_request=per_fixed, reuse=rec)
            else:
                rec = _PlanKeys() if len(plan) <= _PlanKeys.MAX_PLAN else None
                fixed = self.replay(plan, per_request=per_fixed, record=rec)
            seen = None
            lost = {id(t): fixed - self.replay([x for x in plan if x is not t], reuse=rec, without=j)
                    for j, t in enumerate(plan)}
            keep = [t for t in plan if lost[id(t)] > 0]
            if len(keep) == len(plan):
                break
            plan = keep
        if not plan:
            fixed = hits0
        gains = array("q", (f - b for f, b in zip(per_fixed, base))) if plan else array("q", bytes(8 * len(base)))
        lost_cap: dict[int, int] = {}
        cap0 = cap_fixed = None
        if self.cap is not None:
            cap0 = self.replay([], capacity=True)
            cap_fixed = fixed_cap = self.replay(plan, capacity=True, reuse=rec) if plan else cap0
            lost_cap = {id(t): fixed_cap - self.replay([x for x in plan if x is not t], capacity=True, reuse=rec, without=j)
                        for j, t in enumerate(plan)}
        forks = []
        moves: list[tuple[int, _LineMove]] = []
        fork_at: dict[tuple[int, int], Fork] = {}    # a fork's node (its edge key) -> the fork
        for dr in drafts.values():
            t = dr.pop("plan", None)
            keep = dr.pop("keep")
            node = dr.pop("node", None)
            if t is None and not keep:
                continue
            tl = lost.get(id(t), 0)
            if t is not None and tl <= 0:
                continue  # a fix that recovers nothing: the fork costs no tokens
            at_cap = None if self.cap is None else max(lost_cap.get(id(t), 0), 0)
            forks.append(Fork(tokens_lost=max(tl, 0), tokens_lost_at_capacity=at_cap, **dr))
            if node is not None:
                fork_at[node] = forks[-1]
            if isinstance(t, _LineMove):
                moves.append((id(forks[-1]), t))
        forks.sort(key=lambda f: (-f.tokens_lost, -f.requests, f.shared_tokens))
        index = {id(f): k for k, f in enumerate(forks)}
        tree0 = _summary(outline0, {n: index[id(f)] for n, f in fork_at.items()})
        tree1 = tree0
        if plan:
            tree1 = _summary(self.tree_pass(plan, reuse=rec)[0].outline(self.bs), {})
        del rec
        return ForkReport(requests=len(self.reqs), query_tokens=self.reqs.tokens,
                          block_size=self.bs, capacity_blocks=self.cap, forks=tuple(forks), hit_tokens=hits0,
                          fixed_hit_tokens=fixed, hit_tokens_at_capacity=cap0, fixed_hit_tokens_at_capacity=cap_fixed,
                          passes=self.passes, replays=self.replays, notes=tuple(self.notes),
                          request_gains=gains, tree=tree0, fixed_tree=tree1, _plan=tuple(plan),
                          _tokenizer=self.tok, _moves=tuple(moves), _rendered=self._kept_renders(plan))

    def _kept_renders(self, plan: Sequence[Any]) -> _RenderTable | None:
        """The re-renders under the plan's tools counterfactuals (the others' are dropped)."""
        ids = {id(t) for t in plan if isinstance(t, _Tools)}
        return self.rendered.keep(ids) if ids else None


def analyze_forks(requests: Iterable[ForkRequest] | Iterable[tuple[int, Any]], *, tokenizer: Any = None,
                  block_size: int = 16, capacity_blocks: int | None = None, user_fields: Sequence[str] = USER_FIELDS,
                  source: str = "", max_forks: int = 32, max_passes: int = 8, max_values: int = 10_000,
                  add_generation_prompt: bool = True, progress: Callable[[int], None] | None = None) -> ForkReport:
    """The shared-prefix tree of a log, its forks, their causes and costs (see :mod:`cachectl.engines.prefix.forks`).

    ``requests``: :class:`ForkRequest` records, or ``(line, value)`` pairs, turned into them here with
    ``tokenizer`` (:func:`fork_requests`), read once: every counterfactual is a pass over the log, so they are
    kept packed (:class:`RequestStore`; pass one to share it: ``LogForks`` locates the moved lines in it). ``capacity_blocks``
    adds the at-capacity (vLLM LRU) replays. ``max_forks`` bounds the forks classified per pass (most requests
    first), ``max_values`` the branches whose values are compared per fork. ``progress(n)``: called as the
    replays view the requests (each replay counts them again).
    """
    if not 1 <= block_size <= 1 << 20:
        raise UsageError("`block_size` must be between 1 and 1,048,576")
    reqs = requests if isinstance(requests, RequestStore) else pack_requests(
        requests, source=source, tokenizer=tokenizer, user_fields=user_fields, add_generation_prompt=add_generation_prompt)
    if not reqs:
        raise InputError("no requests", source=source)
    analyzer = _Analyzer(reqs, tokenizer=tokenizer, block_size=block_size, capacity_blocks=capacity_blocks,
                         user_fields=user_fields, max_forks=max_forks, max_values=max_values, progress=progress)
    try:
        return analyzer.run(max_passes)
    finally:
        del analyzer.causes  # (it holds analyzer.view: a cycle that would keep the analysis' tables until a collection)
