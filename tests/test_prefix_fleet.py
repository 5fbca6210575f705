"""simulate-prefix for a fleet: each router's rule on hand-checked traces, N = 1 equals one server, the CPU
tier against a naive two-tier reference, the CLI."""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines.prefix.fleet import ROUTERS, CacheAwareParams, HashRing, route, simulate_fleet
from cachectl.engines.prefix.replay import simulate
from cachectl.engines.prefix.trace import TraceRequest, iter_trace, trace_records
from cachectl.errors import InputError

from .conftest import FIXTURES
from .reference_prefix import NaiveVllm

RAG = FIXTURES / "traces" / "rag.jsonl"


def req(i, tokens, *, ts=None, out=0, session=None, salt=None):
    return TraceRequest(index=i, line=i + 1, prompt_tokens=len(tokens), tokens=list(tokens), timestamp=ts,
                        output_tokens=out, session=session, salt=salt, tenant=salt)


def rag(**kw):
    return list(iter_trace(trace_records(str(RAG)), source="rag.jsonl", **kw))


# ---------------------------------------------------------------------------------------- N = 1 is today


@pytest.mark.parametrize("concurrency, warmup", [(1, 0), (1, 30), (3, 0)])
def test_one_replica_reproduces_the_single_server_for_every_router(concurrency, warmup):
    reqs = [TraceRequest(**{**r.__dict__, "session": r.index % 7}) for r in rag()]
    one = simulate(reqs, capacity_blocks=300, concurrency=concurrency, warmup=warmup)
    fleet = simulate_fleet(reqs, replicas=1, routers=ROUTERS, capacity_blocks=300, concurrency=concurrency,
                           warmup=warmup)
    for r in fleet.results:
        assert (r.router, r.requests, r.query_tokens, r.hit_tokens) == (r.router, one.requests, one.query_tokens,
                                                                       one.hit_tokens)
        assert r.replicas[0].evicted_blocks == one.evicted_blocks and r.cpu_hit_tokens == 0


def test_one_replica_with_a_cpu_tier_keeps_the_gpu_hits_of_today():
    reqs = rag()
    one = simulate(reqs, capacity_blocks=120)
    for cpu in (1, 50, 5000):
        r = simulate_fleet(reqs, replicas=1, routers=["round-robin"], capacity_blocks=120,
                           cpu_offload_blocks=cpu).results[0]
        assert r.gpu_hit_tokens == one.hit_tokens and r.replicas[0].evicted_blocks == one.evicted_blocks
        assert r.hit_tokens == r.gpu_hit_tokens + r.cpu_hit_tokens
    assert r.cpu_hit_tokens > 0


# ------------------------------------------------------------------------------------------- the rules


def test_round_robin_and_seeded_random():
    reqs = [req(i, [i] * 8) for i in range(10)]
    assert route(reqs, replicas=3, router="round-robin")[0] == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    a = route(reqs, replicas=3, router="random", seed=1)[0]
    assert a == route(reqs, replicas=3, router="random", seed=1)[0]
    assert a != route(reqs, replicas=3, router="random", seed=2)[0]
    assert set(a) <= {0, 1, 2}


def test_session_affinity_and_a_missing_session():
    reqs = [req(i, [i] * 8, session=f"s{i % 4}") for i in range(40)]
    assign = route(reqs, replicas=3, router="session")[0]
    for s in range(4):
        assert len({assign[i] for i in range(s, 40, 4)}) == 1   # one replica per session
    with pytest.raises(InputError, match=r"t.jsonl:2: no session"):
        route([req(0, [1], session="a"), req(1, [1])], replicas=2, router="session", source="t.jsonl")


def test_prefix_hash_looks_at_the_first_k_blocks_only():
    base = list(range(64))                                # 4 blocks of 16
    reqs = [req(i, base + [1000 + i] * 20) for i in range(20)]          # same 4 blocks, then different
    assert len(set(route(reqs, replicas=4, router="prefix-hash", prefix_blocks=4)[0])) == 1
    other = [req(i, [i] + base[1:] + [7] * 20) for i in range(40)]      # first block differs
    assert len(set(route(other, replicas=4, router="prefix-hash", prefix_blocks=4)[0])) > 1


def test_consistent_hashing_moves_few_values_when_a_replica_is_added():
    four, five = HashRing(4), HashRing(5)
    moved = sum(four(v) != five(v) for v in range(2000))
    assert moved < 2000 * 0.35           # about 1/5 move; a modulo hash would move about 4/5


def test_least_loaded_counts_requests_in_flight():
    # decode 1 s per output token; one slot per replica. t=0: A (4 s) -> r0; t=0: B (1 s) -> r1;
    # t=2: B done, A in flight -> r1; t=2.5: both busy (r0 until 4, r1 until 3), loads 1,1 -> r0 (lowest index);
    # t=3.5: r1 free (ends 3), r0 holds A and the queued one -> r1
    reqs = [req(0, [1], ts=0, out=4), req(1, [2], ts=0, out=1), req(2, [3], ts=2, out=1),
            req(3, [4], ts=2.5, out=1), req(4, [5], ts=3.5, out=1)]
    assert route(reqs, replicas=2, router="least-loaded", decode_s_per_token=1.0)[0] == [0, 1, 1, 0, 1]


def test_least_loaded_queues_beyond_concurrency():
    # two slots on each of 2 replicas; 5 requests at t=0 of 10 s: r0 r1 r0 r1 r0; at t=15 r0 still has its
    # queued third request (started at 10, ends 20): loads 1, 0 -> r1
    reqs = [req(i, [i], ts=0, out=10) for i in range(5)] + [req(5, [9], ts=15, out=1)]
    assert route(reqs, replicas=2, router="least-loaded", concurrency=2, decode_s_per_token=1.0)[0] == \
        [0, 1, 0, 1, 0, 1]


def test_cache_aware_prefix_match_smallest_tree_and_threshold():
    sys_a, sys_b = list(range(64)), list(range(100, 164))
    reqs = [req(0, sys_a + [1] * 16),        # trees empty: ratio 0 -> smallest tree, r0 (lowest index)
            req(1, sys_b + [2] * 16),        # no match -> smallest tree: r1
            req(2, sys_a + [3] * 32),        # 64/96 > 0.5 on r0 -> r0 (its tree: 7 blocks)
            req(3, sys_b + [4] * 16),        # 64/80 on r1 -> r1 (6 blocks)
            req(4, sys_a[:32] + [5] * 32)]   # 32/64 = 0.5, not above 0.5 -> the smallest tree, r1
    assign, d = route(reqs, replicas=2, router="cache-aware", block_size=16)
    assert assign == [0, 1, 0, 1, 1]
    assert d == {"load_balance": 0, "prefix_match": 2, "smallest_tree": 3}
    lower = CacheAwareParams(cache_threshold=0.49)
    assert route(reqs, replicas=2, router="cache-aware", block_size=16, params=lower)[0][4] == 0


def test_cache_aware_turns_to_the_shortest_queue_when_imbalanced():
    # abs 2, rel 1.5: every request shares the prefix, so all go to r0 until its load exceeds r1's by more than
    # 2 (and 1.5 x): the 4th request sees loads 3, 0 -> r1
    reqs = [req(i, list(range(64)) + [i] * 16, ts=0, out=100) for i in range(5)]
    p = CacheAwareParams(balance_abs_threshold=2, balance_rel_threshold=1.5)
    assign, d = route(reqs, replicas=2, router="cache-aware", block_size=16, params=p, decode_s_per_token=1.0)
    # loads 0,0: empty trees -> r0; 1,0 and 2,0: not imbalanced (gap <= 2), match 64/80 -> r0; 3,0: imbalanced
    # -> r1; 3,1: balanced again, both trees match 4 blocks -> r0 (the lowest index)
    assert assign == [0, 0, 0, 1, 0]
    assert d["load_balance"] == 1


def test_cache_aware_prunes_trees_by_trace_time():
    # B (1 block) -> r0; A (5 blocks) -> r1, the smallest tree; at t=100 A again: matched on r1 unless the
    # trees were pruned to one block each (then 16/80 is below the threshold, and the trees tie: r0)
    a = list(range(80))
    reqs = [req(0, list(range(500, 516)), ts=0), req(1, a, ts=1), req(2, a[:64] + [2] * 16, ts=100)]
    keep = CacheAwareParams(eviction_interval_s=30, max_tree_tokens=10_000)
    assert route(reqs, replicas=2, router="cache-aware", block_size=16, params=keep)[0] == [0, 1, 1]
    pruned = CacheAwareParams(eviction_interval_s=30, max_tree_tokens=16)
    assert route(reqs, replicas=2, router="cache-aware", block_size=16, params=pruned)[0] == [0, 1, 0]
    never = CacheAwareParams(eviction_interval_s=0, max_tree_tokens=16)
    assert route(reqs, replicas=2, router="cache-aware", block_size=16, params=never)[0] == [0, 1, 1]


def test_cache_aware_pruning_at_epoch_timestamps_is_one_step():
    """Unix-epoch timestamps (1.7e9 s) once meant 57 million due prunings, one by one, before the first
    request; the prunings due between two requests are now one (the same trees) and the grid is kept."""
    import time

    a = list(range(80))
    t0 = 1_700_000_000.0
    reqs = [req(0, list(range(500, 516)), ts=t0), req(1, a, ts=t0 + 1), req(2, a[:64] + [2] * 16, ts=t0 + 100)]
    pruned = CacheAwareParams(eviction_interval_s=30, max_tree_tokens=16)
    start = time.perf_counter()
    assert route(reqs, replicas=2, router="cache-aware", block_size=16, params=pruned)[0] == [0, 1, 0]
    assert time.perf_counter() - start < 1.0
    # t0 + 1 and t0 + 29 fall between the same two grid points (multiples of 30 s): no pruning between them
    same = [req(0, list(range(500, 516)), ts=30 * 10 ** 7 + 1), req(1, a, ts=30 * 10 ** 7 + 2),
            req(2, a[:64] + [2] * 16, ts=30 * 10 ** 7 + 29)]
    assert route(same, replicas=2, router="cache-aware", block_size=16, params=pruned)[0] == [0, 1, 1]


# ------------------------------------------------------------------------------------------ the CPU tier


class NaiveTiered:
    """The naive GPU pool plus a CPU LRU over its keys (whole prefixes): fed by GPU evictions, looked up from
    the first GPU miss."""

    def __init__(self, gpu: int, cpu: int, bs: int):
        self.gpu, self.cpu, self.cap, self.bs = NaiveVllm(gpu, bs), OrderedDict(), cpu, bs

    def run(self, tokens, salt=None):
        bs, n = self.bs, len(tokens)
        self.gpu.victims = []
        gpu_hit = self.gpu.run(tokens, salt)
        keys = [(salt, tuple(tokens[:(i + 1) * bs])) for i in range(n // bs)]
        cpu_hit = 0
        for k in keys[gpu_hit // bs:(n - 1) // bs]:
            if k not in self.cpu:
                break
            self.cpu.move_to_end(k)
            cpu_hit += bs
        for k in self.gpu.victims:
            self.cpu[k] = None
            self.cpu.move_to_end(k)
        while len(self.cpu) > self.cap:
            self.cpu.popitem(last=False)
        return gpu_hit, cpu_hit


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=25),
       st.sampled_from([2, 4, 8]), st.integers(0, 6), st.integers(1, 12), st.booleans())
@settings(max_examples=150, deadline=None)
def test_cpu_tier_equals_a_naive_two_tier_reference(trace, bs, extra, cpu, repeats):
    if repeats:
        trace = [t if i % 3 else list(trace[i // 2]) for i, t in enumerate(trace)]
    else:
        trace = [t if i == 0 or i % 2 else trace[i // 2] + t for i, t in enumerate(trace)]
    gpu = max(-(-len(t) // bs) for t in trace) + extra
    naive = NaiveTiered(gpu, cpu, bs)
    expected = [naive.run(t) for t in trace]
    reqs = [req(i, t) for i, t in enumerate(trace)]
    r = simulate_fleet(reqs, replicas=1, routers=["round-robin"], block_size=bs, capacity_blocks=gpu,
                       cpu_offload_blocks=cpu).results[0]
    assert (r.gpu_hit_tokens, r.cpu_hit_tokens) == (sum(g for g, _ in expected), sum(c for _, c in expected))


def test_cpu_tier_hand_checked():
    # GPU 4 blocks of 4, CPU 4 blocks. A (4 blocks) then B (4 blocks) evicts A's blocks to the CPU tier;
    # A again: GPU miss at once, the CPU tier has A0..A2 (the cap leaves the last block to compute): 12 tokens
    a, b = list(range(16)), list(range(100, 116))
    reqs = [req(0, a), req(1, b), req(2, a)]
    r = simulate_fleet(reqs, replicas=1, routers=["round-robin"], block_size=4, capacity_blocks=4,
                       cpu_offload_blocks=4, bytes_per_token=1000, link_gbps=1.0).results[0]
    assert (r.gpu_hit_tokens, r.cpu_hit_tokens) == (0, 12)
    assert r.cpu_read_bytes == 12 * 1000 and r.cpu_read_s == pytest.approx(12 * 1000 / 1e9)
    assert r.replicas[0].offloaded_blocks == 4 + 4      # B evicts A's 4, A again evicts B's 4


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_router_all_json_and_table(cli, write):
    rows = [{"tokens": [s] * 48 + [i] * 20, "conversation": f"c{i % 6}", "timestamp": i * 0.1, "output_tokens": 5}
            for i, s in enumerate([1, 2, 3] * 10)]
    path = write("t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    r = cli("simulate-prefix", path, "--capacity-blocks", "20", "--replicas", "3", "--router", "all", "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert [x["router"] for x in d["results"]] == list(ROUTERS)
    for x in d["results"]:
        assert sum(p["requests"] for p in x["replicas"]) == x["requests"] == 30
        assert sum(p["hit_tokens"] for p in x["replicas"]) == x["hit_tokens"]
        assert x["request_imbalance"] >= 1.0
    assert d["router_params"]["cache_aware"]["cache_threshold"] == 0.5
    t = cli("simulate-prefix", path, "--capacity-blocks", "20", "--replicas", "3", "--router", "all")
    assert t.exit_code == 0 and "cache-aware" in t.stdout and "session" in t.stdout


@pytest.mark.parametrize("args, expect", [
    (["--replicas", "2", "--router", "nope"], "--router must be one of"),
    (["--replicas", "2", "--router", "session"], "t.jsonl:1: no session to route by"),
    (["--replicas", "2", "--curve"], "drop --sweep-*"),
    (["--cpu-offload-gib", "1"], "--cpu-offload-gib needs --model"),
    (["--replicas", "2", "--gpu", "H100"], "--gpu needs --model"),
    (["--replicas", "2", "--cpu-offload-blocks", "4", "--policy", "radix"], "sits below vLLM's block pool"),
    (["--gpu", "H100"], "--gpu needs --model"),
    (["--gpu", "H100", "--model", "llama-3.1-8b", "--curve"], "price one replay or a fleet run"),
    (["--replicas", "2", "--cache-threshold", "1.5"], "--cache-threshold must be between 0 and 1"),
    (["--replicas", "2", "--cpu-offload-gib", "-1", "--model", "llama-3.1-8b"], "--cpu-offload-gib must be positive"),
    (["--replicas", "2", "--link", "usb"], "--link must be one of"),
    (["--replicas", "2", "--router", "session", "--session-field", "user.id"], "t.jsonl:1: field 'user.id': missing"),
])
def test_cli_fleet_bad_usage(cli, write, args, expect):
    path = write("t.jsonl", json.dumps({"tokens": list(range(40))}) + "\n")
    r = cli("simulate-prefix", path, "--capacity-blocks", "20", *args)
    assert r.exit_code == 2 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr


# ------------------------------------------------------------------------------------ worth and --jobs

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": False}


def test_hits_worth_by_hand():
    from cachectl.engines.prefix.value import hits_worth

    # 10 requests hitting 100 tokens each
    w = hits_worth(1000, hit_square_sum=10 * 100 ** 2, config=TINY, model_source="tiny", gpu="H100",
                   gpu_hour_usd=3.6, utilization=0.5)
    # per layer: q 64x64, o 64x64, k and v 64x(2x16) each, MLP 3 x 64 x 128; + 5 norms of 64; no embeddings
    per_layer = 64 * 64 + 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128
    assert w.active_params == 2 * per_layer + 5 * 64
    attention = 2 * 2 * 4 * 16 * 100 ** 2 * 10          # 2 x layers x heads x head_dim x sum of hit^2
    assert w.flops_saved == 2 * w.active_params * 1000 + attention
    assert w.gpu == "H100-SXM" and w.gpu_seconds_at_peak == pytest.approx(w.flops_saved / 989e12)
    assert w.gpu_seconds_at_utilization == pytest.approx(2 * w.gpu_seconds_at_peak)
    assert w.usd == pytest.approx(w.gpu_seconds_at_utilization / 3600 * 3.6)


def test_cli_worth_and_offload_json(cli, write, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    rows = [{"tokens": list(range(64)) + [i] * 16} for i in range(6)]
    path = write("t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    r = cli("simulate-prefix", path, "--capacity-blocks", "6", "--replicas", "1", "--cpu-offload-blocks", "8",
            "--model", cfg, "--gpu", "H100", "--gpu-hour-usd", "2", "-f", "json")
    assert r.exit_code == 0, r.stderr
    x = json.loads(r.stdout)["results"][0]
    assert x["hit_tokens"] == x["gpu_hit_tokens"] + x["cpu_hit_tokens"] == x["worth"]["hit_tokens"]
    # 2 (K, V) x 2 layers x 2 heads x 16 x 2 bytes = 256 bytes per token
    assert x["cpu_read_bytes"] == x["cpu_hit_tokens"] * 256
    assert json.loads(r.stdout)["link"]["gbps"] == 64
    # the squares of each request's hit, from the same replay with --per-request on one server
    one = cli("simulate-prefix", path, "--capacity-blocks", "6", "--per-request", "-f", "json")
    gpu_only = json.loads(cli("simulate-prefix", path, "--capacity-blocks", "6", "--replicas", "1", "--model", cfg,
                              "--gpu", "H100", "-f", "json").stdout)["results"][0]
    assert gpu_only["hit_square_sum"] == sum(q["hit_tokens"] ** 2 for q in json.loads(one.stdout)["per_request"])
    assert gpu_only["worth"]["attention_flops"] == 2 * 2 * 4 * 16 * gpu_only["hit_square_sum"]


@pytest.mark.parametrize("routers, extra", [
    (["round-robin", "cache-aware"], {}),                           # a task per router
    (["cache-aware"], {"cpu_offload_blocks": 100, "concurrency": 2}),  # a task per replica
    (["prefix-hash", "random", "least-loaded"], {"policy": "radix", "warmup": 20}),
])
def test_jobs_give_the_same_numbers(routers, extra):
    reqs = rag()
    one = simulate_fleet(reqs, replicas=3, routers=routers, capacity_blocks=200, **extra)
    two = simulate_fleet(reqs, replicas=3, routers=routers, capacity_blocks=200, jobs=2, **extra)
    assert one == two and one.results[0].hit_tokens > 0


def test_cli_session_field_named_and_default_order(cli, write):
    rows = [{"tokens": [i % 3] * 40, "chat_id": f"x{i % 3}", "user": {"id": i % 2}} for i in range(12)]
    path = write("t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")

    def placement(*extra):
        r = cli("simulate-prefix", path, "--capacity-blocks", "20", "--replicas", "4", "--router", "session",
                *extra, "-f", "json")
        assert r.exit_code == 0, r.stderr
        return [p["requests"] for p in json.loads(r.stdout)["results"][0]["replicas"]]

    by_chat = placement()                                   # chat_id, the only default field present
    assert sum(by_chat) == 12 and all(n % 4 == 0 for n in by_chat)   # 3 sessions of 4 requests, kept together
    by_user = placement("--session-field", "user.id")       # 2 sessions of 6
    assert sorted(n for n in by_user if n) in ([6, 6], [12])


@pytest.mark.parametrize("policy", ["radix", "chunk", "infinite"])
def test_one_replica_reproduces_the_other_policies(policy):
    reqs = rag()[:40]
    cap = None if policy == "infinite" else 300
    one = simulate(reqs, policy=policy, capacity_blocks=cap)
    for r in simulate_fleet(reqs, replicas=1, routers=["round-robin", "cache-aware"], policy=policy,
                            capacity_blocks=cap).results:
        assert (r.requests, r.query_tokens, r.hit_tokens) == (one.requests, one.query_tokens, one.hit_tokens)


# ------------------------------------------------------------------ the CPU tier with requests in flight


def test_cpu_tier_with_concurrency_keeps_the_gpu_hits_of_the_concurrent_server():
    reqs = rag()
    for conc in (2, 5):
        one = simulate(reqs, capacity_blocks=150, concurrency=conc, decode_s_per_token=0.05)
        r = simulate_fleet(reqs, replicas=1, routers=["round-robin"], capacity_blocks=150, concurrency=conc,
                           decode_s_per_token=0.05, cpu_offload_blocks=400).results[0]
        assert r.gpu_hit_tokens == one.hit_tokens and r.replicas[0].evicted_blocks == one.evicted_blocks
        assert r.cpu_hit_tokens > 0


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=25),
       st.sampled_from([2, 4]), st.integers(0, 6), st.integers(1, 12), st.integers(2, 4))
@settings(max_examples=100, deadline=None)
def test_cpu_tier_with_concurrency_but_nothing_in_flight_equals_the_naive_two_tier_reference(trace, bs, extra, cpu,
                                                                                              conc):
    # requests without output finish as they arrive: the ref-counted pool then replays them one at a time
    trace = [t if i == 0 or i % 2 else trace[i // 2] + t for i, t in enumerate(trace)]
    gpu = max(-(-len(t) // bs) for t in trace) + extra
    naive = NaiveTiered(gpu, cpu, bs)
    expected = [naive.run(t) for t in trace]
    reqs = [req(i, t, out=0) for i, t in enumerate(trace)]
    r = simulate_fleet(reqs, replicas=1, routers=["round-robin"], block_size=bs, capacity_blocks=gpu,
                       concurrency=conc, cpu_offload_blocks=cpu).results[0]
    assert (r.gpu_hit_tokens, r.cpu_hit_tokens) == (sum(g for g, _ in expected), sum(c for _, c in expected))


def test_cpu_tier_with_requests_in_flight_hand_checked():
    # GPU 8 blocks of 4, CPU 8. A (4 blocks, arrives at 0, decodes for 2 s) and B (4 blocks, arrives at 0.1,
    # done at 0.12), then C (4 new blocks) at 10 s and A again at 11 s.
    # One at a time: A is freed first, so C evicts A's blocks to the CPU tier and A again reads 12 tokens back
    # from it (the L - 1 cap leaves the last block), evicting B's blocks in turn.
    # Two in flight: B finishes before A and is freed first, so C evicts B's blocks instead: A again hits
    # 12 tokens on the GPU and the CPU tier (B's blocks) is not read.
    a, b, c = list(range(16)), list(range(100, 116)), list(range(200, 216))
    reqs = [req(0, a, ts=0.0, out=100), req(1, b, ts=0.1, out=1), req(2, c, ts=10.0), req(3, a, ts=11.0)]
    kw = dict(replicas=1, routers=["round-robin"], block_size=4, capacity_blocks=8, decode_s_per_token=0.02,
              cpu_offload_blocks=8)
    seq = simulate_fleet(reqs, concurrency=1, **kw).results[0]
    assert (seq.gpu_hit_tokens, seq.cpu_hit_tokens, seq.replicas[0].offloaded_blocks) == (0, 12, 8)
    par = simulate_fleet(reqs, concurrency=2, **kw).results[0]
    assert (par.gpu_hit_tokens, par.cpu_hit_tokens) == (12, 0)
    assert par.gpu_hit_tokens == simulate(reqs, block_size=4, capacity_blocks=8, concurrency=2).hit_tokens


# ----------------------------------------------------------------------------------------- per tenant


def test_per_tenant_rows_add_up_and_equal_the_single_server_table():
    reqs = rag()
    one = simulate(reqs, capacity_blocks=300)
    fleet = simulate_fleet(reqs, replicas=1, routers=["round-robin"], capacity_blocks=300).results[0]
    assert {(t.tenant, t.requests, t.query_tokens, t.hit_tokens) for t in fleet.per_tenant} == \
        {(t.tenant, t.requests, t.query_tokens, t.hit_tokens) for t in one.per_tenant}
    assert fleet.cross_tenant_shared_blocks == one.cross_tenant_shared_blocks
    for r in simulate_fleet(reqs, replicas=3, routers=["round-robin", "random", "prefix-hash", "cache-aware"],
                            capacity_blocks=100,
                            cpu_offload_blocks=50).results:
        assert len(r.per_tenant) == len(one.per_tenant) > 1
        assert sum(t.hit_tokens for t in r.per_tenant) == r.hit_tokens
        assert sum(t.requests for t in r.per_tenant) == r.requests


def test_cli_fleet_tenant_table(cli):
    r = cli("simulate-prefix", RAG, "--capacity-blocks", "100", "--replicas", "2", "--router", "all")
    assert r.exit_code == 0, r.stderr
    assert "round-robin hit rate" in r.stdout and "cross-tenant shared blocks: round-robin 0" in r.stdout
    plain = cli("simulate-prefix", FIXTURES / "traces" / "mooncake_conv.jsonl", "--block-size", "512",
                "--capacity-blocks", "100", "--replicas", "2")
    assert plain.exit_code == 0 and "tenant" not in plain.stdout


# ------------------------------------------------------------------------------------------ partitions



def _partition(cli, tmp_path, trace, *args, name="parts"):
    out = tmp_path / name
    r = cli("simulate-prefix", trace, *args, "--partition-dir", out, "-f", "json")
    assert r.exit_code == 0, r.stderr
    return out, json.loads(r.stdout)


@pytest.mark.parametrize("router, routing, replay", [
    ("round-robin", [], ["--warmup", "0.3"]),
    ("random", ["--seed", "7"], ["--concurrency", "3", "--cpu-offload-blocks", "100"]),
    ("session", [], ["--cpu-offload-blocks", "300", "--jobs", "2"]),
    ("prefix-hash", ["--prefix-blocks", "2"], ["--policy", "radix", "--capacity-blocks", "300"]),
])
def test_partitions_replay_to_the_numbers_of_one_process(cli, tmp_path, router, routing, replay):
    pytest.importorskip("pyarrow")
    trace = FIXTURES / "traces" / "fleet.jsonl"
    route_args = ["--replicas", "4", "--router", router, *routing]
    replay_args = replay
    parts, written = _partition(cli, tmp_path, trace, *route_args)
    assert written["router"] == router and sum(p["requests"] for p in written["partitions"]) == 250
    one = cli("simulate-prefix", trace, "--capacity-blocks", "100", *route_args, *replay_args, "-f", "json")
    many = cli("simulate-prefix", parts, "--capacity-blocks", "100", *replay_args, "-f", "json")
    assert one.exit_code == 0 and many.exit_code == 0, one.stderr + many.stderr
    a, b = json.loads(one.stdout), json.loads(many.stdout)
    assert a["results"] == b["results"] and a["results"][0]["hit_tokens"] > 0
    assert a["warmup_requests"] == b["warmup_requests"]


def test_partitions_of_a_parquet_mooncake_trace(cli, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    src = FIXTURES / "traces" / "mooncake_conv.jsonl"
    rows = [json.loads(x) for x in open(src, encoding="utf-8")]
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "mc.parquet"))
    parts, _ = _partition(cli, tmp_path, tmp_path / "mc.parquet", "--replicas", "3", "--router", "prefix-hash",
                          "--block-size", "512")
    args = ["--block-size", "512", "--capacity-blocks", "60", "--concurrency", "2", "-f", "json"]
    one = json.loads(cli("simulate-prefix", src, "--replicas", "3", "--router", "prefix-hash", *args).stdout)
    many = json.loads(cli("simulate-prefix", parts, *args).stdout)
    assert one["results"] == many["results"]


@pytest.mark.parametrize("args, expect", [
    (["--replicas", "2", "--router", "cache-aware"], "cache-aware decides from the state its earlier choices left"),
    (["--replicas", "2", "--router", "least-loaded"], "stays single-process"),
    (["--router", "session"], "give --replicas N and --router"),
    (["--replicas", "2", "--router", "all"], "--router all includes cache-aware and least-loaded"),
    (["--replicas", "2", "--router", "round-robin", "--curve"], "--partition-dir writes partitions and replays nothing"),
])
def test_partition_dir_refuses(cli, tmp_path, args, expect):
    pytest.importorskip("pyarrow")
    r = cli("simulate-prefix", RAG, *args, "--partition-dir", tmp_path / "p")
    assert r.exit_code == 2 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_partition_dir_must_be_new_or_empty_and_ray_needs_partitions(cli, tmp_path):
    pytest.importorskip("pyarrow")
    parts, _ = _partition(cli, tmp_path, RAG, "--replicas", "2", "--router", "round-robin")
    again = cli("simulate-prefix", RAG, "--replicas", "2", "--router", "round-robin", "--partition-dir", parts)
    assert again.exit_code == 2 and "is not empty" in again.stderr
    r = cli("simulate-prefix", RAG, "--capacity-blocks", "100", "--ray")
    assert r.exit_code == 2 and "--ray replays trace partitions" in r.stderr
    r = cli("simulate-prefix", parts, "--capacity-blocks", "100", "--router", "session")
    assert r.exit_code == 2 and "drop --router and --replicas" in r.stderr
    r = cli("simulate-prefix", parts, "--capacity-blocks", "100", "--tenant-field", "x")
    assert r.exit_code == 2 and "apply when it is written" in r.stderr
    (parts / "replica-00001.parquet").unlink()
    r = cli("simulate-prefix", parts, "--capacity-blocks", "100")
    assert r.exit_code == 2 and "partition file replica-00001.parquet is missing" in r.stderr, r.stderr


def _partition_under(limit: tuple[int, int], out, replicas: int):
    """``simulate-prefix partition`` in a process whose open files are limited to ``limit`` (soft, hard)."""
    import resource
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "cachectl", "simulate-prefix", "partition", str(FIXTURES / "traces" / "fleet.jsonl"),
         "--replicas", str(replicas), "--router", "round-robin", "--partition-dir", str(out), "-f", "json"],
        capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="resource limits are POSIX")
def test_partitions_past_the_open_file_limit(tmp_path):
    # one file a partition, written side by side: 400 partitions under a soft limit of 128 (macOS's default is
    # 256) raise it toward the hard one, and are all written (it was an error at the 64th partition or so,
    # naming the first)
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"this machine's hard limit on open files is {hard}")
    r = _partition_under((128, hard), tmp_path / "p", 400)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["partitions"]) == 400 and sum(p["requests"] for p in doc["partitions"]) == 250
    assert len(list((tmp_path / "p").iterdir())) == 401  # and the manifest
    # a hard limit below what the partitions need: one line before anything is written
    r = _partition_under((128, 128), tmp_path / "q", 400)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "cachectl: error: --replicas 400 writes 400 partition files side by side, and this process may open 128 "
        "files (ulimit -n): raise the limit to 464 or route over fewer replicas"]
    assert not (tmp_path / "q").exists()


@pytest.mark.ray
def test_partitions_replayed_as_ray_tasks_in_a_local_ray(cli, tmp_path):
    """Ray's own API (ray.remote, ray.get) on a local two-CPU Ray: the numbers of one process."""
    pytest.importorskip("pyarrow")
    pytest.importorskip("ray")
    trace = FIXTURES / "traces" / "fleet.jsonl"
    parts, _ = _partition(cli, tmp_path, trace, "--replicas", "4", "--router", "session")
    args = ["--capacity-blocks", "100", "--cpu-offload-blocks", "300", "--concurrency", "2", "-f", "json"]
    one = json.loads(cli("simulate-prefix", trace, "--replicas", "4", "--router", "session", *args).stdout)
    r = cli("simulate-prefix", parts, *args, "--ray", "--jobs", "2", env={"RAY_ADDRESS": ""})
    assert r.exit_code == 0, r.stderr
    ray_run = json.loads(r.stdout)
    assert ray_run["results"] == one["results"] and "as Ray tasks" in ray_run["notes"][0]


@pytest.mark.parametrize("args, named, why", [
    (["--prefix-blocks", "8"], "--prefix-blocks", "routing was done when the partitions were written"),
    (["--seed", "5"], "--seed", "routing options change nothing on replay"),
    (["--seed", "0"], "--seed", "routing options change nothing on replay"),     # the default, given: still refused
    (["--cache-threshold", "0.3", "--router-max-tree-tokens", "5"], "--cache-threshold, --router-max-tree-tokens",
     "drop them"),
    (["--balance-abs-threshold", "3"], "--balance-abs-threshold", "drop it"),
    (["--hash-block-size", "16"], "--hash-block-size", "holds requests as they were read"),
    (["--ray-address", "127.0.0.1:1"], "--ray-address names the cluster for --ray: add --ray", ""),
])
def test_replay_refuses_options_that_routing_or_reading_used(cli, tmp_path, args, named, why):
    pytest.importorskip("pyarrow")
    parts, _ = _partition(cli, tmp_path, RAG, "--replicas", "2", "--router", "prefix-hash")
    r = cli("simulate-prefix", parts, "--capacity-blocks", "100", *args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert named in r.stderr and why in r.stderr, r.stderr
    if why:
        assert f"{parts}/manifest.json" in r.stderr


def test_replay_at_another_block_size_says_what_routing_used(cli, tmp_path):
    pytest.importorskip("pyarrow")
    trace = FIXTURES / "traces" / "fleet.jsonl"
    ph, _ = _partition(cli, tmp_path, trace, "--replicas", "3", "--router", "prefix-hash", name="ph")
    rr, _ = _partition(cli, tmp_path, trace, "--replicas", "3", "--router", "round-robin", name="rr")
    args = ["--capacity-blocks", "100", "--block-size", "32"]
    same = json.loads(cli("simulate-prefix", ph, "--capacity-blocks", "100", "-f", "json").stdout)
    assert not any("block size" in n for n in same["notes"])
    r = cli("simulate-prefix", ph, *args, "-f", "json")
    assert r.exit_code == 0, r.stderr
    note = [n for n in json.loads(r.stdout)["notes"] if "block size" in n]
    assert len(note) == 1 and "prefix-hash routed by the first 4 blocks of 16 tokens" in note[0]
    assert "replayed at block size 32: not what routing the trace in one process" in note[0]
    text = cli("simulate-prefix", ph, *args).stdout
    assert "note: prefix-hash routed by the first 4 blocks of 16 tokens" in text
    # round-robin does not look at block sizes: the replay at 32 is routing at 32 in one process, and says so
    one = json.loads(cli("simulate-prefix", trace, "--replicas", "3", "--router", "round-robin", *args,
                         "-f", "json").stdout)
    many = json.loads(cli("simulate-prefix", rr, *args, "-f", "json").stdout)
    assert one["results"] == many["results"]
    assert any("written at block size 16; round-robin routing does not depend on it" in n for n in many["notes"])


def test_a_replaced_partition_file_is_refused_by_its_row_count(cli, tmp_path):
    pytest.importorskip("pyarrow")
    import shutil

    parts, written = _partition(cli, tmp_path, FIXTURES / "traces" / "fleet.jsonl", "--replicas", "3",
                                "--router", "prefix-hash")
    counts = [p["requests"] for p in written["partitions"]]
    assert counts[0] != counts[1]
    shutil.copy(parts / "replica-00000.parquet", parts / "replica-00001.parquet")
    r = cli("simulate-prefix", parts, "--capacity-blocks", "100")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"replica-00001.parquet: {counts[0]} rows, but manifest.json says {counts[1]} requests" in r.stderr


def test_a_folder_without_a_manifest_is_not_a_partition_directory(cli, tmp_path):
    pytest.importorskip("pyarrow")
    parts, _ = _partition(cli, tmp_path, RAG, "--replicas", "2", "--router", "round-robin")
    (parts / "manifest.json").unlink()
    for folder in (parts, tmp_path):          # a folder of .parquet files, a parent folder
        r = cli("simulate-prefix", folder, "--capacity-blocks", "100")
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "no manifest.json: not a partition directory (write one with --partition-dir)" in r.stderr


@pytest.mark.ray
def test_an_unreachable_ray_address_is_one_line_soon(cli, tmp_path):
    pytest.importorskip("pyarrow")
    pytest.importorskip("ray")
    import socket
    import time

    parts, _ = _partition(cli, tmp_path, RAG, "--replicas", "2", "--router", "round-robin")
    with socket.socket() as s:             # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    r = cli("simulate-prefix", parts, "--capacity-blocks", "100", "--ray", "--ray-address", f"127.0.0.1:{port}")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"--ray-address 127.0.0.1:{port}: cannot reach the Ray cluster" in r.stderr
    assert time.monotonic() - t0 < 30
    r = cli("simulate-prefix", parts, "--capacity-blocks", "100", "--ray", env={"RAY_ADDRESS": "nonsense"})
    assert r.exit_code == 2 and "RAY_ADDRESS nonsense: expected HOST:PORT" in r.stderr, r.stderr


def test_help_names_parquet_and_partition_directories(cli):
    out = cli("simulate-prefix", "--help").stdout
    assert "Parquet" in out and "partition directory written by --partition-dir" in " ".join(out.split())
