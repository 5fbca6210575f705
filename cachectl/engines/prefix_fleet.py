"""A fleet of prefix-cache replicas behind a router, with an optional CPU offload tier per replica.

Every router here decides from what a router sees (the request, its arrival, the requests it sent where),
never from the replicas' true cache contents, so a trace is routed once, up front, and each replica then
replays its share through the exact single-instance engine (:func:`cachectl.engines.prefix.simulate`).
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
they had been recomputed, so GPU hits are unchanged by the tier). Requests one at a time only.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from ..errors import InputError, UsageError
from .prefix import SCHEMA_VERSION, CapacityError, TraceRequest, request_keys, simulate

ROUTERS = ("round-robin", "random", "session", "prefix-hash", "least-loaded", "cache-aware")
SESSION_FIELDS = ("conversation", "session_id", "chat_id")
RING_VNODES = 160


@dataclass(frozen=True)
class CacheAwareParams:
    """SGLang router's ``CacheAwareConfig::default()`` (``sgl-router/src/policies/mod.rs``). Its Python
    launcher (``sglang_router/router_args.py``) starts with 0.3 / 64 / 1.5 / 120 s / 2**26 instead."""

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
    cpu_read_bytes: float | None = None
    cpu_write_bytes: float | None = None
    cpu_read_s: float | None = None
    cpu_write_s: float | None = None


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


def route(requests: Sequence[TraceRequest], *, replicas: int, router: str, block_size: int = 16,
          hash_fn: str = "builtin", concurrency: int = 1, decode_s_per_token: float = 0.02, seed: int = 0,
          prefix_blocks: int = 4, params: CacheAwareParams = CacheAwareParams(),
          source: str = "", session_fields: Sequence[str] = SESSION_FIELDS) -> tuple[list[int], dict]:
    """The replica of each request, and counts of how the router decided (cache-aware)."""
    if router not in ROUTERS:
        raise UsageError(f"unknown router {router!r}; choose one of {', '.join(ROUTERS)} (or all)")
    if replicas < 1:
        raise UsageError("replicas must be at least 1")
    n = len(requests)
    if router == "round-robin":
        return [i % replicas for i in range(n)], {}
    if router == "random":
        rng = random.Random(seed)
        return [rng.randrange(replicas) for _ in range(n)], {}
    if router == "session":
        ring = HashRing(replicas)
        out = []
        for req in requests:
            if req.session is None:
                if len(session_fields) == 1:
                    raise InputError("missing: the session router needs it on every request", source=source,
                                     line=req.line, field=session_fields[0])
                raise InputError("no session to route by: expected one of the fields "
                                 f"{', '.join(session_fields)} (or name one with --session-field)",
                                 source=source, line=req.line)
            out.append(ring(("session", req.session)))
        return out, {}
    if router == "prefix-hash":
        ring = HashRing(replicas)
        return [ring(("prefix", _prefix_value(req, prefix_blocks, block_size))) for req in requests], {}

    loads = _Loads(replicas, concurrency)
    clock = 0.0
    out = []
    decisions = {"load_balance": 0, "prefix_match": 0, "smallest_tree": 0} if router == "cache-aware" else {}
    trees: list[OrderedDict] = [OrderedDict() for _ in range(replicas)]
    max_keys = max(0, params.max_tree_tokens // block_size)
    next_evict = params.eviction_interval_s
    for req in requests:
        t = req.timestamp if req.timestamp is not None else clock
        clock = max(clock, t)
        load = loads.at(clock)
        if router == "least-loaded":
            r = load.index(min(load))
        else:
            if params.eviction_interval_s > 0:
                while clock >= next_evict:
                    for tree in trees:
                        while len(tree) > max_keys:
                            tree.popitem(last=False)
                    next_evict += params.eviction_interval_s
            bs = req.hash_block_size if req.hash_ids is not None else block_size
            keys = request_keys(req, bs, hash_fn)
            hi, lo = max(load), min(load)
            if hi - lo > params.balance_abs_threshold and hi > lo * params.balance_rel_threshold:
                r = load.index(lo)
                decisions["load_balance"] += 1
            else:
                matched = []
                for tree in trees:
                    m = 0
                    for k in keys:
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
            for k in reversed(keys):      # the deepest first, so that LRU pruning takes leaves first
                tree[k] = None
                tree.move_to_end(k)
        loads.add(r, clock, req.output_tokens * decode_s_per_token)
        out.append(r)
    return out, decisions


# ------------------------------------------------------------------------------------------------ replay


def _replay_offload(requests: Sequence[TraceRequest], *, block_size: int, capacity_blocks: int, hash_fn: str,
                    cpu_blocks: int, warmup: int, source: str) -> dict:
    """One replica, requests one at a time: the exact GPU pool plus an LRU CPU tier fed by its evictions."""
    from .prefix_lru import LruKeyPool

    pool = LruKeyPool(capacity_blocks, block_size)
    victims: list = []
    pool.victims = victims
    cpu: OrderedDict = OrderedDict()
    tally = dict(requests=0, query_tokens=0, gpu_hit_tokens=0, cpu_hit_tokens=0, offloaded_blocks=0,
                 cpu_evicted_blocks=0, hit_square_sum=0)
    for i, req in enumerate(requests):
        bs = block_size
        keys = request_keys(req, bs, hash_fn)
        del victims[:]
        try:
            gpu_hit = pool.run(keys, req.prompt_tokens, req.tenant)
        except CapacityError:
            need = -(-req.prompt_tokens // bs)
            raise CapacityError(f"{source}:{req.line}: a request of {req.prompt_tokens} tokens needs {need} blocks "
                                f"of {bs} but the capacity is {capacity_blocks}") from None
        nh = gpu_hit // bs
        limit = min(len(keys), (req.prompt_tokens - 1) // bs)
        nc = 0
        for k in keys[nh:limit]:          # the lookup continues below the GPU, from its first miss
            if k not in cpu:
                break
            cpu.move_to_end(k)
            nc += 1
        for k in victims:                 # what the GPU evicted goes to the CPU tier (newest)
            cpu[k] = None
            cpu.move_to_end(k)
        over = len(cpu) - cpu_blocks
        for _ in repeat(None, max(0, over)):
            cpu.popitem(last=False)
        if i < warmup:
            continue
        tally["requests"] += 1
        tally["query_tokens"] += req.prompt_tokens
        tally["gpu_hit_tokens"] += gpu_hit
        tally["cpu_hit_tokens"] += nc * bs
        tally["hit_square_sum"] += (gpu_hit + nc * bs) ** 2
        tally["offloaded_blocks"] += len(victims)
        tally["cpu_evicted_blocks"] += max(0, over)
    tally["evicted_blocks"] = pool.evicted
    return tally


def _replay(job: tuple) -> dict:
    """One replica's share (a top-level function, so that it can run in another process)."""
    requests, kw = job
    if not requests or kw["warmup"] >= len(requests):
        return dict(requests=0, query_tokens=0, gpu_hit_tokens=0, cpu_hit_tokens=0, evicted_blocks=0,
                    offloaded_blocks=0, cpu_evicted_blocks=0, hit_square_sum=0)
    if kw.get("cpu_blocks"):
        return _replay_offload(requests, block_size=kw["block_size"], capacity_blocks=kw["capacity_blocks"],
                               hash_fn=kw["hash_fn"], cpu_blocks=kw["cpu_blocks"], warmup=kw["warmup"],
                               source=kw["source"])
    r = simulate(requests, policy=kw["policy"], block_size=kw["block_size"], capacity_blocks=kw["capacity_blocks"],
                 hash_fn=kw["hash_fn"], concurrency=kw["concurrency"], decode_s_per_token=kw["decode_s_per_token"],
                 source=kw["source"], warmup=kw["warmup"], per_request=True)
    return dict(requests=r.requests, query_tokens=r.query_tokens, gpu_hit_tokens=r.hit_tokens,
                cpu_hit_tokens=0, evicted_blocks=r.evicted_blocks, offloaded_blocks=0, cpu_evicted_blocks=0,
                hit_square_sum=sum([q.hit_tokens ** 2 for q in r.per_request or ()]))


_TASKS: list = []


def _replay_inherited(i: int) -> dict:
    """Task ``i`` of the parent's list, inherited through fork: nothing but the index crosses the pipe."""
    return _replay(_TASKS[i])


def _imbalance(values: list[int]) -> float | None:
    mean = sum(values) / len(values)
    return max(values) / mean if mean else None


def simulate_fleet(requests: Sequence[TraceRequest], *, replicas: int, routers: Sequence[str],
                   policy: str = "vllm", block_size: int = 16, capacity_blocks: int | None = None,
                   hash_fn: str = "builtin", concurrency: int = 1, decode_s_per_token: float = 0.02,
                   seed: int = 0, prefix_blocks: int = 4, params: CacheAwareParams = CacheAwareParams(),
                   cpu_offload_blocks: int | None = None, bytes_per_token: float | None = None,
                   link_gbps: float | None = None, warmup: int = 0, jobs: int = 1,
                   source: str = "", notes: Sequence[str] = (),
                   session_fields: Sequence[str] = SESSION_FIELDS) -> FleetReport:
    """Route ``requests`` with each router and replay every replica's share; the first ``warmup`` requests of
    the trace fill the caches but are not counted."""
    if cpu_offload_blocks is not None:
        if cpu_offload_blocks < 1:
            raise UsageError("the CPU offload tier needs at least one block")
        if policy != "vllm" or concurrency != 1:
            raise UsageError("the CPU offload tier follows the vllm policy with requests one at a time: use "
                             "--policy vllm and --concurrency 1")
    if prefix_blocks < 1:
        raise UsageError("prefix-hash needs at least one block (--prefix-blocks)")
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
              cpu_blocks=cpu_offload_blocks)
    plans = []
    for router in routers:
        assign, decisions = route(requests, replicas=replicas, router=router, block_size=block_size, hash_fn=hash_fn,
                                  concurrency=concurrency, decode_s_per_token=decode_s_per_token, seed=seed,
                                  prefix_blocks=prefix_blocks, params=params, source=source,
                                  session_fields=session_fields)
        shares: list[list[TraceRequest]] = [[] for _ in range(replicas)]
        skips = [0] * replicas
        for i, (req, r) in enumerate(zip(requests, assign)):
            shares[r].append(req)
            if i < warmup:
                skips[r] += 1
        plans.append((router, decisions, [(shares[r], {**kw, "warmup": skips[r]}) for r in range(replicas)]))
    tasks = [job for _, _, js in plans for job in js]
    if jobs > 1 and len(tasks) > 1:
        import gc
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        global _TASKS
        _TASKS = tasks
        gc.freeze()        # the children inherit the trace: keep the collector from touching (copying) its pages
        try:
            with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as ex:
                outs = list(ex.map(_replay_inherited, range(len(tasks))))
        finally:
            _TASKS = []
            gc.unfreeze()
    else:
        outs = list(map(_replay, tasks))
    results = []
    for k, (router, decisions, _) in enumerate(plans):
        per = outs[k * replicas:(k + 1) * replicas]
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
        results.append(RouterResult(router=router, requests=sum(s.requests for s in stats), query_tokens=q,
                                    hit_tokens=hit, hit_rate=hit / q if q else None,
                                    gpu_hit_tokens=hit - cpu_hit, cpu_hit_tokens=cpu_hit,
                                    request_imbalance=_imbalance([s.requests for s in stats]),
                                    token_imbalance=_imbalance([s.query_tokens for s in stats]),
                                    replicas=tuple(stats), decisions=decisions,
                                    hit_square_sum=sum(o["hit_square_sum"] for o in per), **moved))
    notes = list(notes)
    if any(r in ("least-loaded", "cache-aware") for r in routers) and all(q.timestamp is None for q in requests):
        notes.append("the trace has no timestamps: every request arrives at time 0, so loads only grow "
                     "(least-loaded is then round-robin) and cache-aware trees are never pruned")
    if warmup:
        notes.append(f"the first {warmup} requests warmed the caches and are not counted")
    router_params = {"seed": seed, "prefix_blocks": prefix_blocks, "ring_vnodes": RING_VNODES,
                     "cache_aware": {**params.__dict__,
                                     "source": "sgl-router/src/policies/mod.rs CacheAwareConfig::default()"}}
    return FleetReport(replicas=replicas, policy=policy, block_size=block_size, capacity_blocks=capacity_blocks,
                       cpu_offload_blocks=cpu_offload_blocks, concurrency=concurrency, warmup_requests=warmup,
                       router_params=router_params, results=tuple(results), notes=tuple(notes))
