"""The hit-rate-vs-capacity curve of vLLM's prefix cache from one read of a trace, and the Belady bound.

The trace is read and keyed once (:func:`key_trace`): each request keeps only its chained block keys (the
salt folded in), its length, tenant and timing, as a pre-keyed :class:`~cachectl.engines.prefix.trace.TraceRequest`
whose ``hash_ids`` are those keys. One LRU-stack pass over that store (:func:`_stack_pass`) then gives the
hits at every capacity of the curve at once, exact for vLLM's rules with requests one at a time; with
``concurrency`` > 1, or keys that are not prefix-chained, each capacity is replayed from the store by the one
engine, :func:`cachectl.engines.prefix.simulate`. The tests check every point against the naive reference
replay. Memory is one key per full block (8 bytes where keys are 64-bit integers), not one per token.

:func:`optimal_hits` is an offline bound at the same capacity and under the same block rules (full blocks
only, chained keys, stop at the first miss, the ``L - 1`` cap, ``ceil(L / block_size)`` blocks held while a
request runs): when blocks must be freed it evicts the cached block whose next use is farthest away
(Belady's MIN). The gap between it and vLLM's LRU says whether the eviction policy or the capacity is what
limits the hit rate.
"""

from __future__ import annotations

import bisect
import heapq
import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import sub
from typing import Any

from ...errors import UsageError
from .pools import SequentialVllmPool
from .replay import SCHEMA_VERSION, simulate
from .trace import TraceRequest, request_keys

#: points of a ``--curve`` when the caller does not say
CURVE_POINTS = 32


# ---------------------------------------------------------------------------------------------- keying


class KeyedRequests(Sequence[TraceRequest]):
    """The requests of a :class:`KeyedTrace`, packed: every request's block keys in one ``array('I')`` (4 bytes a
    key where they are 64-bit integers: the builtin hash, Mooncake ids; else a list of each request's keys), and
    its length, line, index, tenant, time and output tokens in arrays. Reading request ``r`` builds its
    pre-keyed :class:`TraceRequest` (what :func:`~.replay.simulate` replays); the curve's passes read
    :meth:`keys` and :attr:`tokens` alone.

    A 64-bit key is kept as a number: while the trace is read, the order in which it was first seen (a map from
    keys to numbers, 12 bytes a distinct key, tells whether a key was seen before); once :meth:`seal` ends the
    reading, its rank among the distinct keys (their own order: a pass that breaks a tie by key breaks it as it
    would by the key), and the map is let go. Any pass only compares keys, so a number serves as its key; and
    the stack pass keeps a key's latest slot in an array by that number (:attr:`distinct`). (20,000 requests of the
    bench log, 26 keys each, 30% of them distinct: 5.6 MB of keys and seen-map, 8 bytes a key and 9 a distinct key,
    against 4.0 MB.)"""

    def __init__(self, block_size: int):
        from ...spool import KeyIndex

        self.block_size = block_size
        self._keys = array("I")
        self._at = array("q", [0])
        self._ids: KeyIndex | None = KeyIndex("uint32")   # key -> its number (None: sealed, or not 64-bit keys)
        self._lists: list[Sequence] | None = None   # each request's keys, once a key is not a 64-bit int
        #: the distinct keys (once sealed; the keys are numbered from 0 to this, less one)
        self.distinct = 0
        #: each request's prompt length in tokens
        self.tokens = array("q")
        self._index = array("q")
        self._lines = array("q")        # _NO_LINE: none
        self._ts = array("d")           # nan: none
        self._out = array("q")
        self._tenants: list | None = None  # only when a request has one

    def append(self, req: TraceRequest, keys: Sequence) -> list[int] | None:
        """Add a request and its block keys; while every key is a 64-bit int, the number of each of ``keys``
        before this request (-1: not seen before), else None."""
        marks = None
        if self._lists is None and self._ids is not None:
            try:
                got = keys if isinstance(keys, array) and keys.typecode == "q" else array("q", keys)
            except (TypeError, OverflowError):
                self._lists = self._originals()
                self._keys, self._ids = array("I"), None
            else:
                marks = self._ids.values(got, -1)
                self._keys.extend(self._numbered(got, marks))
                self._at.append(len(self._keys))
        if self._lists is not None:
            self._lists.append(keys)
        self.tokens.append(req.prompt_tokens)
        self._index.append(req.index)
        self._lines.append(_NO_LINE if req.line is None else req.line)
        self._ts.append(math.nan if req.timestamp is None else req.timestamp)
        self._out.append(req.output_tokens)
        if req.tenant is not None and self._tenants is None:
            self._tenants = [None] * (len(self.tokens) - 1)
        if self._tenants is not None:
            self._tenants.append(req.tenant)
        return marks

    def _numbered(self, keys: Sequence[int], marks: list[int]) -> list[int]:
        """``keys`` as numbers: the ones seen before (``marks``), the new ones numbered on from the last."""
        assert self._ids is not None
        new: dict[int, int] = {}
        out = list(marks)
        top = len(self._ids)
        for j, m in enumerate(marks):
            if m < 0:
                out[j] = new.setdefault(keys[j], top + len(new))
        if new:
            self._ids.put(list(new), list(new.values()), absent=True)
        return out

    def _originals(self) -> list[Sequence]:
        """Each request's keys so far as they were given (the numbers turned back into keys)."""
        assert self._ids is not None
        keys, ids = self._ids.arrays()
        by_number = [0] * len(keys)
        for k, i in zip(keys.tolist(), ids.tolist()):
            by_number[i] = k
        return [[by_number[i] for i in self.keys(r)] for r in range(len(self))]

    def seal(self) -> None:
        """The reading is over: each key's number becomes its rank among the distinct keys, and the map from
        keys to numbers is let go."""
        if self._ids is None:
            return
        import numpy as np

        keys, ids = self._ids.arrays()
        self._ids = None
        self.distinct = len(keys)
        rank = np.empty(len(keys), np.uint32)
        rank[ids] = np.arange(len(keys), dtype=np.uint32)  # (the map's keys are sorted)
        del keys, ids
        numbers = np.frombuffer(self._keys, np.uint32)  # (the array itself, changed in place a chunk at a time)
        for s in range(0, len(numbers), 1 << 20):
            numbers[s:s + (1 << 20)] = rank[numbers[s:s + (1 << 20)]]

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def packed(self) -> bool:
        """Whether every key is a 64-bit integer, in the one array."""
        return self._lists is None

    def keys(self, r: int) -> Sequence:
        """Request ``r``'s block keys."""
        if self._lists is not None:
            return self._lists[r]
        return self._keys[self._at[r]:self._at[r + 1]]

    def __getitem__(self, r: Any) -> Any:
        if isinstance(r, slice):
            return [self[k] for k in range(*r.indices(len(self)))]
        if r < 0:
            r += len(self)
        if not 0 <= r < len(self):
            raise IndexError(r)
        line, ts = self._lines[r], self._ts[r]
        return TraceRequest(index=self._index[r], line=None if line == _NO_LINE else line,
                            prompt_tokens=self.tokens[r], hash_ids=self.keys(r), hash_block_size=self.block_size,
                            tenant=self._tenants[r] if self._tenants is not None else None,
                            timestamp=None if math.isnan(ts) else ts, output_tokens=self._out[r])

    def __iter__(self) -> Iterator[TraceRequest]:
        for r in range(len(self)):
            yield self[r]


_NO_LINE = -(1 << 63)


@dataclass(frozen=True)
class KeyedTrace:
    """A trace reduced to block keys at one block size (pre-keyed requests, salts folded into the keys)."""

    block_size: int
    requests: KeyedRequests
    min_capacity_blocks: int          # blocks the largest request holds: the smallest capacity that works
    min_capacity_line: int | None     # the line of the (first) largest request
    query_tokens: int
    unbounded_blocks: int = 0         # block slots a pool of unbounded size takes: no eviction from there on


def key_trace(requests: Iterable[TraceRequest], block_sizes: Sequence[int], *, hash_fn: str = "builtin",
              source: str = "") -> dict[int, KeyedTrace]:
    """Read the requests once and key them at every block size in ``block_sizes``."""
    keyer = TraceKeyer(block_sizes, hash_fn=hash_fn, source=source)
    for req in requests:
        keyer.add(req)
    return keyer.result()


class TraceKeyer:
    """:func:`key_trace` fed one request at a time (:meth:`add`), its keyed traces made at the end (:meth:`result`)."""

    def __init__(self, block_sizes: Sequence[int], *, hash_fn: str = "builtin", source: str = "") -> None:
        if not block_sizes or any(bs < 1 for bs in block_sizes):
            raise UsageError("`block_size` must be at least 1")
        self.block_sizes, self.hash_fn, self.source = list(block_sizes), hash_fn, source
        self.stores = {bs: KeyedRequests(bs) for bs in block_sizes}
        self.largest: dict[int, tuple[int, int | None]] = {bs: (0, None) for bs in block_sizes}
        self.unbounded = {bs: _Unbounded() for bs in block_sizes}
        self.query = 0

    def add(self, req: TraceRequest) -> None:
        self.query += req.prompt_tokens
        for bs in self.block_sizes:
            if req.hash_ids is not None and req.hash_block_size != bs:
                raise UsageError(f"{self.source}: hash_ids cover {req.hash_block_size}-token blocks; run with "
                                 f"`block_size` {req.hash_block_size} (they cannot be split)")
            store = self.stores[bs]
            keys: Sequence = request_keys(req, bs, self.hash_fn)
            marks = store.append(req, keys)
            need = -(-req.prompt_tokens // bs)
            if need > self.largest[bs][0]:
                self.largest[bs] = (need, req.line)
            state = self.unbounded[bs]
            hits = state.seen_then_add(keys, min(len(keys), (req.prompt_tokens - 1) // bs), marks, store)
            taken = min(state.waiting, need - hits)
            state.taken += need - hits - taken
            state.waiting += (1 if req.prompt_tokens % bs else 0) - taken

    def result(self) -> dict[int, KeyedTrace]:
        stores, largest = self.stores, self.largest
        if not self.query and not any(stores.values()):
            from ...errors import InputError

            raise InputError("the trace has no requests", source=self.source)
        for store in stores.values():
            store.seal()
        return {bs: KeyedTrace(block_size=bs, requests=stores[bs], min_capacity_blocks=largest[bs][0],
                               min_capacity_line=largest[bs][1], query_tokens=self.query,
                               unbounded_blocks=max(self.unbounded[bs].taken, largest[bs][0]))
                for bs in self.block_sizes}


class _Unbounded:
    """A pool of unbounded size, as far as the ceiling needs it: a partial block waiting at the front of the free
    queue (0 or 1), and the block slots taken. Whether a key was seen before is the store's to say (its map of
    keys to numbers) while the keys are 64-bit integers; past that, a set of the keys seen is kept here."""

    __slots__ = ("seen", "waiting", "taken")

    def __init__(self) -> None:
        self.seen: set | None = None
        self.waiting = 0
        self.taken = 0

    def seen_then_add(self, keys: Sequence, limit: int, marks: list[int] | None, store: KeyedRequests) -> int:
        """How many of ``keys[:limit]`` were seen before the first that was not; then every key is seen.
        ``marks``: the store's numbers of ``keys`` before this request (-1: not seen), or None where its keys are
        no longer 64-bit ints (``keys`` is then the store's last request)."""
        if marks is not None:
            return next((i for i in range(limit) if marks[i] < 0), limit)
        seen = self.seen
        if seen is None:
            seen = self.seen = {k for r in range(len(store) - 1) for k in store.keys(r)}
        present = list(map(seen.__contains__, keys[:limit]))
        seen.update(keys)
        return present.index(False) if False in present else limit


def resolve_warmup(warmup: float | int | None, n_requests: int) -> int:
    """``--warmup``: a count of requests (an int >= 1, or 0) or a share of the trace (0 <= x < 1)."""
    if warmup is None or warmup == 0:
        return 0
    if warmup < 0:
        raise UsageError("`warmup` must be a number of requests or a share between 0 and 1")
    if isinstance(warmup, float) and warmup < 1:
        return int(math.floor(warmup * n_requests))
    if isinstance(warmup, float) and not warmup.is_integer():
        raise UsageError(f"`warmup` {warmup} is neither a share below 1 nor a whole number of requests")
    return int(warmup)


def no_eviction_capacity(kt: KeyedTrace) -> int:
    """The smallest capacity at which the sequential vLLM pool never evicts (the curve's ceiling).

    Every block slot a pool of unbounded size ever takes, duplicates from the ``L - 1`` cap and the partial
    tail block included: with that many blocks, never-used blocks are always there to take.
    """
    reqs = kt.requests
    total = sum(-(-t // kt.block_size) for t in reqs.tokens)
    pool = SequentialVllmPool(max(1, total), kt.block_size)
    for r, length in enumerate(reqs.tokens):
        pool.run(reqs.keys(r), length)
    return max(pool.fresh, kt.min_capacity_blocks)


def curve_capacities(low: int, high: int, points: int = CURVE_POINTS) -> list[int]:
    """About ``points`` capacities from ``low`` to ``high``, log-spaced, whole and distinct, both ends in."""
    if points < 2 or high <= low:
        return [low] if high <= low else [low, high]
    ratio = (high / low) ** (1 / (points - 1))
    caps = sorted({min(high, max(low, round(low * ratio ** i))) for i in range(points)} | {low, high})
    return caps


# -------------------------------------------------------------------------------------------- optimal


def optimal_hits(kt: KeyedTrace, capacity_blocks: int, *, warmup: int = 0) -> int:
    """Hit tokens of Belady's MIN at ``capacity_blocks`` under vLLM's block rules, requests one at a time.

    A request's hits are its leading cached keys up to ``min(full blocks, (L - 1) // block_size)``; while it
    runs it holds ``ceil(L / block_size)`` blocks, its hits pinned; to make room, the unpinned cached block
    whose next use (the next request that can hit it) is farthest goes first, the deeper block of a prefix
    first on a tie. Its full blocks stay cached afterwards (one copy per key), so the cached blocks it computes
    again (past its hits: the ``L - 1`` cap, or a miss before them) go first: dropping them costs nothing.
    """
    bs = kt.block_size
    reqs = kt.requests
    if capacity_blocks < kt.min_capacity_blocks:
        raise UsageError(f"capacity {capacity_blocks} is below the {kt.min_capacity_blocks} blocks the largest "
                         "request needs")
    inf = len(reqs)
    # next_use[r][p]: the next request after r that can hit the key r has at position p; none (inf) when the
    # next request holding the key cannot hit it (past its L - 1 cap): it computes the block again anyway
    nxt_of: dict = {}
    next_use: list[list[int]] = [[] for _ in reqs]
    for r in range(len(reqs) - 1, -1, -1):
        keys = reqs.keys(r)
        limit = min(len(keys), (reqs.tokens[r] - 1) // bs)
        next_use[r] = [nxt_of.get(k, inf) for k in keys]
        for k in keys[limit:]:
            nxt_of[k] = inf
        for k in keys[:limit]:
            nxt_of[k] = r
    cached: dict = {}       # key -> (next use, position): its eviction priority
    heap: list = []         # (-next use, -position, key); stale entries skipped
    hit_tokens = 0
    for r, length in enumerate(reqs.tokens):
        keys = reqs.keys(r)
        limit = min(len(keys), (length - 1) // bs)
        nh = 0
        while nh < limit and keys[nh] in cached:
            nh += 1
        pinned = set(keys[:nh])
        need = -(-length // bs) - nh
        short = need - (capacity_blocks - len(cached))
        if short > 0:  # cached keys this request computes again cost nothing to drop: they come back at once
            for k in keys[nh:]:
                if short <= 0:
                    break
                if k in cached and k not in pinned:
                    del cached[k]                           # its heap entry is stale from now on
                    short -= 1
        deferred = []
        while capacity_blocks - len(cached) < need:
            nu, neg_p, k = heapq.heappop(heap)
            if cached.get(k) != (-nu, -neg_p):
                continue                                    # stale
            if k in pinned:
                deferred.append((nu, neg_p, k))
                continue
            del cached[k]
        for item in deferred:
            heapq.heappush(heap, item)
        uses = next_use[r]
        for p, k in enumerate(keys):
            prio = (uses[p], p)
            cached[k] = prio
            heapq.heappush(heap, (-prio[0], -p, k))
        if len(heap) > 4 * capacity_blocks + 1024:
            heap = [(-v[0], -v[1], k) for k, v in cached.items()]
            heapq.heapify(heap)
        if r >= warmup:
            hit_tokens += nh * bs
    return hit_tokens


# ---------------------------------------------------------------------------------------------- stack


_CHUNK = 12          # dead slots are counted per chunk of 2**12 slots


def _latest(reqs: KeyedRequests) -> Any:
    """An empty map of block keys to slots: an array by key (8 bytes a distinct key) where the store numbered the
    keys (:meth:`KeyedRequests.seal`), else a :class:`~cachectl.spool.KeyDict`."""
    from ...spool import KeyDict

    return _Slots(reqs.distinct) if reqs.packed else KeyDict()


class _Slots:
    """:class:`~cachectl.spool.KeyDict`'s calls over an array of the keys numbered from 0 (-1: no value)."""

    __slots__ = ("_at",)

    def __init__(self, n: int) -> None:
        self._at = array("q", [-1]) * n

    def values(self, keys: Sequence[int]) -> list[int]:
        at = self._at
        return [at[k] for k in keys]

    def put(self, keys: Sequence[int], values: Iterable[int]) -> None:
        at = self._at
        for k, v in zip(keys, values):
            at[k] = v


class _Thresholds:
    """How many blocks have a threshold at most C, for any C: a count per distinct threshold (at most the
    deepest stack depth of the trace, however long the trace), not one entry per block."""

    __slots__ = ("counts", "values", "upto")

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.values: list[int] = []
        self.upto: list[int] = []

    def add(self, thresholds: list[int]) -> None:
        self.counts.update(thresholds)

    def seal(self) -> None:
        self.values = sorted(self.counts)
        self.upto = list(accumulate(self.counts[v] for v in self.values))
        self.counts = Counter()

    def at_most(self, capacity: int) -> int:
        i = bisect.bisect_right(self.values, capacity)
        return self.upto[i - 1] if i else 0


@dataclass
class _Stack:
    """What one pass of the LRU stack leaves: hits at the capacities it tracked."""

    counted: _Thresholds  # thresholds of the counted requests: a block hits at capacity C iff threshold <= C
    every: _Thresholds    # the same for all requests (warm-up included), for the eviction count
    corrections: dict     # capacity -> [counted, every] hit blocks to add where duplicate blocks shifted depths
    total_blocks: int     # sum of ceil(L / block_size)
    prepended_pops: int   # partial tail blocks taken back by the next request
    unbounded_hits: int   # hit blocks of the counted requests with no eviction (the ceiling)

    def hit_blocks(self, capacity: int, counted: bool = True) -> int:
        base = (self.counted if counted else self.every).at_most(capacity)
        return base + self.corrections.get(capacity, (0, 0))[0 if counted else 1]


class _Duplicates:
    """The extra blocks vLLM keeps at one capacity after the ``L - 1`` cap recomputed a cached block.

    A key then has several blocks (``entries``, slots in registration order; hits use the first, vLLM's
    ``get_one_block``); all but its newest are stale slots that still take room: each pushes every older
    block one place deeper until it is evicted.
    """

    __slots__ = ("stale", "owner", "entries", "counted", "every")

    def __init__(self) -> None:
        self.stale: list[int] = []      # sorted slots of stale blocks
        self.owner: dict = {}           # stale slot -> key
        self.entries: dict = {}         # key -> slots of its blocks, oldest registered first
        self.counted = 0                # hit-block corrections against the plain stack
        self.every = 0

    def newer(self, slot: int) -> int:
        return len(self.stale) - bisect.bisect_right(self.stale, slot)

    def add(self, slot: int, key) -> None:
        bisect.insort(self.stale, slot)
        self.owner[slot] = key

    def drop(self, slot: int) -> None:
        del self.stale[bisect.bisect_left(self.stale, slot)]
        del self.owner[slot]


def _stack_pass(kt: KeyedTrace, skip: int, capacities: Sequence[int] = (),
                progress: Callable[[int], None] | None = None) -> _Stack | None:
    """Mattson's LRU stack over block keys, exact for vLLM's sequential rules; None where it does not apply.

    Between requests the pool holds, newest first, the full blocks ordered by (request, -position) (a
    request frees tail first), and after request r at capacity C exactly the newest ``C - u_r`` of them,
    ``u_r = 1`` when r left a partial block at the front of the free queue (the next request takes it back
    before anything is evicted). That order does not depend on C: a block computed again gets the same place
    as a block hit. So a block of request r hits at capacity C iff every block before it in the request has
    stack depth ``<= C - u_{r-1}``: one threshold per block (the prefix maximum of the depths, plus u).

    Only the ``L - 1`` cap adds to this: a block-aligned request whose blocks are all cached recomputes its
    last block, and vLLM keeps both copies. The stale copies are followed per capacity in ``capacities``
    (:class:`_Duplicates`), which corrects those capacities' hits. Keys that are not prefix-chained (a key
    seen before after an unseen one; Mooncake ids can be anything) make the pass return None.
    """
    bs = kt.block_size
    caps = sorted(c for c in set(capacities) if c >= kt.min_capacity_blocks)
    dups: dict[int, _Duplicates] = {}    # capacities holding stale blocks now
    last = _latest(kt.requests)       # key -> slot of its latest touch (-1: none)
    dead = bytearray()                # slot -> 1 once its key was touched again
    per_chunk: list[int] = []         # dead slots per chunk
    dead_total = 0
    slots = 0
    every = _Thresholds()
    counted = every if skip == 0 else _Thresholds()
    corrections: dict = {}
    total_blocks = pops = unbounded_hits = 0
    u_prev = 0

    def dead_upto(t: int) -> int:     # dead slots <= t
        c = t >> _CHUNK
        return sum(per_chunk[:c]) + dead.count(1, c << _CHUNK, t + 1)

    reqs = kt.requests
    for r, length in enumerate(reqs.tokens):
        if progress is not None:
            progress(1)
        keys = reqs.keys(r)
        n = len(keys)
        total = -(-length // bs)
        total_blocks += total
        limit = min(n, (length - 1) // bs)
        prev = last.values(keys)
        try:
            h = prev.index(-1)
        except ValueError:
            h = n
        if (h < n and prev.count(-1) != n - h) or len(set(keys)) != n:
            return None                                    # not prefix-chained
        got = prev[:h]                                     # the slots of the keys seen before: a prefix
        m = min(h, limit + 1)                              # depths needed: the hits, and the capped block
        thresholds: list[int] = []
        capped = None                                      # the capped block's threshold, when it is cached
        if m:
            seen = got[:m]
            t = seen[0]
            d = slots - t - (dead_total - dead_upto(t))    # newest first: depth 1 is the latest touch
            # runs of consecutive slots (blocks last touched together, in order) deepen by one per block
            steps = list(map(sub, seen, got[1:m]))
            if min(steps, default=1) < 1:
                return None                                # a later block touched before an earlier one
            start = 0
            for p in [i for i, x in enumerate(steps, 1) if x != 1]:
                thresholds.extend(range(d + u_prev, d + u_prev + p - start))
                d += p - start - 1
                t, t_next = seen[p - 1], seen[p]
                gap = t - t_next - 1                       # blocks touched since, alive or dead, in between
                if gap < 4096:
                    d += 1 + gap - dead.count(1, t_next + 1, t)
                else:
                    d += 1 + gap - (dead_upto(t - 1) - dead_upto(t_next))
                start = p
            thresholds.extend(range(d + u_prev, d + u_prev + m - start))
            if m > limit:                                  # the L - 1 cap recomputes this cached block
                capped = thresholds.pop()
        every.add(thresholds)
        if r >= skip and counted is not every:
            counted.add(thresholds)
        # capacities holding stale copies, and those where this request makes one
        touched = list(dups)
        if capped is not None:
            touched += [c for c in caps[bisect.bisect_left(caps, capped):] if c not in dups]
        pos = None
        for cap in touched:
            dup = dups.get(cap)
            base = bisect.bisect_right(thresholds, cap)
            if dup is None:
                hits = base
                makes = True                               # listed above: capped <= cap
                dup = dups[cap] = _Duplicates()
            else:
                lo, hi = 0, len(thresholds)                # first block deeper than cap, stale copies counted
                while lo < hi:
                    mid = (lo + hi) // 2
                    if thresholds[mid] + dup.newer(got[mid]) <= cap:
                        lo = mid + 1
                    else:
                        hi = mid
                hits = lo
                makes = capped is not None and capped + dup.newer(got[limit]) <= cap
                dup.every += hits - base
                if r >= skip:
                    dup.counted += hits - base
                if dup.entries and hits:
                    if pos is None:
                        pos = dict(zip(keys, range(n)))
                    for k in dup.entries.keys() & set(keys[:hits]):
                        p = pos[k]
                        blocks = dup.entries[k]
                        newest = got[p]
                        if blocks[0] != newest:            # the hit uses the oldest copy, a stale one
                            dup.drop(blocks[0])
                            dup.add(newest, k)
                        blocks[0] = slots + n - 1 - p
            if makes:
                k = keys[limit]
                old = got[limit]
                dup.entries.setdefault(k, [old]).append(slots + n - 1 - limit)
                dup.add(old, k)
        hits_unbounded = min(h, limit)
        if r >= skip:
            unbounded_hits += hits_unbounded
        pops += u_prev
        u_prev = 1 if length % bs else 0
        # the base stack: earlier touches of these keys die, the request's blocks are the newest slots
        if h:
            lo, hi = got[h - 1], got[0]
            if hi - lo + 1 == h:                           # one run of slots (the usual case): in bulk
                dead[lo:hi + 1] = b"\x01" * h
                for c in range(lo >> _CHUNK, (hi >> _CHUNK) + 1):
                    per_chunk[c] += min(hi, ((c + 1) << _CHUNK) - 1) - max(lo, c << _CHUNK) + 1
            else:
                for t in got[:h]:
                    dead[t] = 1
                    per_chunk[t >> _CHUNK] += 1
        dead_total += h
        last.put(keys, range(slots + n - 1, slots - 1, -1))
        slots += n
        dead.extend(bytes(n))
        while len(per_chunk) <= (slots >> _CHUNK):
            per_chunk.append(0)
        # stale copies beyond the newest C - u blocks are gone (the oldest first)
        for cap in list(dups):
            dup = dups[cap]
            room = cap - u_prev
            while dup.stale:
                s = dup.stale[0]
                alive_above = slots - 1 - s - (dead_total - dead_upto(s))
                if alive_above + len(dup.stale) <= room:   # its depth: alive above, the other stales, itself
                    break
                k = dup.owner[s]
                dup.drop(s)
                blocks = dup.entries[k]
                blocks.remove(s)
                if len(blocks) == 1:
                    del dup.entries[k]
            if not dup.stale:
                corrections[cap] = [corrections.get(cap, [0, 0])[0] + dup.counted,
                                    corrections.get(cap, [0, 0])[1] + dup.every]
                del dups[cap]
    for cap, dup in dups.items():
        corrections[cap] = [corrections.get(cap, [0, 0])[0] + dup.counted,
                            corrections.get(cap, [0, 0])[1] + dup.every]
    every.seal()
    if counted is not every:
        counted.seal()
    return _Stack(counted=counted, every=every, corrections=corrections, total_blocks=total_blocks,
                  prepended_pops=pops, unbounded_hits=unbounded_hits)


# ---------------------------------------------------------------------------------------------- curve


@dataclass(frozen=True)
class CurvePoint:
    capacity_blocks: int
    capacity_tokens: int
    fits: bool                           # False: the largest request does not fit, the point is not replayed
    hit_tokens: int | None
    hit_rate: float | None
    evicted_blocks: int | None
    optimal_hit_tokens: int | None = None   # the Belady bound, when asked for
    optimal_hit_rate: float | None = None


@dataclass(frozen=True, kw_only=True)
class CurveReport:
    schema_version: int = SCHEMA_VERSION
    policy: str = "vllm"
    block_size: int
    requests: int
    warmup_requests: int
    counted_requests: int
    query_tokens: int                    # of the counted requests
    min_capacity_blocks: int
    min_capacity_line: int | None
    ceiling_capacity_blocks: int         # no eviction from here on
    ceiling_hit_rate: float | None       # the infinite policy's hit rate
    concurrency: int
    points: tuple[CurvePoint, ...]
    optimal: bool = False
    replayed_points: int = 0             # points replayed one by one (the rest come from the one stack pass)
    notes: tuple[str, ...] = ()


def capacity_curve(kt: KeyedTrace, capacities: Sequence[int] | None = None, *, points: int = CURVE_POINTS,
                   warmup: float | int | None = 0, concurrency: int = 1, decode_s_per_token: float = 0.02,
                   optimal: bool = False, source: str = "",
                   progress: Callable[[int], None] | None = None) -> CurveReport:
    """Hit rate at each capacity (or at ``points`` log-spaced ones from the minimum to the ceiling).
    ``progress(n)``: called as requests are replayed (once per request of the one pass, or per capacity replayed)."""
    n = len(kt.requests)
    skip = resolve_warmup(warmup, n)
    if skip >= n:
        raise UsageError(f"`warmup` covers all {n} requests: nothing is left to count")
    ceiling = kt.unbounded_blocks
    if capacities is None:
        capacities = curve_capacities(kt.min_capacity_blocks, ceiling, points)
    elif any(c < 1 for c in capacities):
        raise UsageError("`capacity_blocks` must be at least one block")
    stack = _stack_pass(kt, skip, capacities, progress) if concurrency == 1 else None
    query = sum(kt.requests.tokens[skip:])
    if stack is not None:
        ceiling_rate = stack.unbounded_hits * kt.block_size / query if query else None
    else:
        ceiling_rate = simulate(kt.requests, policy="infinite", block_size=kt.block_size, source=source,
                                warmup=skip).hit_rate
    out = []
    replayed = 0
    for cap in capacities:
        tokens = cap * kt.block_size
        if cap < kt.min_capacity_blocks:
            out.append(CurvePoint(capacity_blocks=cap, capacity_tokens=tokens, fits=False, hit_tokens=None,
                                  hit_rate=None, evicted_blocks=None))
            continue
        if stack is not None:
            hit_tokens = stack.hit_blocks(cap) * kt.block_size
            every = stack.hit_blocks(cap, counted=False)
            evicted = stack.total_blocks - every - stack.prepended_pops - min(cap, kt.unbounded_blocks)
            hit_rate = hit_tokens / query if query else None
        else:
            rep = simulate(kt.requests, policy="vllm", block_size=kt.block_size, capacity_blocks=cap,
                           concurrency=concurrency, decode_s_per_token=decode_s_per_token, source=source,
                           warmup=skip)
            hit_tokens, hit_rate, evicted = int(rep.hit_tokens), rep.hit_rate, rep.evicted_blocks
            replayed += 1
            if progress is not None:
                progress(n)
        opt = optimal_hits(kt, cap, warmup=skip) if optimal else None
        if optimal and progress is not None:
            progress(n)
        out.append(CurvePoint(capacity_blocks=cap, capacity_tokens=tokens, fits=True, hit_tokens=hit_tokens,
                              hit_rate=hit_rate, evicted_blocks=evicted, optimal_hit_tokens=opt,
                              optimal_hit_rate=None if opt is None else (opt / query if query else None)))
    notes = []
    small = [p.capacity_blocks for p in out if not p.fits]
    if small:
        notes.append(f"{len(small)} capacit{'y' if len(small) == 1 else 'ies'} ({', '.join(map(str, small))} blocks) "
                     f"cannot hold the largest request (line {kt.min_capacity_line}): the minimum is "
                     f"{kt.min_capacity_blocks} blocks of {kt.block_size}")
    if skip:
        notes.append(f"the first {skip} requests warmed the cache and are not counted")
    if replayed and concurrency == 1:
        notes.append(f"the hash_ids are not prefix-chained: {replayed} point{'s' if replayed > 1 else ''} "
                     "replayed one by one (exact, slower)")
    if optimal:
        notes.append("optimal: an offline bound (Belady: evict the block used again farthest in the future) under "
                     "the same block rules, requests one at a time; no real server can know the future")
        if concurrency > 1:
            notes.append("the optimal bound replays requests one at a time; the vLLM points use --concurrency")
    if concurrency > 1:
        notes.append("the ceiling capacity is the sequential one: with requests in flight a little eviction may "
                     "remain at the top point")
    return CurveReport(block_size=kt.block_size, requests=n, warmup_requests=skip, counted_requests=n - skip,
                       query_tokens=query, min_capacity_blocks=kt.min_capacity_blocks,
                       min_capacity_line=kt.min_capacity_line, ceiling_capacity_blocks=ceiling,
                       ceiling_hit_rate=ceiling_rate, concurrency=concurrency, points=tuple(out), optimal=optimal, replayed_points=replayed,
                       notes=tuple(notes))

