"""kv-inspect config arithmetic: hand-computed sizes, layer kinds, GGUF metadata, the CLI contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cachectl.engines import kvmath
from cachectl.errors import InputError, UsageError

from .conftest import ROOT

GIB = 1024 ** 3


def cfg(**kw):
    base = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512}
    return {**base, **kw}


def test_gqa_bytes_per_token_and_head_dim_from_config():
    # 2 (K,V) x 4 layers x 2 KV heads x (512 / 8 = 64) x 2 bytes
    assert kvmath.kv_shape(cfg()).bytes_per_token == 2 * 4 * 2 * 64 * 2
    # an explicit head_dim wins over hidden / heads (Gemma: 256 with hidden 3584 / 16 heads)
    assert kvmath.kv_shape(cfg(head_dim=100)).bytes_per_token == 2 * 4 * 2 * 100 * 2
    assert kvmath.kv_shape(cfg(num_key_value_heads=None)).kv_heads == 8  # MHA when the field is absent
    assert kvmath.kv_shape(cfg(), "fp8").bytes_per_token == 2 * 4 * 2 * 64
    assert kvmath.kv_shape(cfg(), "int4").bytes_per_token == 2 * 4 * 2 * 64 * 0.5


def test_catalog_models_hand_computed():
    llama = kvmath.catalog()["llama-3.1-8b"]["config"]
    assert kvmath.kv_shape(llama).bytes_per_token == 131_072          # 2 x 32 x 8 x 128 x 2
    assert kvmath.estimate_params(llama) == 8_030_261_248             # Meta's published count
    ds = kvmath.catalog()["deepseek-v3"]["config"]
    assert kvmath.kv_shape(ds).bytes_per_token == (512 + 64) * 61 * 2  # MLA: one latent + rope key, no V
    g = kvmath.layer_groups(kvmath.catalog()["gemma-2-9b"]["config"])
    assert {(x.type, x.layers, x.window) for x in g} == {("sliding_attention", 21, 4096), ("full_attention", 21, None)}


def test_sliding_window_caps_memory():
    c = cfg(sliding_window=1000, model_type="mistral")
    groups = kvmath.layer_groups(c)
    per = kvmath.kv_shape(c).bytes_per_token
    assert kvmath.kv_bytes(groups, 500) == per * 500
    assert kvmath.kv_bytes(groups, 50_000) == per * 1000


def test_layers_without_kv_are_excluded():
    c = cfg(layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"])
    groups = {g.type: g for g in kvmath.layer_groups(c)}
    assert groups["no_kv"].layers == 2 and groups["no_kv"].bytes_per_token == 0
    assert kvmath.kv_shape(c).bytes_per_token == 2 * 2 * 2 * 64 * 2


def test_budget_sequences_blocks_and_decode_bound():
    r = kvmath.inspect_config(kvmath.catalog()["llama-3.1-8b"]["config"], model="m", source="s",
                              contexts=(32768,), gpu="H100")
    budget = 80e9 * 0.9 - 8_030_261_248 * 2
    assert r.kv_budget_bytes == pytest.approx(budget)
    assert r.contexts[0].max_sequences == int(budget // (131_072 * 32768))
    assert r.vllm_blocks == int(budget // (131_072 * 16))
    assert r.contexts[0].decode_ms_per_token == pytest.approx((8_030_261_248 * 2 + 131_072 * 32768) / 3.35e12 * 1e3)


def test_moe_decode_bound_reads_active_parameters():
    entry = kvmath.catalog()["deepseek-v3"]
    r = kvmath.inspect_config(entry["config"], model="d", source="s", contexts=(4096,), gpu="H200",
                              published_params=entry["params"], active_params=entry["active_params"])
    assert r.contexts[0].decode_ms_per_token == pytest.approx((36.6e9 * 2 + 70_272 * 4096) / 4.8e12 * 1e3)
    assert any("weights do not fit" in n for n in r.notes)


def test_gguf_metadata_written_by_the_gguf_package(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(32)
    w.add_head_count(32)
    w.add_head_count_kv(8)
    w.add_embedding_length(4096)
    w.add_context_length(131072)
    w.add_token_list([f"tok{i}" for i in range(300)])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    config = kvmath.read_gguf_config(str(path))
    assert kvmath.kv_shape(config).bytes_per_token == 131_072


def test_bad_models(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + b"\x00" * 20)
    with pytest.raises(InputError, match="not a GGUF file"):
        kvmath.resolve_model(str(bad))
    broken = tmp_path / "config.json"
    broken.write_text('{"num_hidden_layers": 0}')
    with pytest.raises(InputError, match="field 'num_hidden_layers'"):
        kvmath.kv_shape(kvmath.load_config(str(broken))[0], source=str(broken))
    with pytest.raises(UsageError, match="never downloads"):
        kvmath.resolve_model("some-org/not-cached-model")
    with pytest.raises(UsageError, match="unknown GPU"):
        kvmath.inspect_config(cfg(), model="m", source="s", gpu="TPU9")


def test_cli_json_contract(cli):
    r = cli("kv-inspect", "llama-3.1-8b", "--context", "4k,32k", "--batch", "4", "--gpu", "A100", "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert {"schema_version", "model", "layers", "kv_heads", "head_dim", "dtype", "bytes_per_token",
            "contexts"} <= set(d)
    assert (d["layers"], d["kv_heads"], d["head_dim"], d["bytes_per_token"]) == (32, 8, 128, 131072)
    assert [c["tokens"] for c in d["contexts"]] == [4096, 32768]
    assert d["contexts"][0]["bytes"] == 131072 * 4096 and d["contexts"][0]["batch_bytes"] == 4 * 131072 * 4096


def test_cli_local_config_dir_and_hub_cache(tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(cfg(vocab_size=100, intermediate_size=1024)))
    out = subprocess.run([sys.executable, "-m", "cachectl", "kv-inspect", str(model), "-f", "json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["bytes_per_token"] == 2 * 4 * 2 * 64 * 2
    # a Hugging Face id resolved through a local cache laid out as huggingface_hub lays it out
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(cfg()))
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "cachectl", "kv-inspect", "acme/tiny", "-f", "json"],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["layers"] == 4


def test_cli_bad_input(cli, tmp_path):
    assert cli("kv-inspect").exit_code == 2
    r = cli("kv-inspect", "llama-3.1-8b", "--context", "lots")
    assert r.exit_code == 2 and "--context" in r.stderr
    r = cli("kv-inspect", "llama-3.1-8b", "--dtype", "fp7")
    assert r.exit_code == 2 and "unknown dtype" in r.stderr
    r = cli("kv-inspect", "llama-3.1-8b", "--gpu-memory", "eighty")
    assert r.exit_code == 2 and "memory size" in r.stderr
    assert cli("kv-inspect", "--list-models").exit_code == 0


# ------------------------------------------------------------------------------------ live (torch)

TINY = {"model_type": "llama", "vocab_size": 1300, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}


def test_live_run_measures_what_the_config_predicts(cli, tmp_path):
    from .conftest import TOK_DIR

    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY))
    r = cli("kv-inspect", model, "--run", "--random-weights", "--prompt", "How do I reset my password?",
            "--tokenizer", TOK_DIR, "--max-new-tokens", "5", "--threads", "1", "-f", "json")
    assert r.exit_code == 0, r.stderr
    run = json.loads(r.stdout)["run"]
    # the last generated token's K/V is computed only when it is fed back
    assert run["seq_length"] == run["prompt_tokens"] + run["generated_tokens"] - 1
    assert run["generated_tokens"] == 5
    # real DynamicCache tensors: 2 layers x (K and V) x 2 KV heads x seq x head_dim 16 x 4 bytes (fp32)
    assert run["measured_bytes"] == 2 * 2 * 2 * run["seq_length"] * 16 * 4
    assert run["agree"] and run["measured_bytes"] == run["predicted_bytes"]
    assert run["layers"][0]["keys_shape"] == [1, 2, run["seq_length"], 16]


def test_live_run_needs_weights_or_random(cli, tmp_path):
    r = cli("kv-inspect", "llama-3.1-8b", "--run", "--prompt", "hi", "--tokenizer", str(tmp_path))
    assert r.exit_code == 2
    r = cli("kv-inspect", "llama-3.1-8b", "--prompt", "hi")
    assert r.exit_code == 2 and "go with --run" in r.stderr


def _tiny_config():
    from .conftest import FIXTURES

    return json.loads((FIXTURES / "tiny-llama" / "config.json").read_text())


def test_turns_crop_where_the_template_rewrites_history(tok):
    from cachectl.engines import kvlive
    from cachectl.inputs import read_prompt

    from .conftest import FIXTURES, PROMPTS

    spec = str(FIXTURES / "tiny-llama")
    stable = kvlive.run_turns(spec, _tiny_config(), tok, read_prompt(str(PROMPTS / "stable_conversation.json")),
                              random_weights=True, threads=1)
    assert stable.mismatches == 0 and stable.all_match
    second = stable.turns[1]
    assert second.common_prefix == second.cached_tokens > 0          # the kept cache is a token prefix
    assert second.prefilled_kept == second.input_tokens - second.cached_tokens
    think = kvlive.run_turns(spec, _tiny_config(), tok, read_prompt(str(PROMPTS / "think_conversation.json")),
                             random_weights=True, threads=1)
    bad = think.turns[1]
    assert bad.mismatch_index is not None and bad.mismatch_index < bad.cached_tokens  # <think> stripped
    assert bad.prefilled_kept == bad.input_tokens - bad.mismatch_index            # cropped to the prefix
    assert bad.same_next_token and bad.max_logit_diff < 1e-4                        # the crop is right


def test_turns_stale_cache_gives_other_logits(tok):
    from cachectl.engines import kvlive
    from cachectl.inputs import prompt_from_value

    from .conftest import FIXTURES

    conv = prompt_from_value([
        {"role": "user", "content": "What is the hit rate?"},
        {"role": "assistant", "content": "<think>\nTwo of three requests shared it.\n</think>\nTwo thirds."},
        {"role": "user", "content": "And as a fraction? Please summarise the conversation so far, with the numbers "
                                    "you used, the block sizes and the cache hit rates."}], source="t", line=None)
    r = kvlive.run_turns(str(FIXTURES / "tiny-llama"), _tiny_config(), tok, conv, random_weights=True, threads=1)
    t = r.turns[1]
    assert t.mismatch_index is not None and t.same_next_token and t.max_logit_diff < 1e-4
    assert t.stale_max_logit_diff is not None and t.stale_max_logit_diff > 1e-3   # the silent wrong answer


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_shared_prefix_copies_equal_fresh_prefill(tok, kind):
    from cachectl.engines import kvlive

    from .conftest import FIXTURES

    r = kvlive.run_shared_prefix(str(FIXTURES / "tiny-llama"), _tiny_config(), tok,
                                 "You are a helpful assistant. Answer briefly and cite the numbers you used.\n",
                                 ["How do I reset my password?", "Is the API rate limited?"], cache_kind=kind,
                                 max_new_tokens=6, random_weights=True, threads=1)
    assert r.all_equal and all(q.reused_tokens > 0 for q in r.questions)


def test_cli_turns_and_shared_prefix_json(cli):
    from .conftest import FIXTURES, PROMPTS, TOK_DIR

    r = cli("kv-inspect", FIXTURES / "tiny-llama", "--random-weights", "--tokenizer", TOK_DIR, "--turns",
            PROMPTS / "think_conversation.json", "--shared-prefix", "You are a helpful assistant. ", "--questions",
            PROMPTS / "questions.txt", "--threads", "1", "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["turns"]["mismatches"] == 1 and d["turns"]["all_match"]
    assert len(d["shared_prefix"]["questions"]) == 3 and d["shared_prefix"]["all_equal"]
    r = cli("kv-inspect", FIXTURES / "tiny-llama", "--random-weights", "--tokenizer", TOK_DIR, "--shared-prefix", "x")
    assert r.exit_code == 2 and "--questions" in r.stderr


def test_quantized_cache_memory_and_divergence(cli):
    pytest.importorskip("optimum.quanto")
    from .conftest import FIXTURES, TOK_DIR

    prompt = "You are a helpful assistant for cache diagnostics. " * 30
    args = ["kv-inspect", FIXTURES / "tiny-llama", "--random-weights", "--tokenizer", TOK_DIR, "--prompt", prompt,
            "--threads", "1", "--max-new-tokens", "8", "-f", "json"]
    q4 = json.loads(cli(*args, "--quantized", "quanto", "--nbits", "4").stdout)["quantized"]
    full = q4["full_bytes"]
    # the real DynamicCache: 2 layers x K,V x 2 heads x seq x 16 dims x 4 bytes
    assert full == 2 * 2 * 2 * q4["seq_length"] * 16 * 4
    assert q4["quantized_bytes"] < 0.3 * full
    q2 = json.loads(cli(*args, "--quantized", "quanto", "--nbits", "2").stdout)["quantized"]
    assert q2["quantized_bytes"] < q4["quantized_bytes"]


@pytest.mark.parametrize("backend,module", [("hqq", "hqq"), ("quanto", "optimum.quanto")])
def test_quantized_backend_missing_is_one_clear_line(cli, monkeypatch, backend, module):
    from .conftest import FIXTURES, TOK_DIR

    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError, as when it is not installed
    r = cli("kv-inspect", FIXTURES / "tiny-llama", "--random-weights", "--tokenizer", TOK_DIR, "--prompt", "hi",
            "--quantized", backend)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"pip install 'llm-cachectl[{backend}]'" in r.stderr


def test_quantized_hqq_where_installed(cli):
    pytest.importorskip("hqq")
    from .conftest import FIXTURES, TOK_DIR

    r = cli("kv-inspect", FIXTURES / "tiny-llama", "--random-weights", "--tokenizer", TOK_DIR, "--prompt",
            "You are a helpful assistant for cache diagnostics. " * 30, "--threads", "1", "--max-new-tokens", "4",
            "--quantized", "hqq", "--nbits", "4", "-f", "json")
    assert r.exit_code == 0, r.stderr
    q = json.loads(r.stdout)["quantized"]
    assert q["full_bytes"] == 2 * 2 * 2 * q["seq_length"] * 16 * 4 and q["quantized_bytes"] < q["full_bytes"]


def test_more_catalog_architectures():
    cat = kvmath.catalog()
    qwen = cat["qwen2.5-7b"]["config"]
    # Qwen2.5 lists a sliding window but switches it off: every layer is full attention
    assert [(g.type, g.layers) for g in kvmath.layer_groups(qwen)] == [("full_attention", 28)]
    assert kvmath.kv_shape(qwen).bytes_per_token == 2 * 28 * 4 * 128 * 2
    mistral = kvmath.layer_groups(cat["mistral-7b-v0.1"]["config"])
    assert [(g.type, g.layers, g.window) for g in mistral] == [("sliding_attention", 32, 4096)]
    gemma3 = {g.type: g for g in kvmath.layer_groups(cat["gemma-3-27b"]["config"])}
    assert (gemma3["sliding_attention"].layers, gemma3["full_attention"].layers) == (52, 10)  # 5 local : 1 global
    # published sizes: Qwen2.5-7B 7.61B, Mistral-7B 7.24B parameters
    assert abs(kvmath.estimate_params(qwen) / 1e9 - 7.61) < 0.01
    assert round(kvmath.estimate_params(cat["mistral-7b-v0.1"]["config"]) / 1e9, 2) == 7.24


def _tiny_model():
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = dict(TINY)
    return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(cfg.pop("model_type"),
                                                                                          **cfg)).eval()


def test_cache_reaches_a_model_that_takes_past_key_values_only():
    # transformers 5.0-5.23: forward(past_key_values=...); `cache=` would vanish into **kwargs
    import torch

    from cachectl.engines import kvlive

    inner = _tiny_model()

    class PastKeyValuesOnly(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs):
            assert "cache" not in kwargs
            return self.inner(input_ids=input_ids, use_cache=use_cache,
                              **{kvlive.cache_keyword(self.inner): past_key_values})

    model = PastKeyValuesOnly()
    assert kvlive.cache_keyword(model) == "past_key_values"
    run = kvlive.inspect_model(model, list(range(3, 11)), max_new_tokens=4)
    assert (run.seq_length, run.expected_seq_length) == (8 + 4 - 1, 11)
    assert run.measured_bytes == 2 * 2 * 2 * 11 * 16 * 4 and run.agree


def test_agree_is_independent_of_the_cache_it_checks():
    # a forward that swallows the cache keyword (what `cache=` did on transformers 5.0-5.23) leaves the cache
    # empty: 0 bytes measured must not "agree" with a prediction built from that same empty cache
    import torch

    from cachectl.engines import kvlive

    inner = _tiny_model()

    class SwallowsCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, input_ids=None, **kwargs):
            return self.inner(input_ids=input_ids, use_cache=False)

    run = kvlive.inspect_model(SwallowsCache(), list(range(3, 11)), max_new_tokens=3)
    assert run.seq_length == 0 and run.measured_bytes == 0
    assert run.expected_seq_length == 10 and run.predicted_bytes == 2 * 2 * 2 * 10 * 16 * 4
    assert not run.agree
