"""Replay traffic through a server prefix cache.

Policies:

- ``vllm``: vLLM v1's block prefix cache (``vllm/v1/core``): only full blocks are hashed, a block's key
  chains its parent's key, the per-tenant salt is an extra key on the first block; lookup walks from the
  first block and stops at the first miss, capped at ``num_tokens - 1``; a request allocates
  ``ceil(L / block_size)`` blocks, registers its full blocks when admitted, and frees them tail first:
  hashed blocks go to the back of the LRU free queue, unhashed ones to the front; a freed block stays
  hittable until its slot is reused. Several blocks may carry the same hash (the ``L - 1`` cap makes a
  request recompute a cached last block), as in vLLM.
- ``radix``: SGLang's token-level radix cache (page size 1): the longest cached token prefix, the same
  ``L - 1`` cap, LRU eviction of unreferenced leaves; running requests pin their path.
- ``chunk``: position-independent reuse of fixed-size chunks (LMCache, 256 tokens) or of declared segments;
  chunks not at the prefix are reused at the cost of recomputing ``recompute_ratio`` of their tokens
  (CacheBlend). An upper bound, labelled as such.
- ``infinite``: the vLLM rules with no eviction: the ceiling.

Block keys use Python's built-in tuple hash by default (only equality matters, and a 64-bit chained hash
makes a collision vanishingly unlikely on real traces); ``hash_fn="sha256"`` uses SHA-256 over a pickle of
``(parent, tokens, extra)`` as vLLM does by default.
"""

from __future__ import annotations

import heapq
import operator
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, count, repeat
from typing import TYPE_CHECKING, Any

from ..errors import InputError, UsageError

if TYPE_CHECKING:
    from .prefix_lru import LruKeyPool

SCHEMA_VERSION = 1
POLICIES = ("vllm", "radix", "chunk", "infinite")
#: bounds of the numbers a trace line carries (beyond them a value is corrupt, and would overflow a float)
MAX_OUTPUT_TOKENS = 10 ** 9
MAX_TIMESTAMP = 1e15
MAX_BLOCK_SIZE = 1 << 20
MAX_CAPACITY_BLOCKS = 1 << 48
#: the parent of a first block under --hash sha256: sha256(b"cachectl-none-hash")
_NONE_SHA = bytes.fromhex("ce0b9c7844bb831fb74122604f087fc11c1af22461e9de893d240facf8aed996")


# ------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: token IDs, or pre-hashed block ids (Mooncake)."""

    index: int
    line: int | None
    prompt_tokens: int
    tokens: Sequence[int] | None = None
    hash_ids: Sequence[Any] | None = None
    hash_block_size: int = 512
    salt: Any = None
    tenant: Any = None
    timestamp: float | None = None
    output_tokens: int = 0
    segments: Sequence[int] | None = None
    #: a salt field was asked for (--salt-field) and this request has none: it is cached unsalted
    unsalted: bool = False
    #: a tenant field was asked for (--tenant-field) and this request has none
    no_tenant: bool = False
    session: Any = None


def block_keys(tokens: Sequence[int], block_size: int, salt: Any = None, hash_fn: str = "builtin") -> list:
    """Chained keys of the full blocks of ``tokens`` (a partial tail block has none).

    builtin: block i's key is the XOR of position-salted tuple hashes of blocks 0..i (the salt folded into
    the first), so it depends on the whole prefix like vLLM's parent-chained hash, and every step runs in
    C (``zip`` cuts the blocks, ``accumulate`` chains them). sha256: vLLM's own, over a pickle of
    ``(parent, tokens, extra)``.
    """
    if hash_fn != "sha256":
        terms = map(hash, zip(count(), zip(*[iter(tokens)] * block_size)))
        if salt is not None and len(tokens) >= block_size:
            first = next(terms) ^ hash(("salt", salt))
            return list(accumulate(chain((first,), terms), operator.xor))
        return list(accumulate(terms, operator.xor))
    import hashlib
    import pickle

    keys = []
    parent = _NONE_SHA
    for i in range(len(tokens) // block_size):
        extra = ("salt", salt) if (i == 0 and salt is not None) else None
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i * block_size:(i + 1) * block_size]), extra),
                                             protocol=5)).digest()
        keys.append(parent)
    return keys


def request_keys(req: TraceRequest, block_size: int, hash_fn: str = "builtin") -> list:
    if req.hash_ids is not None:
        full = req.prompt_tokens // req.hash_block_size
        ids = list(req.hash_ids[:full])
        if req.salt is not None and ids:  # a salt changes the first key and so, chained, every key
            return [hash((("salt", req.salt), ids[0]))] + [hash((("salt", req.salt), i)) for i in ids[1:]]
        return ids
    return block_keys(_tokens(req), block_size, req.salt, hash_fn)


def _tokens(req: TraceRequest) -> Sequence[int]:
    """The token IDs of a request that is not pre-hashed (every request but Mooncake ``hash_ids`` has them)."""
    if req.tokens is None:
        raise UsageError(f"line {req.line}: the request carries hash_ids, not token IDs")
    return req.tokens


# ---------------------------------------------------------------------------------------------- vLLM


class CapacityError(UsageError):
    pass


class VllmBlockPool:
    """vLLM v1's block pool: ref counts, a doubly linked LRU free queue, and hash -> blocks."""

    def __init__(self, capacity_blocks: int, block_size: int):
        if capacity_blocks < 1:
            raise UsageError("capacity must be at least one block")
        n = capacity_blocks
        self.block_size = block_size
        self.capacity = n
        # The free queue starts with every block in id order. The never-used blocks (ids fresh..n-1) stand
        # in it as one node, FRESH, until taken from the front one by one, so that a capacity costs memory
        # only as far as the trace uses it.
        self.head, self.tail, self.FRESH = -1, -2, -3
        self.prev: dict = {self.FRESH: self.head, self.tail: self.FRESH}
        self.next: dict = {self.head: self.FRESH, self.FRESH: self.tail}
        self.fresh = 0
        self.ref: list[int] = []
        self.key: list = []
        self.owner: list = []
        self.cached: dict = {}
        self.free_count = n
        self.evicted = 0
        self.in_use = 0
        self.peak_in_use = 0
        self.cross_tenant_hits = 0
        self.victims: list | None = None    # when a list: keys no block holds any more are appended (offload)

    # -- free queue
    def _remove(self, b: int) -> None:
        p, q = self.prev[b], self.next[b]
        self.next[p] = q
        self.prev[q] = p

    def _append(self, b: int) -> None:
        t = self.prev[self.tail]
        self.next[t] = b
        self.prev[b] = t
        self.next[b] = self.tail
        self.prev[self.tail] = b

    def _prepend(self, b: int) -> None:
        h = self.next[self.head]
        self.prev[h] = b
        self.next[b] = h
        self.prev[b] = self.head
        self.next[self.head] = b

    # -- requests
    def lookup(self, keys: Sequence, num_tokens: int) -> list[int]:
        """Blocks of the longest cached prefix, capped so that the last token is recomputed."""
        limit = min(len(keys), (num_tokens - 1) // self.block_size)
        hits = []
        cached = self.cached
        for i in range(limit):
            blocks = cached.get(keys[i])
            if not blocks:
                break
            hits.append(next(iter(blocks)))
        return hits

    def can_admit(self, hits: Sequence[int], num_tokens: int) -> bool:
        need = -(-num_tokens // self.block_size) - len(hits)
        evictable_hits = sum(1 for b in hits if self.ref[b] == 0)
        return need + evictable_hits <= self.free_count

    def admit(self, keys: Sequence, num_tokens: int, hits: list[int], tenant: Any = None) -> list[int]:
        ref, key = self.ref, self.key
        for b in hits:
            if ref[b] == 0:
                self._remove(b)
                self.free_count -= 1
            ref[b] += 1
            if self.owner[b] != tenant:
                self.cross_tenant_hits += 1
        need = -(-num_tokens // self.block_size) - len(hits)
        if need > self.free_count:  # the caller checks can_admit first
            raise CapacityError("not enough free blocks")
        blocks = list(hits)
        nxt, head = self.next, self.head
        for _ in range(need):
            b = nxt[head]
            if b == self.FRESH:  # the next never-used block
                b = self.fresh
                self.fresh += 1
                if self.fresh == self.capacity:
                    self._remove(self.FRESH)
                ref.append(0)
                key.append(None)
                self.owner.append(None)
            else:
                self._remove(b)
            self.free_count -= 1
            k = key[b]
            if k is not None:  # evict: the slot is reused, its content is no longer hittable
                owners = self.cached[k]
                del owners[b]
                if not owners:
                    del self.cached[k]
                    if self.victims is not None:
                        self.victims.append(k)
                key[b] = None
                self.evicted += 1
            ref[b] = 1
            blocks.append(b)
        for i in range(len(hits), len(keys)):  # register the full blocks computed now
            b = blocks[i]
            k = keys[i]
            key[b] = k
            self.owner[b] = tenant
            owners = self.cached.get(k)
            if owners is None:
                self.cached[k] = {b: None}
            else:
                owners[b] = None
        self.in_use = self.capacity - self.free_count
        if self.in_use > self.peak_in_use:
            self.peak_in_use = self.in_use
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        ref, key = self.ref, self.key
        for b in reversed(blocks):  # tail first
            ref[b] -= 1
            if ref[b] == 0:
                if key[b] is not None:
                    self._append(b)
                else:
                    self._prepend(b)
                self.free_count += 1
        self.in_use = self.capacity - self.free_count


class SequentialVllmPool:
    """The same rules as :class:`VllmBlockPool` for one request at a time, with bulk operations.

    Between requests no block is referenced, so the free queue is, front to back: the unhashed blocks
    prepended when freed (most recent first), the never-used blocks in id order, then one segment per
    finished request holding its full blocks in the order they were appended (tail first). Touching a
    block again re-stamps it into the newest segment with one C-level ``dict.update`` instead of moving it:
    the copy left in the older segment is stale and skipped when eviction reaches it. Only newly computed
    and evicted blocks take a Python-level step each.
    """

    def __init__(self, capacity_blocks: int, block_size: int):
        if capacity_blocks < 1:
            raise UsageError("capacity must be at least one block")
        self.block_size = block_size
        self.capacity = capacity_blocks
        self.prepended: list[int] = []      # a stack: the last one prepended is the front
        self.fresh = 0                      # never-used blocks are fresh..capacity-1
        self.segments: deque = deque()      # [segment id, blocks]; eviction pops blocks from the end
        self.stamp: dict = {}               # block -> id of the segment that holds it validly
        self.seg_id = 0
        self.entries = 0
        self.key: dict = {}                 # block -> its key, for hashed blocks
        self.owner: dict = {}
        self.primary: dict = {}             # key -> the oldest block holding it
        self.dups: dict = {}                # key -> younger blocks holding it too, oldest first
        self.evicted = 0
        self.peak_in_use = 0
        self.cross_tenant_hits = 0
        self.track_owners = False
        self.victims: list | None = None    # when a list: keys no block holds any more are appended (offload)

    def _evict(self, b: int) -> None:
        k = self.key.pop(b)
        self.evicted += 1
        primary = self.primary
        if primary[k] == b:
            more = self.dups.get(k)
            if more:
                primary[k] = more.pop(0)
                if not more:
                    del self.dups[k]
            else:
                del primary[k]
                if self.victims is not None:
                    self.victims.append(k)
        else:
            self.dups[k].remove(b)
            if not self.dups[k]:
                del self.dups[k]

    def _take_many(self, n: int) -> list[int]:
        """``n`` blocks from the front of the free queue: the prepended, the never used, then the oldest
        valid entries of the oldest segments (evicting their keys), in bulk."""
        out: list[int] = []
        pre = self.prepended
        while n and pre:
            out.append(pre.pop())
            n -= 1
        if n and self.fresh < self.capacity:
            k = min(n, self.capacity - self.fresh)
            out.extend(range(self.fresh, self.fresh + k))
            self.fresh += k
            n -= k
        if not n:
            return out
        stamp, segments, key, primary = self.stamp, self.segments, self.key, self.primary
        while n:
            sid, blocks = segments[0]
            cut = max(0, len(blocks) - n)
            chunk = blocks[cut:]
            del blocks[cut:]
            self.entries -= len(chunk)
            chunk.reverse()                       # eviction pops from the end
            valid = [b for b in chunk if stamp.get(b) == sid]
            if len(valid) > n:                    # cannot happen: at most n taken  # pragma: no cover
                raise AssertionError("took too many blocks")
            deque(map(stamp.__delitem__, valid), 0)
            if self.dups or self.victims is not None:
                for b in valid:
                    if b in key:
                        self._evict(b)
            else:                                 # one block per key (a valid block in a segment is hashed)
                deque(map(primary.__delitem__, map(key.pop, valid)), 0)
                self.evicted += len(valid)
            out.extend(valid)
            n -= len(valid)
            if not blocks:
                segments.popleft()
        return out

    def _compact(self) -> None:
        stamp = self.stamp
        kept: deque = deque()
        entries = 0
        for sid, blocks in self.segments:
            live = [b for b in blocks if stamp.get(b) == sid]
            if live:
                kept.append([sid, live])
                entries += len(live)
        self.segments, self.entries = kept, entries

    def run(self, keys: Sequence, num_tokens: int, tenant: Any = None) -> int:
        bs = self.block_size
        limit = min(len(keys), (num_tokens - 1) // bs)
        found = list(map(self.primary.get, keys[:limit]))
        try:
            hits = found[:found.index(None)]
        except ValueError:
            hits = found
        total = -(-num_tokens // bs)
        if total > self.capacity:
            raise CapacityError(f"needs {total} blocks")
        nh = len(hits)
        stamp = self.stamp
        stamp.update(zip(hits, repeat(-1)))          # touch: in use, out of the free queue
        if tenant is not None or self.track_owners:
            self.track_owners = True
            self.cross_tenant_hits += nh - list(map(self.owner.get, hits)).count(tenant)
        new = self._take_many(total - nh)
        full = len(keys)
        new_full = new[:full - nh]
        new_keys = keys[nh:full]
        if any(map(self.primary.__contains__, new_keys)):  # a cached block recomputed (the L - 1 cap)
            for b, k in zip(new_full, new_keys):
                if k in self.primary:
                    self.dups.setdefault(k, []).append(b)
                else:
                    self.primary[k] = b
        else:
            self.primary.update(zip(new_keys, new_full))
        self.key.update(zip(new_full, new_keys))
        if self.track_owners:
            self.owner.update(zip(new_full, repeat(tenant)))
        if total > self.peak_in_use:
            self.peak_in_use = total
        # free, tail first: full (hashed) blocks to the back as a new segment, the partial tail to the front
        blocks = hits + new_full
        self.seg_id += 1
        self.segments.append([self.seg_id, blocks])
        self.entries += len(blocks)
        stamp.update(zip(blocks, repeat(self.seg_id)))
        if total > full:
            self.prepended.append(new[-1])
        if self.entries > 4 * self.capacity + 1024:
            self._compact()
        return nh * bs


class InfiniteCache:
    """The vLLM lookup rules with unlimited memory."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.cached: dict = {}
        self.evicted = 0
        self.peak_in_use = 0
        self.cross_tenant_hits = 0

    def run(self, keys: Sequence, num_tokens: int, tenant: Any) -> int:
        limit = min(len(keys), (num_tokens - 1) // self.block_size)
        hits = 0
        cached = self.cached
        while hits < limit and keys[hits] in cached:
            if cached[keys[hits]] != tenant:
                self.cross_tenant_hits += 1
            hits += 1
        for k in keys[hits:]:
            cached.setdefault(k, tenant)
        self.peak_in_use = max(self.peak_in_use, len(cached) + (1 if num_tokens % self.block_size else 0))
        return hits * self.block_size


# --------------------------------------------------------------------------------------------- radix


class _Node:
    __slots__ = ("children", "key", "parent", "last", "lock", "owner")

    def __init__(self, key: tuple, parent: _Node | None, owner: Any = None):
        self.children: dict = {}
        self.key = key
        self.parent = parent
        self.last = 0
        self.lock = 0
        self.owner = owner


class RadixCache:
    """SGLang-style token radix tree with LRU eviction of unlocked leaves (capacity in tokens)."""

    def __init__(self, capacity_tokens: int | None):
        self.root = _Node((), None)
        self.root.lock = 1
        self.capacity = capacity_tokens
        self.size = 0
        self.clock = 0
        self.evicted_tokens = 0
        self.peak = 0
        self.cross_tenant_tokens = 0

    def _match(self, tokens: Sequence[int]) -> tuple[int, list[_Node]]:
        node, pos, path = self.root, 0, []
        n = len(tokens)
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            key = child.key
            m = 0
            lim = min(len(key), n - pos)
            while m < lim and key[m] == tokens[pos + m]:
                m += 1
            if m < len(key):  # split the edge so that the matched part is its own node
                mid = _Node(key[:m], node, child.owner)
                mid.last = child.last
                node.children[key[0]] = mid
                child.key = key[m:]
                child.parent = mid
                mid.children[child.key[0]] = child
                mid.lock = child.lock
                child = mid
            path.append(child)
            pos += m
            node = child
            if m < len(key):
                break
        return pos, path

    def run(self, tokens: Sequence, tenant: Any, offset: int = 0) -> tuple[int, list[_Node]]:
        """Match, insert the rest, lock the path (until :meth:`release`); return the hit tokens.

        ``offset`` leading pseudo-tokens (a tenant's salt) are not counted; the hit is capped at L - 1.
        """
        self.clock += 1
        matched, path = self._match(tokens)
        hit = max(0, min(matched - offset, len(tokens) - offset - 1))
        for node in path:
            node.last = self.clock
            if node.owner != tenant:
                self.cross_tenant_tokens += len(node.key)
        node = path[-1] if path else self.root
        if matched < len(tokens):
            rest = tuple(tokens[matched:])
            leaf = _Node(rest, node, tenant)
            leaf.last = self.clock
            node.children[rest[0]] = leaf
            self.size += len(rest)
            path.append(leaf)
        for nd in path:
            nd.lock += 1
        self.peak = max(self.peak, self.size)
        self._evict()
        return hit, path

    def release(self, path: list[_Node]) -> None:
        for nd in path:
            nd.lock -= 1
        self._evict()

    def _evict(self) -> None:
        if self.capacity is None or self.size <= self.capacity:
            return
        leaves: list[tuple[int, int, _Node]] = []
        stack = [self.root]
        while stack:
            nd = stack.pop()
            if nd.children:
                stack.extend(nd.children.values())
            elif nd.lock == 0:
                leaves.append((nd.last, id(nd), nd))
        heapq.heapify(leaves)
        while self.size > self.capacity and leaves:
            _, _, nd = heapq.heappop(leaves)
            parent = nd.parent
            assert parent is not None              # the root is locked, never a leaf to evict
            del parent.children[nd.key[0]]
            self.size -= len(nd.key)
            self.evicted_tokens += len(nd.key)
            if parent is not self.root and not parent.children and parent.lock == 0:
                heapq.heappush(leaves, (parent.last, id(parent), parent))


# --------------------------------------------------------------------------------------------- chunk


class ChunkCache:
    """Position-independent chunk reuse (LMCache / CacheBlend), LRU over chunks, capacity in tokens."""

    def __init__(self, capacity_tokens: int | None, chunk_size: int, recompute_ratio: float):
        self.capacity = capacity_tokens
        self.chunk_size = chunk_size
        self.recompute = recompute_ratio
        self.lru: OrderedDict = OrderedDict()
        self.size = 0
        self.evicted_tokens = 0
        self.peak = 0
        self.prefix_hit_tokens = 0
        self.reused_nonprefix_tokens = 0
        self.cross_tenant_tokens = 0

    def run(self, tokens: Sequence[int], segments: Sequence[int] | None, salt: Any, tenant: Any) -> float:
        bounds = []
        if segments:
            pos = 0
            for s in segments:
                bounds.append((pos, pos + s))
                pos += s
        else:
            n = len(tokens) // self.chunk_size  # full chunks only
            bounds = [(i * self.chunk_size, (i + 1) * self.chunk_size) for i in range(n)]
        prefix = True
        saved = 0.0
        cap = len(tokens) - 1
        chained = hash(("chunk-root", salt))
        for start, end in bounds:
            piece = tuple(tokens[start:end])
            key = hash((salt, piece))                 # content only: reusable anywhere (CacheBlend)
            chained = hash((chained, piece))          # content and everything before it: exact reuse
            size = end - start
            entry = self.lru.get(key)
            if entry is not None:
                self.lru.move_to_end(key)
                if entry[1] != tenant:
                    self.cross_tenant_tokens += size
                usable = max(0, min(end, cap) - start)
                if prefix and chained in entry[2]:   # same chunk, same position, same prefix: exact
                    saved += usable
                    self.prefix_hit_tokens += usable
                else:
                    prefix = False
                    saved += usable * (1.0 - self.recompute)
                    self.reused_nonprefix_tokens += usable
                entry[2].add(chained)
            else:
                prefix = False
                self.lru[key] = (size, tenant, {chained})
                self.size += size
        self.peak = max(self.peak, self.size)
        if self.capacity is not None:
            while self.size > self.capacity and self.lru:
                _, (size, _, _) = self.lru.popitem(last=False)
                self.size -= size
                self.evicted_tokens += size
        return saved


# --------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class TenantStats:
    tenant: Any
    requests: int
    query_tokens: int
    hit_tokens: float
    hit_rate: float | None


@dataclass(frozen=True)
class RequestHit:
    index: int
    line: int | None
    prompt_tokens: int
    hit_tokens: float
    tenant: Any = None


@dataclass(frozen=True, kw_only=True)
class PrefixReport:
    schema_version: int = SCHEMA_VERSION
    policy: str
    block_size: int
    capacity_blocks: int | None
    requests: int
    query_tokens: int
    hit_tokens: float
    hit_rate: float | None
    prefill_tokens_saved: float
    evicted_blocks: int
    evicted_tokens: int
    peak_blocks_in_use: int
    cross_tenant_shared_blocks: int
    per_tenant: tuple[TenantStats, ...]
    #: requests without the asked-for salt field (cached unsalted) and without the asked-for tenant field
    unsalted_requests: int = 0
    requests_without_tenant: int = 0
    per_request: tuple[RequestHit, ...] | None = None
    upper_bound: bool = False
    notes: tuple[str, ...] = ()
    warmup_requests: int = 0


@dataclass
class _Tally:
    requests: int = 0
    query: int = 0
    hits: float = 0.0


def simulate(requests: Iterable[TraceRequest], *, policy: str = "vllm", block_size: int = 16,
             capacity_blocks: int | None = None, hash_fn: str = "builtin", concurrency: int = 1,
             decode_s_per_token: float = 0.02, chunk_size: int = 256, recompute_ratio: float = 0.15,
             per_request: bool = False, source: str = "", warmup: int = 0) -> PrefixReport:
    """Replay requests through one prefix-cache policy and count what vLLM's metrics would count.

    The first ``warmup`` requests fill the cache but are not counted.
    """
    if policy not in POLICIES:
        raise UsageError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise UsageError(f"--block-size must be between 1 and {MAX_BLOCK_SIZE:,}")
    if capacity_blocks is not None and not 1 <= capacity_blocks <= MAX_CAPACITY_BLOCKS:
        raise UsageError(f"a capacity must be between 1 and {MAX_CAPACITY_BLOCKS:,} blocks, got {str(capacity_blocks)[:30]}")
    if policy == "vllm" and capacity_blocks is None:
        raise UsageError("the vllm policy needs --capacity-blocks N (or --capacity-gib X --model M); "
                         "--policy infinite gives the no-eviction ceiling")
    if concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    if not 0.0 <= recompute_ratio <= 1.0:
        raise UsageError("--recompute-ratio must be between 0 and 1")
    tenants: dict[Any, _Tally] = {}
    unsalted = no_tenant = 0
    rows: list[RequestHit] = []
    total = _Tally()
    notes: list[str] = []
    seq_pool: LruKeyPool | None = None
    pool: VllmBlockPool | None = None
    if policy == "vllm" and capacity_blocks is not None:
        if concurrency == 1:
            from .prefix_lru import LruKeyPool

            seq_pool = LruKeyPool(capacity_blocks, block_size)
        else:
            pool = VllmBlockPool(capacity_blocks, block_size)
    inf = InfiniteCache(block_size) if policy == "infinite" else None
    cap_tokens = capacity_blocks * block_size if capacity_blocks is not None else None
    radix = RadixCache(cap_tokens) if policy == "radix" else None
    chunk = ChunkCache(cap_tokens, chunk_size, recompute_ratio) if policy == "chunk" else None
    running: list = []  # (end_time, seq, handle) of requests in flight
    handle: Any
    clock = 0.0
    seq = 0
    seen = 0

    def finish(handle) -> None:
        if pool is not None:
            pool.free(handle)
        elif radix is not None:
            radix.release(handle)

    for req in requests:
        if req.hash_ids is not None and req.hash_block_size != block_size and policy in ("vllm", "infinite"):
            raise UsageError(f"{source}: hash_ids cover {req.hash_block_size}-token blocks; run with "
                             f"--block-size {req.hash_block_size} (they cannot be split)")
        if req.hash_ids is not None and policy in ("radix", "chunk"):
            raise UsageError(f"{source}: the {policy} policy needs token IDs; hash_ids traces work with the vllm "
                             "and infinite policies")
        arrival = req.timestamp if req.timestamp is not None else clock
        clock = max(clock, arrival)
        # requests that finished by now give their blocks back (in the order they finish)
        while running and (running[0][0] <= clock or concurrency == 1):
            end, _, handle = heapq.heappop(running)
            clock = max(clock, end) if concurrency == 1 else clock
            finish(handle)
        tenant = req.tenant
        hit: float
        if seq_pool is not None:
            try:
                hit = seq_pool.run(request_keys(req, block_size, hash_fn), req.prompt_tokens, tenant)
            except CapacityError:
                need = -(-req.prompt_tokens // block_size)
                raise CapacityError(f"{source}:{req.line}: a request of {req.prompt_tokens} tokens needs "
                                    f"{need} blocks of {block_size} but the capacity is {capacity_blocks}; "
                                    f"the minimum that works for this trace is at least {need}") from None
            handle = None
        elif pool is not None:
            keys = request_keys(req, block_size, hash_fn)
            while True:
                hits = pool.lookup(keys, req.prompt_tokens)
                if pool.can_admit(hits, req.prompt_tokens) and len(running) < concurrency:
                    break
                if not running:
                    need = -(-req.prompt_tokens // block_size)
                    raise CapacityError(f"{source}:{req.line}: a request of {req.prompt_tokens} tokens needs "
                                        f"{need} blocks of {block_size} but the capacity is {capacity_blocks}; "
                                        f"the minimum that works for this trace is at least {need}")
                end, _, handle = heapq.heappop(running)  # wait for the earliest running request
                clock = max(clock, end)
                finish(handle)
            blocks = pool.admit(keys, req.prompt_tokens, hits, tenant)
            hit = len(hits) * block_size
            handle = blocks
        elif inf is not None:
            hit = inf.run(request_keys(req, block_size, hash_fn), req.prompt_tokens, tenant)
            handle = None
        elif radix is not None:
            while len(running) >= concurrency:
                end, _, h = heapq.heappop(running)
                clock = max(clock, end)
                finish(h)
            if req.salt is None:
                hit, handle = radix.run(_tokens(req), tenant)
            else:  # a salt isolates tenants: a pseudo-token of its own at the root of each tenant's tree
                hit, handle = radix.run([("salt", req.salt), *_tokens(req)], tenant, offset=1)
            if radix.capacity is not None and radix.size > radix.capacity and not running:
                raise CapacityError(f"{source}:{req.line}: a request of {req.prompt_tokens} tokens does not fit "
                                    f"in {radix.capacity} tokens of capacity")
        else:
            assert chunk is not None
            hit = chunk.run(_tokens(req), req.segments, req.salt, tenant)
            handle = None
        if handle is not None:
            seq += 1
            heapq.heappush(running, (clock + req.output_tokens * decode_s_per_token, seq, handle))
        seen += 1
        if seen <= warmup:
            continue
        unsalted += req.unsalted
        no_tenant += req.no_tenant
        t = tenants.setdefault(tenant, _Tally())
        for tally in (t, total):
            tally.requests += 1
            tally.query += req.prompt_tokens
            tally.hits += hit
        if per_request:
            rows.append(RequestHit(index=req.index, line=req.line, prompt_tokens=req.prompt_tokens, hit_tokens=hit,
                                   tenant=tenant))
    while running:
        finish(heapq.heappop(running)[2])
    if total.requests == 0:
        if seen:
            raise UsageError(f"`warmup` covers all {seen} requests: nothing is left to count")
        raise InputError("the trace has no requests", source=source)
    if policy != "chunk":  # whole tokens everywhere but in the chunk policy's upper bound
        total.hits = int(total.hits)
        for v in tenants.values():
            v.hits = int(v.hits)

    p = pool or seq_pool
    if p is not None:
        evicted_blocks, evicted_tokens = p.evicted, p.evicted * block_size
        peak, cross = p.peak_in_use, p.cross_tenant_hits
    elif inf is not None:
        evicted_blocks = evicted_tokens = 0
        peak, cross = inf.peak_in_use, inf.cross_tenant_hits
    else:
        c = radix or chunk
        assert c is not None
        evicted_tokens = c.evicted_tokens
        evicted_blocks = -(-evicted_tokens // block_size)
        peak = -(-c.peak // block_size)
        cross = -(-c.cross_tenant_tokens // block_size)
        if chunk is not None:
            notes.append(f"chunk reuse is an upper bound: chunks away from the prefix are counted as reused minus "
                         f"the {recompute_ratio:.0%} of their tokens CacheBlend recomputes; attention across "
                         "chunks is approximated")
    if warmup and seen:
        notes.append(f"the first {min(warmup, seen)} requests warmed the cache and are not counted")
    if policy == "vllm" and hash_fn == "builtin":
        notes.append("block keys: Python's 64-bit tuple hash (equality is all that matters); --hash sha256 for "
                     "vLLM's own")
    per_tenant = tuple(TenantStats(tenant=k, requests=v.requests, query_tokens=v.query, hit_tokens=v.hits,
                                   hit_rate=v.hits / v.query if v.query else None) for k, v in tenants.items())
    return PrefixReport(policy=policy, block_size=block_size, capacity_blocks=capacity_blocks,
                        requests=total.requests, query_tokens=total.query, hit_tokens=total.hits,
                        hit_rate=total.hits / total.query if total.query else None,
                        prefill_tokens_saved=total.hits, evicted_blocks=evicted_blocks, evicted_tokens=evicted_tokens,
                        peak_blocks_in_use=peak, cross_tenant_shared_blocks=cross, per_tenant=per_tenant,
                        unsalted_requests=unsalted, requests_without_tenant=no_tenant,
                        per_request=tuple(rows) if per_request else None, upper_bound=policy == "chunk",
                        notes=tuple(notes), warmup_requests=min(warmup, seen))


# --------------------------------------------------------------------------------------------- reading


def trace_records(path: str) -> Iterator[tuple[int, Any, bool]]:
    """``(line, value, has_bool_literal)`` for each line of a JSONL trace, parsed with orjson.

    The flag (a ``true``/``false`` that may be on the line) lets token lists be checked at C speed: a bool
    would otherwise pass as 0 or 1.
    """
    from ..inputs import iter_raw_lines, parse_jsonl_line

    for lineno, raw, source in iter_raw_lines(path):
        yield lineno, parse_jsonl_line(raw, source, lineno), _may_hold_bool(raw)


def _may_hold_bool(raw: bytes) -> bool:
    """Whether ``true`` or ``false`` may be on the line: both end in ``e``, a letter a token list never holds,
    so only the few ``e`` of the line (in its keys) are looked at, each found with one ``memchr``. Never a
    false "no"; past 16 of them, one scan for the two words."""
    find = raw.find
    i = find(b"e")
    seen = 0
    while i >= 0:
        if raw[i - 3:i] == b"tru" or raw[i - 4:i] == b"fals":
            return True
        seen += 1
        if seen == 16:
            return b"true" in raw or b"false" in raw
        i = find(b"e", i + 1)
    return False


_check_ids: Any = None


def _token_list(value: Any, name: str, where: dict, maybe_bool: bool = True) -> list:
    """Token IDs through the one validator of token-ID lists (:func:`cachectl.inputs.prompt.check_ids`)."""
    global _check_ids
    if _check_ids is None:  # imported on first use (this module stays light), then kept: one call per request
        from ..inputs.prompt import check_ids

        _check_ids = check_ids
    _check_ids(value, field=name, maybe_bool=maybe_bool, **where)
    return value


def _int_list(value: Any, name: str, where: dict) -> list:
    if not isinstance(value, list):
        raise InputError("expected a list", field=name, **where)
    for i, x in enumerate(value):
        if type(x) is not int or x < 0:
            raise InputError(f"{x!r:.60} is not a non-negative integer", field=f"{name}[{i}]", **where)
    return value


#: deepest JSON object or list taken as a salt, tenant or session (its repr recurses once per level)
MAX_KEY_DEPTH = 64


def _nested_key(value: Any, name: str, where: dict) -> str:
    """A salt, tenant or session that is a JSON object or list, as one hashable string (its repr). Nested
    deeper than :data:`MAX_KEY_DEPTH` levels it is refused: repr would meet Python's recursion limit at a depth
    that depends on the caller's stack."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_KEY_DEPTH:
            raise InputError(f"nested deeper than {MAX_KEY_DEPTH} levels", field=name, **where)
        for child in (v.values() if isinstance(v, dict) else v):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return repr(value)


def _get(value: dict, dotted: str) -> Any:
    cur: Any = value
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def iter_trace(records: Iterable[tuple], *, source: str, tokenizer: Any = None,
               salt_field: str | None = None, tenant_field: str | None = None, hash_block_size: int = 512,
               as_kind: str | None = None, batch_size: int = 128, no_salt: bool = False,
               add_generation_prompt: bool = True, session_fields: Sequence[str] = ()) -> Iterator[TraceRequest]:
    """Requests from a JSONL trace: token IDs, Mooncake hash_ids, or text/chat through a tokenizer.

    ``records`` yields ``(line, value)`` or, from :func:`trace_records`, ``(line, value, has_bool_literal)``.
    ``session_fields``: the first of these (dotted) fields present on a line is the request's ``session``
    (for session-affinity routing); None when none is.
    """
    pending: list[tuple[int, Any, Any, dict]] = []
    index = 0

    def flush() -> Iterator[TraceRequest]:
        nonlocal index
        if not pending:
            return
        from ..inputs import prompt_from_value

        prompts = [prompt_from_value(v, source=source, line=ln, as_kind=as_kind) for ln, v, _, _ in pending]
        # chat requests as vLLM's chat endpoint renders them by default (with the assistant header)
        toks = tokenizer.tokenize_many(prompts, add_generation_prompt=add_generation_prompt)
        for (ln, _, salt, meta), tok in zip(pending, toks):
            yield TraceRequest(index=index, line=ln, prompt_tokens=len(tok.ids), tokens=list(tok.ids), salt=salt,
                               **meta)
            index += 1
        pending.clear()

    for record in records:
        line, value = record[0], record[1]
        maybe_bool = record[2] if len(record) > 2 else True
        where = {"source": source, "line": line}
        if not isinstance(value, dict):
            raise InputError("expected a JSON object per line", **where)
        salt = _get(value, salt_field) if salt_field else value.get("salt", value.get("cache_salt"))
        # a request without a salt is an ordinary one (vLLM's cache_salt is optional): cached unsalted, counted
        unsalted = bool(salt_field) and salt is None
        tenant = _get(value, tenant_field) if tenant_field else salt
        no_tenant = bool(tenant_field) and tenant is None
        if no_salt:
            salt = None
        if isinstance(salt, (dict, list)):
            salt = _nested_key(salt, salt_field or "salt", where)
        if isinstance(tenant, (dict, list)):
            tenant = _nested_key(tenant, tenant_field or "salt", where)
        ts = value.get("timestamp")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))
                               or not -MAX_TIMESTAMP < ts < MAX_TIMESTAMP):
            raise InputError(f"expected a number of seconds (or Mooncake milliseconds), got {ts!r:.60}",
                             field="timestamp", **where)
        out_key = "output_tokens" if "output_tokens" in value else "output_length"
        out = value.get(out_key) or 0
        if isinstance(out, bool) or not isinstance(out, int) or not 0 <= out <= MAX_OUTPUT_TOKENS:
            raise InputError(f"expected a non-negative integer up to {MAX_OUTPUT_TOKENS:,}, got {out!r:.60}",
                             field=out_key, **where)
        meta: dict[str, Any] = {"tenant": tenant, "timestamp": None if ts is None else float(ts), "output_tokens": out,
                "unsalted": unsalted, "no_tenant": no_tenant}
        if session_fields:
            session = next((v for v in map(lambda f: _get(value, f), session_fields) if v is not None), None)
            meta["session"] = (_nested_key(session, "session", where) if isinstance(session, (dict, list))
                               else session)
        if "hash_ids" in value and as_kind is None:
            if pending:
                yield from flush()
            ids = _int_list(value["hash_ids"], "hash_ids", where)
            length = value.get("input_length")
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise InputError(f"expected a positive integer, got {length!r:.60}", field="input_length", **where)
            if -(-length // hash_block_size) != len(ids):
                raise InputError(f"{len(ids)} hash_ids do not cover input_length {length} in blocks of "
                                 f"{hash_block_size} (--hash-block-size)", field="hash_ids", **where)
            if len(set(ids)) != len(ids):
                first: dict = {}
                for i, h in enumerate(ids):
                    if h in first:
                        raise InputError(f"hash id {h} repeats hash_ids[{first[h]}]: a Mooncake hash id names a "
                                         "block with its whole prefix, so one request cannot hold it twice",
                                         field=f"hash_ids[{i}]", **where)
                    first[h] = i
            if ts is not None and meta["timestamp"] is not None and ts > 1e11:
                meta["timestamp"] = ts / 1000.0  # Mooncake timestamps are milliseconds
            yield TraceRequest(index=index, line=line, prompt_tokens=length, hash_ids=ids,
                               hash_block_size=hash_block_size, salt=salt, **meta)
            index += 1
            continue
        key = ("tokens" if "tokens" in value else "prompt_token_ids" if "prompt_token_ids" in value
               else "input_ids" if "input_ids" in value else None)
        if key is not None and as_kind in (None, "ids"):
            if pending:
                yield from flush()
            tokens = _token_list(value[key], key, where, maybe_bool)
            segments = value.get("segments")
            if segments is not None:
                segments = _int_list(segments, "segments", where)
                if sum(segments) != len(tokens):
                    raise InputError(f"segments sum to {sum(segments)}, not the {len(tokens)} tokens",
                                     field="segments", **where)
            yield TraceRequest(index=index, line=line, prompt_tokens=len(tokens), tokens=tokens, salt=salt,
                               segments=segments, **meta)
            index += 1
            continue
        if any(k in value for k in ("prompt", "messages", "text", "body")):
            if tokenizer is None:
                raise InputError("a text or chat request needs --tokenizer to become token IDs", **where)
            pending.append((line, value, salt, meta))
            if len(pending) >= batch_size:
                yield from flush()
            continue
        raise InputError("no tokens: expected 'tokens' (token IDs), 'hash_ids' with 'input_length' (Mooncake), "
                         "or 'prompt'/'messages' with --tokenizer", **where)
    yield from flush()
