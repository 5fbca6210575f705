"""simulate-prefix: hand-checked vLLM rules, a naive reference, the other policies, the CLI."""

from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines.prefix.pools import CapacityError
from cachectl.engines.prefix.replay import simulate
from cachectl.engines.prefix.trace import TraceRequest
from cachectl.errors import UsageError

from .reference_prefix import NaiveVllm


def reqs(*token_lists, salts=None, **kw):
    out = []
    for i, toks in enumerate(token_lists):
        salt = salts[i] if salts else None
        out.append(TraceRequest(index=i, line=i + 1, prompt_tokens=len(toks), tokens=list(toks), salt=salt,
                                tenant=salt, **kw))
    return out


def hits(report):
    return [r.hit_tokens for r in report.per_request]


def run(*token_lists, policy="vllm", block_size=16, capacity=100, salts=None, **kw):
    return simulate(reqs(*token_lists, salts=salts), policy=policy, block_size=block_size,
                    capacity_blocks=capacity, per_request=True, **kw)


# ------------------------------------------------------------------------------------------- vLLM rules


def test_fully_cached_prompt_hits_all_but_the_last_block():
    # a fully cached 32-token prompt at bs=16 hits 16 tokens, not 32 (the last token is recomputed)
    assert hits(run(range(32), range(32))) == [0, 16]
    assert hits(run(range(33), range(33))) == [0, 32]


def test_partial_tail_block_never_hits():
    r = run(range(20), range(20), range(40))
    assert hits(r) == [0, 16, 16]


def test_tail_blocks_are_evicted_before_the_head():
    a = list(range(16))                     # 4 blocks of 4
    b = [100 + i for i in range(8)]         # 2 new blocks
    r = run(a, b, a, block_size=4, capacity=4)
    # freeing A appends A3, A2, A1, A0: B's two blocks take A3 and A2, so A's head (8 tokens) still hits
    assert hits(r) == [0, 0, 8]
    assert r.evicted_blocks == 2 + 2        # B evicts A3, A2; A again evicts B's two blocks


def test_unhashed_partial_block_goes_to_the_front():
    x = list(range(10))                     # 2 full blocks + a partial one, at bs=4
    y = [50, 51, 52, 53]
    r = run(x, y, x, block_size=4, capacity=3)
    # Y takes the freed partial block from the front (no eviction), so X still hits both full blocks; only
    # X's return evicts Y's block. Were the partial block at the back, Y would evict X1 and X would hit 0.
    assert hits(r) == [0, 0, 8] and r.evicted_blocks == 1


def test_freed_blocks_stay_hittable_until_reused():
    r = run(range(64), [999] * 16, range(64), block_size=16, capacity=5)
    assert hits(r) == [0, 0, 48]


def test_salt_isolates_tenants():
    r = run(range(64), range(64), range(64), salts=["a", "b", "a"])
    assert hits(r) == [0, 0, 48]
    assert r.cross_tenant_shared_blocks == 0
    assert {t.tenant: t.hit_tokens for t in r.per_tenant} == {"a": 48, "b": 0}


def test_unsalted_tenants_share_blocks_and_it_is_reported():
    rs = [TraceRequest(index=i, line=i + 1, prompt_tokens=64, tokens=list(range(64)), tenant=t)
          for i, t in enumerate(["a", "b"])]
    r = simulate(rs, capacity_blocks=100)
    assert r.hit_tokens == 48 and r.cross_tenant_shared_blocks == 3


def test_capacity_smaller_than_one_request():
    with pytest.raises(CapacityError, match="needs 3 blocks of 16 but the capacity is 2"):
        run(range(40), capacity=2)


def test_sha256_keys_give_the_same_hits():
    trace = [list(range(40)), list(range(36)) + [7, 7, 7], list(range(48))]
    assert hits(run(*trace, hash_fn="sha256")) == hits(run(*trace))


def test_mooncake_hash_ids():
    r1 = TraceRequest(index=0, line=1, prompt_tokens=1100, hash_ids=[1, 2, 3], hash_block_size=512)
    r2 = TraceRequest(index=1, line=2, prompt_tokens=1100, hash_ids=[1, 2, 3], hash_block_size=512)
    r3 = TraceRequest(index=2, line=3, prompt_tokens=2048, hash_ids=[1, 2, 9, 10], hash_block_size=512)
    r = simulate([r1, r2, r3], block_size=512, capacity_blocks=20, per_request=True)
    # the third id covers a partial block (1100 - 1024 tokens): never hashed, never hit
    assert hits(r) == [0, 1024, 1024]


def test_concurrent_requests_pin_their_blocks():
    a = TraceRequest(index=0, line=1, prompt_tokens=16, tokens=list(range(16)), timestamp=0.0, output_tokens=100)
    b = TraceRequest(index=1, line=2, prompt_tokens=8, tokens=[90] * 8, timestamp=0.5, output_tokens=0)
    c = TraceRequest(index=2, line=3, prompt_tokens=16, tokens=list(range(16)), timestamp=0.6, output_tokens=0)
    r = simulate([a, b, c], block_size=4, capacity_blocks=5, concurrency=2, per_request=True)
    # A holds 4 of 5 blocks until it finishes at t=2.0, so B (2 blocks) waits; B then takes the never-used
    # block and evicts A's tail block only, so C hits A's other three blocks (the L - 1 cap allows 3)
    assert hits(r) == [0, 0, 12]
    assert r.evicted_blocks == 2  # A's tail for B, then B's tail for C's recomputed last block
    assert r.peak_blocks_in_use == 4


# ----------------------------------------------------------------------------------- reference checks

token_lists = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=60), min_size=1, max_size=25)


@given(token_lists, st.sampled_from([1, 2, 4, 16]), st.integers(0, 10), st.lists(st.sampled_from([None, "a", "b"]),
                                                                                 min_size=25, max_size=25))
@settings(max_examples=300, deadline=None)
def test_engine_equals_naive_reference(trace, bs, extra_capacity, salts):
    # some requests share long prefixes: extend earlier ones
    trace = [t if i == 0 or i % 3 else trace[i - 1] + t for i, t in enumerate(trace)]
    capacity = max(-(-len(t) // bs) for t in trace) + extra_capacity
    naive = NaiveVllm(capacity, bs)
    expected = [naive.run(t, salts[i]) for i, t in enumerate(trace)]
    r = run(*trace, block_size=bs, capacity=capacity, salts=salts[:len(trace)])
    assert hits(r) == expected
    assert r.evicted_blocks == naive.evicted
    assert all(h <= max(0, len(t) - 1) for h, t in zip(expected, trace))


@given(token_lists, st.sampled_from([1, 4, 16]))
@settings(max_examples=150, deadline=None)
def test_policy_ordering_on_unbounded_memory(trace, bs):
    trace = [t if i == 0 or i % 2 else trace[i - 1] + t for i, t in enumerate(trace)]
    inf = hits(run(*trace, policy="infinite", block_size=bs, capacity=None))
    big = hits(run(*trace, block_size=bs, capacity=sum(-(-len(t) // bs) for t in trace) + 1))
    radix = hits(run(*trace, policy="radix", block_size=bs, capacity=None))
    assert inf == big                                  # nothing evicted: vllm reaches the ceiling
    assert all(r >= i for r, i in zip(radix, inf))     # token-level >= block-level
    assert all(r <= len(t) - 1 for r, t in zip(radix, trace))


@given(token_lists, st.sampled_from([1, 4, 16]), st.lists(st.sampled_from([None, "a", "b", 7]), min_size=25, max_size=25),
       st.sampled_from(["builtin", "sha256", "big_ids"]))
@settings(max_examples=150, deadline=None)
def test_compact_infinite_keys_replay_as_the_dict_does(trace, bs, tenants, keys):
    # the compact key table (fix and report's replays) against the dict simulate-prefix keeps: the same hits,
    # cross-tenant hits and peak, over builtin keys, sha256 digests, and hash IDs past 64 bits beside small ones
    trace = [t if i == 0 or i % 3 else trace[i - 1] + t for i, t in enumerate(trace)]

    def requests():
        for i, t in enumerate(trace):
            if keys == "big_ids":  # Mooncake-style hash IDs, some past 64 bits, some negative
                n = len(t) // bs
                ids = [(sum(t[:(j + 1) * bs]) * (-1) ** j) << (70 * (j % 2)) for j in range(n)]
                yield TraceRequest(index=i, line=i + 1, prompt_tokens=len(t), hash_ids=ids, hash_block_size=bs,
                                   tenant=tenants[i])
            else:
                yield TraceRequest(index=i, line=i + 1, prompt_tokens=len(t), tokens=list(t), tenant=tenants[i])

    hash_fn = "sha256" if keys == "sha256" else "builtin"
    plain = simulate(requests(), policy="infinite", block_size=bs, per_request=True, hash_fn=hash_fn)
    compact = simulate(requests(), policy="infinite", block_size=bs, per_request=True, hash_fn=hash_fn, compact=True)
    assert hits(compact) == hits(plain)
    assert compact.peak_blocks_in_use == plain.peak_blocks_in_use
    assert compact.cross_tenant_shared_blocks == plain.cross_tenant_shared_blocks
    assert compact == plain
    # the hits alone, into an array (what the fork analysis reads), without the rows: the rows' hits, in order
    into = array("q")
    bare = simulate(requests(), policy="infinite", block_size=bs, hash_fn=hash_fn, compact=True, hits_into=into)
    assert list(into) == hits(plain) and bare.per_request is None and bare.hit_tokens == plain.hit_tokens


def test_hits_into_at_capacity_and_not_for_the_chunk_policy():
    trace = [TraceRequest(index=i, line=i + 1, prompt_tokens=len(t), tokens=t)
             for i, t in enumerate([list(range(40)), list(range(40)), [9] * 40, list(range(40))])]
    into = array("q")
    rows = simulate(trace, policy="vllm", block_size=4, capacity_blocks=12, per_request=True)
    simulate(trace, policy="vllm", block_size=4, capacity_blocks=12, hits_into=into)
    assert list(into) == hits(rows) and 0 in into and max(into) > 0
    with pytest.raises(UsageError, match="whole tokens"):
        simulate(trace, policy="chunk", block_size=4, hits_into=array("q"))


# ----------------------------------------------------------------------------------------- other policies


def test_radix_token_level_and_eviction():
    # block size 1: SGLang's default page size, token-level matching (what --policy radix did at any block size)
    r = run(range(30), range(20), range(30), policy="radix", capacity=None, block_size=1)
    assert hits(r) == [0, 19, 29]
    small = run(range(30), [9] * 30, range(30), policy="radix", capacity=48, block_size=1)  # 48 tokens
    assert hits(small) == [0, 0, 0] and small.evicted_tokens >= 30 and small.peak_blocks_in_use <= 48
    # block size 16 is the page size: whole pages only
    paged = run(range(30), range(20), range(30), policy="radix", capacity=None, block_size=16)
    assert hits(paged) == [0, 16, 16]


def test_radix_salt_isolation():
    r = run(range(30), range(30), policy="radix", capacity=None, salts=["a", "b"])
    assert hits(r) == [0, 0] and r.cross_tenant_shared_blocks == 0


def test_chunk_reuse_out_of_order_is_an_upper_bound():
    c1, c2, c3 = [1] * 256, [2] * 256, [3] * 256
    r = run(c1 + c2 + c3, c3 + c2 + c1 + [0], policy="chunk", capacity=None, recompute_ratio=0.15)
    # every chunk of the second request was seen, none at its prefix position: 768 x 0.85
    assert hits(r) == [0, pytest.approx(768 * 0.85)]
    assert r.upper_bound and any("upper bound" in n for n in r.notes)
    prefix_order = run(c1 + c2 + c3, c1 + c2 + c3 + [0], policy="chunk", capacity=None)
    assert hits(prefix_order) == [0, 768]


def test_vllm_needs_capacity():
    from cachectl.errors import UsageError

    with pytest.raises(UsageError, match="--capacity-blocks"):
        run(range(10), capacity=None)


# ------------------------------------------------------------------------------------------------ CLI


def write_trace(write, rows, name="trace.jsonl"):
    return write(name, "\n".join(json.dumps(r) for r in rows) + "\n")


def test_cli_json_contract(cli, write):
    path = write_trace(write, [{"tokens": list(range(32))}, {"tokens": list(range(32))}, {"tokens": list(range(40))}])
    r = cli("simulate-prefix", path, "--capacity-blocks", "10", "--per-request", "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert {"schema_version", "requests", "query_tokens", "hit_tokens", "hit_rate", "evicted_blocks",
            "per_request"} <= set(d)
    assert (d["requests"], d["query_tokens"], d["hit_tokens"]) == (3, 104, 48)
    assert [(p["index"], p["prompt_tokens"], p["hit_tokens"]) for p in d["per_request"]] == [(0, 32, 0), (1, 32, 16),
                                                                                             (2, 40, 32)]


def test_cli_text_and_tokenizer_path(cli, write):
    from .conftest import TOK_DIR

    sys_prompt = "You are a helpful assistant. " * 20
    path = write_trace(write, [{"messages": [{"role": "system", "content": sys_prompt},
                                             {"role": "user", "content": f"question {i}"}], "salt": "t1"}
                               for i in range(3)])
    r = cli("simulate-prefix", path, "--capacity-blocks", "100", "--tokenizer", TOK_DIR)
    assert r.exit_code == 0, r.stderr
    assert "hit rate" in r.stdout and "t1" in r.stdout


def test_cli_sweep_and_plot(cli, write, tmp_path):
    rows = [{"tokens": list(range(i % 5 * 50, i % 5 * 50 + 64))} for i in range(20)]
    path = write_trace(write, rows)
    png = tmp_path / "sweep.png"
    r = cli("simulate-prefix", path, "--sweep-capacity", "8,16,64", "--sweep-block-size", "8,16", "--plot", png,
            "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["sweep"]) == 6
    by = {(x["block_size"], x["capacity_blocks"]): x["hit_rate"] for x in d["sweep"]}
    assert by[(16, 64)] >= by[(16, 16)] >= by[(16, 8)] and by[(8, 64)] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_capacity_gib_from_a_model_config(cli, write, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "hidden_size": 64}))
    path = write_trace(write, [{"tokens": list(range(32))}])
    r = cli("simulate-prefix", path, "--capacity-gib", "0.001", "--model", cfg, "-f", "json")
    assert r.exit_code == 0, r.stderr
    # 2 (K,V) x 2 layers x 2 heads x 16 dims x 2 bytes = 256 bytes/token; 0.001 GiB / (256 x 16) = 262 blocks
    assert json.loads(r.stdout)["capacity_blocks"] == int(0.001 * 1024 ** 3 // (256 * 16))


@pytest.mark.parametrize("rows, args, expect", [
    ([{"foo": 1}], ["--capacity-blocks", "4"], "trace.jsonl:1: no tokens"),
    ([{"tokens": [1, -2]}], ["--capacity-blocks", "4"], "trace.jsonl:1: field 'tokens[1]': token ID -2 is not a non-negative"),
    ([{"tokens": [1, 2.5]}], ["--capacity-blocks", "4"], "field 'tokens[1]'"),
    ([{"tokens": [1, True]}], ["--capacity-blocks", "4"], "field 'tokens[1]': token ID True is not"),
    ([{"tokens": [1, 2 ** 70]}], ["--capacity-blocks", "4"], "field 'tokens[1]'"),
    ([{"tokens": list(range(40))}], ["--capacity-blocks", "2"], "the capacity is 2"),
    ([{"hash_ids": [1, 2], "input_length": 5000}], ["--capacity-blocks", "4", "--block-size", "512"],
     "do not cover input_length"),
    ([{"prompt": "hi"}], ["--capacity-blocks", "4"], "needs --tokenizer"),
])
def test_cli_bad_input(cli, write, rows, args, expect):
    path = write_trace(write, rows)
    r = cli("simulate-prefix", path, *args)
    assert r.exit_code == 2 and expect in r.stderr and r.stderr.count("\n") == 1


@given(token_lists, st.sampled_from([1, 2, 4, 16]), st.integers(0, 10))
@settings(max_examples=200, deadline=None)
def test_general_pool_equals_naive_reference(trace, bs, extra_capacity):
    """The ref-counted pool (used with --concurrency) replays sequential traffic like the reference."""
    from cachectl.engines.prefix.pools import VllmBlockPool
    from cachectl.engines.prefix.trace import block_keys

    trace = [t if i == 0 or i % 3 else trace[i - 1] + t for i, t in enumerate(trace)]
    capacity = max(-(-len(t) // bs) for t in trace) + extra_capacity
    naive, pool = NaiveVllm(capacity, bs), VllmBlockPool(capacity, bs)
    for t in trace:
        keys = block_keys(t, bs)
        hit = pool.lookup(keys, len(t))
        blocks = pool.admit(keys, len(t), hit)
        pool.free(blocks)
        assert len(hit) * bs == naive.run(t)
    assert pool.evicted == naive.evicted


def test_cli_no_salt_reveals_cross_tenant_sharing(cli):
    from .conftest import FIXTURES

    trace = FIXTURES / "traces" / "rag.jsonl"
    salted = json.loads(cli("simulate-prefix", trace, "--capacity-blocks", "300", "-f", "json").stdout)
    open_ = json.loads(cli("simulate-prefix", trace, "--capacity-blocks", "300", "--tenant-field", "salt",
                           "--no-salt", "-f", "json").stdout)
    assert salted["cross_tenant_shared_blocks"] == 0
    assert open_["cross_tenant_shared_blocks"] > 0 and open_["hit_tokens"] > salted["hit_tokens"]
    assert {t["tenant"] for t in open_["per_tenant"]} == {"acme", "globex"}


@given(token_lists, st.sampled_from([1, 2, 4, 16]), st.integers(0, 10),
       st.lists(st.sampled_from([None, "a", "b"]), min_size=25, max_size=25), st.booleans())
@settings(max_examples=300, deadline=None)
def test_both_sequential_pools_equal_the_naive_reference(trace, bs, extra_capacity, salts, repeats):
    """The key-level LRU (hand-over to blocks on the first duplicate) and the block-level pool, alone."""
    from cachectl.engines.prefix.lru import LruKeyPool
    from cachectl.engines.prefix.pools import SequentialVllmPool
    from cachectl.engines.prefix.trace import block_keys

    if repeats:   # whole repeats: block-aligned ones recompute a cached last block (duplicates, hand-over)
        trace = [t if i == 0 or i % 3 else list(trace[i // 2]) for i, t in enumerate(trace)]
    else:         # conversations: extend earlier requests
        trace = [t if i == 0 or i % 2 else trace[i // 2] + t for i, t in enumerate(trace)]
    capacity = max(-(-len(t) // bs) for t in trace) + extra_capacity
    naive = NaiveVllm(capacity, bs)
    pools = [LruKeyPool(capacity, bs), SequentialVllmPool(capacity, bs)]
    for i, t in enumerate(trace):
        expected = naive.run(t, salts[i])
        keys = block_keys(t, bs, salts[i])
        assert [p.run(keys, len(t), salts[i]) for p in pools] == [expected, expected]
    assert [p.evicted for p in pools] == [naive.evicted] * 2
    assert pools[0].cross_tenant_hits == pools[1].cross_tenant_hits
    assert pools[0].peak_in_use == pools[1].peak_in_use


def test_salt_field_absent_on_a_line_is_an_unsalted_request_and_counted(cli, write):
    shared = list(range(100, 164))                      # 4 full blocks of 16
    rows = [{"tokens": shared + [1], "tenant_salt": "a"}, {"tokens": shared + [2]},
            {"tokens": shared + [3], "tenant_salt": "b"}, {"tokens": shared + [4]}]
    trace = write("t.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    r = cli("simulate-prefix", trace, "--policy", "infinite", "--salt-field", "tenant_salt", "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["unsalted_requests"] == 2
    # the two unsalted requests share one cache; each salted one is alone: only the 4th request hits (4 blocks,
    # capped at L - 1 = 64 tokens -> 64)
    assert d["hit_tokens"] == 64
    text = cli("simulate-prefix", trace, "--policy", "infinite", "--salt-field", "tenant_salt").stdout
    assert "2 of 4 requests have no 'tenant_salt': cached unsalted" in text


def test_tenant_field_absent_is_said(cli, write):
    trace = write("t.jsonl", "\n".join(json.dumps({"tokens": list(range(10, 50)), "org": o})
                                       for o in ("x", None, "y")).replace(', "org": null', "") + "\n")
    r = cli("simulate-prefix", trace, "--policy", "infinite", "--tenant-field", "team")
    assert r.exit_code == 0 and "--tenant-field 'team' is absent on 3 of 3 requests (so no tenant table)" in r.stdout
    r = cli("simulate-prefix", trace, "--policy", "infinite", "--tenant-field", "org")
    assert "is absent on 1 of 3 requests" in r.stdout and "(so no tenant table)" not in r.stdout
    assert json.loads(cli("simulate-prefix", trace, "--policy", "infinite", "--tenant-field", "org", "-f",
                          "json").stdout)["requests_without_tenant"] == 1


def test_chat_traces_can_be_rendered_with_another_chat_template(cli):
    from .conftest import FIXTURES, TOK_DIR

    log = str(FIXTURES / "prompts" / "demo_log.jsonl")
    template = FIXTURES / "chat_templates" / "Apertus-8B-Instruct.jinja"
    own = json.loads(cli("simulate-prefix", log, "-t", TOK_DIR, "--capacity-blocks", "1000", "-f", "json").stdout)
    other = json.loads(cli("simulate-prefix", log, "-t", TOK_DIR, "--chat-template", str(template),
                           "--capacity-blocks", "1000", "-f", "json").stdout)
    # the same requests, rendered through another template's text: other token counts
    assert other["requests"] == own["requests"] and other["query_tokens"] != own["query_tokens"]
    r = cli("simulate-prefix", log, "--chat-template", str(template), "--capacity-blocks", "1000")
    assert r.exit_code == 2 and "--chat-template needs --tokenizer" in r.stderr
