"""The one-pass capacity curve and the Belady bound, against independent single-capacity replays."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from cachectl.engines.prefix.curve import (
    capacity_curve,
    curve_capacities,
    key_trace,
    no_eviction_capacity,
    optimal_hits,
    resolve_warmup,
)
from cachectl.engines.prefix.replay import simulate
from cachectl.engines.prefix.trace import TraceRequest
from cachectl.errors import UsageError

from .reference_prefix import NaiveVllm


def make(trace, salts=None, **kw):
    return [TraceRequest(index=i, line=i + 1, prompt_tokens=len(t), tokens=list(t),
                         salt=salts[i] if salts else None, tenant=salts[i] if salts else None, **kw)
            for i, t in enumerate(trace)]


def shape(trace, dup_every=4):
    """Share prefixes (extend earlier requests) and repeat whole requests, some of a length that is a
    multiple of the block size, so that the L - 1 cap recomputes cached blocks (duplicate hashes)."""
    out = []
    for i, t in enumerate(trace):
        if i and i % 3 == 0:
            t = out[-1] + t
        elif i and i % dup_every == 0:
            t = list(out[i // 2])
        out.append(t)
    return out


def naive_hits(trace, salts, capacity, bs, warmup=0):
    pool = NaiveVllm(capacity, bs)
    hits = [pool.run(t, salts[i] if salts else None) for i, t in enumerate(trace)]
    return sum(hits[warmup:]), pool.evicted


token_lists = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=48), min_size=1, max_size=24)
salt_lists = st.lists(st.sampled_from([None, "a", "b"]), min_size=24, max_size=24)


@given(token_lists, st.sampled_from([1, 2, 4, 8]), salt_lists, st.integers(0, 30), st.booleans(),
       st.sampled_from(["builtin", "sha256"]))
@settings(max_examples=150, deadline=None)
def test_every_curve_point_equals_a_single_replay(trace, bs, salts, warm, use_salts, hash_fn):
    # (sha256 keys are bytes: the keyed store holds them in lists, the stack pass in a dict)
    trace = shape(trace)
    salts = salts[:len(trace)] if use_salts else None
    kt = key_trace(make(trace, salts), [bs], hash_fn=hash_fn)[bs]
    assert kt.requests.packed == (hash_fn == "builtin" or all(len(t) < bs for t in trace))  # (no key: packed)
    need = max(-(-len(t) // bs) for t in trace)
    assert kt.min_capacity_blocks == need
    warmup = min(warm, len(trace) - 1)
    caps = [max(1, need - 2), need - 1, need, need + 1, need + 3, 2 * need + 5, 1000]
    rep = capacity_curve(kt, [c for c in caps if c >= 1], warmup=warmup)
    assert rep.warmup_requests == warmup and rep.counted_requests == len(trace) - warmup
    for p in rep.points:
        if p.capacity_blocks < need:
            assert not p.fits and p.hit_rate is None
            continue
        assert p.fits
        hits, evicted = naive_hits(trace, salts, p.capacity_blocks, bs, warmup)
        assert p.hit_tokens == hits, p
        assert p.evicted_blocks == evicted
        single = simulate(make(trace, salts), block_size=bs, capacity_blocks=p.capacity_blocks, warmup=warmup)
        assert single.hit_tokens == p.hit_tokens and single.hit_rate == p.hit_rate


@given(token_lists, st.sampled_from([1, 4, 8]))
@settings(max_examples=80, deadline=None)
def test_automatic_curve_spans_minimum_to_ceiling(trace, bs):
    trace = shape(trace)
    kt = key_trace(make(trace), [bs])[bs]
    rep = capacity_curve(kt, points=12)
    caps = [p.capacity_blocks for p in rep.points]
    assert caps[0] == rep.min_capacity_blocks and caps[-1] == rep.ceiling_capacity_blocks
    assert caps == sorted(set(caps)) and all(p.fits for p in rep.points)
    top = rep.points[-1]
    inf = simulate(make(trace), policy="infinite", block_size=bs)
    # at the ceiling nothing is evicted and the hit rate is the infinite policy's
    assert top.evicted_blocks == 0 and top.hit_tokens == inf.hit_tokens and rep.ceiling_hit_rate == inf.hit_rate
    # ... and one block less does evict (the ceiling is the smallest such capacity), unless that is too small
    below = rep.ceiling_capacity_blocks - 1
    if below >= rep.min_capacity_blocks:
        assert simulate(make(trace), block_size=bs, capacity_blocks=below).evicted_blocks > 0


def test_too_small_points_are_reported_with_the_true_minimum():
    trace = [list(range(10)), list(range(100)), list(range(30))]   # the largest needs 25 blocks of 4
    kt = key_trace(make(trace), [4])[4]
    rep = capacity_curve(kt, [2, 10, 24, 25, 40])
    assert [p.fits for p in rep.points] == [False, False, False, True, True]
    assert rep.min_capacity_blocks == 25 and rep.min_capacity_line == 2
    assert "minimum is 25 blocks" in rep.notes[0] and "line 2" in rep.notes[0]
    assert rep.points[3].hit_tokens == naive_hits(trace, None, 25, 4)[0]


def test_concurrency_points_equal_single_concurrent_replays():
    import random

    rng = random.Random(5)
    base = [rng.randrange(5) for _ in range(64)]
    trace = [base[:rng.randrange(8, 64)] + [rng.randrange(5) for _ in range(rng.randrange(1, 20))]
             for _ in range(40)]
    reqs = [TraceRequest(index=i, line=i + 1, prompt_tokens=len(t), tokens=t, timestamp=i * 0.1,
                         output_tokens=rng.randrange(0, 30)) for i, t in enumerate(trace)]
    kt = key_trace(reqs, [4])[4]
    rep = capacity_curve(kt, [21, 30, 60, 200], concurrency=3, decode_s_per_token=0.05)
    for p in rep.points:
        single = simulate(reqs, block_size=4, capacity_blocks=p.capacity_blocks, concurrency=3,
                          decode_s_per_token=0.05)
        assert (p.hit_tokens, p.evicted_blocks) == (single.hit_tokens, single.evicted_blocks)


def test_mooncake_hash_ids_key_at_their_own_block_size_only():
    r = TraceRequest(index=0, line=1, prompt_tokens=1100, hash_ids=[1, 2, 3], hash_block_size=512)
    assert key_trace([r], [512])[512].min_capacity_blocks == 3
    with pytest.raises(UsageError, match="512-token blocks"):
        key_trace([r], [16])


def test_keyed_requests_give_back_each_request_as_keyed():
    # the packed store rebuilds each pre-keyed request as it was read: keys, length, line (or none), index,
    # tenant, time and output tokens; 64-bit keys come back as their rank among the distinct keys (the same
    # equalities, the same order); ids that are no 64-bit integers (Mooncake's may be strings) turn the store
    # to lists from there on, the requests before them kept as given
    reqs = [TraceRequest(index=5, line=None, prompt_tokens=40, hash_ids=[1, -2, 2**63 - 1], hash_block_size=8),
            TraceRequest(index=6, line=9, prompt_tokens=17, hash_ids=[3, 4], hash_block_size=8, tenant="t",
                         timestamp=1.5, output_tokens=7),
            TraceRequest(index=7, line=10, prompt_tokens=24, hash_ids=["a", "b", "c"], hash_block_size=8),
            TraceRequest(index=8, line=11, prompt_tokens=8, hash_ids=[2**64], hash_block_size=8)]
    for n in (2, 4):
        kept = key_trace(reqs[:n], [8])[8].requests
        assert len(kept) == n and kept.packed == (n == 2)
        given = [list(r.hash_ids)[:r.prompt_tokens // 8] for r in reqs[:n]]
        if n == 2:
            ranks = {k: i for i, k in enumerate(sorted({k for keys in given for k in keys}))}
            given = [[ranks[k] for k in keys] for keys in given]
            assert kept.distinct == len(ranks) == 5
        for r, keys, got in zip(reqs, given, kept):
            assert (list(got.hash_ids), got.prompt_tokens, got.line, got.index, got.tenant, got.timestamp,
                    got.output_tokens, got.hash_block_size) == (
                keys, r.prompt_tokens, r.line, r.index, r.tenant, r.timestamp, r.output_tokens, 8)
        assert [list(kept.keys(i)) for i in range(n)] == given
        assert list(kept.tokens) == [r.prompt_tokens for r in reqs[:n]] and kept[-1] == kept[n - 1]
        assert [x.index for x in kept[1:]] == [r.index for r in reqs[1:n]]


def test_warmup_share_and_count():
    assert resolve_warmup(0.5, 11) == 5 and resolve_warmup(3, 11) == 3 and resolve_warmup(None, 4) == 0
    assert resolve_warmup(3.0, 11) == 3
    with pytest.raises(UsageError):
        resolve_warmup(-1, 5)
    with pytest.raises(UsageError):
        resolve_warmup(2.5, 5)
    kt = key_trace(make([list(range(8))] * 3), [4])[4]
    with pytest.raises(UsageError, match="covers all 3"):
        capacity_curve(kt, [4], warmup=3)


def test_curve_capacities_are_log_spaced_and_distinct():
    caps = curve_capacities(247, 100_000, 32)
    assert caps[0] == 247 and caps[-1] == 100_000 and 30 <= len(caps) <= 32
    ratios = [b / a for a, b in zip(caps, caps[1:])]
    assert max(ratios) / min(ratios) < 1.05
    assert curve_capacities(5, 5) == [5] and curve_capacities(5, 7, 32) == [5, 6, 7]


# ------------------------------------------------------------------------------------------- optimal


class _TooBig(Exception):
    """The exhaustive search would visit more states than a test can afford."""


def brute_force_optimum(trace, capacity, bs, budget=200_000):
    """Most hit tokens over every choice of blocks to evict, under the same block rules (tiny traces only:
    past ``budget`` states it gives up with :class:`_TooBig`)."""
    best = 0
    visited = 0

    def keys_of(t):
        return [tuple(t[:(i + 1) * bs]) for i in range(len(t) // bs)]

    def go(r, cached, total):
        nonlocal best, visited
        visited += 1
        if visited > budget:
            raise _TooBig
        if r == len(trace):
            best = max(best, total)
            return
        t = trace[r]
        ks = keys_of(t)
        limit = min(len(ks), (len(t) - 1) // bs)
        nh = 0
        while nh < limit and ks[nh] in cached:
            nh += 1
        need = -(-len(t) // bs) - nh
        free = capacity - len(cached)
        evictable = sorted(cached - set(ks[:nh]))
        n_out = max(0, need - free)
        for out in itertools.combinations(evictable, n_out):
            kept = (cached - set(out)) | set(ks)
            # after the request its blocks are free again: any subset may be dropped, but a cache never
            # gains from dropping (the rules never force a bypass), so keep them all
            go(r + 1, frozenset(kept), total + nh * bs)

    go(0, frozenset(), 0)
    return best


@given(st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=9), min_size=1, max_size=7),
       st.sampled_from([1, 2, 3]), st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_belady_bound_is_the_optimum_on_tiny_traces(trace, bs, extra):
    trace = shape(trace, dup_every=2)
    kt = key_trace(make(trace), [bs])[bs]
    cap = kt.min_capacity_blocks + extra
    opt = optimal_hits(kt, cap)
    try:
        best = brute_force_optimum(trace, cap, bs)
    except _TooBig:  # an exponential search (a few examples in a thousand): not a tiny trace
        reject()
    assert opt == best


@given(token_lists, st.sampled_from([1, 2, 4, 8]), st.integers(0, 12), salt_lists)
@settings(max_examples=120, deadline=None)
def test_belady_bound_is_at_least_lru_and_at_most_the_ceiling(trace, bs, extra, salts):
    trace = shape(trace)
    kt = key_trace(make(trace, salts[:len(trace)]), [bs])[bs]
    cap = kt.min_capacity_blocks + extra
    lru = naive_hits(trace, salts[:len(trace)], cap, bs)[0]
    ceiling = simulate(make(trace, salts[:len(trace)]), policy="infinite", block_size=bs).hit_tokens
    assert lru <= optimal_hits(kt, cap) <= ceiling
    assert optimal_hits(kt, no_eviction_capacity(kt)) == ceiling


# ------------------------------------------------------------------------------------------------ CLI


def _trace(write, rows, name="trace.jsonl"):
    import json

    return write(name, "\n".join(json.dumps(r) for r in rows) + "\n")


def test_cli_curve_from_stdin_equals_single_runs(cli, write):
    import json

    rows = [{"tokens": list(range(i % 5 * 50, i % 5 * 50 + 64 + i % 3))} for i in range(30)]
    path = _trace(write, rows)
    text = path.read_text()
    r = cli("simulate-prefix", "-", "--curve", "--curve-points", "6", "--optimal", "-f", "json", input=text)
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["mode"] == "curve" and len(d["sweep"]) >= 5
    c = d["curves"][0]
    assert c["min_capacity_blocks"] == 5 and d["sweep"][0]["capacity_blocks"] == 5
    assert d["sweep"][-1]["capacity_blocks"] == c["ceiling_capacity_blocks"]
    for p in d["sweep"]:
        one = json.loads(cli("simulate-prefix", path, "--capacity-blocks", p["capacity_blocks"], "-f", "json").stdout)
        assert one["hit_tokens"] == p["hit_tokens"] and one["evicted_blocks"] == p["evicted_blocks"]
        assert p["hit_rate"] <= p["optimal_hit_rate"] <= c["ceiling_hit_rate"]


def test_cli_too_small_points_do_not_abort_the_sweep(cli, write):
    import json

    path = _trace(write, [{"tokens": list(range(40))}, {"tokens": list(range(100))}, {"tokens": list(range(40))}])
    r = cli("simulate-prefix", path, "--sweep-capacity", "2,6,7,20", "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert [p["fits"] for p in d["sweep"]] == [False, False, True, True]
    assert d["curves"][0]["min_capacity_blocks"] == 7 and d["curves"][0]["min_capacity_line"] == 2
    text = cli("simulate-prefix", path, "--sweep-capacity", "2,20")
    assert "too small" in text.stdout and "minimum is 7 blocks" in text.stdout
    none = cli("simulate-prefix", path, "--sweep-capacity", "2,3")
    assert none.exit_code == 2 and "the minimum that works is 7 blocks" in none.stderr
    assert none.stderr.count("\n") == 1


def test_cli_warmup_is_not_counted(cli, write):
    import json

    rows = [{"tokens": list(range(64))}] * 4
    path = _trace(write, rows)
    d = json.loads(cli("simulate-prefix", path, "--capacity-blocks", "10", "--warmup", "1", "-f", "json").stdout)
    assert (d["requests"], d["hit_tokens"], d["warmup_requests"]) == (3, 3 * 48, 1)
    half = json.loads(cli("simulate-prefix", path, "--capacity-blocks", "10", "--warmup", "0.5", "-f", "json").stdout)
    assert (half["requests"], half["warmup_requests"], half["hit_rate"]) == (2, 2, 0.75)
    stdin = cli("simulate-prefix", "-", "--capacity-blocks", "10", "--warmup", "0.5", input=path.read_text())
    assert stdin.exit_code == 0 and "not counted" in stdin.stdout
    bad = cli("simulate-prefix", path, "--capacity-blocks", "10", "--warmup", "x")
    assert bad.exit_code == 2 and "--warmup" in bad.stderr
    every = cli("simulate-prefix", path, "--capacity-blocks", "10", "--warmup", "4")
    assert every.exit_code == 2 and "--warmup covers all 4" in every.stderr


def test_cli_generation_prompt_is_added_to_chat_requests(cli, write, tok):
    import json

    from cachectl.inputs import prompt_from_value

    from .conftest import TOK_DIR

    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi there"}]
    path = _trace(write, [{"messages": msgs}])
    p = prompt_from_value({"messages": msgs}, source="x", line=1)
    with_gen = len(tok.tokenize_many([p], add_generation_prompt=True)[0].ids)
    without = len(tok.tokenize_many([p], add_generation_prompt=False)[0].ids)
    assert with_gen > without
    d = json.loads(cli("simulate-prefix", path, "--capacity-blocks", "100", "--tokenizer", TOK_DIR, "-f", "json").stdout)
    assert d["query_tokens"] == with_gen and d["chat_generation_prompt"] is True
    d = json.loads(cli("simulate-prefix", path, "--capacity-blocks", "100", "--tokenizer", TOK_DIR,
                       "--no-generation-prompt", "-f", "json").stdout)
    assert d["query_tokens"] == without and d["chat_generation_prompt"] is False
    tokens = _trace(write, [{"tokens": [1, 2, 3]}], "ids.jsonl")
    assert json.loads(cli("simulate-prefix", tokens, "--capacity-blocks", "4", "-f", "json").stdout)[
        "chat_generation_prompt"] is None


def test_cli_capacity_gib_with_a_catalog_model(cli, write):
    import json

    from cachectl.engines.kv.config import blocks_for_memory, kv_shape, resolve_model

    path = _trace(write, [{"tokens": list(range(32))}])
    r = cli("simulate-prefix", path, "--capacity-gib", "1", "--model", "llama-3.1-8b", "-f", "json")
    assert r.exit_code == 0, r.stderr
    config, source, _ = resolve_model("llama-3.1-8b")
    assert json.loads(r.stdout)["capacity_blocks"] == blocks_for_memory(1, kv_shape(config).bytes_per_token, 16)
    assert json.loads(r.stdout)["capacity_blocks"] == 512  # 128 KiB per token at bf16: 8,192 tokens, 512 blocks of 16
    bad = cli("simulate-prefix", path, "--capacity-gib", "1", "--model", "no-such-model")
    assert bad.exit_code == 2 and "not a local path, a catalog name" in bad.stderr


def test_cli_gzip_trace(cli, write):
    import gzip
    import json

    rows = [{"tokens": list(range(64))}] * 3
    path = write("trace.jsonl.gz", gzip.compress(("\n".join(json.dumps(r) for r in rows) + "\n").encode()))
    d = json.loads(cli("simulate-prefix", path, "--curve", "-f", "json").stdout)
    assert d["sweep"][0]["hit_tokens"] == 2 * 48


def test_cli_zstd_trace_through_pyarrow(cli, write, tmp_path, monkeypatch):
    """A zstd-compressed trace (file or stdin) reads as the plain one; a cut one is an error, not a short
    count; without pyarrow, one line says what to install."""
    import json
    import random
    import sys

    pa = pytest.importorskip("pyarrow")
    rng = random.Random(2)
    text = "".join(json.dumps({"tokens": [rng.randrange(6) for _ in range(rng.randrange(1, 60))]}) + "\n"
                   for _ in range(300))
    plain = write("trace.jsonl", text)
    packed = tmp_path / "trace.jsonl.zst"
    with pa.CompressedOutputStream(str(packed), "zstd") as out:
        out.write(text.encode())
    assert packed.read_bytes()[:4] == b"\x28\xb5\x2f\xfd" and packed.stat().st_size < len(text) // 2
    args = ["--capacity-blocks", "40", "--block-size", "4", "-f", "json"]
    want = cli("simulate-prefix", plain, *args)
    assert want.exit_code == 0 and json.loads(want.stdout)["hit_tokens"] > 0
    assert cli("simulate-prefix", packed, *args).stdout == want.stdout
    import subprocess

    piped = subprocess.run([sys.executable, "-m", "cachectl", "simulate-prefix", "-", *args],
                           input=packed.read_bytes(), capture_output=True, timeout=120)  # a real pipe (peek)
    assert piped.returncode == 0 and piped.stdout.decode() == want.stdout
    curve = ["--curve", "--curve-points", "4", "--block-size", "4", "-f", "json"]
    assert cli("simulate-prefix", packed, *curve).stdout == cli("simulate-prefix", plain, *curve).stdout
    cut = write("cut.jsonl.zst", packed.read_bytes()[:packed.stat().st_size // 2])
    r = cli("simulate-prefix", cut, *args)
    assert r.exit_code == 2 and r.stderr.strip() == f"cachectl: error: {cut}: corrupt zstd data (Truncated compressed stream)"
    assert r.stdout == ""
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    r = cli("simulate-prefix", packed, *args)
    assert r.exit_code == 2 and "needs pyarrow (pip install 'llm-cachectl[parquet]')" in r.stderr


# ----------------------------------------------------------------------------------------- stack pass


@given(token_lists, st.sampled_from([1, 2, 4, 8]), salt_lists, st.integers(0, 30), st.integers(0, 3))
@settings(max_examples=250, deadline=None)
def test_stack_pass_equals_the_naive_reference_at_every_capacity(trace, bs, salts, warm, shaping):
    """No point is replayed: the one stack pass (with stale duplicate blocks followed per capacity) is exact."""
    if shaping == 1:
        trace = shape(trace)
    elif shaping == 2:   # chat-like: every request extends an earlier one or starts afresh
        out = []
        for i, t in enumerate(trace):
            out.append(out[i // 2] + t if i and i % 2 else t)
        trace = out
    elif shaping == 3:   # many whole repeats of block-aligned prompts: duplicates everywhere
        trace = [list(t[:bs * max(1, len(t) // bs)]) * 1 for t in trace]
        trace = [t if i % 2 == 0 or i < 2 else trace[i - 2] for i, t in enumerate(trace)]
    salts = salts[:len(trace)]
    warmup = min(warm, len(trace) - 1)
    kt = key_trace(make(trace, salts), [bs])[bs]
    need = kt.min_capacity_blocks
    rep = capacity_curve(kt, list(range(need, need + 40)), warmup=warmup)
    assert rep.replayed_points == 0
    for p in rep.points:
        hits, evicted = naive_hits(trace, salts, p.capacity_blocks, bs, warmup)
        assert (p.hit_tokens, p.evicted_blocks) == (hits, evicted), p.capacity_blocks


def test_duplicate_blocks_are_followed_without_replay():
    a, b = list(range(16)), [50 + i for i in range(12)]
    trace = [a, b, a, b, a, list(range(20)), a, [7] * 16, a]   # a is block-aligned (4 blocks of 4): repeating
    kt = key_trace(make(trace), [4])[4]                         # it whole recomputes its cached last block
    rep = capacity_curve(kt, list(range(5, 30)))
    assert rep.replayed_points == 0
    for p in rep.points:
        assert (p.hit_tokens, p.evicted_blocks) == naive_hits(trace, None, p.capacity_blocks, 4)


def test_unchained_hash_ids_fall_back_to_replays():
    from cachectl.engines.prefix.curve import _stack_pass

    rs = [TraceRequest(index=i, line=i + 1, prompt_tokens=1536, hash_ids=ids, hash_block_size=512)
          for i, ids in enumerate([[1, 2, 3], [9, 2, 3], [1, 2, 3]])]
    kt = key_trace(rs, [512])[512]
    assert _stack_pass(kt, 0) is None
    rep = capacity_curve(kt, [3, 4, 6])
    for p in rep.points:
        assert p.hit_tokens == simulate(rs, block_size=512, capacity_blocks=p.capacity_blocks).hit_tokens


def test_cli_mooncake_fixture_curve_points_equal_single_runs(cli):
    import json

    from .conftest import FIXTURES

    trace = FIXTURES / "traces" / "mooncake_conv.jsonl"
    d = json.loads(cli("simulate-prefix", trace, "--block-size", "512", "--curve", "--curve-points", "5",
                       "-f", "json").stdout)
    c = d["curves"][0]
    assert c["requests"] == 1500 and c["replayed_points"] == 0
    for p in d["sweep"][:3]:
        one = json.loads(cli("simulate-prefix", trace, "--block-size", "512", "--capacity-blocks",
                             p["capacity_blocks"], "-f", "json").stdout)
        assert (one["hit_tokens"], one["evicted_blocks"]) == (p["hit_tokens"], p["evicted_blocks"])
    assert d["sweep"][-1]["hit_rate"] == c["ceiling_hit_rate"]


def test_cli_single_run_too_small_names_the_true_minimum(cli, write):
    rows = [{"tokens": list(range(40))}, {"tokens": list(range(200))}, {"tokens": list(range(500))},
            {"tokens": list(range(30))}]
    path = _trace(write, rows)
    r = cli("simulate-prefix", path, "--capacity-blocks", "5")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    # the first request that does not fit needs 13 blocks, but the largest (line 3) needs 32
    assert "at least 13" in r.stderr and "the whole trace needs 32 blocks of 16 (its largest request, line 3)" \
        in r.stderr


@given(st.lists(st.lists(st.integers(0, 40), max_size=12), max_size=30), st.integers(0, 30))
@settings(max_examples=100, deadline=None)
def test_the_unbounded_pool_sees_keys_as_a_set_does(requests, switch):
    """The ceiling's keys seen (the store's numbers of 64-bit keys, a set once a key is not one) answer as a set
    does, across the switch (keys that were ints, then bytes); the store numbers the keys as a set sees them."""
    from cachectl.engines.prefix.curve import KeyedRequests, _Unbounded

    pool, plain, store = _Unbounded(), set(), KeyedRequests(1)
    for r, keys in enumerate(requests):
        keys = keys if r < switch else [k.to_bytes(2, "little") if k % 2 else k for k in keys]
        limit = len(keys) - 1 if keys else 0
        want = next((i for i, k in enumerate(keys[:limit]) if k not in plain), limit)
        marks = store.append(TraceRequest(index=r, line=None, prompt_tokens=len(keys)), keys)
        if marks is not None:
            assert [m >= 0 for m in marks] == [k in plain for k in keys]
        assert pool.seen_then_add(keys, limit, marks, store) == want
        plain.update(keys)
    store.seal()
    if store.packed:
        assert pool.seen is None and store.distinct == len(plain)
        ranks = {k: i for i, k in enumerate(sorted(plain))}
        assert [list(store.keys(r)) for r in range(len(store))] == [[ranks[k] for k in keys] for keys in requests]
    else:
        assert pool.seen == plain


@given(token_lists, st.sampled_from([1, 2, 4]))
@settings(max_examples=60, deadline=None)
def test_the_ceiling_is_the_same_whichever_keys(trace, bs):
    trace = shape(trace)
    a, b = (key_trace(make(trace), [bs], hash_fn=h)[bs] for h in ("builtin", "sha256"))
    assert a.unbounded_blocks == b.unbounded_blocks and a.min_capacity_blocks == b.min_capacity_blocks
