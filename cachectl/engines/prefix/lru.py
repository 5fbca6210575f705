"""vLLM's sequential block pool as an LRU over block keys, in bulk C-level operations.

Between two requests (one at a time) the pool's hashed blocks are, newest first, ordered by (request,
-position): a request frees its blocks tail first, and a block hit gets the same place as a block computed
again. After request r exactly the newest ``C - u_r`` of them stay (``u_r = 1`` when r left a partial block
at the front of the free queue, which the next request takes back before anything is evicted; never-used
blocks go before any eviction). So while every key has one block, the pool is an ordered dict of keys: a
request moves its keys to the newest end (position 0 last) and the oldest go. A plain ``dict`` keeps that
order (insertion order; a key popped and set again goes to the end) at a lower cost per key than an
``OrderedDict``; the oldest are taken in one ``islice`` per request. ``tests/test_prefix.py`` checks it
against the naive reference.

Only the ``L - 1`` cap breaks the one-block-per-key picture: a request whose cached last full block is
recomputed (vLLM then keeps both blocks, and hits keep using the older). At that moment the state is handed
to :class:`~cachectl.engines.prefix.pools.SequentialVllmPool`, which models duplicates, block for block.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice, repeat
from typing import Any

from ...errors import UsageError
from .pools import CapacityError, SequentialVllmPool

_MISSING = object()


class LruKeyPool:
    """Same answers as :class:`~cachectl.engines.prefix.pools.SequentialVllmPool` (hits, evictions, peak, cross-tenant
    hits), faster while no block is duplicated; then it delegates to one."""

    def __init__(self, capacity_blocks: int, block_size: int):
        if capacity_blocks < 1:
            raise UsageError("capacity must be at least one block")
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.lru: dict = {}                     # key -> tenant that computed its block; oldest first
        self.used = 0                           # blocks ever taken from the never-used ones
        self.prepended = 0                      # a freed partial block at the front of the free queue (0 or 1)
        self._evicted = 0
        self._peak = 0
        self._cross = 0
        self.exact: SequentialVllmPool | None = None  # the block-level pool, once a block is duplicated
        self.victims: list | None = None        # when a list: the keys evicted are appended to it (offload tier)

    @property
    def evicted(self) -> int:
        return self.exact.evicted if self.exact is not None else self._evicted

    @property
    def peak_in_use(self) -> int:
        return self.exact.peak_in_use if self.exact is not None else self._peak

    @property
    def cross_tenant_hits(self) -> int:
        return self.exact.cross_tenant_hits if self.exact is not None else self._cross

    def run(self, keys: Sequence, num_tokens: int, tenant: Any = None) -> int:
        if self.exact is not None:
            return self.exact.run(keys, num_tokens, tenant)
        bs, lru = self.block_size, self.lru
        n = len(keys)
        total = -(-num_tokens // bs)
        if total > self.capacity:
            raise CapacityError(f"needs {total} blocks")
        limit = min(n, (num_tokens - 1) // bs)
        owners = list(map(lru.get, keys[:limit], repeat(_MISSING)))
        try:
            nh = owners.index(_MISSING)
            owners = owners[:nh]
        except ValueError:
            nh = limit
        if any(map(lru.__contains__, keys[nh:])):  # a cached block computed again: vLLM keeps two
            self._hand_over()
            assert self.exact is not None  # the hand-over made it
            return self.exact.run(keys, num_tokens, tenant)
        self._cross += nh - owners.count(tenant)
        if total > self._peak:
            self._peak = total
        need = total - nh
        taken = min(self.prepended, need)
        fresh = min(self.capacity - self.used, need - taken)
        self.used += fresh
        evict = need - taken - fresh
        self.prepended += (1 if num_tokens % bs else 0) - taken
        # the request's blocks become the newest, position 0 last; hits keep the tenant that computed them
        deque(map(lru.pop, keys[:nh]), 0)
        owners.reverse()
        lru.update(zip(keys[::-1], [*repeat(tenant, n - nh), *owners]))
        if evict:
            victims = list(islice(lru, evict))     # the oldest, in one pass over the front of the dict
            deque(map(lru.__delitem__, victims), 0)
            if self.victims is not None:
                self.victims.extend(victims)
        self._evicted += evict
        return nh * bs

    def _hand_over(self) -> None:
        """Build the block-level pool in the same state: hashed blocks oldest first, then the rest."""
        pool = SequentialVllmPool(self.capacity, self.block_size)
        items = list(self.lru.items())
        held = len(items)
        blocks = list(range(held))                 # block i holds the i-th oldest key
        pool.key = {b: k for b, (k, _) in zip(blocks, items)}
        pool.primary = {k: b for b, (k, _) in zip(blocks, items)}
        pool.owner = {b: o for b, (_, o) in zip(blocks, items)}
        pool.track_owners = True
        pool.seg_id = 1
        pool.segments = deque([[1, blocks[::-1]]])  # eviction pops from the end: the oldest last
        pool.stamp = dict.fromkeys(blocks, 1)
        pool.entries = held
        pool.prepended = [held] if self.prepended else []
        pool.fresh = held + self.prepended
        assert pool.fresh == self.used, (pool.fresh, self.used)
        pool.evicted, pool.peak_in_use, pool.cross_tenant_hits = self._evicted, self._peak, self._cross
        pool.victims = self.victims
        self.exact = pool
        self.lru = {}
