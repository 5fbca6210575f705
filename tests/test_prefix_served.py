"""simulate-prefix, predicted vs served: the served counts read from logs, and each disagreement's reason.

The served counts are what vLLM's block pool serves, from the naive reference of vLLM's rules that the
faithfulness tests hold the engine to (tests/reference_prefix.py), run on the prompts as a perturbed server
saw them: a smaller pool, block size 32, a template that changes the first tokens or adds a line, LoRA
adapters; each perturbation must be named.
"""

from __future__ import annotations

import json
import random

import pytest

from cachectl.engines.prefix.read import KeyedTrace
from cachectl.engines.prefix.replay import simulate
from cachectl.engines.prefix.served import compare_served
from cachectl.engines.prefix.trace import iter_trace, trace_records
from cachectl.errors import InputError
from cachectl.inputs.files import JsonlChunks
from cachectl.inputs.usage import served_cache

from .conftest import ROOT
from .reference_prefix import NaiveVllm

# ------------------------------------------------------------------------------------------- reading


def test_served_counts_from_vllm_sglang_and_token_lines():
    loc = {"source": "log.jsonl", "line": 1}
    vllm = {"timestamp": 1, "body": {"model": "m", "messages": []},
            "usage": {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
                      "prompt_tokens_details": {"cached_tokens": 32}}}
    got = served_cache(vllm, **loc)
    assert (got.cached_tokens, got.prompt_tokens, got.field) == (32, 40, "usage.prompt_tokens_details.cached_tokens")
    bare = served_cache({"tokens": [1], "usage": {"prompt_tokens_details": {"cached_tokens": 16}}}, **loc)
    assert (bare.cached_tokens, bare.prompt_tokens) == (16, None)
    sglang = served_cache({"text": "x", "meta_info": {"id": "a", "prompt_tokens": 9, "cached_tokens": 5,
                                                      "e2e_latency": 0.1}}, **loc)
    assert (sglang.cached_tokens, sglang.prompt_tokens, sglang.field) == (5, 9, "meta_info.cached_tokens")
    # vLLM without --enable-prompt-tokens-details: prompt_tokens_details is null, nothing is known
    assert served_cache({"usage": {"prompt_tokens": 40, "prompt_tokens_details": None}}, **loc) is None
    assert served_cache({"tokens": [1, 2]}, **loc) is None


@pytest.mark.parametrize("value,field", [
    ({"usage": {"prompt_tokens": 4, "prompt_tokens_details": {"cached_tokens": 8}}}, "usage.prompt_tokens_details"),
    ({"usage": {"prompt_tokens_details": {"cached": 8}}}, "usage.prompt_tokens_details.cached"),
    ({"usage": {"cache_hits": 8}}, "usage.cache_hits"),
    ({"meta_info": {"prompt_tokens": 4, "cached_tokens": 5}}, "meta_info.cached_tokens"),
    ({"meta_info": {"cached_tokens": -1}}, "meta_info.cached_tokens"),
])
def test_bad_served_counts_are_located(value, field):
    with pytest.raises(InputError) as exc:
        served_cache(value, source="log.jsonl", line=3)
    assert exc.value.line == 3 and exc.value.field.startswith(field)


def test_both_readers_carry_the_served_counts(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"tokens": list(range(i, i + 40)), "model": "a" if i % 2 else "b",
             "usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": i}}} for i in range(30)]
    rows[5] = {"tokens": list(range(40))}            # a line without usage
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    one = list(iter_trace(trace_records(str(path)), source="t"))
    many = list(KeyedTrace(JsonlChunks(str(path), 512, 128), block_size=16, jobs=3))
    want = [(r.served_cached_tokens, r.served_prompt_tokens, r.served_model) for r in one]
    assert want[5] == (None, None, None) and want[7] == (7, 40, "a")
    assert [(r.served_cached_tokens, r.served_prompt_tokens, r.served_model) for r in many] == want


# ------------------------------------------------------------------------------------- the server


def traffic(n=90, seed=7):
    """Multi-turn chat token traffic: four system prompts, conversations that grow, well-spaced timestamps."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1000) for _ in range(rng.randrange(150, 400))] for _ in range(4)]
    convs = [{"sys": rng.randrange(4), "history": []} for _ in range(25)]
    out = []
    for i in range(n):
        c = rng.randrange(25)
        conv = convs[c]
        user = [rng.randrange(1000) for _ in range(rng.randrange(20, 60))]
        tokens = systems[conv["sys"]] + conv["history"] + user
        out.append({"tokens": tokens, "conversation": c, "timestamp": i * 5.0, "output_tokens": 40})
        conv["history"] = conv["history"] + user + [rng.randrange(1000) for _ in range(40)]
    return out


def served_log(tmp_path, lines, *, capacity=400, block_size=16, seen=None, salt=None):
    """The lines with the usage vLLM's block pool (the naive reference) serves on what the server saw."""
    server = NaiveVllm(capacity, block_size)
    path = tmp_path / "served.jsonl"
    with path.open("w") as fh:
        for i, line in enumerate(lines):
            tokens = seen(i, line["tokens"]) if seen else line["tokens"]
            cached = server.run(tokens, salt=salt(line) if salt else None)
            fh.write(json.dumps({**line, "usage": {"prompt_tokens": len(tokens), "completion_tokens": 40,
                                                   "prompt_tokens_details": {"cached_tokens": cached}}}) + "\n")
    return path


def compare(path, capacity=400, block_size=16):
    requests = list(iter_trace(trace_records(str(path)), source=str(path)))
    settings = {"policy": "vllm", "block_size": block_size, "capacity_blocks": capacity, "source": str(path)}
    return compare_served(requests, simulate(requests, **settings), settings=settings)


def reasons(report):
    return {c.reason: (c.requests, c.confidence) for c in report.reasons}


def test_the_same_server_agrees_on_every_request(tmp_path):
    s = compare(served_log(tmp_path, traffic()))
    assert s.requests == 90 and s.agree == 90 and not s.reasons and s.served_hit_tokens == s.predicted_hit_tokens


def test_a_smaller_pool_is_named_with_its_size(tmp_path):
    s = compare(served_log(tmp_path, traffic(), capacity=60), capacity=400)
    assert s.disagree > 10 and s.served_above == 0
    assert set(reasons(s)) == {"capacity"} and reasons(s)["capacity"][1] == "likely"
    best = next(h for h in s.hypotheses if h.reason == "capacity")
    assert best.params["capacity_blocks"] == 60 and best.agreeing_requests == 90


def test_block_size_32_is_named(tmp_path):
    # the same memory (6,400 tokens) in blocks of 32
    s = compare(served_log(tmp_path, traffic(), capacity=200, block_size=32), capacity=400)
    assert set(reasons(s)) == {"block_size"}
    h = next(h for h in s.hypotheses if h.reason == "block_size")
    assert h.params["block_size"] == 32 and h.agreeing_requests == 90


def test_served_counts_that_are_not_whole_blocks_are_certain(tmp_path):
    # a token-level server (blocks of 1: what SGLang's default page size gives) against an assumed 16
    s = compare(served_log(tmp_path, traffic(), capacity=6400, block_size=1), capacity=400)
    assert reasons(s)["block_size"][1] == "certain"
    assert "not whole blocks of 16" in next(r.evidence for r in s.rows if r.reason == "block_size")


def test_a_template_that_changes_the_first_tokens_is_named(tmp_path):
    # the server's template puts a per-request value at the top (the same length): nothing it caches matches
    s = compare(served_log(tmp_path, traffic(), seen=lambda i, t: [5000 + i] + t[1:]))
    assert s.served_hit_tokens == 0 and set(reasons(s)) == {"template"}
    assert reasons(s)["template"][1] == "likely"
    assert any("prefix caching may be off" in n for n in s.notes)


def test_a_template_that_adds_a_line_is_certain_and_the_rest_still_explained(tmp_path):
    lines = traffic()
    # the server renders the conversations of system prompt 0 with a 3-token line at the top, and its pool is
    # smaller than assumed: both are named, each on its own requests
    first = lines[0]["tokens"][:20]
    s = compare(served_log(tmp_path, lines, capacity=80,
                           seen=lambda i, t: [7, 7, 7] + t if t[:20] == first else t), capacity=400)
    got = reasons(s)
    assert got["template"][1] == "certain" and got["capacity"][1] == "likely"
    assert "+3 tokens" in next(c.evidence for c in s.reasons if c.reason == "template")
    capacity = next(h for h in s.hypotheses if h.reason == "capacity")
    assert capacity.params["capacity_blocks"] == 80 and capacity.agreeing_requests == 90


def test_lora_adapters_are_named(tmp_path):
    lines = [{**line, "model": "adapter-a" if line["conversation"] % 2 else "base"} for line in traffic()]
    s = compare(served_log(tmp_path, lines, salt=lambda line: ("lora", line["model"])))
    assert set(reasons(s)) == {"salt_or_lora"} and reasons(s)["salt_or_lora"][1] == "likely"


# --------------------------------------------------------------------------------------------- CLI


def test_cli_json_rows_and_summary(cli, tmp_path):
    path = served_log(tmp_path, traffic(), capacity=60)
    r = cli("simulate-prefix", path, "--capacity-blocks", "400", "-f", "json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    rows = out["per_request"]
    assert len(rows) == 90 and {"served_cached_tokens", "agrees", "reason", "confidence"} <= set(rows[0])
    s = out["served"]
    assert s["requests"] == 90 and s["agree"] + s["disagree"] == 90 == sum(row["agrees"] for row in rows) + s["disagree"]
    assert s["reasons"][0]["reason"] == "capacity" and len(s["disagreements"]) == s["disagree"]
    text = cli("simulate-prefix", path, "--capacity-blocks", "400").stdout
    assert "predicted vs served: 90 requests" in text and "capacity smaller than assumed" in text


def test_the_fixture_log_is_the_one_its_script_builds():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_served_log", ROOT / "fixtures" / "make_served_log.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    build = script.build
    lines = (ROOT / "fixtures" / "traces" / "served.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == build()


# ---------------------------------------------------------------------------------------------- worth


def test_worth_on_one_server_is_prefill_only_and_decode_bounds_it(cli, write):
    """Decode time does not change with hits: 95% hits on an output-heavy workload buy little end to end."""
    prompt = list(range(1000))
    rows = [{"tokens": prompt, "output_tokens": out} for out in [2000] * 20]
    path = write("t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    r = cli("simulate-prefix", path, "--capacity-blocks", "200", "--model", "llama-3.1-8b", "--gpu", "H100",
            "--batch", "8", "-f", "json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    w, t = out["worth"], out["worth"]["serving"]
    assert out["hit_rate"] > 0.9
    assert t["prefill_share_saved"] > 0.9 and t["share_saved"] < 0.05
    assert t["end_to_end_s_without_hits"] == pytest.approx(t["prefill_s_without_hits"] + t["decode_s"])
    assert t["end_to_end_s_with_hits"] == pytest.approx(t["end_to_end_s_without_hits"] - t["prefill_s_saved"])
    # decode: (weights + batch x KV at the mean context) over the bandwidth, output / batch steps
    kv = 131072 * (1000 + 1000)   # llama-3.1-8b: 128 KiB per token at bf16; mean context prompt + output / 2
    assert t["kv_bytes_per_sequence"] == kv
    assert t["decode_step_s"] == pytest.approx((t["weight_bytes_per_step"] + 8 * kv) / 3350e9)
    assert t["decode_s"] == pytest.approx(40000 / 8 * t["decode_step_s"])
    # prefill at 40% of 989 TFLOPS: 2 x params per token plus attention over the prefix
    flops = 2 * w["active_params"] * 20000 + 2 * 32 * 32 * 128 * 20 * 1000 ** 2
    assert t["prefill_s_without_hits"] == pytest.approx(flops / (989e12 * 0.4))
    assert t["ttft_s_saved"] == pytest.approx(t["prefill_s_saved"] / 20)
    assert t["throughput_gain"] == pytest.approx(t["end_to_end_s_without_hits"] / t["end_to_end_s_with_hits"])
    assert t["hash_cpu_s"] == pytest.approx(20000 * t["hash_ns_per_token"] * 1e-9)
    assert "bench_block_hash.py" in t["hash_source"] and "vLLM" in t["hash_published"]
    assert len(t["assumptions"]) == 4


def test_block_hash_cost_data_names_its_measurement_and_the_published_figure():
    table = json.loads((ROOT / "cachectl" / "data" / "block_hash_cost.json").read_text())
    m = table["measured"]
    assert m["by"] == "bench/bench_block_hash.py" and m["sha256_ns_per_token"] > m["builtin_ns_per_token"] > 0
    assert m["date"] and m["machine"] and table["published"]["source"]


def test_a_server_count_far_past_the_trace_is_not_modelled_as_a_line_at_the_top():
    """A server that counted more prompt tokens than the trace holds, by the same count on every such row, is
    replayed with that many tokens at the top (a template's line) up to MAX_SHIFT_TOKENS; past it the count is no
    line a template writes, and is not replayed (a Langfuse log that read 100 million cached tokens on a 31-token
    prompt built them as a list, and ran out of memory)."""
    from cachectl.engines.prefix.served import MAX_SHIFT_TOKENS, _server_view
    from cachectl.engines.prefix.trace import TraceRequest

    for d, modelled in ((3, True), (MAX_SHIFT_TOKENS, True), (MAX_SHIFT_TOKENS + 1, False), (10**8, False)):
        reqs = [TraceRequest(index=0, line=1, prompt_tokens=32, tokens=list(range(32)), served_prompt_tokens=32 + d)]
        view, what = _server_view(reqs, {0: ("template", "")})
        assert bool(what) == modelled, d
        assert view[0].prompt_tokens == (32 + d if modelled else 32)
