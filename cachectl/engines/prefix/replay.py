"""Replay traffic through a server prefix cache: :func:`simulate` feeds the requests of a trace
(:mod:`.trace`) through one of the pools (:mod:`.pools`, or the key-level LRU of :mod:`.lru`) and tallies hits
per request and per tenant into a :class:`PrefixReport`.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import InputError, UsageError
from .pools import CapacityError, ChunkCache, InfiniteCache, RadixCache, VllmBlockPool
from .trace import TraceRequest, request_keys, request_tokens

if TYPE_CHECKING:
    from .lru import LruKeyPool

SCHEMA_VERSION = 1
POLICIES = ("vllm", "radix", "chunk", "infinite")
MAX_BLOCK_SIZE = 1 << 20
MAX_CAPACITY_BLOCKS = 1 << 48



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
    #: what the server reported it served from its cache (None: the log does not say); see :mod:`.served`
    served_cached_tokens: int | None = None
    served_prompt_tokens: int | None = None


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
    #: sums over the counted requests, for what the hits are worth (:mod:`.value`): hit tokens squared and
    #: prompt tokens squared (the attention terms), and the output tokens the trace says they generated
    hit_square_sum: float = 0.0
    query_square_sum: float = 0.0
    output_tokens: int = 0
    #: counted requests whose line carries the served cached tokens
    served_requests: int = 0


@dataclass
class _Tally:
    requests: int = 0
    query: int = 0
    hits: float = 0.0
    hit_sq: float = 0.0
    query_sq: float = 0.0
    output: int = 0
    served: int = 0


def simulate(requests: Iterable[TraceRequest], *, policy: str = "vllm", block_size: int = 16,
             capacity_blocks: int | None = None, hash_fn: str = "builtin", concurrency: int = 1,
             decode_s_per_token: float = 0.02, chunk_size: int = 256, recompute_ratio: float = 0.15,
             per_request: bool = False, source: str = "", warmup: int = 0, compact: bool = False,
             hits_into: array | None = None) -> PrefixReport:
    """Replay requests through one prefix-cache policy and count what vLLM's metrics would count.

    The first ``warmup`` requests fill the cache but are not counted. ``per_request``: one row per counted
    request; rows are kept without it for the requests that carry a served count (:mod:`.served` compares
    them), and then ``per_request`` holds those. ``compact``: the infinite policy keeps its keys in about half
    the memory, at two to three times the time (``fix`` and ``report`` replay a whole log many times).
    ``hits_into``: each counted request's hit tokens appended to this array, in 8 bytes where a row takes about 200
    (whole tokens: not with the chunk policy).
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
    if hits_into is not None and policy == "chunk":
        raise UsageError("the chunk policy's hits are not whole tokens: `hits_into` takes whole tokens")
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
            from .lru import LruKeyPool

            seq_pool = LruKeyPool(capacity_blocks, block_size)
        else:
            pool = VllmBlockPool(capacity_blocks, block_size)
    inf = InfiniteCache(block_size, compact=compact) if policy == "infinite" else None
    cap_tokens = capacity_blocks * block_size if capacity_blocks is not None else None
    radix = RadixCache(cap_tokens, page_size=block_size) if policy == "radix" else None  # the block size is the page
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
            tokens = request_tokens(req)
            while True:  # SGLang evicts before it allocates: a request that cannot fit waits for running ones
                handle = radix.admit(tokens, req.salt, tenant) if len(running) < concurrency else None
                if handle is not None:
                    break
                if not running:
                    raise CapacityError(f"{source}:{req.line}: a request of {req.prompt_tokens} tokens needs "
                                        f"{-(-req.prompt_tokens // block_size)} pages of {block_size} but the "
                                        f"capacity is {capacity_blocks}")
                end, _, h = heapq.heappop(running)
                clock = max(clock, end)
                finish(h)
            hit = handle.hit
        else:
            assert chunk is not None
            hit = chunk.run(request_tokens(req), req.segments, req.salt, tenant)
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
        total.hit_sq += hit * hit
        total.query_sq += req.prompt_tokens * req.prompt_tokens
        total.output += req.output_tokens
        if req.served_cached_tokens is not None:
            total.served += 1
        if hits_into is not None:
            hits_into.append(hit)
        if per_request or req.served_cached_tokens is not None:  # a served count is compared row by row
            rows.append(RequestHit(index=req.index, line=req.line, prompt_tokens=req.prompt_tokens, hit_tokens=hit,
                                   tenant=tenant, served_cached_tokens=req.served_cached_tokens,
                                   served_prompt_tokens=req.served_prompt_tokens))
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
                        per_request=tuple(rows) if per_request or total.served else None, upper_bound=policy == "chunk",
                        notes=tuple(notes), warmup_requests=min(warmup, seen), hit_square_sum=total.hit_sq,
                        query_square_sum=float(total.query_sq), output_tokens=total.output,
                        served_requests=total.served)



class InfiniteVersions:
    """The no-eviction replay (:func:`simulate`'s ``infinite`` policy, one tenant) of several versions of
    one log in one pass: version ``j`` is bit ``j`` of a mask. One map (a :class:`~cachectl.spool.KeyIndex`, 16
    bytes an entry, 9 up to eight versions) holds each block key with the mask of the versions that cached it, so a
    request that several versions send alike (a line no fix changed) is hashed, looked up and inserted once for all
    of them, and a block the versions share is kept once. Each version's counts equal :func:`simulate` over that version's requests alone
    (``tests/test_measure_sweep.py`` checks it).

    ``add(tokens, mask, salt=None)``: the versions of ``mask`` each send ``tokens`` (with vLLM's ``cache_salt``, which
    keys their blocks apart from unsalted ones) as their next request.
    ``totals(j)``: version ``j``'s requests, query tokens and hit tokens. ``labelled``: each request is added with a
    ``label`` (the model its line names), and ``by_label(j)`` gives version ``j``'s hit tokens summed by label."""

    def __init__(self, versions: int, block_size: int, labelled: bool = False) -> None:
        from ...spool import KeyDict, KeyIndex

        if not 1 <= block_size <= MAX_BLOCK_SIZE:
            raise UsageError(f"--block-size must be between 1 and {MAX_BLOCK_SIZE:,}")
        self.block_size = block_size
        # (the keys are the builtin hash's, signed 64-bit ints, and a mask is one up to 63 versions, in a byte up to
        # eight; past 63, a dict)
        bits = next((t for n, t in ((8, "uint8"), (16, "uint16"), (32, "uint32"), (63, "int64")) if versions <= n), None)
        self._table = KeyIndex(bits) if bits is not None else KeyDict()
        self._requests = [0] * versions
        self._query = [0] * versions
        self._hits = [0] * versions
        self._by: list[dict[Any, int]] | None = [{} for _ in range(versions)] if labelled else None

    def add(self, tokens: Any, mask: int, salt: Any = None, label: Any = None) -> None:
        from .trace import block_keys

        bs = self.block_size
        keys = block_keys(tokens, bs, salt)
        n = len(tokens)
        limit = min(len(keys), (n - 1) // bs)  # (vLLM's lookup leaves at least one token to compute)
        table = self._table
        masks = table.values(keys, 0)
        active, i = mask, 0
        while i < limit and active:   # the longest cached prefix, per version: a version drops out at its miss
            has = masks[i]
            if active & ~has:
                self._count(active & ~has, i * bs, n, label)
                active &= has
            i += 1
        if active:
            self._count(active, i * bs, n, label)
        new = list(dict.fromkeys(k for k, m in zip(keys, masks) if not m))  # (cached by no version yet)
        grown = {k: m | mask for k, m in zip(keys, masks) if m and m & mask != mask}
        if grown:
            table.put(list(grown), list(grown.values()))
        table.put(new, [mask] * len(new), absent=True)

    def _count(self, mask: int, hit: int, n: int, label: Any) -> None:
        j, by = 0, self._by
        while mask:
            if mask & 1:
                self._requests[j] += 1
                self._query[j] += n
                self._hits[j] += hit
                if by is not None:
                    by[j][label] = by[j].get(label, 0) + hit
            mask >>= 1
            j += 1

    def totals(self, j: int) -> tuple[int, int, int]:
        """Version ``j``'s requests, query tokens and hit tokens (the totals of :func:`simulate`'s report)."""
        return self._requests[j], self._query[j], self._hits[j]

    def by_label(self, j: int) -> dict[Any, int]:
        """Version ``j``'s hit tokens by the label of the request that read them (``labelled`` runs only)."""
        if self._by is None:
            raise ValueError("by_label needs a run made with labelled=True")
        return dict(self._by[j])
