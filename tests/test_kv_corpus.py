"""Public model configs (fixtures/configs, sources in SOURCES.md) read as transformers reads them, checked against
the real thing: each config, scaled down (few layers, a tiny hidden size, the same attention shape), builds a
random-weight model with transformers; the cache it fills must hold the bytes kv-inspect predicts (within one
token per sliding layer: transformers keeps window - 1 tokens there) and the model must have the parameters the
config arithmetic counts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cachectl.engines.kv import config as kvmath

from .conftest import FIXTURES, ROOT

CONFIGS = FIXTURES / "configs"
PROMPT = list(range(3, 23))        # 20 tokens, past every scaled sliding window (8)
NEW_TOKENS = 3                     # the cache then holds 20 + 3 - 1 = 22 tokens

#: the scaled-down model of each config: what is overridden (everything else, legacy fields and the class
#: defaults the config relies on included, stays as published); the attention shape (query heads per KV head,
#: MQA, MLA, the layer pattern) is kept
SCALED: dict[str, dict] = {
    "falcon-7b": {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 256},
    "llama-3.1-8b": {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 8, "num_key_value_heads": 2,
                     "num_hidden_layers": 2, "vocab_size": 256},
    "mistral-7b-v0.1": {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 8,
                        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256, "sliding_window": 8},
    "mixtral-8x7b-v0.1": {"hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 8,
                          "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
                          "num_local_experts": 4},
    "qwen1.5-moe-a2.7b": {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                          "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
                          "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "num_experts": 4,
                          "num_experts_per_tok": 2, "max_window_layers": 2},
    "qwen3-30b-a3b": {"hidden_size": 64, "head_dim": 16, "intermediate_size": 96, "num_attention_heads": 8,
                      "num_key_value_heads": 1, "num_hidden_layers": 2, "vocab_size": 256,
                      "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "max_window_layers": 2},
    "deepseek-v2-lite": {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                         "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256, "kv_lora_rank": 16,
                         "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
                         "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
                         "n_shared_experts": 1},
    "deepseek-v3": {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 4,
                    "num_hidden_layers": 2, "first_k_dense_replace": 1, "vocab_size": 256, "q_lora_rank": 24,
                    "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
                    "moe_intermediate_size": 32, "n_routed_experts": 8, "n_group": 2, "topk_group": 1,
                    "num_experts_per_tok": 2},
    "gemma-2-9b": {"hidden_size": 64, "head_dim": 16, "intermediate_size": 96, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 256, "sliding_window": 8,
                   "query_pre_attn_scalar": 16},
    # the text config keeps relying on Gemma3TextConfig's defaults for the heads (8 query, 4 KV, head_dim 256)
    "gemma-3-4b-it": {"text_config": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6,
                                      "sliding_window": 8, "vocab_size": 256}},
    "qwen2.5-7b": {"hidden_size": 56, "intermediate_size": 96, "num_attention_heads": 7, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 256, "max_window_layers": 2},
    "gpt2": {"n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 64, "vocab_size": 256},
    "santacoder": {"n_embd": 64, "n_head": 4, "n_inner": 128, "n_layer": 2, "n_positions": 64, "vocab_size": 256},
    "phi-3-mini-4k": {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 4,
                      "num_hidden_layers": 2, "vocab_size": 256, "sliding_window": 8, "pad_token_id": 0,
                      "eos_token_id": 2},
}
#: the attention shape each config is in the corpus for
SHAPES = {"falcon-7b": "MQA (multi_query, no num_key_value_heads)", "llama-3.1-8b": "GQA",
          "mistral-7b-v0.1": "GQA, every layer sliding", "mixtral-8x7b-v0.1": "MoE (8 experts), GQA",
          "qwen1.5-moe-a2.7b": "MoE with a shared expert", "qwen3-30b-a3b": "MoE, explicit head_dim, GQA 8:1",
          "deepseek-v2-lite": "MLA (no q_lora), MoE", "deepseek-v3": "MLA (q_lora), MoE, dense first layers",
          "gemma-2-9b": "sliding and global layers alternating", "gemma-3-4b-it":
          "composite (text_config on class defaults), 5 sliding : 1 global", "qwen2.5-7b": "GQA 7:1, qkv biases, "
          "sliding window switched off", "gpt2": "MHA, GPT-2 field names, tied", "santacoder":
          "MQA (gpt_bigcode multi_query)", "phi-3-mini-4k": "fused qkv, every layer sliding"}


def published(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def scaled(name: str) -> dict:
    config = published(name)
    for key, value in SCALED[name].items():
        if isinstance(value, dict):
            config[key] = {**config.get(key, {}), **value}
        else:
            config[key] = value
    return config


_BUILT: dict[str, object] = {}


def build(name: str):
    """The random-weight transformers model of the scaled config (the text model of a composite one)."""
    if name not in _BUILT:
        import torch
        import transformers

        transformers.utils.logging.set_verbosity_error()
        config = dict(scaled(name))
        hf = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
        torch.manual_seed(0)
        if "text_config" in scaled(name):
            hf = hf.get_text_config()
        _BUILT[name] = transformers.AutoModelForCausalLM.from_config(hf).eval()
    return _BUILT[name]


def test_the_corpus_has_ten_architectures_of_every_shape():
    types = {kvmath.model_type(published(n)) for n in SCALED}
    assert len(types) >= 10, types
    assert set(SHAPES) == set(SCALED) and all((CONFIGS / f"{n}.json").is_file() for n in SCALED)
    sources = (CONFIGS / "SOURCES.md").read_text()
    assert all(f"`{n}.json`" in sources for n in SCALED)


@pytest.mark.parametrize("name", sorted(SCALED))
def test_kv_bytes_equal_the_cache_transformers_fills(name):
    from cachectl.engines.kv import live as kvlive

    run = kvlive.inspect_model(build(name), PROMPT, max_new_tokens=NEW_TOKENS)
    seq = len(PROMPT) + NEW_TOKENS - 1
    assert run.seq_length == seq
    groups = kvmath.layer_groups(scaled(name), run.dtype)   # the dtype the config asks for (torch_dtype)
    # transformers keeps window - 1 tokens in a sliding layer: exact with that rule, and the arithmetic kv-inspect
    # prints (min(tokens, window)) within one token per sliding layer
    exact = sum(g.bytes_per_token * (min(seq, g.window - 1) if g.window else seq) for g in groups)
    c = scaled(name)
    if c.get("kv_lora_rank") and run.layers[0].keys_shape[1] != 1:
        # older transformers (5.0) cache MLA decompressed, per head (nope + rope keys, v values), not the latent
        # vLLM and SGLang keep (5.24 caches the latent): check that form, the arithmetic stays the engines'
        per_head = c["qk_nope_head_dim"] + c["qk_rope_head_dim"] + c["v_head_dim"]
        nbytes = kvmath.DTYPE_BYTES[run.dtype]
        assert run.measured_bytes == c["num_hidden_layers"] * c["num_attention_heads"] * per_head * nbytes * seq
        return
    one_token = sum(g.bytes_per_token for g in groups if g.window)
    assert run.measured_bytes == exact, (name, run.layers)
    assert abs(run.measured_bytes - kvmath.kv_bytes(groups, seq)) <= one_token
    assert kvmath.config_note(scaled(name)) is None            # read through transformers' configuration class


def test_published_configs_hand_computed():
    def bpt(name):
        return kvmath.kv_shape(published(name)).bytes_per_token

    # Falcon-7B: multi_query and no num_key_value_heads -> one K/V head of 4544 / 71 = 64 dims, 32 layers, bf16
    assert bpt("falcon-7b") == 2 * 32 * 1 * 64 * 2 == 8192                    # not 71 x that
    assert bpt("santacoder") == 2 * 24 * 1 * 128 * 2                           # gpt_bigcode multi_query
    assert bpt("gpt2") == 2 * 12 * 12 * 64 * 2                                 # n_layer, n_head, n_embd
    # Gemma 3 4B: its text_config leaves the heads to Gemma3TextConfig (8 query, 4 KV, head_dim 256)
    g3 = {g.type: g for g in kvmath.layer_groups(published("gemma-3-4b-it"))}
    assert (g3["sliding_attention"].layers, g3["full_attention"].layers) == (29, 5)
    assert (g3["full_attention"].kv_heads, g3["full_attention"].head_dim, g3["sliding_attention"].window) == \
        (4, 256, 1024)
    assert bpt("gemma-3-4b-it") == 2 * 34 * 4 * 256 * 2
    assert bpt("deepseek-v2-lite") == 27 * (512 + 64) * 2                      # MLA latent + rope key
    assert bpt("qwen2.5-7b") == 2 * 28 * 4 * 128 * 2
    assert [g.type for g in kvmath.layer_groups(published("qwen2.5-7b"))] == ["full_attention"]


def test_a_model_type_transformers_does_not_know_keeps_the_field_reading_and_says_so():
    legacy = published("falcon-7b-refinedweb")            # the RefinedWeb config.json Falcon-7B first shipped with
    assert kvmath.kv_shape(legacy).bytes_per_token == 8192  # n_layer, n_head, multi_query read as legacy names
    note = kvmath.config_note(legacy)
    assert note is not None and "does not know model_type 'RefinedWebModel'" in note
    r = kvmath.inspect_config(legacy, model="falcon-7b-rw", source="s")
    assert note in r.notes


def test_falcon_new_decoder_architecture_cache_heads_follow_the_installed_transformers():
    # Falcon-40B: 8 KV heads (num_kv_heads, what vLLM and SGLang cache, and the arithmetic in every release).
    # transformers' own cache: before 5.25 FalconAttention repeats them to the 128 query heads before it writes
    # its cache (16x what the model needs); from 5.25 it caches the 8 (kvmath.transformers_cache_kv_heads cites
    # both sources)
    from cachectl.engines.kv import live as kvlive

    assert kvmath.kv_shape(published("falcon-40b")).bytes_per_token == 2 * 60 * 8 * 64 * 2
    import torch
    import transformers

    config = {**published("falcon-40b"), "hidden_size": 64, "num_attention_heads": 8, "num_kv_heads": 2,
              "num_hidden_layers": 2, "vocab_size": 256}
    torch.manual_seed(0)
    hf = transformers.AutoConfig.for_model(config.pop("model_type"), **config)
    run = kvlive.inspect_model(transformers.AutoModelForCausalLM.from_config(hf).eval(), PROMPT, max_new_tokens=1)
    config["model_type"] = "falcon"
    served = kvmath.kv_bytes(kvmath.layer_groups(config, run.dtype), run.seq_length)
    # what the model really cached: 8 heads (the query heads) or 2 (its KV heads), and nothing else
    cached = run.layers[0].keys_shape[1]
    assert cached in (2, 8) and run.measured_bytes == cached // 2 * served
    # cachectl's rule for the installed release predicts it, and the other release's rule would not
    installed = transformers.__version__
    other = "5.24.0" if kvmath._release(installed) >= kvmath.FALCON_CACHES_KV_HEADS_SINCE else "5.25.0"
    assert cached == (kvmath.transformers_cache_kv_heads(config, installed) or 2)
    assert cached != (kvmath.transformers_cache_kv_heads(config, other) or 2)
    assert run.measured_bytes == kvmath.kv_bytes(kvmath.transformers_cache_groups(config, installed, run.dtype),
                                                 run.seq_length)
    assert run.measured_bytes != kvmath.kv_bytes(kvmath.transformers_cache_groups(config, other, run.dtype),
                                                 run.seq_length)
    assert run.agree and run.predicted_bytes == run.measured_bytes
    # the arithmetic (what a serving engine caches) does not move with transformers
    assert kvmath.kv_shape(config, run.dtype).bytes_per_token == kvmath.layer_groups(config, run.dtype)[0].bytes_per_token


def test_falcon_cache_rule_by_transformers_release():
    falcon40 = published("falcon-40b")                     # 128 query heads, 8 KV heads, 60 layers, head_dim 64
    assert kvmath.transformers_cache_kv_heads(falcon40, "5.24.0") == 128
    assert kvmath.transformers_cache_kv_heads(falcon40, "5.0.0") == 128
    for newer in ("5.25.0", "5.25.0.dev0", "5.26.1", "6.0.0"):
        assert kvmath.transformers_cache_kv_heads(falcon40, newer) is None, newer
    old = kvmath.transformers_cache_groups(falcon40, "5.24.0")
    assert [(g.kv_heads, g.bytes_per_token) for g in old] == [(128, 2 * 60 * 128 * 64 * 2)]
    assert kvmath.transformers_cache_groups(falcon40, "5.25.0") == kvmath.layer_groups(falcon40)
    note = kvmath.transformers_cache_note(falcon40, "5.24.0")
    assert note is not None and "16x" in note and kvmath.transformers_cache_note(falcon40, "5.25.0") is None
    # multi-query Falcon-7B caches its one K/V head in both releases
    for version in ("5.24.0", "5.25.0"):
        assert kvmath.transformers_cache_kv_heads(published("falcon-7b"), version) is None
        assert kvmath.transformers_cache_groups(published("falcon-7b"), version) == \
            kvmath.layer_groups(published("falcon-7b"))
    # a new-decoder config whose KV heads are its query heads caches them either way
    same = {**falcon40, "num_kv_heads": 128}
    assert kvmath.transformers_cache_kv_heads(same, "5.24.0") is None


@pytest.mark.parametrize("name", sorted(SCALED))
def test_parameter_counts_equal_the_models_transformers_builds(name):
    model = build(name)
    count = kvmath.count_params(scaled(name))
    assert count is not None
    assert count.approximate is None or name == "gemma-3-4b-it" and "vision_config" in count.approximate
    assert count.total == sum(p.numel() for p in model.parameters()), name
    assert count.active <= count.total and (count.active < count.total) == (count.experts > 0)


def test_mixtral_on_an_a100_does_not_fit_and_says_so():
    # 46.70B parameters, every expert in memory: 86.99 GiB of bf16 weights > 80 GiB x 0.9
    r = kvmath.inspect_config(published("mixtral-8x7b-v0.1"), model="mixtral", source="s", contexts=(4096,),
                              gpu_memory=80 * kvmath.GIB)
    assert r.params == 46_702_792_704 and r.active_params == 12_879_925_248       # published: 46.7B, 12.9B
    assert r.weights_bytes == 46_702_792_704 * 2 and r.kv_budget_bytes == 0
    assert r.weights_fit is False and r.contexts[0].max_sequences == 0
    assert len(r.findings) == 1 and "do not fit" in r.findings[0] and "86.99 GiB" in r.findings[0]
    assert "all" not in r.weights_source and "every one of the 8 experts of 32 MoE layers" in r.weights_source
    h200 = kvmath.inspect_config(published("mixtral-8x7b-v0.1"), model="mixtral", source="s", gpu="H200")
    assert h200.weights_fit is True and not h200.findings and h200.kv_budget_bytes > 0
    # the decode bound reads the parameters a token goes through
    assert any("12.9B parameters active per token" in n for n in h200.notes)


def test_published_parameter_counts():
    # the counts the model cards publish (total; active per token for MoE)
    def count(name):
        c = kvmath.count_params(published(name))
        return round(c.total / 1e9, 1), round(c.active / 1e9, 1)

    assert kvmath.count_params(published("llama-3.1-8b")).total == 8_030_261_248
    assert kvmath.count_params(published("gpt2")).total == 124_439_808
    assert count("mixtral-8x7b-v0.1") == (46.7, 12.9)
    assert count("qwen1.5-moe-a2.7b") == (14.3, 2.7)
    assert count("qwen3-30b-a3b") == (30.5, 3.4)        # published 30.5B / 3.3B
    assert count("deepseek-v3")[0] == 671.0              # published 671B (+14B of the MTP module, not counted)
    assert count("falcon-7b")[0] == 6.9 and count("mistral-7b-v0.1")[0] == 7.2


def test_the_shipped_catalog_readings_are_what_transformers_reads():
    """kv-inspect answers a catalog name from cachectl/data/catalog_readings.json instead of importing
    transformers (and torch): the file must hold exactly what the installed transformers makes of each config,
    for every catalog model it reads through its configuration class (rerun fixtures/make_catalog_readings.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_catalog_readings",
                                                  ROOT / "fixtures" / "make_catalog_readings.py")
    assert spec and spec.loader
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    shipped = json.loads((ROOT / "cachectl" / "data" / kvmath.READINGS).read_text(encoding="utf-8"))["readings"]
    assert shipped == json.loads(json.dumps(maker.readings()))
    # the version to_dict() stamps is not a reading (it kept 5.24's file from matching 5.25's equal readings)
    assert not any("transformers_version" in e["reading"] for e in shipped.values())
    assert {e["catalog"] for e in shipped.values()} == set(kvmath.catalog())


def test_a_catalog_name_is_read_without_importing_transformers():
    code = ("import sys; from cachectl.engines.kv import config as c; "
            "cfg, src, _ = c.resolve_model('llama-3.1-8b'); c.inspect_config(cfg, model='llama-3.1-8b', source=src); "
            "print('transformers' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


# ------------------------------------------------------------------------- MLA configs that list layer_types

_MLA = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "kv_lora_rank": 16,
        "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "intermediate_size": 96,
        "moe_intermediate_size": 32, "torch_dtype": "float32"}
_DSA = {**_MLA, "num_hidden_layers": 2, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
        "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "q_lora_rank": 24, "index_head_dim": 16,
        "index_n_heads": 2, "index_topk": 8}
#: DeepSeek-V3.2 and GLM-MoE-DSA list every layer "indexed_attention", Kimi Linear "full_attention" (MLA) and
#: "linear_attention" (KDA, a fixed state): all MLA, not num_key_value_heads x head_dim per layer
LISTED_MLA = {
    "deepseek_v32": {"model_type": "deepseek_v32", **_DSA},
    "glm_moe_dsa": {"model_type": "glm_moe_dsa", **_DSA},
    "kimi_linear": {"model_type": "kimi_linear", **_MLA, "num_hidden_layers": 4, "pad_token_id": 0,
                    "bos_token_id": 1, "eos_token_id": 2, "num_experts": 4, "num_experts_per_token": 2,
                    "linear_attn_config": {"head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4,
                                           "full_attn_layers": [2, 4], "kda_layers": [1, 3]}},
}


def _listed_mla(mt: str) -> dict:
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if mt not in CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {transformers.__version__} has no {mt}")
    return dict(LISTED_MLA[mt])


@pytest.mark.parametrize("mt", sorted(LISTED_MLA))
def test_mla_layers_listed_as_attention_are_counted_as_mla(mt):
    c = _listed_mla(mt)
    latent = c["kv_lora_rank"] + c["qk_rope_head_dim"]                 # 16 + 8 per token per MLA layer
    mla_layers = 2                                                      # DSA: both layers; Kimi: layers 2 and 4
    groups = {g.type: g for g in kvmath.layer_groups(c, "bf16")}
    assert groups["mla"].layers == mla_layers
    assert groups["mla"].bytes_per_token == mla_layers * latent * 2
    if mt == "kimi_linear":
        assert set(groups) == {"mla", "no_kv"} and groups["no_kv"].layers == 2   # KDA: a fixed state, no KV
        expected = mla_layers * latent * 2
    else:
        # the indexer's key, as vLLM caches it: index_head_dim fp8 values + a 4-byte fp32 scale per 128 of them
        ik = groups[kvmath.INDEXER_KEYS]
        assert ik.layers == 2 and ik.bytes_per_token == 2 * (c["index_head_dim"] + c["index_head_dim"] // 128 * 4)
        expected = mla_layers * latent * 2 + 2 * c["index_head_dim"]
    shape = kvmath.kv_shape(c, "bf16")
    assert shape.bytes_per_token == expected and shape.mla_dim == latent
    # not the per-head arithmetic the listed kinds used to get: 2 x 4 KV heads x head_dim per layer
    assert shape.bytes_per_token != 2 * mla_layers * c["num_key_value_heads"] * 2 * 8 * 2


def test_dsa_indexer_keys_at_deepseek_v32_scale():
    # DeepSeek-V3.2's shape: 61 layers, latent 512 + 64, index_head_dim 128 -> 128 fp8 + 4 scale bytes per layer
    c = {**_listed_mla("deepseek_v32"), "num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
         "index_head_dim": 128, "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128}
    assert kvmath.kv_shape(c, "bf16").bytes_per_token == 61 * (512 + 64) * 2 + 61 * (128 + 4)
    r = kvmath.inspect_config(c, model="dsv32", source="s", contexts=(4096,))
    assert any("indexer" in n and "132 bytes" in n for n in r.notes)


def test_glm_dsa_shared_indexer_layers_cache_no_indexer_keys():
    # IndexCache: "shared" layers reuse the previous layer's top-k and run no indexer (no indexer keys)
    c = {**_listed_mla("glm_moe_dsa"), "num_hidden_layers": 4, "indexer_types": ["full", "shared", "full", "shared"]}
    groups = {g.type: g for g in kvmath.layer_groups(c, "fp32")}
    assert groups["mla"].layers == 4 and groups[kvmath.INDEXER_KEYS].layers == 2


@pytest.mark.parametrize("mt", sorted(LISTED_MLA))
def test_listed_mla_live_cache_agrees(mt):
    import torch
    import transformers

    from cachectl.engines.kv import live as kvlive

    c = _listed_mla(mt)
    kwargs = {k: v for k, v in c.items() if k != "model_type"}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(mt, **kwargs)).eval()
    run = kvlive.inspect_model(model, PROMPT, max_new_tokens=NEW_TOKENS)
    seq = len(PROMPT) + NEW_TOKENS - 1
    latent_bytes = 2 * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 4 * seq     # 2 MLA layers, fp32
    indexer_bytes = 0 if mt == "kimi_linear" else 2 * c["index_head_dim"] * 4 * seq   # transformers: model dtype
    assert run.seq_length == seq and run.dtype == "fp32"
    assert run.measured_bytes == latent_bytes + indexer_bytes, run.layers
    assert run.agree and run.predicted_bytes == run.measured_bytes
    if indexer_bytes:
        assert all(layer.indexer_keys_shape == (1, seq, c["index_head_dim"]) for layer in run.layers)


#: layer kinds transformers lists and caches its own way (cache_utils.get_layer_types_and_kwargs): Llama 4's chunked
#: layers are sliding-window layers of attention_chunk_size; Nemotron-H's "mlp" and "moe" layers hold nothing. Both
#: were counted as full attention (three and four times the cache the run measured)
LISTED_KINDS = {
    "llama4_text": ({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "intermediate_size_mlp": 96,
                     "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "attention_chunk_size": 8, "num_local_experts": 2, "num_experts_per_tok": 1,
                     "interleave_moe_layer_step": 1}, {"chunked_attention": (3, 8), "full_attention": (1, None)}),
    "nemotron_h": ({"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hybrid_override_pattern": "M-*E",
                    "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 1,
                    "n_routed_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 32,
                    "moe_shared_expert_intermediate_size": 32}, {"no_kv": (3, None), "full_attention": (1, None)}),
}


@pytest.mark.parametrize("mt", sorted(LISTED_KINDS))
def test_listed_layer_kinds_are_cached_as_transformers_caches_them(mt):
    import torch
    import transformers

    from cachectl.engines.kv import live as kvlive

    kwargs, expect = LISTED_KINDS[mt]
    groups = kvmath.layer_groups({"model_type": mt, **kwargs}, "fp32")
    assert {g.type: (g.layers, g.window) for g in groups} == expect
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(mt, **kwargs)).eval()
    run = kvlive.inspect_model(model, PROMPT, max_new_tokens=NEW_TOKENS)
    seq = len(PROMPT) + NEW_TOKENS - 1
    exact = sum(g.bytes_per_token * (min(seq, g.window - 1) if g.window else seq) for g in groups)
    assert run.measured_bytes == exact and run.agree, run.layers


@pytest.mark.parametrize("extra, bytes_per_token", [
    ({"num_kv_shared_layers": 2}, 256),     # Gemma 3n/4's: a Llama has none (it was 0 bytes)
    ({"global_head_dim": 64}, 256),         # Gemma 4's (it was 1,024)
    ({"value_head_dim": 8}, 256),           # only a GGUF file's (it was 192)
])
def test_fields_of_other_architectures_leave_a_llama_as_it_is(extra, bytes_per_token):
    base = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    assert sum(g.bytes_per_token for g in kvmath.layer_groups({**base, **extra})) == bytes_per_token


@pytest.mark.parametrize("field", ["value_head_dim", "global_head_dim", "global_value_head_dim"])
def test_a_bad_head_dim_field_is_refused_at_its_name(field):
    from cachectl.errors import InputError

    base = {"model_type": "gemma4_text", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    for bad in (-100, "abc", 1.5):
        with pytest.raises(InputError, match=f"field '{field}': expected a positive integer"):
            kvmath.check_config({**base, field: bad})


def test_a_text_config_that_is_not_an_object_is_named():
    from cachectl.errors import InputError

    for bad in ("abc", 7, ["x"]):   # (read as absent: the error named num_hidden_layers)
        with pytest.raises(InputError, match="field 'text_config': expected the text model's configuration"):
            kvmath.check_config({"model_type": "llava", "text_config": bad, "num_hidden_layers": 2})


def test_a_sliding_pattern_list_holds_true_or_false():
    from cachectl.errors import InputError

    base = {"model_type": "gemma3_text", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "hidden_size": 64, "sliding_window": 8, "cachectl_from_gguf": True}
    assert [g.type for g in kvmath.layer_groups({**base, "sliding_window_pattern": [True, False]})] == [
        "sliding_attention", "full_attention"]
    with pytest.raises(InputError, match="field 'sliding_window_pattern': expected true or false per layer, got 'false'"):
        kvmath.layer_groups({**base, "sliding_window_pattern": ["false", "true"]})   # ('false' counted as sliding)
