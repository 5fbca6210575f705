"""The server prefix caches a trace is replayed through, one class per policy.

Policies:

- ``vllm``: vLLM v1's block prefix cache (``vllm/v1/core``): only full blocks are hashed, a block's key
  chains its parent's key, the per-tenant salt is an extra key on the first block; lookup walks from the
  first block and stops at the first miss, capped at ``num_tokens - 1``; a request allocates
  ``ceil(L / block_size)`` blocks, registers its full blocks when admitted, and frees them tail first:
  hashed blocks go to the back of the LRU free queue, unhashed ones to the front; a freed block stays
  hittable until its slot is reused. Several blocks may carry the same hash (the ``L - 1`` cap makes a
  request recompute a cached last block), as in vLLM.
- ``radix``: SGLang's radix cache with its page size (the block size; 1 is token level): the longest cached
  prefix in whole pages, the same ``L - 1`` cap, LRU eviction of unlocked leaves before a request's pages are
  allocated (the pool is never exceeded); running requests pin their path and hold their partial last page.
- ``chunk``: position-independent reuse of fixed-size chunks (LMCache, 256 tokens) or of declared segments;
  chunks not at the prefix are reused at the cost of recomputing ``recompute_ratio`` of their tokens
  (CacheBlend). An upper bound, labelled as such.
- ``infinite``: the vLLM rules with no eviction: the ceiling.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from ...errors import UsageError

if TYPE_CHECKING:
    pass


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


class _KeyTable:
    """Block key -> tenant as a dict holds them, in a fraction of the memory: signed 64-bit keys (the builtin
    hash's) in a :class:`~cachectl.spool.KeyIndex` (about 16 bytes an entry, no int objects), each tenant by its
    number; any other key (sha256 digests, hash IDs past 64 bits) in a dict beside it."""

    __slots__ = ("_other", "_table", "_tenants")

    def __init__(self) -> None:
        from ...spool import KeyIndex

        self._table = KeyIndex()
        self._other: dict = {}
        self._tenants: dict[Any, int] = {}

    def tenant_number(self, tenant: Any) -> int:
        return self._tenants.setdefault(tenant, len(self._tenants))

    def run(self, keys: Sequence, limit: int, number: int) -> list[int]:
        """The tenant numbers of the first ``limit`` keys up to the first one absent; then every key from there on
        that has none gets ``number`` (one request's lookup and insert)."""
        if not all(type(k) is int and -_SIGNED <= k < _SIGNED for k in keys):
            return self._run_each(keys, limit, number)
        got = self._table.values(keys)
        n, limit = 0, min(limit, len(keys))
        while n < limit and got[n] >= 0:
            n += 1
        new = list(dict.fromkeys(k for k, v in zip(keys[n:], got[n:]) if v < 0))
        self._table.put(new, [number] * len(new), absent=True)
        return got[:n]

    def _run_each(self, keys: Sequence, limit: int, number: int) -> list[int]:
        """:meth:`run` one key at a time (keys that are not all signed 64-bit ints)."""
        def table(k: Any) -> Any:
            return self._table if type(k) is int and -_SIGNED <= k < _SIGNED else self._other

        found: list[int] = []
        for k in keys[:limit]:
            got = table(k).get(k)
            if got is None:
                break
            found.append(got)
        for k in keys[len(found):]:
            if table(k).get(k) is None:
                table(k)[k] = number
        return found

    def __len__(self) -> int:
        return len(self._table) + len(self._other)


_SIGNED = 2**63


class InfiniteCache:
    """The vLLM lookup rules with unlimited memory. ``compact``: the keys in a :class:`_KeyTable`, for the whole-log
    commands that replay a long log many times (100,024 distinct blocks of 20,000 generated requests: a peak of
    3.5 MB against the dict's 11.2, tracemalloc; slower: the lookups go through numpy a request at a time)."""

    def __init__(self, block_size: int, compact: bool = False):
        self.block_size = block_size
        self.cached: dict = {}
        self.table = _KeyTable() if compact else None
        self.evicted = 0
        self.peak_in_use = 0
        self.cross_tenant_hits = 0

    def run(self, keys: Sequence, num_tokens: int, tenant: Any) -> int:
        limit = min(len(keys), (num_tokens - 1) // self.block_size)
        if self.table is not None:
            return self._run_compact(self.table, keys, limit, num_tokens, tenant)
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

    def _run_compact(self, table: _KeyTable, keys: Sequence, limit: int, num_tokens: int, tenant: Any) -> int:
        """:meth:`run` over a :class:`_KeyTable` (the same lookups, in the same order)."""
        mine = table.tenant_number(tenant)
        found = table.run(keys, limit, mine)
        hits = len(found)
        self.cross_tenant_hits += hits - found.count(mine)
        self.peak_in_use = max(self.peak_in_use, len(table) + (1 if num_tokens % self.block_size else 0))
        return hits * self.block_size


# --------------------------------------------------------------------------------------------- radix


class _Node:
    __slots__ = ("children", "key", "parent", "last", "lock", "owner", "seq")

    def __init__(self, key: tuple, parent: _Node | None, owner: Any = None, seq: int = 0):
        self.children: dict = {}
        self.key = key
        self.parent = parent
        self.last = 0
        self.lock = 0
        self.owner = owner
        self.seq = seq                # creation order: breaks LRU ties deterministically


class RadixHandle:
    """What a request admitted by :meth:`RadixCache.admit` holds until :meth:`RadixCache.release`."""

    __slots__ = ("hit", "node", "tail")

    def __init__(self, hit: int, node: _Node, tail: int):
        self.hit = hit                # cached tokens reused (whole pages, at most L - 1)
        self.node = node              # the last node of its prompt: it and its ancestors are locked
        self.tail = tail              # tokens of its partial last page (held, never inserted)


class RadixCache:
    """SGLang's RadixCache (``python/sglang/srt/mem_cache/radix_cache.py``) with its scheduler's rules.

    ``page_size`` P: keys are matched and inserted in whole pages (a node's key is a multiple of P tokens; a
    child is found by its first page; a match is cut to whole pages); a request matches its first ``L - 1``
    tokens (``adjust_max_prefix_ids``), allocates ``ceil(L / P)`` pages minus the matched ones, evicting
    unlocked leaves in LRU order first when the pool lacks them (the pool is never exceeded), inserts the
    whole pages of its prompt (a page already in the tree is not stored twice) and keeps its partial last page
    until it finishes. A salt is SGLang's ``extra_key``: one tree per key, never shared. Capacity in tokens.
    """

    def __init__(self, capacity_tokens: int | None, page_size: int = 1):
        if page_size < 1:
            raise UsageError("the page size must be at least 1")
        self.page = page_size
        self.roots: dict[Any, _Node] = {}
        self.capacity = None if capacity_tokens is None else capacity_tokens // page_size * page_size
        self.size = 0                 # tokens in the tree
        self.held = 0                 # tokens of the partial last pages running requests hold
        self.clock = 0
        self.seq = 0
        self.evicted_tokens = 0
        self.peak = 0                 # the most tokens of the pool in use at once (tree + partial pages)
        self.cross_tenant_tokens = 0

    def _root(self, salt: Any) -> _Node:
        root = self.roots.get(salt)
        if root is None:
            root = self.roots[salt] = _Node((), None, seq=self._next())
            root.lock = 1             # a root is never evicted
        return root

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _child_key(self, tokens: Sequence, pos: int) -> Any:
        return tokens[pos] if self.page == 1 else tuple(tokens[pos:pos + self.page])

    def _split(self, child: _Node, m: int) -> _Node:
        """Cut ``child``'s key after ``m`` tokens (a multiple of the page): the first part becomes its parent."""
        parent = child.parent
        assert parent is not None
        mid = _Node(child.key[:m], parent, child.owner, self._next())
        mid.last, mid.lock = child.last, child.lock
        parent.children[self._child_key(child.key, 0)] = mid
        child.key = child.key[m:]
        child.parent = mid
        mid.children[self._child_key(child.key, 0)] = child
        return mid

    def _walk(self, tokens: Sequence, root: _Node) -> tuple[int, list[_Node]]:
        """The cached whole pages of ``tokens``: (tokens matched, the nodes on the way), splitting the last node
        where the match ends inside it, as SGLang does."""
        p = self.page
        n = len(tokens) // p * p
        node, pos, path = root, 0, []
        while pos < n:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            key = child.key
            lim = min(len(key), n - pos)
            m = 0
            if p == 1:
                while m < lim and key[m] == tokens[pos + m]:
                    m += 1
            else:
                while m < lim and key[m:m + p] == tuple(tokens[pos + m:pos + m + p]):
                    m += p
            if m == 0:                    # pragma: no cover - the first page matched to find the child
                break
            if m < len(key):              # the match ends inside the node: split it there, stop
                path.append(self._split(child, m))
                pos += m
                break
            path.append(child)
            pos += m
            node = child
        return pos, path

    # -- SGLang's own operations (the unit tests port its cases)
    def match(self, tokens: Sequence, salt: Any = None) -> tuple[int, list[_Node]]:
        """``match_prefix``: the longest cached prefix in whole pages; refreshes the LRU time of its nodes."""
        self.clock += 1
        matched, path = self._walk(tokens, self._root(salt))
        for nd in path:
            nd.last = self.clock
        return matched, path

    def insert(self, tokens: Sequence, salt: Any = None, tenant: Any = None) -> tuple[int, list[_Node]]:
        """Insert the whole pages of ``tokens`` (as ``cache_finished_req`` and ``cache_unfinished_req`` do):
        returns the tokens that were already cached and the path of the prompt."""
        root = self._root(salt)
        self.clock += 1
        aligned = len(tokens) // self.page * self.page
        prefix, path = self._walk(tokens[:aligned], root)
        for nd in path:
            nd.last = self.clock
        if prefix < aligned:
            rest = tuple(tokens[prefix:aligned])
            parent = path[-1] if path else root
            leaf = _Node(rest, parent, tenant, self._next())
            leaf.last = self.clock
            parent.children[self._child_key(rest, 0)] = leaf
            self.size += len(rest)
            path.append(leaf)
        return prefix, path

    @staticmethod
    def lock(node: _Node) -> None:
        """``inc_lock_ref``: the node and its ancestors (a split later copies the count to the new parent, so
        walking up from the same node always unlocks what was locked)."""
        while node.parent is not None:
            node.lock += 1
            node = node.parent

    @staticmethod
    def unlock(node: _Node) -> None:
        """``dec_lock_ref``."""
        while node.parent is not None:
            node.lock -= 1
            node = node.parent

    def _nodes(self):
        stack = list(self.roots.values())
        while stack:
            nd = stack.pop()
            if nd.parent is not None:
                yield nd
            stack.extend(nd.children.values())

    def protected_size(self) -> int:
        """Tokens in locked nodes (running requests' paths)."""
        return sum(len(nd.key) for nd in self._nodes() if nd.lock > 0)

    def evictable_size(self) -> int:
        return self.size - self.protected_size()

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves, least recently used first, until ``num_tokens`` are freed (whole nodes, so it
        may free more) or nothing is evictable; returns the tokens freed."""
        leaves = [(nd.last, nd.seq, nd) for nd in self._nodes() if not nd.children and nd.lock == 0]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            _, _, nd = heapq.heappop(leaves)
            parent = nd.parent
            assert parent is not None              # a root is locked, never a leaf to evict
            del parent.children[self._child_key(nd.key, 0)]
            freed += len(nd.key)
            if parent.parent is not None and not parent.children and parent.lock == 0:
                heapq.heappush(leaves, (parent.last, parent.seq, parent))
        self.size -= freed
        self.evicted_tokens += freed
        return freed

    # -- a request, as SGLang's scheduler runs it
    def admit(self, tokens: Sequence, salt: Any = None, tenant: Any = None) -> RadixHandle | None:
        """Match the first ``L - 1`` tokens, evict what the new pages need, insert, lock: the handle, or None
        when the pool cannot hold the request even with every unlocked leaf evicted (it has to wait)."""
        p, n = self.page, len(tokens)
        hit, path = self.match(tokens[:max(n - 1, 0)], salt)
        need = -(-n // p) * p - hit                   # the pages of the tokens to compute
        last = path[-1] if path else self._root(salt)
        self.lock(last)
        if self.capacity is not None:
            short = need - (self.capacity - self.size - self.held)
            if short > 0:
                self.evict(short)
                if need > self.capacity - self.size - self.held:
                    self.unlock(last)
                    return None
            self.peak = max(self.peak, self.size + self.held + need)
        self.unlock(last)
        _, full = self.insert(tokens, salt, tenant)
        end = full[-1] if full else self._root(salt)
        self.lock(end)
        tail = n % p and p                            # the partial last page stays with the request
        self.held += tail
        if self.capacity is None:
            self.peak = max(self.peak, self.size + self.held)
        for nd in path:
            if nd.owner != tenant:
                self.cross_tenant_tokens += len(nd.key)
        return RadixHandle(hit, end, tail)

    def release(self, handle: RadixHandle) -> None:
        """The request finished: its path is unlocked (stays cached) and its partial last page freed."""
        self.unlock(handle.node)
        self.held -= handle.tail


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
