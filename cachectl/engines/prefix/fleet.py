"""A fleet of prefix-cache replicas behind a router, with an optional CPU offload tier per replica.

Every router here decides from what a router sees (the request, its arrival, the requests it sent where),
never from the replicas' true cache contents, so a trace is routed once, up front, and each replica then
replays its share through the exact pools of the single-instance engine (:mod:`cachectl.engines.prefix`).
With one replica every router sends everything to replica 0: today's numbers, exactly.

Routers:

- ``round-robin``: request i to replica i mod N.
- ``random``: uniform, from a seeded generator.
- ``session``: affinity, a consistent-hash ring over the request's session value.
- ``prefix-hash``: the same ring over the request's first K full blocks (K = ``prefix_blocks``).
- ``least-loaded``: the replica with the fewest requests in flight (queued or running) at arrival.
- ``cache-aware``: SGLang's router (``sgl-router/src/policies/cache_aware.rs``): per replica an approximate
  tree of what it was sent; imbalanced when ``max - min > balance_abs_threshold`` and
  ``max > balance_rel_threshold * min`` (loads = requests in flight) -> the least loaded; otherwise the
  replica with the longest prefix match when ``match / length > cache_threshold`` (strictly, as the code
  compares), else the replica with the smallest tree. Trees are pruned (LRU, leaves first) to
  ``max_tree_tokens`` every ``eviction_interval_s`` seconds of trace time.

Load model (least-loaded, cache-aware): each replica serves ``concurrency`` requests at once, first come
first served; a request holds a slot for ``output_tokens x decode_s_per_token`` (prefill time is not
modelled). Arrivals are the trace's timestamps; without them every request arrives at time 0, so loads only
grow and least-loaded degenerates to round-robin.

Offload tier (``cpu_offload_blocks``): below each replica's GPU pool, an LRU of block keys filled by the keys
the GPU pool evicts; on admission the GPU prefix is looked up first, then the lookup continues in the CPU
tier from the first GPU miss (a CPU hit is read back: the GPU pool then holds those blocks exactly as if
they had been recomputed, so GPU hits are unchanged by the tier). With requests in flight the GPU pool is
vLLM's ref-counted pool and the tier watches it the same way.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import os
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import count, repeat
from typing import Any

from ...errors import InputError, UsageError
from .pools import CapacityError, VllmBlockPool
from .replay import MAX_BLOCK_SIZE, MAX_CAPACITY_BLOCKS, SCHEMA_VERSION, TenantStats, simulate
from .trace import TraceRequest, request_keys

ROUTERS = ("round-robin", "random", "session", "prefix-hash", "least-loaded", "cache-aware")
#: routers whose choice depends on the request alone: a trace can be routed once, up front, and partitioned
STATELESS_ROUTERS = ("round-robin", "random", "session", "prefix-hash")
SESSION_FIELDS = ("conversation", "session_id", "chat_id")
RING_VNODES = 160


@dataclass(frozen=True)
class CacheAwareParams:
    """SGLang router's ``CacheAwareConfig::default()`` (``sgl-router/src/policies/mod.rs``). Its Python
    launcher (``sglang_router/router_args.py``, as shipped in sglang-router 0.3.2 on PyPI, read 2026-12-01)
    starts with 0.3 / 64 / 1.5 / 60 s / 2**26 (characters) instead."""

    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.1
    eviction_interval_s: float = 30.0
    max_tree_tokens: int = 10000       # SGLang counts characters of text; here tokens of full blocks


@dataclass(frozen=True)
class ReplicaStats:
    replica: int
    requests: int
    query_tokens: int
    hit_tokens: int
    hit_rate: float | None
    gpu_hit_tokens: int
    cpu_hit_tokens: int
    evicted_blocks: int
    offloaded_blocks: int = 0
    cpu_evicted_blocks: int = 0


@dataclass(frozen=True)
class RouterResult:
    router: str
    requests: int
    query_tokens: int
    hit_tokens: int
    hit_rate: float | None
    gpu_hit_tokens: int
    cpu_hit_tokens: int
    request_imbalance: float | None        # max / mean requests per replica
    token_imbalance: float | None          # max / mean prompt tokens per replica
    replicas: tuple[ReplicaStats, ...]
    decisions: dict = field(default_factory=dict)   # cache-aware: how each request was placed
    hit_square_sum: float = 0.0                     # sum over requests of (hit tokens)^2: the attention saved
    query_square_sum: float = 0.0                   # sum over requests of (prompt tokens)^2: all the attention
    output_tokens: int = 0                          # of the counted requests (decode, for what hits are worth)
    cpu_read_bytes: float | None = None
    cpu_write_bytes: float | None = None
    cpu_read_s: float | None = None
    cpu_write_s: float | None = None
    #: per tenant (--tenant-field, else the salt), over all replicas; empty when no request names one
    per_tenant: tuple[TenantStats, ...] = ()
    cross_tenant_shared_blocks: int = 0


@dataclass(frozen=True, kw_only=True)
class FleetReport:
    schema_version: int = SCHEMA_VERSION
    mode: str = "fleet"
    replicas: int
    policy: str
    block_size: int
    capacity_blocks: int | None
    cpu_offload_blocks: int | None
    concurrency: int
    warmup_requests: int
    router_params: dict
    results: tuple[RouterResult, ...]
    notes: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------------------ routing


def _digest(value: Any) -> int:
    """A hash stable across processes and runs (Python's str hash is salted per process)."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode("utf-8"), digest_size=8).digest(), "big")


class HashRing:
    """Consistent hashing: ``RING_VNODES`` points per replica on a 64-bit ring; a value goes to the first point
    clockwise of its hash."""

    def __init__(self, replicas: int, vnodes: int = RING_VNODES):
        points = sorted((_digest(("replica", r, v)), r) for r in range(replicas) for v in range(vnodes))
        self.positions = [p for p, _ in points]
        self.owners = [r for _, r in points]

    def __call__(self, value: Any) -> int:
        i = bisect.bisect_right(self.positions, _digest(value))
        return self.owners[i % len(self.owners)]


class _Loads:
    """Requests in flight per replica: ``concurrency`` slots each, first come first served."""

    def __init__(self, replicas: int, concurrency: int):
        self.ends: list[list[float]] = [[] for _ in range(replicas)]    # end times of queued + running
        self.slots: list[list[float]] = [[0.0] * concurrency for _ in range(replicas)]

    def at(self, t: float) -> list[int]:
        for ends in self.ends:
            while ends and ends[0] <= t:
                heapq.heappop(ends)
        return [len(e) for e in self.ends]

    def add(self, r: int, t: float, service_s: float) -> None:
        start = max(t, heapq.heappop(self.slots[r]))
        end = start + service_s
        heapq.heappush(self.slots[r], end)
        heapq.heappush(self.ends[r], end)


def _prefix_value(req: TraceRequest, blocks: int, block_size: int) -> Any:
    if req.hash_ids is not None:
        full = req.prompt_tokens // req.hash_block_size
        return (req.salt, tuple(req.hash_ids[:max(1, min(blocks, full))]))
    tokens = req.tokens or ()
    take = min(blocks, len(tokens) // block_size) * block_size or len(tokens)
    return (req.salt, tuple(tokens[:take]))


def stateless_router(router: str, *, replicas: int, block_size: int = 16, seed: int = 0, prefix_blocks: int = 4,
                     source: str = "", session_fields: Sequence[str] = SESSION_FIELDS) -> Callable[[TraceRequest], int]:
    """A router that decides from the request alone (and its place in the trace): round-robin, random,
    session, prefix-hash. Called once per request in trace order, it streams: a trace can be routed (and
    partitioned) without holding it."""
    if router not in STATELESS_ROUTERS:
        raise UsageError(f"the {router} router decides from what it routed before (loads, trees): it routes "
                         f"in one process; up front, routers {', '.join(STATELESS_ROUTERS)} only")
    if replicas < 1:
        raise UsageError("replicas must be at least 1")
    if router == "round-robin":
        counter = count()
        return lambda req: next(counter) % replicas
    if router == "random":
        rng = random.Random(seed)
        return lambda req: rng.randrange(replicas)
    ring = HashRing(replicas)
    if router == "prefix-hash":
        return lambda req: ring(("prefix", _prefix_value(req, prefix_blocks, block_size)))

    def by_session(req: TraceRequest) -> int:
        if req.session is None:
            if len(session_fields) == 1:
                raise InputError("missing: the session router needs it on every request", source=source,
                                 line=req.line, field=session_fields[0])
            raise InputError("no session to route by: expected one of the fields "
                             f"{', '.join(session_fields)} (or name one with --session-field)",
                             source=source, line=req.line)
        return ring(("session", req.session))
    return by_session


def route(requests: Sequence[TraceRequest], *, replicas: int, router: str, block_size: int = 16,
          hash_fn: str = "builtin", concurrency: int = 1, decode_s_per_token: float = 0.02, seed: int = 0,
          prefix_blocks: int = 4, params: CacheAwareParams = CacheAwareParams(),
          source: str = "", session_fields: Sequence[str] = SESSION_FIELDS,
          keys: Sequence[Sequence] | None = None) -> tuple[list[int], dict]:
    """The replica of each request, and counts of how the router decided (cache-aware). ``keys``: each
    request's block keys, when they are already computed (at ``block_size``)."""
    if router not in ROUTERS:
        raise UsageError(f"unknown router {router!r}; choose one of {', '.join(ROUTERS)} (or all)")
    if replicas < 1:
        raise UsageError("replicas must be at least 1")
    if router in STATELESS_ROUTERS:
        pick = stateless_router(router, replicas=replicas, block_size=block_size, seed=seed,
                                prefix_blocks=prefix_blocks, source=source, session_fields=session_fields)
        return list(map(pick, requests)), {}

    loads = _Loads(replicas, concurrency)
    clock = 0.0
    out = []
    decisions = {"load_balance": 0, "prefix_match": 0, "smallest_tree": 0} if router == "cache-aware" else {}
    trees: list[OrderedDict] = [OrderedDict() for _ in range(replicas)]
    max_keys = max(0, params.max_tree_tokens // block_size)
    next_evict = params.eviction_interval_s
    for i, req in enumerate(requests):
        t = req.timestamp if req.timestamp is not None else clock
        clock = max(clock, t)
        load = loads.at(clock)
        if router == "least-loaded":
            r = load.index(min(load))
        else:
            if params.eviction_interval_s > 0:
                if clock >= next_evict:   # prunings due since the last request: one does what they all would
                    for tree in trees:
                        while len(tree) > max_keys:
                            tree.popitem(last=False)
                    missed = (clock - next_evict) // params.eviction_interval_s
                    next_evict += (missed + 1) * params.eviction_interval_s
                    if next_evict <= clock:   # float rounding at large times
                        next_evict = clock + params.eviction_interval_s
            bs = req.hash_block_size if req.hash_ids is not None else block_size
            req_keys = keys[i] if keys is not None and bs == block_size else request_keys(req, bs, hash_fn)
            hi, lo = max(load), min(load)
            if hi - lo > params.balance_abs_threshold and hi > lo * params.balance_rel_threshold:
                r = load.index(lo)
                decisions["load_balance"] += 1
            else:
                matched = []
                for tree in trees:
                    m = 0
                    for k in req_keys:
                        if k not in tree:
                            break
                        m += 1
                    matched.append(m)
                best = max(matched)
                ratio = best * bs / req.prompt_tokens if req.prompt_tokens else 0.0
                if ratio > params.cache_threshold:
                    r = matched.index(best)
                    decisions["prefix_match"] += 1
                else:
                    sizes = [len(tree) for tree in trees]
                    r = sizes.index(min(sizes))
                    decisions["smallest_tree"] += 1
            tree = trees[r]
            for k in reversed(req_keys):  # the deepest first, so that LRU pruning takes leaves first
                tree[k] = None
                tree.move_to_end(k)
        loads.add(r, clock, req.output_tokens * decode_s_per_token)
        out.append(r)
    return out, decisions


# ------------------------------------------------------------------------------------------------ replay


def _tally() -> dict:
    """What one replica's replay counts (plain values, so that it crosses process and Ray boundaries)."""
    return dict(requests=0, query_tokens=0, gpu_hit_tokens=0, cpu_hit_tokens=0, evicted_blocks=0,
                offloaded_blocks=0, cpu_evicted_blocks=0, hit_square_sum=0, cross_tenant_hits=0, tenants={},
                query_square_sum=0, output_tokens=0)


def _count(t: dict, req: TraceRequest, gpu_hit: float, cpu_hit: int) -> None:
    t["requests"] += 1
    t["query_tokens"] += req.prompt_tokens
    t["gpu_hit_tokens"] += gpu_hit
    t["cpu_hit_tokens"] += cpu_hit
    t["hit_square_sum"] += (gpu_hit + cpu_hit) ** 2
    t["query_square_sum"] += req.prompt_tokens ** 2
    t["output_tokens"] += req.output_tokens
    per = t["tenants"].get(req.tenant)
    if per is None:
        t["tenants"][req.tenant] = per = [0, 0, 0]
    per[0] += 1
    per[1] += req.prompt_tokens
    per[2] += gpu_hit + cpu_hit


def _too_small(req: TraceRequest, kw: dict) -> CapacityError:
    bs = kw["block_size"]
    need = -(-req.prompt_tokens // bs)
    return CapacityError(f"{kw['source']}:{req.line}: a request of {req.prompt_tokens} tokens needs {need} blocks "
                         f"of {bs} but the capacity is {kw['capacity_blocks']}")


def _replay_vllm(items: Iterable[tuple[int, TraceRequest, Sequence]], kw: dict) -> dict:
    """One replica under the vllm policy, from ``(position in the trace, request, its block keys)``: the exact
    pool of :func:`cachectl.engines.prefix.simulate` (its sequential pool with requests one at a time, its
    ref-counted pool and the same arrival/finish loop with ``concurrency`` > 1), plus the CPU tier when
    ``cpu_blocks`` is set: an LRU of the keys the GPU pool evicts, looked up from the first GPU miss. The
    tier only watches the GPU pool (a block read back is held as if computed), so it works the same way
    with requests in flight."""
    from .lru import LruKeyPool

    bs, capacity, concurrency = kw["block_size"], kw["capacity_blocks"], kw["concurrency"]
    cpu_blocks, warmup, decode = kw.get("cpu_blocks") or 0, kw["warmup"], kw["decode_s_per_token"]
    pool: Any = LruKeyPool(capacity, bs) if concurrency == 1 else VllmBlockPool(capacity, bs)
    victims: list | None = [] if cpu_blocks else None
    pool.victims = victims
    cpu: OrderedDict = OrderedDict()
    t = _tally()
    running: list = []      # (end time, sequence, blocks) of the requests in flight
    clock = 0.0
    seq = 0
    for pos, req, keys in items:
        n = req.prompt_tokens
        if req.hash_ids is not None and req.hash_block_size != bs:
            raise UsageError(f"{kw['source']}: hash_ids cover {req.hash_block_size}-token blocks; run with "
                             f"--block-size {req.hash_block_size} (they cannot be split)")
        if victims:
            victims.clear()
        if concurrency == 1:
            try:
                gpu_hit = pool.run(keys, n, req.tenant)
            except CapacityError:
                raise _too_small(req, kw) from None
        else:       # as simulate(): finish what ended by the arrival, wait for a slot and for free blocks
            clock = max(clock, req.timestamp if req.timestamp is not None else clock)
            while running and running[0][0] <= clock:
                pool.free(heapq.heappop(running)[2])
            while True:
                hits = pool.lookup(keys, n)
                if pool.can_admit(hits, n) and len(running) < concurrency:
                    break
                if not running:
                    raise _too_small(req, kw)
                end, _, blocks = heapq.heappop(running)
                clock = max(clock, end)
                pool.free(blocks)
            seq += 1
            heapq.heappush(running, (clock + req.output_tokens * decode, seq, pool.admit(keys, n, hits, req.tenant)))
            gpu_hit = len(hits) * bs
        cpu_hit = 0
        if cpu_blocks:
            limit = min(len(keys), (n - 1) // bs)
            for k in keys[gpu_hit // bs:limit]:     # the lookup continues below the GPU, from its first miss
                if k not in cpu:
                    break
                cpu.move_to_end(k)
                cpu_hit += bs
            for k in victims or ():                 # what the GPU evicted goes to the CPU tier (newest)
                cpu[k] = None
                cpu.move_to_end(k)
            over = max(0, len(cpu) - cpu_blocks)
            for _ in repeat(None, over):
                cpu.popitem(last=False)
            if pos >= warmup:
                t["offloaded_blocks"] += len(victims or ())
                t["cpu_evicted_blocks"] += over
        if pos >= warmup:
            _count(t, req, gpu_hit, cpu_hit)
    t["evicted_blocks"] = pool.evicted
    t["cross_tenant_hits"] = pool.cross_tenant_hits
    return t


def _replay_other(requests: Sequence[TraceRequest], kw: dict) -> dict:
    """One replica under the radix, chunk or infinite policy, through :func:`~cachectl.engines.prefix.simulate`
    (``warmup`` here: how many of these requests are warm-up)."""
    t = _tally()
    if not requests or kw["warmup"] >= len(requests):
        return t
    r = simulate(requests, policy=kw["policy"], block_size=kw["block_size"], capacity_blocks=kw["capacity_blocks"],
                 hash_fn=kw["hash_fn"], concurrency=kw["concurrency"], decode_s_per_token=kw["decode_s_per_token"],
                 source=kw["source"], warmup=kw["warmup"], per_request=True)
    t.update(requests=r.requests, query_tokens=r.query_tokens, gpu_hit_tokens=r.hit_tokens,
             evicted_blocks=r.evicted_blocks, cross_tenant_hits=r.cross_tenant_shared_blocks,
             hit_square_sum=sum([q.hit_tokens ** 2 for q in r.per_request or ()]),
             query_square_sum=r.query_square_sum, output_tokens=r.output_tokens,
             tenants={s.tenant: [s.requests, s.query_tokens, s.hit_tokens] for s in r.per_tenant})
    return t


#: what forked workers inherit: the trace, its keys (vllm) and the tasks; only an index or a router name goes to
#: a worker, and a few counters come back
_SHARED: dict = {}


def _replay_task(i: int) -> dict:
    requests, keys, kw = _SHARED["requests"], _SHARED["keys"], _SHARED["kw"]
    positions = _SHARED["tasks"][i]
    if keys is not None:
        return _replay_vllm(((p, requests[p], keys[p]) for p in positions), kw)
    share = [requests[p] for p in positions]
    return _replay_other(share, {**kw, "warmup": sum(1 for p in positions if p < kw["warmup"])})


def _route_and_replay(router: str) -> tuple[dict, list[dict]]:
    requests, keys, kw = _SHARED["requests"], _SHARED["keys"], _SHARED["kw"]
    assign, decisions = route(requests, router=router, keys=keys, **_SHARED["route_kw"])
    shares: list[list[int]] = [[] for _ in range(_SHARED["route_kw"]["replicas"])]
    for i, r in enumerate(assign):
        shares[r].append(i)
    if keys is not None:
        return decisions, [_replay_vllm(((p, requests[p], keys[p]) for p in share), kw) for share in shares]
    return decisions, [_replay_other([requests[p] for p in share],
                                     {**kw, "warmup": sum(1 for p in share if p < kw["warmup"])}) for share in shares]


def _in_processes(fn: Callable, items: list, jobs: int) -> list:
    """``fn`` over ``items`` in ``jobs`` forked processes, which inherit :data:`_SHARED` (nothing big is
    pickled); the collector is frozen first, so that the children do not touch (and so copy) the parent's
    pages."""
    import gc
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    gc.freeze()
    try:
        with ProcessPoolExecutor(max_workers=min(jobs, len(items)),
                                 mp_context=multiprocessing.get_context("fork")) as ex:
            return list(ex.map(fn, items))
    finally:
        gc.unfreeze()


def replay_partition(path: str, kw: dict) -> dict:
    """One replica's partition file (see :mod:`cachectl.inputs.parquet`), read and replayed wherever this
    runs: in this process, a worker process, or a Ray worker (the file must be readable there)."""
    from ...inputs.parquet import partition_rows

    hbs = kw["hash_block_size"]
    requests = (TraceRequest(**row, hash_block_size=hbs) for row in partition_rows(path))
    if kw["policy"] == "vllm":
        bs, hf = kw["block_size"], kw["hash_fn"]
        return _replay_vllm(((r.index, r, request_keys(r, bs, hf)) for r in requests), kw)
    share = list(requests)
    return _replay_other(share, {**kw, "warmup": sum(1 for r in share if r.index < kw["warmup"])})


def _imbalance(values: list[int]) -> float | None:
    mean = sum(values) / len(values)
    return max(values) / mean if mean else None


def _check(*, policy: str, block_size: int, capacity_blocks: int | None, concurrency: int,
           cpu_offload_blocks: int | None, prefix_blocks: int = 1) -> None:
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise UsageError(f"--block-size must be between 1 and {MAX_BLOCK_SIZE:,}")
    if capacity_blocks is not None and not 1 <= capacity_blocks <= MAX_CAPACITY_BLOCKS:
        raise UsageError(f"a capacity must be between 1 and {MAX_CAPACITY_BLOCKS:,} blocks, got "
                         f"{str(capacity_blocks)[:30]}")
    if policy == "vllm" and capacity_blocks is None:
        raise UsageError("the vllm policy needs --capacity-blocks N (or --capacity-gib X --model M); "
                         "--policy infinite gives the no-eviction ceiling")
    if concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    if cpu_offload_blocks is not None:
        if cpu_offload_blocks < 1:
            raise UsageError("the CPU offload tier needs at least one block")
        if policy != "vllm":
            raise UsageError("the CPU offload tier sits below vLLM's block pool: use --policy vllm")
    if prefix_blocks < 1:
        raise UsageError("prefix-hash needs at least one block (--prefix-blocks)")


def _result(router: str, decisions: dict, per: Sequence[dict], *, block_size: int, cpu_offload_blocks: int | None,
            bytes_per_token: float | None, link_gbps: float | None) -> RouterResult:
    stats = []
    for r, o in enumerate(per):
        hit = o["gpu_hit_tokens"] + o["cpu_hit_tokens"]
        stats.append(ReplicaStats(replica=r, requests=o["requests"], query_tokens=o["query_tokens"],
                                  hit_tokens=hit, hit_rate=hit / o["query_tokens"] if o["query_tokens"] else None,
                                  gpu_hit_tokens=o["gpu_hit_tokens"], cpu_hit_tokens=o["cpu_hit_tokens"],
                                  evicted_blocks=o["evicted_blocks"], offloaded_blocks=o["offloaded_blocks"],
                                  cpu_evicted_blocks=o["cpu_evicted_blocks"]))
    q = sum(s.query_tokens for s in stats)
    hit = sum(s.hit_tokens for s in stats)
    cpu_hit = sum(s.cpu_hit_tokens for s in stats)
    moved: dict = {}
    if cpu_offload_blocks is not None and bytes_per_token is not None:
        read_b = cpu_hit * bytes_per_token
        write_b = sum(s.offloaded_blocks for s in stats) * block_size * bytes_per_token
        moved = dict(cpu_read_bytes=read_b, cpu_write_bytes=write_b)
        if link_gbps:
            moved.update(cpu_read_s=read_b / (link_gbps * 1e9), cpu_write_s=write_b / (link_gbps * 1e9))
    tenants: dict = {}
    for o in per:                      # in order of first appearance, replica by replica
        for tenant, (n, qt, ht) in o["tenants"].items():
            acc = tenants.setdefault(tenant, [0, 0, 0])
            acc[0] += n
            acc[1] += qt
            acc[2] += ht
    per_tenant = () if set(tenants) <= {None} else tuple(
        TenantStats(tenant=k, requests=n, query_tokens=qt, hit_tokens=ht, hit_rate=ht / qt if qt else None)
        for k, (n, qt, ht) in sorted(tenants.items(), key=lambda kv: (kv[0] is None, str(kv[0]))))
    return RouterResult(router=router, requests=sum(s.requests for s in stats), query_tokens=q, hit_tokens=hit,
                        hit_rate=hit / q if q else None, gpu_hit_tokens=hit - cpu_hit, cpu_hit_tokens=cpu_hit,
                        request_imbalance=_imbalance([s.requests for s in stats]),
                        token_imbalance=_imbalance([s.query_tokens for s in stats]), replicas=tuple(stats),
                        decisions=decisions, hit_square_sum=sum(o["hit_square_sum"] for o in per),
                        query_square_sum=sum(o.get("query_square_sum", 0) for o in per),
                        output_tokens=sum(o.get("output_tokens", 0) for o in per),
                        per_tenant=per_tenant, cross_tenant_shared_blocks=sum(o["cross_tenant_hits"] for o in per),
                        **moved)


def _router_params(seed: int, prefix_blocks: int, params: CacheAwareParams) -> dict:
    return {"seed": seed, "prefix_blocks": prefix_blocks, "ring_vnodes": RING_VNODES,
            "cache_aware": {**params.__dict__, "source": "sgl-router/src/policies/mod.rs CacheAwareConfig::default()"}}


def simulate_fleet(requests: Sequence[TraceRequest], *, replicas: int, routers: Sequence[str],
                   policy: str = "vllm", block_size: int = 16, capacity_blocks: int | None = None,
                   hash_fn: str = "builtin", concurrency: int = 1, decode_s_per_token: float = 0.02,
                   seed: int = 0, prefix_blocks: int = 4, params: CacheAwareParams = CacheAwareParams(),
                   cpu_offload_blocks: int | None = None, bytes_per_token: float | None = None,
                   link_gbps: float | None = None, warmup: int = 0, jobs: int = 1,
                   source: str = "", notes: Sequence[str] = (),
                   session_fields: Sequence[str] = SESSION_FIELDS) -> FleetReport:
    """Route ``requests`` with each router and replay every replica's share; the first ``warmup`` requests of
    the trace fill the caches but are not counted.

    Under the vllm policy every request is keyed once (the keys serve every router and replica); ``jobs`` > 1
    replays the (router, replica) shares in forked processes that inherit the trace and its keys, so only an
    index goes to a worker and a few counters come back.
    """
    _check(policy=policy, block_size=block_size, capacity_blocks=capacity_blocks, concurrency=concurrency,
           cpu_offload_blocks=cpu_offload_blocks, prefix_blocks=prefix_blocks)
    if not requests:
        raise InputError("the trace has no requests", source=source)
    if warmup >= len(requests):
        raise UsageError(f"`warmup` covers all {len(requests)} requests: nothing is left to count")
    for req in requests:
        if req.hash_ids is not None and req.hash_block_size != block_size:
            raise UsageError(f"{source}: hash_ids cover {req.hash_block_size}-token blocks; run with "
                             f"--block-size {req.hash_block_size} (they cannot be split)")
    kw = dict(policy=policy, block_size=block_size, capacity_blocks=capacity_blocks, hash_fn=hash_fn,
              concurrency=concurrency, decode_s_per_token=decode_s_per_token, source=source,
              cpu_blocks=cpu_offload_blocks, warmup=warmup)
    route_kw: dict[str, Any] = dict(replicas=replicas, block_size=block_size, hash_fn=hash_fn,
                                    concurrency=concurrency, decode_s_per_token=decode_s_per_token, seed=seed,
                                    prefix_blocks=prefix_blocks, params=params, source=source,
                                    session_fields=session_fields)
    keys = [request_keys(r, block_size, hash_fn) for r in requests] if policy == "vllm" else None
    _SHARED.update(requests=requests, keys=keys, kw=kw, route_kw=route_kw)
    try:
        if jobs > 1 and len(routers) >= jobs:     # a task per router: its routing and its replicas' replays
            planned = _in_processes(_route_and_replay, list(routers), jobs)
        else:                                     # routing here, a task per (router, replica)
            plans = [route(requests, router=router, keys=keys, **route_kw) for router in routers]
            tasks = []
            for assign, _ in plans:
                shares: list[list[int]] = [[] for _ in range(replicas)]
                for i, r in enumerate(assign):
                    shares[r].append(i)
                tasks.extend(shares)
            _SHARED["tasks"] = tasks
            outs = (_in_processes(_replay_task, list(range(len(tasks))), jobs) if jobs > 1 and len(tasks) > 1
                    else list(map(_replay_task, range(len(tasks)))))
            planned = [(d, outs[k * replicas:(k + 1) * replicas]) for k, (_, d) in enumerate(plans)]
    finally:
        _SHARED.clear()
    results = [_result(router, decisions, per, block_size=block_size, cpu_offload_blocks=cpu_offload_blocks,
                       bytes_per_token=bytes_per_token, link_gbps=link_gbps)
               for router, (decisions, per) in zip(routers, planned)]
    notes = list(notes)
    if any(r in ("least-loaded", "cache-aware") for r in routers) and all(q.timestamp is None for q in requests):
        notes.append("the trace has no timestamps: every request arrives at time 0, so loads only grow "
                     "(least-loaded is then round-robin) and cache-aware trees are never pruned")
    if warmup:
        notes.append(f"the first {warmup} requests warmed the caches and are not counted")
    return FleetReport(replicas=replicas, policy=policy, block_size=block_size, capacity_blocks=capacity_blocks,
                       cpu_offload_blocks=cpu_offload_blocks, concurrency=concurrency, warmup_requests=warmup,
                       router_params=_router_params(seed, prefix_blocks, params), results=tuple(results),
                       notes=tuple(notes))


def simulate_partitions(paths: Sequence[str], manifest: dict, *, policy: str = "vllm", block_size: int = 16,
                        capacity_blocks: int | None = None, hash_fn: str = "builtin", concurrency: int = 1,
                        decode_s_per_token: float = 0.02, cpu_offload_blocks: int | None = None,
                        bytes_per_token: float | None = None, link_gbps: float | None = None, warmup: int = 0,
                        jobs: int = 1, ray: bool = False, ray_address: str | None = None,
                        source: str = "") -> FleetReport:
    """Replay a routed trace's partitions, one per replica (``manifest``: what
    :class:`cachectl.inputs.parquet.PartitionWriter` wrote): in this process, in ``jobs`` worker processes
    that each read their own partition, or on a Ray cluster, one Ray task per partition. Each replica's
    replay is the one :func:`simulate_fleet` runs, so the numbers are the same as routing the trace in one
    process."""
    router = manifest["router"]
    if router not in STATELESS_ROUTERS:  # (a manifest partition never wrote: no router of it routes up front)
        raise InputError(f"expected one of {', '.join(STATELESS_ROUTERS)}, got {router[:40]!r}",
                         source=os.path.join(source, "manifest.json") if source else "manifest.json", field="router")
    _check(policy=policy, block_size=block_size, capacity_blocks=capacity_blocks, concurrency=concurrency,
           cpu_offload_blocks=cpu_offload_blocks)
    total = manifest["requests"]
    if warmup >= total:
        raise UsageError(f"`warmup` covers all {total} requests: nothing is left to count")
    kw = dict(policy=policy, block_size=block_size, capacity_blocks=capacity_blocks, hash_fn=hash_fn,
              concurrency=concurrency, decode_s_per_token=decode_s_per_token, source=source,
              cpu_blocks=cpu_offload_blocks, warmup=warmup, hash_block_size=manifest["hash_block_size"])
    if ray:
        outs = _on_ray(paths, kw, ray_address, jobs)
    elif jobs > 1 and len(paths) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # forked: the parent holds nothing big (each worker reads its own partition) and runs no threads
        with ProcessPoolExecutor(max_workers=min(jobs, len(paths)),
                                 mp_context=multiprocessing.get_context("fork")) as ex:
            outs = list(ex.map(replay_partition, paths, repeat(kw)))
    else:
        outs = [replay_partition(p, kw) for p in paths]
    result = _result(router, {}, outs, block_size=block_size, cpu_offload_blocks=cpu_offload_blocks,
                     bytes_per_token=bytes_per_token, link_gbps=link_gbps)
    notes = [f"replayed {len(paths)} partitions routed by {router} up front"
             + (" as Ray tasks" if ray else f" in {min(jobs, len(paths))} processes" if jobs > 1 else "")]
    routed_bs = manifest.get("block_size")
    if routed_bs is not None and routed_bs != block_size:
        if router == "prefix-hash":
            notes.append(f"prefix-hash routed by the first {manifest['router_params'].get('prefix_blocks')} "
                         f"blocks of {routed_bs} tokens (the partitions' block size), replayed at block size "
                         f"{block_size}: not what routing the trace in one process at block size {block_size} "
                         f"gives (write the partitions again with --block-size {block_size} for that)")
        else:
            notes.append(f"the partitions were written at block size {routed_bs}; {router} routing does not "
                         f"depend on it, so this replay at block size {block_size} is routing the trace in one "
                         "process at that block size")
    if warmup:
        notes.append(f"the first {warmup} requests warmed the caches and are not counted")
    return FleetReport(replicas=len(paths), policy=policy, block_size=block_size, capacity_blocks=capacity_blocks,
                       cpu_offload_blocks=cpu_offload_blocks, concurrency=concurrency, warmup_requests=warmup,
                       router_params=manifest["router_params"], results=(result,), notes=tuple(notes))


def _on_ray(paths: Sequence[str], kw: dict, address: str | None, jobs: int) -> list[dict]:
    """One Ray task per partition (``ray.remote`` / ``ray.get``); Ray schedules them. Without an address (and
    without ``RAY_ADDRESS``) a local Ray instance is started for the run, with ``jobs`` CPUs when ``jobs`` > 1,
    else all of them."""
    import os

    from ...raycluster import ray_cluster, task_error

    with ray_cluster(address, jobs=jobs) as ray:
        task = ray.remote(replay_partition)
        refs = [task.remote(os.path.abspath(p), kw) for p in paths]
        try:
            return list(ray.get(refs))
        except ray.exceptions.RayTaskError as exc:
            raise task_error(ray, exc) from None
