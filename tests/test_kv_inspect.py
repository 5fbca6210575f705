"""kv-inspect config arithmetic: hand-computed sizes, layer kinds, GGUF metadata, the CLI contract."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from cachectl.engines.kv import config as kvmath
from cachectl.errors import InputError, UsageError

from .conftest import FIXTURES, ROOT

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
    # an H100 80 GB: the driver reports 81,559 MiB (79.6 GiB), not the datasheet's 80e9 bytes
    budget = 81_559 * 1024 ** 2 * 0.9 - 8_030_261_248 * 2
    assert r.kv_budget_bytes == pytest.approx(budget)
    assert r.contexts[0].max_sequences == int(budget // (131_072 * 32768))
    assert r.vllm_blocks == int(budget // (131_072 * 16))
    assert r.contexts[0].decode_ms_per_token == pytest.approx((8_030_261_248 * 2 + 131_072 * 32768) / 3.35e12 * 1e3)


def test_moe_decode_bound_reads_active_parameters():
    entry = kvmath.catalog()["deepseek-v3"]
    r = kvmath.inspect_config(entry["config"], model="d", source="s", contexts=(4096,), gpu="H200",
                              published_params=entry["params"], active_params=entry["active_params"])
    assert r.contexts[0].decode_ms_per_token == pytest.approx((36.6e9 * 2 + 70_272 * 4096) / 4.8e12 * 1e3)
    # 671B bf16 parameters on one H200: a finding (exit 1), not a note
    assert r.weights_fit is False and any("do not fit in H200 memory" in f for f in r.findings)
    assert not any("do not fit" in n for n in r.notes) and r.contexts[0].max_sequences == 0


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
    assert r.exit_code == 2 and "fp7" in r.stderr and "bf16" in r.stderr and r.stderr.count("\n") == 1
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


def test_live_run_of_a_new_decoder_falcon_agrees_with_the_installed_transformers(cli, tmp_path):
    # 8 query heads in groups of 4 around 2 KV heads; transformers before 5.25 caches the 8 (and kv-inspect says
    # so in a note), 5.25 and later the 2 (what the arithmetic above the run counts)
    import transformers

    from .conftest import TOK_DIR

    model = tmp_path / "falcon"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(
        {"model_type": "falcon", "new_decoder_architecture": True, "vocab_size": 1300, "hidden_size": 64,
         "num_attention_heads": 8, "num_kv_heads": 2, "num_hidden_layers": 2, "torch_dtype": "float32"}))
    r = cli("kv-inspect", model, "--run", "--random-weights", "--prompt", "How do I reset my password?",
            "--tokenizer", TOK_DIR, "--max-new-tokens", "3", "--threads", "1", "-f", "json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    run = out["run"]
    repeats = kvmath._release(transformers.__version__) < kvmath.FALCON_CACHES_KV_HEADS_SINCE
    heads = 8 if repeats else 2
    assert run["layers"][0]["keys_shape"] == [1, heads, run["seq_length"], 8]
    assert run["agree"] and run["measured_bytes"] == run["predicted_bytes"] == 2 * 2 * heads * run["seq_length"] * 8 * 4
    assert out["bytes_per_token"] == 2 * 2 * 2 * 8 * 4                      # the arithmetic: 2 KV heads, always
    assert any("repeated to the 8 query heads" in n for n in out["notes"]) == repeats


def test_live_run_needs_weights_or_random(cli, tmp_path):
    r = cli("kv-inspect", "llama-3.1-8b", "--run", "--prompt", "hi", "--tokenizer", str(tmp_path))
    assert r.exit_code == 2
    r = cli("kv-inspect", "llama-3.1-8b", "--prompt", "hi")
    assert r.exit_code == 2 and "go with --run" in r.stderr


def _tiny_config():
    from .conftest import FIXTURES

    return json.loads((FIXTURES / "tiny-llama" / "config.json").read_text())


def test_turns_crop_where_the_template_rewrites_history(tok):
    from cachectl.engines.kv import live as kvlive
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
    from cachectl.engines.kv import live as kvlive
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
    from cachectl.engines.kv import live as kvlive

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

    from cachectl.engines.kv import live as kvlive

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

    from cachectl.engines.kv import live as kvlive

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


# ------------------------------------------------------------------------ real configurations


def _gguf(path, arch, *, layers, heads, kv, key_length=None, key_length_swa=None, window=None, pattern=None,
          causal=None, context=None, tensors=()):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_embedding_length(2560)
    if key_length:
        w.add_key_length(key_length)
        w.add_value_length(key_length)
    if key_length_swa:
        w.add_key_length_swa(key_length_swa)
        w.add_value_length_swa(key_length_swa)
    if window:
        w.add_sliding_window(window)
    if pattern is not None:
        w.add_sliding_window_pattern(pattern)
    if causal is not None:
        w.add_causal_attention(causal)
    if context:
        w.add_context_length(context)
    w.add_token_list([f"tok{i}" for i in range(300)])
    for name in tensors:
        w.add_tensor(name, np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gemma4_gguf_per_layer_arrays(tmp_path, cli):
    # FACTS: Gemma 4 GGUF, 30 layers, head_count_kv [8,8,8,8,8,2] x 5, sliding_window_pattern true = sliding,
    # key_length 512 (global), key_length_swa 256 (sliding): 225,280 B/token at 16-bit, not 491,520
    path = _gguf(tmp_path / "gemma4.gguf", "gemma4", layers=30, heads=16, kv=[8, 8, 8, 8, 8, 2] * 5,
                 key_length=512, key_length_swa=256, window=1024, pattern=([True] * 5 + [False]) * 5,
                 context=131072)
    config = kvmath.read_gguf_config(str(path))
    # one period of the pattern, repeated over the layers, reads the same
    period = _gguf(tmp_path / "period.gguf", "gemma4", layers=30, heads=16, kv=[8, 8, 8, 8, 8, 2] * 5,
                   key_length=512, key_length_swa=256, window=1024, pattern=[True] * 5 + [False])
    assert kvmath.layer_groups(kvmath.read_gguf_config(str(period))) == kvmath.layer_groups(config)
    groups = {g.type: g for g in kvmath.layer_groups(config)}
    sliding, full = groups["sliding_attention"], groups["full_attention"]
    assert (sliding.layers, sliding.kv_heads, sliding.head_dim, sliding.window) == (25, 8, 256, 1024)
    assert (full.layers, full.kv_heads, full.head_dim) == (5, 2, 512)
    assert kvmath.kv_shape(config).bytes_per_token == 225_280 == 25 * 8 * 256 * 2 * 2 + 5 * 2 * 512 * 2 * 2
    r = cli("kv-inspect", path, "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["bytes_per_token"] == 225_280 and d["kv_heads"] is None and d["head_dim"] is None
    r = cli("kv-inspect", path)
    assert "KV heads and head dims per layer type" in r.stdout and "225,280 bytes per token" in r.stdout


def test_gguf_per_layer_array_longer_than_64_and_mamba_layers(tmp_path):
    # 80 layers: a per-layer array this long must be read, not skipped like the vocabulary
    kv = [0 if i % 4 == 3 else 8 for i in range(80)]   # every 4th layer without attention KV
    path = _gguf(tmp_path / "hybrid.gguf", "granitehybrid", layers=80, heads=32, kv=kv, key_length=128)
    groups = {g.type: g for g in kvmath.layer_groups(kvmath.read_gguf_config(str(path)))}
    assert groups["full_attention"].layers == 60 and groups["no_kv"].layers == 20
    assert kvmath.kv_shape(kvmath.read_gguf_config(str(path))).bytes_per_token == 60 * 8 * 128 * 2 * 2


def test_gguf_tied_embeddings_from_the_tensor_list(tmp_path):
    tied = _gguf(tmp_path / "tied.gguf", "llama", layers=2, heads=4, kv=2, tensors=["token_embd.weight"])
    untied = _gguf(tmp_path / "untied.gguf", "llama", layers=2, heads=4, kv=2,
                   tensors=["token_embd.weight", "output.weight"])
    assert kvmath.read_gguf_config(str(tied))["tie_word_embeddings"] is True
    assert kvmath.read_gguf_config(str(untied))["tie_word_embeddings"] is False


def test_gemma4_config_json_per_kind_head_dims_match_a_real_transformers_cache():
    # config.json alike: global_head_dim for full-attention layers, and the config transformers itself writes
    # (per_layer_config, keys "05"), measured against the real cache of a random-weight Gemma 4
    import torch
    import transformers

    from cachectl.engines.kv import live as kvlive

    if "gemma4_text" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {transformers.__version__} has no Gemma 4 (the main job runs this)")
    base = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=12, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=8,
                vocab_size_per_layer_input=300, hidden_size_per_layer_input=8, num_kv_shared_layers=2)
    groups = {g.type: g for g in kvmath.layer_groups({"model_type": "gemma4_text", **base}, "fp32")}
    assert (groups["full_attention"].layers, groups["full_attention"].head_dim) == (1, 32)   # layer 5; 11 shared
    assert (groups["sliding_attention"].layers, groups["shared_kv"].layers) == (9, 2)
    torch.manual_seed(0)
    hf = transformers.AutoConfig.for_model("gemma4_text", **base)
    model = transformers.AutoModelForCausalLM.from_config(hf).eval()
    run = kvlive.inspect_model(model, list(range(3, 23)), max_new_tokens=4)
    assert run.seq_length == run.expected_seq_length == 23
    # 9 sliding layers hold window - 1 = 7 tokens, the global layer all 23 at head_dim 32
    assert run.measured_bytes == 9 * 2 * 2 * 7 * 16 * 4 + 2 * 2 * 23 * 32 * 4
    assert run.agree


def test_encoder_only_models_are_refused(tmp_path, cli):
    bert = _gguf(tmp_path / "bert.gguf", "bert", layers=12, heads=12, kv=12, causal=False)
    r = cli("kv-inspect", bert)
    assert r.exit_code == 2 and "encoder-only" in r.stderr and r.stderr.count("\n") == 1
    model = tmp_path / "bert"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(cfg(model_type="bert")))
    r = cli("kv-inspect", model)
    assert r.exit_code == 2 and "encoder-only model (bert)" in r.stderr
    # a decoder config is not refused
    (model / "config.json").write_text(json.dumps(cfg(model_type="llama")))
    assert cli("kv-inspect", model).exit_code == 0


def test_context_beyond_the_maximum_is_said(cli):
    d = json.loads(cli("kv-inspect", "gemma-2-9b", "--context", "4k,128k", "-f", "json").stdout)
    assert any("131,072 is beyond the model's maximum of 8,192" in n for n in d["notes"])
    d = json.loads(cli("kv-inspect", "gemma-2-9b", "--context", "4k,8k", "-f", "json").stdout)
    assert not any("beyond" in n for n in d["notes"])


def test_tied_embeddings_default_per_model_type():
    # the defaults table against the installed transformers' configuration classes
    import transformers

    from cachectl.datafiles import load_data

    table = load_data("model_defaults.json")["tie_word_embeddings"]
    known = set(transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES)
    checked = [t for t in table if t in known]          # older transformers lack the newest types (gemma4)
    assert len(checked) >= 0.8 * len(table)
    for model_type in checked:
        hf = transformers.AutoConfig.for_model(model_type).get_text_config()
        assert hf.tie_word_embeddings is table[model_type], model_type
    gemma = {k: v for k, v in kvmath.catalog()["gemma-2-9b"]["config"].items() if k != "tie_word_embeddings"}
    assert kvmath.tied_embeddings(gemma) == (True, "the gemma2 default")
    untied = kvmath.estimate_params({**gemma, "tie_word_embeddings": False})
    assert kvmath.estimate_params(gemma) == untied - 256000 * 3584     # one embedding matrix fewer
    r = kvmath.inspect_config(gemma, model="g", source="s")
    # said with the other values the file leaves to transformers (it was a note of its own)
    assert kvmath.DefaultUsed("tie_word_embeddings", True, "transformers Gemma2Config default",
                              "transformers Gemma2Config") in r.defaults_used


def test_gpu_memory_is_what_the_driver_reports(cli):
    d = json.loads(cli("kv-inspect", "llama-3.1-8b", "--gpu", "H200", "-f", "json").stdout)
    # nvidia-smi's memory.total on this project's H200 (docs/gpu_checks_h200.json), not the datasheet's 141e9 bytes
    assert d["gpu_memory_bytes"] == 143771 * 2**20
    d = json.loads(cli("kv-inspect", "llama-3.1-8b", "--gpu", "H100", "-f", "json").stdout)
    assert abs(d["gpu_memory_bytes"] / GIB - 79.6) < 0.1


def test_random_weights_refused_with_the_number_and_the_limit(cli):
    from cachectl.engines.kv import live as kvlive

    from .conftest import TOK_DIR

    # 70.55B parameters in fp32 (~263 GiB) fit on no machine this runs on: refused before anything is built
    r = cli("kv-inspect", "llama-3.1-70b", "--run", "--random-weights", "--prompt", "hi", "--tokenizer", TOK_DIR)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "about 262.8" in r.stderr and "70.55B parameters" in r.stderr and "of memory is available" in r.stderr
    # MoE: the catalog's published total is used where the config alone cannot size the model
    r = cli("kv-inspect", "deepseek-v3", "--run", "--random-weights", "--prompt", "hi", "--tokenizer", TOK_DIR)
    assert r.exit_code == 2 and "671.00B parameters" in r.stderr
    llama = kvmath.catalog()["llama-3.1-8b"]["config"]
    with pytest.raises(UsageError, match=r"about 29\.92 GiB for 8\.03B parameters, but 20\.00 GiB"):
        kvlive.check_random_weights_memory(llama, available=20 * GIB)
    kvlive.check_random_weights_memory(llama, available=40 * GIB)          # fits: no error
    assert kvlive.available_memory_bytes() > 0


def test_hints_for_missing_weights_and_tokenizer(cli):
    from .conftest import FIXTURES, TOK_DIR

    tiny = FIXTURES / "tiny-llama"                                            # a config.json and nothing else
    r = cli("kv-inspect", tiny, "--run", "--prompt", "hi", "--tokenizer", TOK_DIR)
    assert r.exit_code == 2 and "no weights" in r.stderr and "--random-weights" in r.stderr
    r = cli("kv-inspect", tiny, "--run", "--random-weights", "--prompt", "hi")
    assert r.exit_code == 2 and "need --tokenizer" in r.stderr and "has no tokenizer files" in r.stderr
    r = cli("kv-inspect", tiny, "--random-weights", "--turns", FIXTURES / "prompts" / "think_conversation.json")
    assert r.exit_code == 2 and "need --tokenizer" in r.stderr


def test_quantized_cache_with_a_token_count_the_default_group_does_not_divide(cli):
    # 77 prompt tokens x 2 KV heads x head_dim 16: transformers' default group of 64 values fails there
    pytest.importorskip("optimum.quanto")
    from .conftest import FIXTURES, PROMPTS, TOK_DIR

    r = cli("kv-inspect", FIXTURES / "tiny-llama", "--random-weights", "--tokenizer", TOK_DIR, "--messages",
            PROMPTS / "think_conversation.json", "--quantized", "quanto", "--nbits", "2", "--threads", "1",
            "--max-new-tokens", "4", "-f", "json")
    assert r.exit_code == 0, r.stderr
    q = json.loads(r.stdout)["quantized"]
    assert (q["seq_length"] - 3) % 2 == 1 and q["quantized_bytes"] < q["full_bytes"]   # 77 prompt tokens: odd


def test_run_header_is_in_the_dtype_the_run_measured(cli):
    from .conftest import FIXTURES, TOK_DIR

    args = ["kv-inspect", FIXTURES / "tiny-llama", "--run", "--random-weights", "--prompt", "hi there",
            "--tokenizer", TOK_DIR, "--max-new-tokens", "2", "--threads", "1", "-f", "json"]
    d = json.loads(cli(*args).stdout)
    assert d["dtype"] == d["run"]["dtype"] == "fp32" and d["bytes_per_token"] == 2 * 2 * 2 * 16 * 4
    assert json.loads(cli(*args, "--dtype", "bf16").stdout)["dtype"] == "bf16"     # an explicit --dtype stays


def test_total_parameters_of_moe_configs_for_the_memory_check():
    from cachectl.engines.kv import live as kvlive

    # Mixtral-8x7B's config.json: 46.7B parameters published
    mixtral = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8, "vocab_size": 32000,
               "tie_word_embeddings": False}
    assert kvmath.estimate_params(mixtral) is None                      # not a dense model
    assert abs(kvmath.estimate_total_params(mixtral) / 46.7e9 - 1) < 0.01
    # DeepSeek-V3 (its config.json's expert fields added to the catalog's): 671B published
    ds = {**kvmath.catalog()["deepseek-v3"]["config"], "n_routed_experts": 256, "n_shared_experts": 1,
          "moe_intermediate_size": 2048, "intermediate_size": 18432, "first_k_dense_replace": 3}
    assert abs(kvmath.estimate_total_params(ds) / 671e9 - 1) < 0.02
    with pytest.raises(UsageError, match=r"46\.\d\dB parameters"):
        kvlive.check_random_weights_memory(mixtral, available=64 * GIB)


def test_a_batch_that_does_not_fit_is_said_so(cli):
    r = cli("kv-inspect", "llama-3.1-8b", "--gpu", "H100", "--batch", "8", "-f", "json")
    d = json.loads(r.stdout)
    fits = {c["tokens"]: c["batch_fits"] for c in d["contexts"]}
    assert all(fits[c["tokens"]] == (c["max_sequences"] >= 8) for c in d["contexts"]) and False in fits.values()
    assert any("a batch of 8 does not fit the KV budget at context 131,072" in n for n in d["notes"])
    alone = json.loads(cli("kv-inspect", "llama-3.1-8b", "-f", "json").stdout)
    assert all(c["batch_fits"] is None for c in alone["contexts"])
    assert not any("does not fit the KV budget" in n for n in alone["notes"])


# ------------------------------------------------------------------ fields a config leaves to transformers

#: configs that leave fields out, each filled in by its model type's configuration class
PARTIAL = {
    "llama": {"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 16},
    "llama-head-dim": {"model_type": "llama", "hidden_size": 2048, "num_attention_heads": 16, "head_dim": 64,
                       "num_hidden_layers": 4},
    "mistral": {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32, "num_hidden_layers": 32,
                "vocab_size": 32000, "intermediate_size": 14336},
    "qwen2": {"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_hidden_layers": 28,
              "num_key_value_heads": 4},
    "gpt2": {"model_type": "gpt2", "n_layer": 6, "n_embd": 768},             # n_head left to GPT2Config
}


def _transformers_reading(config: dict) -> dict:
    """What the model's attention modules use, from transformers itself: the configuration class built from
    the partial dict (attribute_map included), then what the attention modules derive where it has no field."""
    import transformers

    kw = {k: v for k, v in config.items() if k != "model_type"}
    hf = transformers.AutoConfig.for_model(config["model_type"], **kw)
    heads = hf.num_attention_heads
    return {"num_hidden_layers": hf.num_hidden_layers, "num_attention_heads": heads,
            "num_key_value_heads": getattr(hf, "num_key_value_heads", None) or heads,   # GPT-2 attention: MHA
            "head_dim": getattr(hf, "head_dim", None) or hf.hidden_size // heads,       # Qwen2Attention, GPT-2
            "hidden_size": hf.hidden_size, "vocab_size": hf.vocab_size,
            "max_position_embeddings": hf.max_position_embeddings, "tie_word_embeddings": hf.tie_word_embeddings,
            "class": type(hf).__name__, "attribute_map": dict(type(hf).attribute_map)}


@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_a_config_that_lacks_fields_is_filled_as_transformers_fills_it(name):
    config = PARTIAL[name]
    hf = _transformers_reading(config)
    shape = kvmath.kv_shape(config)
    assert (shape.layers, shape.kv_heads, shape.head_dim) == \
        (hf["num_hidden_layers"], hf["num_key_value_heads"], hf["head_dim"])
    r = kvmath.inspect_config(config, model=name, source="/models/x/config.json")
    said = {d.field: d for d in r.defaults_used}
    for field in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
                  "vocab_size", "max_position_embeddings", "tie_word_embeddings"):
        given = field in config or hf["attribute_map"].get(field) in config
        if given:
            assert field not in said, field                        # what the file gives is not a default
        else:
            assert field in said and said[field].value == hf[field], field
            assert said[field].source.startswith((f"transformers {hf['class']} default", "derived: ")), said[field]
    lines = kvmath.describe_defaults(r.defaults_used, r.source)
    text = "\n".join(lines)
    assert all(f"{d.field}={json.dumps(d.value)}" in text for d in r.defaults_used)
    assert all("(absent in config.json)" in line for line in lines)


def test_which_values_came_from_the_configuration_class_and_which_it_derived():
    r = kvmath.inspect_config(PARTIAL["llama"], model="m", source="/m/config.json")
    by = {d.field: d for d in r.defaults_used}
    assert by["num_hidden_layers"] == kvmath.DefaultUsed("num_hidden_layers", 32, "transformers LlamaConfig default",
                                                         "transformers LlamaConfig")
    assert by["num_key_value_heads"].source == "derived: num_attention_heads" and by["num_key_value_heads"].value == 16
    assert by["head_dim"].source == "derived: hidden_size / num_attention_heads" and by["head_dim"].value == 128
    assert kvmath.describe_defaults(r.defaults_used, r.source)[0].startswith(
        "from transformers' LlamaConfig defaults (absent in config.json): num_hidden_layers=32, "
        "num_key_value_heads=16 (= num_attention_heads), head_dim=128 (= hidden_size / num_attention_heads), ")
    # Mistral's class gives 8 KV heads, not as many as the attention heads, and a 4,096-token window
    m = {d.field: d for d in kvmath.inspect_config(PARTIAL["mistral"], model="m", source="s").defaults_used}
    assert (m["num_key_value_heads"].value, m["num_key_value_heads"].source) == (8, "transformers MistralConfig default")
    assert m["sliding_window"].value == 4096
    # GPT-2: the class's own names (attribute_map), and what its attention derives (no such fields in GPT2Config)
    g = {d.field: d for d in kvmath.inspect_config(PARTIAL["gpt2"], model="m", source="s").defaults_used}
    assert "num_hidden_layers" not in g and "hidden_size" not in g                # n_layer, n_embd given
    assert (g["num_attention_heads"].value, g["num_attention_heads"].attribute) == (12, "n_head")
    assert g["head_dim"] == kvmath.DefaultUsed("head_dim", 64, "derived: hidden_size / num_attention_heads", "cachectl")
    # an explicit head_dim is the file's
    h = {d.field for d in kvmath.inspect_config(PARTIAL["llama-head-dim"], model="m", source="s").defaults_used}
    assert "head_dim" not in h and "num_hidden_layers" not in h and "num_key_value_heads" in h


def test_a_composite_config_names_the_text_configs_defaults():
    config = {"model_type": "gemma3", "text_config": {"hidden_size": 2560, "num_hidden_layers": 34}}
    import transformers

    text = transformers.AutoConfig.for_model("gemma3", text_config=config["text_config"]).get_text_config()
    r = kvmath.inspect_config(config, model="g", source="s")
    by = {d.field: d for d in r.defaults_used}
    assert by["num_key_value_heads"].value == text.num_key_value_heads == r.kv_heads
    assert by["head_dim"].value == text.head_dim == r.head_dim
    assert by["num_attention_heads"].source == "transformers Gemma3TextConfig default"
    assert "num_hidden_layers" not in by and "hidden_size" not in by


def test_kv_inspect_says_which_values_came_from_transformers_defaults(cli, write):
    path = write("config.json", PARTIAL["llama"])
    r = cli("kv-inspect", path, "--context", "4k")
    assert r.exit_code == 0, r.stderr
    assert ("from transformers' LlamaConfig defaults (absent in config.json): num_hidden_layers=32, "
            "num_key_value_heads=16 (= num_attention_heads), head_dim=128 (= hidden_size / num_attention_heads), "
            "intermediate_size=11008, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=false"
            ) in r.stdout.splitlines()
    assert "tie_word_embeddings is not in the config" not in r.stdout      # said once, with the others
    d = json.loads(cli("kv-inspect", path, "--context", "4k", "-f", "json").stdout)
    assert {"schema_version", "model", "layers", "kv_heads", "head_dim", "bytes_per_token", "contexts",
            "layer_types", "weights_bytes", "notes", "findings"} <= set(d)
    assert d["defaults_used"][0] == {"field": "num_hidden_layers", "value": 32,
                                     "source": "transformers LlamaConfig default", "by": "transformers LlamaConfig",
                                     "attribute": None}
    assert [x["field"] for x in d["defaults_used"]] == [
        "num_hidden_layers", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
        "max_position_embeddings", "tie_word_embeddings"]
    # a complete config uses no default
    full = write("full.json", {**PARTIAL["llama-head-dim"], "num_key_value_heads": 4, "intermediate_size": 512,
                               "vocab_size": 1000, "max_position_embeddings": 4096, "tie_word_embeddings": False})
    d = json.loads(cli("kv-inspect", full, "-f", "json").stdout)
    assert d["defaults_used"] == []
    assert "defaults" not in cli("kv-inspect", full).stdout


def test_a_field_nothing_can_fill_is_one_line_naming_file_and_field(cli, write):
    unknown = write("config.json", {"model_type": "not-a-model", "hidden_size": 512, "num_attention_heads": 8})
    r = cli("kv-inspect", unknown)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert str(unknown) in r.stderr and "field 'num_hidden_layers'" in r.stderr
    assert "does not know model_type 'not-a-model'" in r.stderr and "add num_hidden_layers" in r.stderr
    # with the fields it needs, an unknown model type reads field by field and says what it derived
    ok = write("ok.json", {"model_type": "not-a-model", "hidden_size": 512, "num_attention_heads": 8,
                           "num_hidden_layers": 2})
    r = cli("kv-inspect", ok, "--context", "4k")
    assert r.exit_code == 0, r.stderr
    assert ("derived as transformers' attention does (absent in ok.json): num_key_value_heads=8 "
            "(= num_attention_heads), head_dim=64 (= hidden_size / num_attention_heads)") in r.stdout.splitlines()
    # a default that does not fit is named in the error: Qwen2Config's 32 KV heads do not divide 28 heads
    qwen = write("qwen.json", {k: v for k, v in PARTIAL["qwen2"].items() if k != "num_key_value_heads"})
    r = cli("kv-inspect", qwen)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "field 'num_key_value_heads'" in r.stderr
    assert "num_key_value_heads 32 is the transformers Qwen2Config default" in r.stderr
    gpt2 = write("gpt2.json", {"model_type": "gpt2", "n_layer": 2, "n_embd": 512})
    r = cli("kv-inspect", gpt2)
    assert r.exit_code == 2 and "num_attention_heads 12 is the transformers GPT2Config default (n_head" in r.stderr


def test_without_transformers_the_shipped_defaults_are_said_and_agree_with_transformers():
    import transformers

    gemma = {k: v for k, v in kvmath.catalog()["gemma-2-9b"]["config"].items() if k != "tie_word_embeddings"}
    code = ("import sys, json; sys.modules['transformers'] = None\n"
            "from cachectl.engines.kv import config as c\n"
            f"r = c.inspect_config({gemma!r}, model='g', source='s')\n"
            "print(json.dumps([[d.field, d.value, d.by] for d in r.defaults_used]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    shipped = {f: (v, by) for f, v, by in json.loads(out.stdout)}
    assert shipped["tie_word_embeddings"] == (True, "cachectl model_defaults.json")
    assert transformers.AutoConfig.for_model("gemma2").tie_word_embeddings is True
    # with transformers installed, its class answers (and agrees)
    r = kvmath.inspect_config(gemma, model="g", source="s")
    assert {d.field: d.by for d in r.defaults_used}["tie_word_embeddings"] == "transformers Gemma2Config"


def test_a_catalog_config_says_its_defaults_without_importing_transformers():
    code = ("import sys; from cachectl.engines.kv import config as c\n"
            "cfg, src, _ = c.resolve_model('qwen2.5-7b'); r = c.inspect_config(cfg, model='q', source=src)\n"
            "print(c.describe_defaults(r.defaults_used, src)); print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "[\"derived as transformers' attention does (absent in the catalog's config): head_dim=128 "
        "(= hidden_size / num_attention_heads)\"]", "False"]


def test_importing_the_cli_imports_neither_torch_nor_transformers():
    code = ("import sys; import cachectl.cli, cachectl.cli.kv_inspect, cachectl.engines.kv.config; "
            "print('transformers' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("field, value, says", [
    # DeepSeek-V3 with -1 routed experts was counted as a 37B dense model, Mixtral with -1 experts as dense
    ("n_routed_experts", -1, "field 'n_routed_experts': expected an integer from 0"),
    ("moe_intermediate_size", -1, "field 'moe_intermediate_size': expected an integer from 0"),
    ("first_k_dense_replace", "3", "field 'first_k_dense_replace': expected an integer from 0"),
    # each field in range, their product past 64 bits: an internal error of the JSON output
    ("hidden_size", 10**12, "parameters, more than any model (1e+15)"),
])
def test_a_config_whose_sizing_fields_are_out_of_range_is_refused(cli, tmp_path, field, value, says):
    config = {**kvmath.catalog()["deepseek-v3"]["config"], "n_routed_experts": 256, "n_shared_experts": 1,
              "moe_intermediate_size": 2048, "intermediate_size": 18432, "first_k_dense_replace": 3,
              "vocab_size": 129280}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, field: value}))
    r = cli("kv-inspect", path, "-f", "json")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert says in r.stderr and "internal error" not in r.stderr


def _raw_gguf(path, entries: list[tuple[str, int, bytes]], tensors: int = 0):
    """A GGUF header written byte by byte: ``(key, value type, value bytes)`` entries (4 uint32, 5 int32, 6 float32,
    8 string, 9 array, 11 int64), and no tensors."""
    import struct

    out = b"GGUF" + struct.pack("<IQQ", 3, tensors, len(entries))
    for key, vtype, data in entries:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + data
    path.write_bytes(out)
    return path


def _llama_gguf_entries(**values):
    import struct

    def s(text):
        return struct.pack("<Q", len(text)) + text.encode()

    base = [("general.architecture", 8, s("llama")), ("llama.block_count", 4, struct.pack("<I", 2)),
            ("llama.attention.head_count", 4, struct.pack("<I", 4)),
            ("llama.embedding_length", 4, struct.pack("<I", 64))]
    return base + [(f"llama.{k}", t, v) for k, (t, v) in values.items()]


@pytest.mark.parametrize("key, vtype, data, says", [
    ("attention.value_length", 5, (-16).to_bytes(4, "little", signed=True), "got -16"),     # was 0 bytes a token
    ("attention.value_length", 10, (2**64 - 1).to_bytes(8, "little"), "got 18446744073709551615"),
    ("attention.value_length", 6, bytes.fromhex("00008441"), "got 16.5"),                   # a float32
    ("attention.value_length_swa", 8, (2).to_bytes(8, "little") + b"16", "got '16'"),     # an internal TypeError
    ("attention.head_count_kv", 4, (0).to_bytes(4, "little"), "0 KV heads"),               # read as 4, unsaid
])
def test_gguf_head_sizes_are_checked_at_their_keys(tmp_path, key, vtype, data, says):
    import struct

    entries = _llama_gguf_entries(**{"attention.key_length": (4, struct.pack("<I", 16)), key: (vtype, data)})
    if key.endswith("_swa"):
        entries.append(("llama.attention.key_length_swa", 4, struct.pack("<I", 16)))
    path = _raw_gguf(tmp_path / "m.gguf", entries)
    with pytest.raises(InputError, match=f"field 'llama.{re.escape(key)}': .*{re.escape(says)}"):
        kvmath.layer_groups(kvmath.read_gguf_config(str(path)))


def test_gguf_metadata_past_what_a_model_has_is_refused_or_skipped_unread(tmp_path):
    """A 100 MB array no key needs took 1 GB and 19 s to read into a list; a header counting more entries than any
    model has is one line before they are read."""
    import resource
    import struct

    import numpy as np

    n = 5_000_000
    rope = ("llama.rope.freqs", 9, struct.pack("<IQ", 4, n) + np.arange(n, dtype=np.uint32).tobytes())
    path = _raw_gguf(tmp_path / "a.gguf", [*_llama_gguf_entries(**{"attention.head_count_kv": (4, struct.pack(
        "<I", 2))}), rope])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    config = kvmath.read_gguf_config(str(path))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000   # KB: the array is not read
    assert config["num_key_value_heads"] == 2
    (tmp_path / "b.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 200_000) + b"\0" * 13 * 200_000)
    with pytest.raises(InputError, match="corrupt GGUF header: 200,000 metadata entries"):
        kvmath.read_gguf_config(str(tmp_path / "b.gguf"))


def test_the_random_weights_refusal_counts_the_parameters_the_report_counts():
    """The refusal used a rough count, 4x low for Falcon-7B (1.6B against 6.9B) and blind to GPT-2's position
    embeddings: the check passed and the model started to build, past the machine's memory."""
    from cachectl.engines.kv import live as kvlive
    from cachectl.engines.kv.config import count_params

    falcon = json.loads((FIXTURES / "configs" / "falcon-7b.json").read_text())
    assert count_params(falcon).total > 6.9e9
    with pytest.raises(UsageError, match=r"about 25\.\d+ GiB for 6\.92B parameters"):
        kvlive.check_random_weights_memory(falcon, available=16 * 2**30)
    gpt2 = {"model_type": "gpt2", "vocab_size": 1300, "n_embd": 64, "n_layer": 1, "n_head": 4, "n_positions": 2 * 10**8}
    with pytest.raises(UsageError, match=r"12\.80B parameters"):
        kvlive.check_random_weights_memory(gpt2, available=16 * 2**30)
    kvlive.check_random_weights_memory({**gpt2, "n_positions": 1024}, available=16 * 2**30)   # a small one is built
