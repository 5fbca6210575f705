"""KV-cache size arithmetic from a model's configuration (shared by kv-inspect and simulate-prefix).

bytes per token = 2 (K and V) x layers x KV heads x head_dim x dtype bytes, with ``head_dim`` from the
config when it has one, GQA/MQA through ``num_key_value_heads``, MLA caches as ``kv_lora_rank +
qk_rope_head_dim`` per layer (one latent, no separate V; also where ``layer_types`` lists the layers as attention),
DeepSeek sparse attention's indexer keys as a group of their own (as vLLM caches them), sliding-window layers
capped at their window, and layers without attention KV (linear attention, Mamba) counted as zero.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ...datafiles import load_data
from ...errors import InputError, UsageError

SCHEMA_VERSION = 1
DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0,
               "fp8": 1.0, "int8": 1.0, "int4": 0.5}
GIB = 1024 ** 3
MAX_MEMORY = 1e15               # bytes: larger sizes are typos (and would overflow the JSON integers)
MAX_CONTEXT = 2 ** 40           # tokens
MAX_LAYERS = 100_000            # no model has more; a bigger count is corrupt (and is materialized per layer)
MAX_CONFIG_INT = 2 ** 40        # any other integer of a config
#: layer kinds with no per-token KV: recurrent or conv state only (transformers' LinearAttentionLayer), and layers
#: with no attention at all ("moe", "mlp": Nemotron-H's; cache_utils.get_layer_types_and_kwargs makes them its
#: "dummy" layers, which hold nothing)
_NO_KV = {"linear_attention", "mamba", "mamba2", "recurrent", "conv", "ssm", "moe", "mlp", "dummy"}
#: layer kinds whose K/V cache this module sizes; any other listed kind is counted as full attention, and said so
KNOWN_LAYER_KINDS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "hybrid", "hybrid_sliding",
                               "attention", "mla", "shared_kv", *_NO_KV})


@dataclass(frozen=True)
class KvShape:
    layers: int
    kv_heads: int | None         # None when layers differ (see the layer groups) or for MLA
    head_dim: int | None         # None when layers differ (see the layer groups) or for MLA
    mla_dim: int | None          # kv_lora_rank + qk_rope_head_dim for MLA caches (no separate V)
    dtype: str
    bytes_per_token: float


@dataclass(frozen=True)
class LayerGroup:
    """Layers that cache the same way."""

    type: str                    # full_attention | sliding_attention | mla | no_kv | shared_kv | indexer_keys
    layers: int
    window: int | None
    bytes_per_token: float       # for all layers of the group together
    kv_heads: int | None = None
    head_dim: int | None = None  # of the keys
    value_dim: int | None = None  # of the values (= head_dim unless the model says otherwise)


@dataclass(frozen=True)
class _Layer:
    type: str
    kv_heads: int | None = None
    head_dim: int | None = None
    value_dim: int | None = None
    window: int | None = None


# ------------------------------------------------------------------------------------------- configs

#: model types whose layers never cache keys and values between tokens (bidirectional encoders)
ENCODER_ONLY = frozenset({"bert", "roberta", "xlm-roberta", "xlm_roberta", "distilbert", "albert", "electra",
                          "deberta", "deberta-v2", "deberta_v2", "camembert", "mpnet", "modernbert", "nomic-bert",
                          "nomic_bert", "jina-bert-v2", "neo-bert", "t5encoder", "bge-m3", "ernie", "xlnet-encoder"})
#: every pattern-th layer is global when the config lists no layer_types (their transformers defaults)
_DEFAULT_SLIDING_PATTERN = {"gemma3": 6, "gemma3_text": 6, "gemma4": 6, "gemma4_text": 6}
_GEMMA4 = {"gemma4", "gemma4_text"}
#: the model types whose configuration classes have a field (transformers 5.24's configuration_*.py): elsewhere the
#: field is an unknown key the model never reads (a Llama config with num_kv_shared_layers was counted 0 bytes a token,
#: one with a negative value_head_dim negative bytes). A config read from a GGUF file has them from its own keys.
_FIELD_FAMILIES = {
    "num_kv_shared_layers": ("gemma3n", "gemma4"),
    "global_head_dim": ("gemma4", "diffusion_gemma", "embedding_gemma2"),
    "global_value_head_dim": ("gemma4", "diffusion_gemma", "embedding_gemma2"),
    "value_head_dim": (),
}


def _own(config: dict, cfg: dict, field: str) -> Any:
    """``cfg[field]`` where the model's configuration class has that field (:data:`_FIELD_FAMILIES`), else None."""
    value = cfg.get(field)
    if value is None or config.get(FROM_GGUF):
        return value
    return value if model_type(config).startswith(_FIELD_FAMILIES[field]) else None


def load_config(path: str) -> tuple[dict, str]:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise InputError("no such model config (pass a model directory or its config.json)", source=str(path))
    from ...inputs import parse_json_document, read_text

    config = parse_json_document(*read_text(str(p)))
    if not isinstance(config, dict):
        raise InputError("expected a JSON object", source=str(p))
    return config, str(p)


def _int(config: dict, key: str, source: str, whole: dict | None = None) -> int:
    """A positive integer field of the (text) config ``config``; ``whole``: the config as the file gives it, to say
    why a field absent from the file has no default either."""
    value = config.get(key)
    if value is None and whole is not None:
        raise InputError(f"absent, and needed: {_why_no_default(whole)} (add {key} to the config)", source=source,
                         field=key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"expected a positive integer, got {value!r:.60}", source=source, field=key)
    return value


def _why_no_default(config: dict) -> str:
    note = config_note(config)
    if note is None:
        mt = model_type(config)
        return f"transformers' {mt} configuration class has no default for it"
    # "transformers 5.24.0 does not know model_type 'foo'", "the config has no model_type", ...
    return note.rsplit(": ", 1)[0]


_OPTIONAL_INTS = ("num_key_value_heads", "head_dim", "sliding_window", "kv_lora_rank", "qk_rope_head_dim",
                  "hidden_size", "num_attention_heads", "attention_chunk_size", "value_head_dim", "global_head_dim",
                  "global_value_head_dim")


#: the integers the parameter count reads (0 where a config writes "none": no shared experts, no q LoRA)
_SIZING_INTS = ("intermediate_size", "vocab_size", "n_routed_experts", "num_local_experts", "num_experts",
                "num_experts_per_tok", "num_experts_per_token", "moe_intermediate_size",
                "shared_expert_intermediate_size", "n_shared_experts", "first_k_dense_replace", "q_lora_rank",
                "qk_nope_head_dim", "v_head_dim", "n_inner", "ffn_hidden_size", "num_kv_shared_layers")
#: more parameters than any model has (the largest have some 10**12): a config that sizes more is corrupt
MAX_PARAMS = 10**15


def check_config(config: dict, source: str = "config.json") -> None:
    """The fields the KV arithmetic and the parameter count read, checked where they are read: integers in range,
    KV heads that divide the attention heads, a head_dim that hidden_size gives when the config has none, and at
    most :data:`MAX_PARAMS` parameters."""
    if config.get("text_config") is not None and not isinstance(config.get("text_config"), dict):
        raise InputError(f"expected the text model's configuration (an object), got {config['text_config']!r:.60}",
                         source=source, field="text_config")  # (it was read as absent, and a field named missing)
    cfg = _text_config(config)
    for key in ("num_hidden_layers", *_OPTIONAL_INTS):
        value = cfg.get(key)
        if value is None or (value == 0 and key != "num_hidden_layers" and not isinstance(value, bool)):
            continue  # absent (0 means absent for the optional ones, as configs write it)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONFIG_INT:
            raise InputError(f"expected a positive integer up to {MAX_CONFIG_INT:,}, got {value!r:.60}",
                             source=source, field=key)
    for key in _SIZING_INTS:  # (a negative one was read as absent: -1 experts counted DeepSeek-V3 as 37B dense)
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= MAX_CONFIG_INT):
            raise InputError(f"expected an integer from 0 to {MAX_CONFIG_INT:,}, got {value!r:.60}",
                             source=source, field=key)
    counted = count_params(config)
    if counted is not None and counted.total > MAX_PARAMS:
        raise InputError(f"sizes {counted.total:.3g} parameters, more than any model ({MAX_PARAMS:.0e}): a field past "
                         "what a model has?", source=source)
    kinds = set(layer_types(config, source))  # checks the layer count
    if cfg.get("kv_lora_rank"):
        return
    if not kinds - _NO_KV:
        return
    heads = _int(cfg, "num_attention_heads", source, config)
    kv_heads = cfg.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise InputError(f"{kv_heads} KV heads do not divide the {heads} attention heads (grouped-query attention "
                         "shares each KV head among a whole number of query heads)"
                         f"{_defaulted(config, 'num_key_value_heads', 'num_attention_heads')}", source=source,
                         field="num_key_value_heads")
    if not cfg.get("head_dim"):
        hidden = _int(cfg, "hidden_size", source, config)
        if hidden % heads:
            raise InputError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} and there is "
                             f"no head_dim{_defaulted(config, 'hidden_size', 'num_attention_heads')}", source=source,
                             field="hidden_size")


def _defaulted(config: dict, *fields: str) -> str:
    """``; num_attention_heads 12 is the transformers GPT2Config default (n_head is absent from the config)`` for
    each of ``fields`` the configuration class filled in: an error about a value the file does not give says so."""
    filled = {d.field: d for d in _filled(config)}
    said = []
    for f in (f for f in fields if f in filled):
        d = filled[f]
        how = (f"is derived {d.source.removeprefix('derived: ')}" if d.source.startswith("derived: as ") else
               f"is derived from {d.source.removeprefix('derived: ')} by {d.by}" if d.source.startswith("derived: ")
               else f"is the {d.source}")
        said.append(f"; {f} {d.value} {how} ({d.attribute or f} is absent from the config)")
    return "".join(said)


def _raw_text_config(config: dict) -> dict:
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


# ------------------------------------------------------------------------------- transformers' reading

#: generic field names read from transformers' configuration object (its ``attribute_map`` turns GPT-2's
#: ``n_head`` or DBRX's ``d_model`` into them; properties such as Falcon's ``head_dim`` count too)
_GENERIC_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
                   "intermediate_size", "vocab_size", "max_position_embeddings", "sliding_window", "layer_types",
                   "kv_lora_rank", "qk_rope_head_dim", "tie_word_embeddings")
#: legacy names (Falcon's RefinedWeb configs, GPT-2 style) read when transformers cannot read the config
_LEGACY_ALIASES = {"n_layer": "num_hidden_layers", "n_layers": "num_hidden_layers", "n_head": "num_attention_heads",
                   "n_heads": "num_attention_heads", "n_embd": "hidden_size", "n_embed": "hidden_size",
                   "d_model": "hidden_size", "n_head_kv": "num_key_value_heads", "num_kv_heads": "num_key_value_heads",
                   "n_positions": "max_position_embeddings"}
#: marks a config translated by cachectl itself (from GGUF metadata): its fields are cachectl's, not a
#: transformers configuration class's, so it is read field by field
FROM_GGUF = "cachectl_from_gguf"


def _kv_heads_as_the_model_builds_them(model_type: str, d: dict) -> int | None:
    """KV heads where transformers' attention module derives them from legacy fields rather than from
    ``num_key_value_heads`` (checked against the caches of random-weight models in tests/test_kv_corpus.py)."""
    heads = d.get("num_attention_heads")
    if model_type == "falcon":  # FalconAttention: num_kv_heads if new_decoder_architecture or not multi_query, else 1
        if d.get("new_decoder_architecture") or not d.get("multi_query"):
            return d.get("num_kv_heads") or heads
        return 1
    if model_type == "gpt_bigcode":  # multi_query: one K/V head shared by all query heads
        return 1 if d.get("multi_query", True) else heads
    if model_type == "dbrx" and isinstance(d.get("attn_config"), dict):
        return d["attn_config"].get("kv_n_heads") or heads
    return None


def _legacy_reading(cfg: dict) -> dict:
    """Today's field-by-field reading, with the legacy names of older configs (RefinedWeb, GPT-2 style)."""
    out = {k: v for k, v in cfg.items() if k != DEFAULTS_KEY}  # cachectl's own record, never the file's
    for old, new in _LEGACY_ALIASES.items():
        if old in cfg and out.get(new) is None:
            out[new] = cfg[old]
    if cfg.get("multi_query") is True and not cfg.get("new_decoder_architecture") and "num_key_value_heads" not in cfg:
        out["num_key_value_heads"] = 1  # multi-query attention: one K/V head
    return out


#: the shipped catalog's configs as transformers reads them (``cachectl/data/catalog_readings.json``, written by
#: ``fixtures/make_catalog_readings.py`` through :func:`_read_through_transformers`, and checked against the installed
#: transformers by tests/test_kv_corpus.py): a catalog name is answered without importing transformers, which
#: imports torch (about 2 s of start-up)
READINGS = "catalog_readings.json"


def reading_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.cache
def _shipped_readings() -> dict[str, dict]:
    try:
        return {key: entry["reading"] for key, entry in load_data(READINGS)["readings"].items()}
    except FileNotFoundError:
        return {}


def config_text(config: dict) -> str:
    """The canonical JSON text a config is read (and its reading cached) by."""
    return json.dumps(config, sort_keys=True, default=str)


@functools.lru_cache(maxsize=128)
def _read_json_config(text: str) -> tuple[dict, str | None]:
    shipped = _shipped_readings().get(reading_key(text))
    if shipped is not None:
        return dict(shipped), None
    return _read_through_transformers(text)


def _read_through_transformers(text: str) -> tuple[dict, str | None]:
    config = json.loads(text)
    raw = _raw_text_config(config)
    mt = config.get("model_type")
    if config.get(FROM_GGUF):
        return _legacy_reading(raw), None
    if not isinstance(mt, str) or not mt:
        return _legacy_reading(raw), ("the config has no model_type: read field by field (transformers' "
                                      "configuration classes not consulted)")
    try:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return _legacy_reading(raw), f"transformers is not installed: the {mt} config is read field by field"
    if mt not in CONFIG_MAPPING_NAMES:
        return _legacy_reading(raw), (f"transformers {transformers.__version__} does not know model_type {mt!r}: "
                                      "the config is read field by field (legacy names included)")
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    previous = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf = transformers.AutoConfig.for_model(mt, **kwargs)
            sub = hf.get_text_config(decoder=True) if hasattr(hf, "get_text_config") else hf
            d = sub.to_dict()
            for name in _GENERIC_FIELDS:
                try:
                    value = getattr(sub, name)
                except AttributeError:
                    continue
                if isinstance(value, (int, float, str, list, tuple)) or value is None:
                    d[name] = list(value) if isinstance(value, tuple) else value
    except Exception as exc:  # a config its class refuses: today's reading, said
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:160]
        return _legacy_reading(raw), (f"transformers' {mt} configuration class refused the config ({first}): read "
                                      "field by field")
    finally:
        transformers.utils.logging.set_verbosity(previous)
    text_type = str(d.get("model_type") or mt)
    kv = _kv_heads_as_the_model_builds_them(text_type, d)
    if kv is not None:
        d["num_key_value_heads"] = kv
    d["model_type"] = text_type
    # to_dict() stamps the installed transformers' version over whatever the file says: bookkeeping, not a reading
    # (kept out, the shipped readings stay equal across releases that read the configs alike, as 5.24 and 5.25 do)
    d.pop("transformers_version", None)
    d[DEFAULTS_KEY] = _filled_by_the_class(hf, sub, config, d, kv_override=kv is not None)
    return d, None


# --------------------------------------------------------------------------- values the file does not give

#: the fields a reading reports when the file leaves them to transformers (in this order): the KV arithmetic's,
#: the weights estimate's and the context limit
_REPORTED = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
             "sliding_window", "kv_lora_rank", "qk_rope_head_dim", "intermediate_size", "vocab_size",
             "max_position_embeddings", "tie_word_embeddings")
#: where a reading through transformers records the fields its configuration class filled in, absent from the file:
#: ``{field: {"source", "by", "attribute"}}`` (shipped in catalog_readings.json, so that a catalog name says it
#: without importing transformers)
DEFAULTS_KEY = "cachectl_defaults"
_NO_DEFAULT = object()


def _class_default(cls: type, attribute: str) -> Any:
    """The default a configuration class gives ``attribute``: its dataclass field's (transformers 5), else its
    ``__init__`` parameter's (transformers 4)."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.name == attribute:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
                return _NO_DEFAULT
    try:
        param = inspect.signature(cls).parameters.get(attribute)
    except (TypeError, ValueError):
        return _NO_DEFAULT
    return _NO_DEFAULT if param is None or param.default is inspect.Parameter.empty else param.default


def _gives(raw: dict, field: str, attribute_map: dict, reading: dict) -> bool:
    """Whether the file gives ``field``: under its name, the class's own name for it (GPT-2's ``n_layer``), or a
    legacy name the class read into it (a null counts as absent: the class fills it)."""
    if raw.get(field) is not None or raw.get(attribute_map.get(field, field)) is not None:
        return True
    return any(new == field and raw.get(old) is not None and raw.get(old) == reading.get(field)
               for old, new in _LEGACY_ALIASES.items())


def _filled_by_the_class(hf: Any, sub: Any, config: dict, d: dict, *, kv_override: bool) -> dict[str, dict]:
    """The reported fields the file leaves out and the configuration class fills in, each with where its value
    comes from: the class's default (``LlamaConfig.num_hidden_layers = 32``), or a value it derives from others
    (``head_dim = hidden_size // num_attention_heads``, ``num_key_value_heads = num_attention_heads``)."""
    raw = {k: v for k, v in config.items() if k != "model_type"}
    if sub is not hf:  # a composite config: the text model's fields are those of its sub-config in the file
        key = next((k for k in (getattr(type(hf), "sub_configs", None) or {}) if getattr(hf, k, None) is sub),
                   "text_config")
        sub_raw = config.get(key)
        raw = sub_raw if isinstance(sub_raw, dict) else {}
    cls = type(sub)
    name = cls.__name__
    amap = dict(getattr(cls, "attribute_map", None) or {})
    out: dict[str, dict] = {}
    for field in _REPORTED:
        value = d.get(field)
        if value is None or isinstance(value, (list, dict)) or _gives(raw, field, amap, d):
            continue
        if field == "tie_word_embeddings" and config.get(field) is not None:  # a composite's top-level flag
            continue
        attribute = amap.get(field, field)
        default = _class_default(cls, attribute)
        heads, hidden = d.get("num_attention_heads"), d.get("hidden_size")
        entry: dict[str, Any] = {"by": f"transformers {name}"}
        if field == "num_key_value_heads" and kv_override:
            entry["source"] = f"derived: as transformers' {d.get('model_type')} attention builds its K/V heads"
        elif default is not _NO_DEFAULT and default is not None and default == value:
            entry["source"] = f"transformers {name} default"
        elif field == "num_key_value_heads" and value == heads:
            entry["source"] = "derived: num_attention_heads"
        elif (field == "head_dim" and isinstance(heads, int) and isinstance(hidden, int) and heads > 0
              and value == hidden // heads):
            entry["source"] = "derived: hidden_size / num_attention_heads"
        elif field == "head_dim" and value == d.get("qk_rope_head_dim"):  # DeepSeek's MLA configs
            entry["source"] = "derived: qk_rope_head_dim"
        else:
            entry["source"] = f"transformers {name} (set when the class is built)"
        if attribute != field:
            entry["attribute"] = attribute
        out[field] = entry
    return out


def _normalized(config: dict) -> tuple[dict, str | None]:
    """``(text config as transformers reads it, note)``: the configuration class of the model type
    (``AutoConfig.for_model``), so legacy fields, class defaults and composite configs mean what they mean to
    transformers; the note says when the config was read field by field instead."""
    try:
        text = config_text(config)
    except (TypeError, ValueError):
        return _legacy_reading(_raw_text_config(config)), "the config is not JSON: read field by field"
    return _read_json_config(text)


def _text_config(config: dict) -> dict:
    return _normalized(config)[0]


def config_note(config: dict) -> str | None:
    """Why the config was read field by field rather than through transformers' configuration class (None when
    it was read through it)."""
    return _normalized(config)[1]


def model_type(config: dict) -> str:
    cfg = _text_config(config)
    return str(cfg.get("model_type") or config.get("model_type") or "")


def is_encoder_only(config: dict) -> bool:
    """A bidirectional encoder (BERT-style): no KV cache is kept between tokens."""
    cfg = _raw_text_config(config)
    if cfg.get("is_causal") is False or config.get("causal_attention") is False:
        return True
    if cfg.get("is_decoder") is True or cfg.get("is_encoder_decoder") is True:
        return False
    return str(cfg.get("model_type") or config.get("model_type") or "").lower() in ENCODER_ONLY


def layer_types(config: dict, source: str = "config.json") -> list[str]:
    """The attention kind of every layer: from ``layer_types`` when the config lists them, else derived."""
    cfg = _text_config(config)
    n = _int(cfg, "num_hidden_layers", source, config)
    if n > MAX_LAYERS:
        raise InputError(f"{n:,} layers is more than any model has ({MAX_LAYERS:,})", source=source,
                         field="num_hidden_layers")
    listed = cfg.get("layer_types")
    if isinstance(listed, list):
        if len(listed) != n:
            raise InputError(f"lists {len(listed)} layer types for {n} layers", source=source, field="layer_types")
        types = [str(t) for t in listed]
        if cfg.get("kv_lora_rank"):
            # multi-head latent attention: a listed attention kind caches the latent, not per-head K/V. transformers
            # 5.24 (line numbers of 5.24; 5.25 caches the same): DeepSeek-V3.2 lists every layer "indexed_attention"
            # (configuration_deepseek_v32.py 137-138) and caches kv_pass (kv_lora_rank) and k_rot (qk_rope_head_dim)
            # as keys and values of one head (modeling_deepseek_v32.py 420-430); GLM-MoE-DSA the same
            # (configuration_glm_moe_dsa.py 157-158, modeling_glm_moe_dsa.py 388-399); Kimi Linear lists
            # "full_attention" (MLA: modeling_kimi_linear.py 285-294) and "linear_attention" (KDA: a fixed recurrent
            # and conv state, modeling_kimi_linear.py 638-709, no per-token KV) (configuration_kimi_linear.py 128-139)
            types = [t if t in _NO_KV or t == "shared_kv" else "mla" for t in types]
    elif cfg.get("kv_lora_rank"):
        types = ["mla"] * n
    elif cfg.get("sliding_window") and cfg.get("use_sliding_window", True) is not False:
        pattern = cfg.get("sliding_window_pattern") or _DEFAULT_SLIDING_PATTERN.get(model_type(config))
        if cfg.get("model_type") == "gemma2":  # Gemma 2 alternates: sliding on even layers, global on odd
            types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        elif isinstance(pattern, list):  # per layer, true = sliding (GGUF)
            if not pattern or n % len(pattern):  # one entry per layer, or one period repeated over the layers
                raise InputError(f"lists {len(pattern)} entries for {n} layers", source=source,
                                 field="sliding_window_pattern")
            odd = [x for x in pattern if x not in (True, False) or isinstance(x, float)]  # ("false" was true)
            if odd:
                raise InputError(f"expected true or false per layer, got {odd[0]!r:.40}", source=source,
                                 field="sliding_window_pattern")
            types = ["sliding_attention" if pattern[i % len(pattern)] else "full_attention" for i in range(n)]
        elif isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 1:
            # every pattern-th layer is global
            types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
        else:
            types = ["sliding_attention"] * n
    else:
        types = ["full_attention"] * n
    shared = _own(config, cfg, "num_kv_shared_layers")
    if isinstance(shared, int) and not isinstance(shared, bool) and 0 < shared <= n:
        # the last layers reuse the K/V of earlier layers of their kind (Gemma 3n, Gemma 4): nothing of their own
        types = types[:n - shared] + ["shared_kv"] * shared
    return types


def _layers(config: dict, source: str) -> list[_Layer]:
    """What each layer caches: kind, KV heads, key and value head dims, window."""
    cfg = _text_config(config)
    types = layer_types(config, source)
    per_layer: dict[int, dict] = {}
    if isinstance(cfg.get("per_layer_config"), dict):  # keys are layer indices, as strings ("05") in JSON
        for key, value in cfg["per_layer_config"].items():
            try:
                per_layer[int(key)] = value if isinstance(value, dict) else {}
            except ValueError:
                raise InputError(f"expected layer indices as keys, got {key!r}", source=source,
                                 field="per_layer_config") from None
    if any(t not in _NO_KV and t not in ("mla", "shared_kv") for t in types):
        heads = _int(cfg, "num_attention_heads", source, config)
        base_kv = cfg.get("num_key_value_heads") or heads
        base_hd = cfg.get("head_dim") or _int(cfg, "hidden_size", source, config) // heads
        base_vd = _own(config, cfg, "value_head_dim") or None
    out = []
    for i, t in enumerate(types):
        if t in _NO_KV:
            out.append(_Layer("no_kv"))
            continue
        if t in ("mla", "shared_kv"):
            out.append(_Layer(t))
            continue
        kv, hd, vd = base_kv, base_hd, base_vd
        if t == "full_attention":
            # per-kind overrides for global layers (config.json of Gemma 4; GGUF key_length vs key_length_swa)
            if _own(config, cfg, "global_head_dim"):
                hd = cfg["global_head_dim"]
            elif model_type(config) in _GEMMA4 and not per_layer:
                hd = 512  # transformers' Gemma4 default when config.json omits it
            if _own(config, cfg, "global_value_head_dim"):
                vd = cfg["global_value_head_dim"]
            if cfg.get("num_global_key_value_heads") and (model_type(config) not in _GEMMA4
                                                          or cfg.get("attention_k_eq_v", False)):
                kv = cfg["num_global_key_value_heads"]
        over = per_layer.get(i, {})
        kv = over.get("num_key_value_heads", kv)
        hd = over.get("head_dim", hd)
        vd = over.get("value_head_dim", vd)
        for name, value in (("num_key_value_heads", kv), ("head_dim", hd)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"expected a positive integer, got {value!r}", source=source,
                                 field=f"{name} (layer {i})")
        # (sliding and chunked layers are one cache class in transformers, capped at the window or the chunk:
        # cache_utils.DYNAMIC_LAYER_TYPE_MAPPING, get_layer_types_and_kwargs; Llama 4's chunked layers before, counted
        # whole, were three times the cache a run measured)
        window = (cfg.get("sliding_window") if t in ("sliding_attention", "hybrid_sliding")
                  else cfg.get("attention_chunk_size") if t == "chunked_attention" else None)
        out.append(_Layer(t, kv, hd, vd or hd, window))
    return out


def layer_groups(config: dict, dtype: str = "bf16", source: str = "config.json") -> tuple[LayerGroup, ...]:
    if dtype not in DTYPE_BYTES:
        raise UsageError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    check_config(config, source)
    cfg = _text_config(config)
    nbytes = DTYPE_BYTES[dtype]
    counts: dict[_Layer, int] = {}
    for layer in _layers(config, source):
        counts[layer] = counts.get(layer, 0) + 1
    groups = []
    for layer, n in counts.items():
        if layer.type in ("no_kv", "shared_kv"):
            groups.append(LayerGroup(layer.type, n, None, 0.0))
        elif layer.type == "mla":
            per = (_int(cfg, "kv_lora_rank", source) + _int(cfg, "qk_rope_head_dim", source, config)) * nbytes
            groups.append(LayerGroup("mla", n, None, n * per))
        else:
            assert layer.kv_heads is not None and layer.head_dim is not None and layer.value_dim is not None
            per = layer.kv_heads * (layer.head_dim + layer.value_dim) * nbytes
            groups.append(LayerGroup(layer.type, n, layer.window, n * per, layer.kv_heads, layer.head_dim,
                                     layer.value_dim))
    indexed = indexer_layers(config, source)
    if indexed:
        index_dim = _int(cfg, "index_head_dim", source, config)
        groups.append(LayerGroup(INDEXER_KEYS, indexed, None, indexed * indexer_key_bytes(index_dim),
                                 head_dim=index_dim))
    return tuple(groups)


#: the layer group of the DeepSeek sparse attention ("DSA") indexer's keys: one key of ``index_head_dim`` per token
#: per layer that runs an indexer, cached beside the MLA latent
INDEXER_KEYS = "indexer_keys"
#: vLLM's indexer cache quantizes each block of 128 values to fp8 with one fp32 scale
INDEXER_QUANT_BLOCK = 128


def indexer_key_bytes(index_head_dim: int) -> float:
    """Bytes per token per layer of the DSA indexer's key cache as vLLM allocates it, whatever the --dtype:
    ``index_head_dim + index_head_dim // 128 * 4`` uint8 (fp8 values and one fp32 scale per 128 of them; 132 for
    DeepSeek-V3.2's 128). vllm-project/vllm 002d6073aa034d4f5545d45021b0e56d1f3c3593,
    vllm/model_executor/models/deepseek_v2.py: ``Indexer.__init__`` (``quant_block_size = 128``, ``k_cache =
    DeepseekV32IndexerCache(head_dim=self.head_dim + self.head_dim // self.quant_block_size * 4,
    dtype=torch.uint8)``), whose ``get_kv_cache_spec`` is an ``MLAAttentionSpec`` of one head of that size.
    SGLang's ``NSATokenToKVPool`` (python/sglang/srt/mem_cache/memory_pool.py) allocates the same
    ``index_head_dim + index_head_dim // quant_block_size * 4`` bytes per token per layer (fp8 + fp32 scale), with a
    bf16 option in some releases. transformers caches the key unquantized in the model's dtype
    (:func:`transformers_cache_groups`)."""
    return float(index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4)


def indexer_layers(config: dict, source: str = "config.json") -> int:
    """How many layers cache DSA indexer keys: MLA layers listed ``indexed_attention`` (transformers' DeepSeek-V3.2
    and GLM-MoE-DSA; an unlisted MLA config with ``index_topk``, as vLLM's ``is_v32 = hasattr(config,
    "index_topk")``), less those whose ``indexer_types`` entry is ``shared`` (GLM-MoE-DSA's IndexCache: they reuse the
    previous layer's top-k and run no indexer; transformers modeling_glm_moe_dsa.py 348-349, vLLM
    deepseek_v2.py ``_skip_topk``, same commit as :func:`indexer_key_bytes`)."""
    cfg = _text_config(config)
    if not cfg.get("kv_lora_rank"):
        return 0
    types = layer_types(config, source)
    listed = cfg.get("layer_types")
    if isinstance(listed, list):
        runs = [str(t) == "indexed_attention" for t in listed]
    elif cfg.get("index_topk"):
        runs = [t == "mla" for t in types]
    else:
        return 0
    shared = cfg.get("indexer_types")
    if isinstance(shared, list) and len(shared) == len(runs):
        runs = [r and s != "shared" for r, s in zip(runs, shared)]
    return sum(r and t == "mla" for r, t in zip(runs, types))


#: the first transformers release whose FalconAttention caches a ``new_decoder_architecture`` Falcon's
#: ``num_kv_heads`` K/V heads; earlier releases repeat them to the query heads before they write the cache
FALCON_CACHES_KV_HEADS_SINCE = (5, 25)


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a transformers version string ("5.25.0", "5.25.0.dev0", "5.24.1+local")."""
    m = re.match(r"\s*(\d+)\.(\d+)", version)
    if m is None:
        raise UsageError(f"cannot read the transformers version {version!r}")
    return int(m.group(1)), int(m.group(2))


def transformers_cache_kv_heads(config: dict, transformers_version: str) -> int | None:
    """The K/V heads per layer that transformers ``transformers_version`` writes into its cache (a
    ``DynamicCache``) where they are not the heads the model has, else None.

    Falcon with ``new_decoder_architecture`` (Falcon-40B/180B: 8 KV heads for 128 query heads):

    - transformers 5.24 (``models/falcon/modeling_falcon.py``): ``FalconAttention._split_heads`` broadcasts each
      group's key and value to the query shape (lines 254-262, ``torch.broadcast_to(key, query.shape)``),
      ``forward`` reshapes them to ``num_kv_heads = self.num_heads if self.new_decoder_architecture`` heads
      (lines 313, 320-321) and caches that (``layer_past.update``, line 328); ``FalconFlashAttention2`` the same
      (lines 442, 449-450, 457). The cache holds ``num_attention_heads`` heads.
    - transformers 5.25 (same file): ``forward`` takes one key and one value per ``num_kv_heads`` group
      (lines 297-301; ``self.num_kv_heads = config.num_kv_heads``, line 278) and caches them
      (``layer_past.update``, line 318); the repetition to the query heads happens after the cache, inside the
      attention function (``repeat_kv`` in ``eager_attention_forward``, lines 222-223). The cache holds
      ``num_kv_heads`` heads, what :func:`layer_groups` counts.

    Multi-query and the original (non-new) Falcon cache 1 and ``num_attention_heads`` heads in both releases,
    as :func:`layer_groups` counts. This describes transformers' own cache only: vLLM and SGLang cache the
    model's ``num_kv_heads`` (the arithmetic of :func:`layer_groups` and :func:`kv_shape`), and the weights
    are ``num_kv_heads`` wide in every release."""
    cfg = _text_config(config)
    if model_type(config) == "falcon" and cfg.get("new_decoder_architecture") and \
            _release(transformers_version) < FALCON_CACHES_KV_HEADS_SINCE:
        heads = _int(cfg, "num_attention_heads", "config")
        return heads if heads != cfg.get("num_key_value_heads") else None
    return None


def transformers_cache_groups(config: dict, transformers_version: str, dtype: str = "bf16",
                              source: str = "config.json") -> tuple[LayerGroup, ...]:
    """The layer groups of the cache transformers ``transformers_version`` fills for this model (what a live
    run measures): :func:`layer_groups`, with the K/V heads :func:`transformers_cache_kv_heads` gives where
    that transformers caches other heads than the model has."""
    groups = layer_groups(config, dtype, source)
    nbytes = DTYPE_BYTES[dtype]
    # transformers keeps the DSA indexer's keys unquantized, in the model's dtype: DynamicIndexedLayer.indexer_keys
    # [batch, seq, index_head_dim] (cache_utils.py 5.24 and 5.25: 316-349), written by the indexer (5.24:
    # modeling_deepseek_v32.py 225-226, modeling_glm_moe_dsa.py 226-227)
    groups = tuple(LayerGroup(g.type, g.layers, None, g.layers * (g.head_dim or 0) * nbytes, head_dim=g.head_dim)
                   if g.type == INDEXER_KEYS else g for g in groups)
    heads = transformers_cache_kv_heads(config, transformers_version)
    if heads is None:
        return groups
    return tuple(g if g.kv_heads is None or g.head_dim is None else
                 LayerGroup(g.type, g.layers, g.window, g.layers * heads * (g.head_dim + (g.value_dim or g.head_dim))
                            * nbytes, heads, g.head_dim, g.value_dim)
                 for g in groups)


def transformers_cache_note(config: dict, transformers_version: str) -> str | None:
    """A note where transformers' own cache holds more than the arithmetic (what vLLM and SGLang cache)."""
    heads = transformers_cache_kv_heads(config, transformers_version)
    if heads is None:
        return None
    kv = _text_config(config).get("num_key_value_heads")
    return (f"transformers {transformers_version} caches Falcon's {kv} KV heads repeated to the {heads} query heads "
            f"(new_decoder_architecture; transformers 5.25 and later cache the {kv}): its DynamicCache holds "
            f"{heads / kv:g}x the bytes per token above, which are what vLLM and SGLang cache"
            if isinstance(kv, int) and kv > 0 else None)

def kv_shape(config: dict[str, Any], dtype: str = "bf16", source: str = "config.json") -> KvShape:
    """Bytes of K and V per token over all layers (below any sliding window)."""
    groups = layer_groups(config, dtype, source)
    cfg = _text_config(config)
    layers = _int(cfg, "num_hidden_layers", source)
    total = sum(g.bytes_per_token for g in groups)
    if cfg.get("kv_lora_rank") and any(g.type == "mla" for g in groups):
        mla = _int(cfg, "kv_lora_rank", source) + _int(cfg, "qk_rope_head_dim", source)
        return KvShape(layers, None, None, mla, dtype, total)
    attn = [g for g in groups if g.kv_heads is not None]
    kv_heads = {g.kv_heads for g in attn}
    dims = {(g.head_dim, g.value_dim) for g in attn}
    one_kv = kv_heads.pop() if len(kv_heads) == 1 else None
    one_dim = dims.pop()[0] if len(dims) == 1 else None
    return KvShape(layers, one_kv, one_dim, None, dtype, total)


def kv_bytes(groups: tuple[LayerGroup, ...], tokens: int) -> float:
    """Bytes one sequence of ``tokens`` holds: sliding layers keep at most their window."""
    return sum(g.bytes_per_token * (min(tokens, g.window) if g.window else tokens) for g in groups)


def tied_embeddings(config: dict) -> tuple[bool, str]:
    """Whether the output head shares the embedding matrix, and where that came from."""
    raw = _raw_text_config(config)
    for c in (raw, config):
        if isinstance(c.get("tie_word_embeddings"), bool):
            return c["tie_word_embeddings"], "config"
    mt = model_type(config)
    if config_note(config) is None and isinstance(_text_config(config).get("tie_word_embeddings"), bool):
        return _text_config(config)["tie_word_embeddings"], f"the {mt} default"  # its configuration class's
    table = load_data("model_defaults.json")["tie_word_embeddings"]
    if mt in table:
        return bool(table[mt]), f"the {mt} default"
    return False, "unknown: assumed untied"


@dataclass(frozen=True)
class DefaultUsed:
    """A value the KV arithmetic, the weights estimate or the context limit used that the file does not give."""

    field: str
    value: Any
    #: ``transformers LlamaConfig default`` | ``derived: num_attention_heads`` | ``derived: hidden_size /
    #: num_attention_heads`` | ``cachectl model_defaults.json (...)`` | ...
    source: str
    #: who filled it in: ``transformers LlamaConfig`` (its configuration class), ``cachectl`` (a config read field by
    #: field), ``cachectl model_defaults.json`` or ``cachectl assumption``
    by: str
    #: the configuration class's own name for the field, where it differs (GPT-2's ``n_layer``)
    attribute: str | None = None


def defaults_used(config: dict, source: str = "config.json", *, weights_estimated: bool = True
                  ) -> tuple[DefaultUsed, ...]:
    """The values the file leaves out that kv-inspect used: those transformers' configuration class filled in (its
    defaults, and the values it derives), and those cachectl derives as transformers' attention does (a head
    size from ``hidden_size / num_attention_heads``, as many KV heads as attention heads) where the class has no
    such field or the config is read field by field. Only the fields the output depends on: the weights' fields
    when the weights are estimated from the config."""
    cfg = _text_config(config)
    recorded = _recorded(cfg)
    kinds = set(layer_types(config, source))
    attention = bool(kinds - _NO_KV - {"mla", "shared_kv"})
    relevant = {"num_hidden_layers", "max_position_embeddings"}
    if attention:
        relevant |= {"num_attention_heads", "num_key_value_heads", "head_dim"}
        if not cfg.get("head_dim"):
            relevant.add("hidden_size")
    if "sliding_attention" in kinds:
        relevant.add("sliding_window")
    if "mla" in kinds:
        relevant |= {"kv_lora_rank", "qk_rope_head_dim"}
    if weights_estimated:
        relevant |= {"hidden_size", "intermediate_size", "vocab_size", "tie_word_embeddings", "num_attention_heads"}
    per_layer = isinstance(cfg.get("per_layer_config"), dict)
    out = []
    for field in _REPORTED:
        if field not in relevant:
            continue
        how = recorded.get(field)
        if isinstance(how, dict) and cfg.get(field) is not None:
            out.append(DefaultUsed(field, cfg[field], str(how.get("source")), str(how.get("by")), how.get("attribute")))
        elif attention and not per_layer and field == "num_key_value_heads" and not cfg.get(field):
            heads = cfg.get("num_attention_heads")
            if isinstance(heads, int):
                out.append(DefaultUsed(field, heads, "derived: num_attention_heads", "cachectl"))
        elif attention and not per_layer and field == "head_dim" and not cfg.get(field):
            heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
            if isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
                out.append(DefaultUsed(field, hidden // heads, "derived: hidden_size / num_attention_heads",
                                       "cachectl"))
        if (field == "head_dim" and not per_layer and "full_attention" in kinds and not cfg.get("global_head_dim")
                and model_type(config) in _GEMMA4):  # _layers' 512: Gemma4TextConfig's global_head_dim default
            out.append(DefaultUsed("global_head_dim", 512, "derived: as transformers' Gemma4TextConfig sizes its "
                                   "global layers by default", "cachectl"))
        elif field == "tie_word_embeddings":
            tied, tied_from = tied_embeddings(config)
            if tied_from == "config" or isinstance(cfg.get(field), bool) and config_note(config) is None:
                continue
            if tied_from.startswith("unknown"):
                out.append(DefaultUsed(field, tied, "assumed untied: no default known for the model type",
                                       "cachectl assumption"))
            else:
                out.append(DefaultUsed(field, tied, f"cachectl model_defaults.json ({tied_from} of transformers' "
                                       "configuration class)", "cachectl model_defaults.json"))
    return tuple(out)


def _recorded(cfg: dict) -> dict:
    """What a reading through transformers recorded of the fields its configuration class filled in."""
    recorded = cfg.get(DEFAULTS_KEY)
    return recorded if isinstance(recorded, dict) else {}


def _filled(config: dict) -> list[DefaultUsed]:
    """The fields transformers' configuration class filled in (from the reading, without reading the layers)."""
    cfg = _text_config(config)
    recorded = _recorded(cfg)
    return [DefaultUsed(f, cfg[f], str(h.get("source")), str(h.get("by")), h.get("attribute"))
            for f, h in recorded.items() if isinstance(h, dict) and cfg.get(f) is not None]


def describe_defaults(defaults: tuple[DefaultUsed, ...], source: str) -> list[str]:
    """One line per filler of the values the file leaves out: ``from transformers' LlamaConfig defaults (absent in
    config.json): num_hidden_layers=32, num_key_value_heads=32 (= num_attention_heads), ...``."""
    if not defaults:
        return []
    if source.lower().endswith(".gguf"):
        where = "absent in the GGUF metadata"
    elif source.startswith("cachectl catalog:"):
        where = "absent in the catalog's config"
    else:
        where = f"absent in {Path(source).name}"
    lines = []
    rank = {"cachectl model_defaults.json": 1, "cachectl": 2, "cachectl assumption": 3}  # transformers' first
    for by in sorted(dict.fromkeys(d.by for d in defaults), key=lambda by: rank.get(by, 0)):
        items = []
        for d in defaults:
            if d.by != by:
                continue
            item = f"{d.field}={json.dumps(d.value)}"
            if d.attribute:
                item += f" ({d.attribute})"
            if d.source.startswith("derived: as "):
                item += f" ({d.source.removeprefix('derived: ')})"
            elif d.source.startswith("derived: "):
                item += f" (= {d.source.removeprefix('derived: ')})"
            items.append(item)
        if by.startswith("transformers "):
            head = f"from transformers' {by.removeprefix('transformers ')} defaults ({where})"
        elif by == "cachectl model_defaults.json":
            head = f"from cachectl's model_defaults.json, transformers' defaults per model type ({where})"
        elif by == "cachectl assumption":
            head = f"assumed ({where}, and no default known for the model type)"
        else:
            head = f"derived as transformers' attention does ({where})"
        lines.append(f"{head}: {', '.join(items)}")
    return lines


def estimate_params(config: dict) -> int | None:
    """Dense-transformer parameter count from the config (embeddings, attention, gated MLP); None for MoE and for
    layers it cannot size (MLA, Mamba)."""
    cfg = _text_config(config)
    if any(cfg.get(k) for k in ("n_routed_experts", "num_local_experts", "num_experts")):
        return None
    try:
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        vocab, inter = cfg["vocab_size"], cfg["intermediate_size"]
        layers = _layers(config, "config")
    except (KeyError, InputError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_CONFIG_INT
               for v in (hidden, heads, vocab, inter)):
        return None
    if any(layer.type in ("mla", "no_kv") for layer in layers) or not isinstance(inter, int):
        return None
    attn = 0
    for layer in layers:
        if layer.type == "shared_kv":  # q and o projections only; K and V come from another layer
            hd = cfg.get("head_dim") or hidden // heads
            attn += 2 * hidden * heads * hd
            continue
        assert layer.head_dim is not None and layer.kv_heads is not None and layer.value_dim is not None
        attn += hidden * heads * layer.head_dim + heads * layer.value_dim * hidden
        attn += hidden * layer.kv_heads * (layer.head_dim + layer.value_dim)
    mlp = 3 * hidden * inter * len(layers)
    embed = vocab * hidden * (1 if tied_embeddings(config)[0] else 2)
    norms = (2 * len(layers) + 1) * hidden
    return int(embed + attn + mlp + norms)


def estimate_total_params(config: dict) -> int | None:
    """All parameters, experts included (a rough count for sizing memory, within a few percent on Mixtral and
    DeepSeek-V3): the dense estimate where it applies, else embeddings + attention + every expert's MLP."""
    dense = estimate_params(config)
    if dense is not None:
        return dense
    cfg = _text_config(config)
    try:
        hidden, layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(cfg.get("num_attention_heads") or 1)
    experts = int(cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    inter = int(cfg.get("intermediate_size") or 0)
    moe_inter = int(cfg.get("moe_intermediate_size") or inter)
    shared = int(cfg.get("n_shared_experts") or 0)
    dense_layers = int(cfg.get("first_k_dense_replace") or 0) if experts else layers
    if cfg.get("kv_lora_rank"):  # MLA: the projections are about 4 hidden x hidden
        attn = 4 * hidden * hidden
    else:
        kv = int(cfg.get("num_key_value_heads") or heads)
        hd = int(cfg.get("head_dim") or hidden // heads)
        attn = 2 * hidden * heads * hd + 2 * hidden * kv * hd
    moe_layers = layers - dense_layers
    mlp = dense_layers * 3 * hidden * inter + moe_layers * (3 * hidden * moe_inter * (experts + shared)
                                                            + hidden * experts)
    embed = vocab * hidden * (1 if tied_embeddings(config)[0] else 2)
    return int(embed + layers * attn + mlp)


@dataclass(frozen=True)
class ParamCount:
    """Parameters of a model from its config, as transformers builds it."""

    total: int                  # every parameter held in memory (all experts of an MoE)
    active: int                 # those one token goes through (the routed experts it uses, shared ones, the rest)
    experts: int = 0            # routed experts per MoE layer (0: dense)
    moe_layers: int = 0
    #: what the count leaves out, where the architecture is not modelled exactly
    approximate: str | None = None


_GATED_MLP = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
              "gemma3_text", "deepseek_v2", "deepseek_v3", "phi3", "olmo", "olmo2", "granite", "cohere", "glm"}
_QK_NORM = {"qwen3", "qwen3_moe", "gemma3_text", "olmo2"}          # per-head q_norm and k_norm (olmo2: full width)
_QKV_BIAS = {"qwen2", "qwen2_moe"}
_FOUR_NORMS = {"gemma2", "gemma3_text"}                            # pre/post attention and feed-forward norms


def _i(cfg: dict, key: str, default: int = 0) -> int:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def count_params(config: dict) -> ParamCount | None:
    """Parameters from the config, for the architectures transformers builds as a decoder of gated-MLP layers
    (Llama, Mistral, Mixtral, Qwen 2/3 and their MoE, Gemma 1-3, DeepSeek V2/V3 with MLA, Phi-3), Falcon, GPT-2
    and GPT-BigCode: embeddings (and the LM head unless tied), attention (GQA, MQA, MLA, biases, q/k norms), the
    MLP or every expert with its router and shared experts, and the norms, checked against
    ``model.parameters()`` of random-weight models (tests/test_kv_corpus.py). Other model types get the gated
    Llama-style count, flagged approximate; None where the config cannot be sized."""
    cfg = _text_config(config)
    mt = model_type(config)
    try:
        hidden, vocab = _int(cfg, "hidden_size", "config"), _int(cfg, "vocab_size", "config")
        heads = _int(cfg, "num_attention_heads", "config")
        layers = _layers(config, "config")
    except InputError:
        return None
    n = len(layers)
    tied = tied_embeddings(config)[0]
    embed = vocab * hidden * (1 if tied else 2)
    approximate = None
    raw = _raw_text_config(config)
    if raw is not config and any(isinstance(v, dict) for k, v in config.items() if k.endswith("_config")
                                 and k != "text_config"):
        approximate = "the text model only: the other towers of the composite config (" + ", ".join(
            k for k, v in config.items() if isinstance(v, dict) and k.endswith("_config") and k != "text_config") + \
            ") are not counted"
    if mt in ("gpt2", "gpt_bigcode"):
        hd = hidden // heads
        kv = 1 if mt == "gpt_bigcode" and cfg.get("multi_query", True) else heads
        inner = _i(cfg, "n_inner") or 4 * hidden
        qkv = hidden + 2 * kv * hd
        per = (hidden * qkv + qkv) + (hidden * hidden + hidden) + 2 * (hidden * inner) + inner + hidden + 4 * hidden
        positions = _i(cfg, "max_position_embeddings") * hidden
        total = embed + positions + n * per + 2 * hidden
        return ParamCount(total, total, approximate=approximate)
    if mt in ("falcon", "RefinedWeb", "RefinedWebModel"):  # the last two: Falcon's configs before transformers
        hd = hidden // heads
        kv = _i(cfg, "num_key_value_heads") or heads
        bias = bool(cfg.get("bias"))
        ffn = _i(cfg, "ffn_hidden_size") or 4 * hidden
        qkv = (heads + 2 * kv) * hd
        per = hidden * qkv + hidden * hidden + 2 * hidden * ffn
        if bias:
            per += qkv + hidden + ffn + hidden
        if cfg.get("new_decoder_architecture"):
            norms = 2 * 2 * hidden if _i(cfg, "num_ln_in_parallel_attn", 2) == 2 else 2 * hidden
        else:
            norms = 2 * hidden if cfg.get("parallel_attn", True) else 4 * hidden
        total = embed + n * (per + norms) + 2 * hidden
        return ParamCount(total, total, approximate=approximate)
    if mt not in _GATED_MLP and approximate is None:
        approximate = f"{mt or 'this model type'} is counted as a Llama-style decoder (gated MLP, no biases)"
    inter = _i(cfg, "intermediate_size")
    if not inter:
        return None
    experts = _i(cfg, "n_routed_experts") or _i(cfg, "num_local_experts") or _i(cfg, "num_experts")
    topk = _i(cfg, "num_experts_per_tok") or _i(cfg, "num_experts_per_token") or 1
    moe_inter = _i(cfg, "moe_intermediate_size") or inter
    shared_inter = _i(cfg, "shared_expert_intermediate_size") or moe_inter * _i(cfg, "n_shared_experts")
    first_dense = _i(cfg, "first_k_dense_replace")
    freq = _i(cfg, "moe_layer_freq", 1) or 1
    step = _i(cfg, "decoder_sparse_step", 1) or 1
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    total = embed + hidden  # the final norm
    inactive = 0
    moe_layers = 0
    for i, layer in enumerate(layers):
        # attention
        if layer.type == "mla":
            q_lora, kv_lora = _i(cfg, "q_lora_rank"), _int(cfg, "kv_lora_rank", "config")
            rope, nope = _int(cfg, "qk_rope_head_dim", "config"), _i(cfg, "qk_nope_head_dim")
            v = _i(cfg, "v_head_dim") or nope
            q_out = heads * (nope + rope)
            attn = (hidden * q_lora + q_lora + q_lora * q_out) if q_lora else hidden * q_out
            attn += hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v) + heads * v * hidden
        elif layer.type == "no_kv":
            approximate = approximate or "layers without attention KV (Mamba, linear attention) are not counted"
            attn = 0
        else:
            hd = layer.head_dim or (cfg.get("head_dim") or hidden // heads)
            vd = layer.value_dim or hd
            kv = 0 if layer.type == "shared_kv" else (layer.kv_heads or 0)
            attn = hidden * heads * hd + heads * vd * hidden + hidden * kv * (hd + vd)
            if mt in _QKV_BIAS:
                attn += heads * hd + kv * (hd + vd)
            elif cfg.get("attention_bias") is True:
                attn += heads * hd + kv * (hd + vd) + hidden
            if mt in _QK_NORM:
                attn += 2 * hd
        # feed-forward
        sparse = experts > 0 and i >= first_dense and i % freq == 0 and i not in mlp_only and (i + 1) % step == 0
        if sparse:
            expert = 3 * hidden * moe_inter
            mlp = experts * expert + hidden * experts          # the experts and the router
            if shared_inter:
                mlp += 3 * hidden * shared_inter + (hidden if mt == "qwen2_moe" else 0)  # and Qwen's shared gate
            inactive += (experts - min(topk, experts)) * expert
            moe_layers += 1
        else:
            mlp = 3 * hidden * inter
            if cfg.get("mlp_bias") is True:
                mlp += 2 * inter + hidden
        norms = (4 if mt in _FOUR_NORMS else 2) * hidden
        total += attn + mlp + norms
    return ParamCount(total, total - inactive, experts if moe_layers else 0, moe_layers, approximate)


def blocks_for_memory(gib: float, bytes_per_token: float, block_size: int) -> int:
    if not 0 < gib < float("inf"):
        raise UsageError("--capacity-gib must be a positive number")
    if bytes_per_token <= 0:
        raise UsageError("the model keeps no KV cache per token (no attention layers): --capacity-gib cannot "
                         "be turned into blocks; pass --capacity-blocks")
    blocks = gib * GIB // (bytes_per_token * block_size)
    if not math.isfinite(blocks):  # (1e300 GiB: past any float, and past any capacity in blocks)
        raise UsageError(f"{gib:g} GiB is more memory than any capacity in blocks holds")
    return int(blocks)


# ---------------------------------------------------------------------------------------------- GGUF

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_MIN_SIZE = {8: 8, 9: 12}   # bytes a string (its length) and an array (type and count) take at least
_GGUF_MAX_DEPTH = 8              # arrays of arrays: the format allows them, real files nest one level


class _GgufFile:
    """Reads a GGUF header, checking every length and count against the bytes left before reading or
    allocating anything: a corrupt count is an error, never an allocation."""

    def __init__(self, fh: BinaryIO, source: str):
        self.fh = fh
        self.source = source
        self.size = fh.seek(0, 2)
        fh.seek(0)

    def left(self) -> int:
        return self.size - self.fh.tell()

    def read(self, n: int, what: str = "metadata") -> bytes:
        if n > self.left():
            raise InputError(f"truncated GGUF {what}: {n:,} bytes announced at offset {self.fh.tell():,}, "
                             f"{self.left():,} left in the file", source=self.source)
        return self.fh.read(n)

    def unpack(self, fmt: str, what: str = "metadata") -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def count(self, n: int, item_size: int, what: str) -> int:
        if n * item_size > self.left():
            raise InputError(f"corrupt GGUF {what}: {n:,} entries of at least {item_size} bytes at offset "
                             f"{self.fh.tell():,}, {self.left():,} bytes left in the file", source=self.source)
        return n

    def value(self, vtype: int, key: str, depth: int = 0, skip_big: bool = False) -> Any:
        if vtype in _GGUF_SCALARS:
            return self.unpack(_GGUF_SCALARS[vtype], f"value of {key!r:.80}")
        if vtype == 8:
            n = self.count(self.unpack("<Q", f"string length of {key!r:.80}"), 1, f"string {key!r:.80}")
            return self.read(n).decode("utf-8", "replace")
        if vtype == 9:
            if depth >= _GGUF_MAX_DEPTH:
                raise InputError(f"GGUF array {key!r:.80} nests arrays more than {_GGUF_MAX_DEPTH} deep",
                                 source=self.source)
            itype = self.unpack("<I", f"array type of {key!r:.80}")
            if itype not in _GGUF_SCALARS and itype not in _GGUF_MIN_SIZE:
                raise InputError(f"unknown GGUF value type {itype} in array {key!r:.80}", source=self.source)
            size = struct.calcsize(_GGUF_SCALARS[itype]) if itype in _GGUF_SCALARS else _GGUF_MIN_SIZE[itype]
            count = self.count(self.unpack("<Q", f"array length of {key!r:.80}"), size, f"array {key!r:.80}")
            # the vocabulary (its tokens, scores and types), and any array longer than a per-layer one can be (a file
            # of one array of 25M integers took 1 GB and 19 s, read into a list nothing asks for)
            skip = skip_big and count > 64 or count > MAX_LAYERS
            if skip and itype in _GGUF_SCALARS:
                self.fh.seek(size * count, 1)
                return None
            if skip and itype == 8:
                for _ in range(count):
                    n = self.count(self.unpack("<Q", f"string length in {key!r:.80}"), 1, f"string in {key!r:.80}")
                    self.fh.seek(n, 1)
                return None
            return [self.value(itype, key, depth + 1) for _ in range(count)]
        raise InputError(f"unknown GGUF value type {vtype} for {key!r:.80}", source=self.source)


#: more metadata entries or tensors than a GGUF file of a model has (a crafted header's counts are read entry by entry)
_GGUF_MAX_KEYS = 100_000
_GGUF_MAX_TENSORS = 10_000_000


def read_gguf_config(path: str) -> dict:
    """The metadata of a GGUF file mapped to config.json field names (the header only, no tensors)."""
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", source=path) from None
    with fh:
        gf = _GgufFile(fh, path)
        if fh.read(4) != b"GGUF":
            raise InputError("not a GGUF file (bad magic)", source=path)
        version = gf.unpack("<I", "header")
        if version < 2:
            raise InputError(f"GGUF version {version} is not supported (2 or newer)", source=path)
        tensor_count = gf.count(gf.unpack("<Q", "header"), 24, "tensor count")  # name length, dims, type, offset
        kv_count = gf.count(gf.unpack("<Q", "header"), 13, "metadata count")  # key length, type, a byte at least
        if kv_count > _GGUF_MAX_KEYS or tensor_count > _GGUF_MAX_TENSORS:
            raise InputError(f"corrupt GGUF header: {kv_count:,} metadata entries and {tensor_count:,} tensors (at "
                             f"most {_GGUF_MAX_KEYS:,} and {_GGUF_MAX_TENSORS:,}: models have some hundreds and "
                             "thousands)", source=path)
        meta: dict[str, Any] = {}
        for _ in range(kv_count):
            klen = gf.count(gf.unpack("<Q", "key length"), 1, "key")
            key = gf.read(klen, "key").decode("utf-8", "replace")
            meta[key] = gf.value(gf.unpack("<I", f"value type of {key!r:.80}"), key,
                                 skip_big=key.startswith("tokenizer."))
        tensors = set()  # the tensor infos follow the metadata: names only (the data is never read)
        for _ in range(tensor_count):
            nlen = gf.count(gf.unpack("<Q", "tensor name length"), 1, "tensor name")
            tensors.add(gf.read(nlen, "tensor name").decode("utf-8", "replace"))
            n_dims = gf.count(gf.unpack("<I", "tensor dimensions"), 8, "tensor dimensions")
            gf.read(8 * n_dims + 4 + 8, "tensor info")
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise InputError("GGUF metadata has no general.architecture", source=path)

    def get(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    for name in ("attention.head_count", "attention.head_count_kv"):
        value = get(name)
        if isinstance(value, list) and (not value or any(isinstance(h, bool) or not isinstance(h, int) or h < 0
                                                         for h in value)):
            raise InputError("expected per-layer head counts (non-negative integers)", source=path,
                             field=f"{arch}.{name}")
    for name in ("block_count", "attention.head_count", "attention.head_count_kv", "embedding_length",
                 "feed_forward_length", "context_length", "attention.key_length", "attention.key_length_swa",
                 "attention.value_length", "attention.value_length_swa", "attention.sliding_window"):
        value = get(name)  # (checked here, at the file's own key: a negative value length was 0 bytes a token)
        if value is not None and not isinstance(value, list) and (
                isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CONFIG_INT):
            raise InputError(f"expected an integer from 0 to {MAX_CONFIG_INT:,}, got {value!r:.60}", source=path,
                             field=f"{arch}.{name}")
    if get("attention.head_count_kv") == 0:  # (it was read as absent: every query head its own KV head, unsaid)
        raise InputError("0 KV heads: a model with attention has at least one", source=path,
                         field=f"{arch}.attention.head_count_kv")
    heads = get("attention.head_count")
    if isinstance(heads, list):  # per layer
        heads = max(heads) or None
    kv = get("attention.head_count_kv")
    config: dict[str, Any] = {"model_type": arch, "num_hidden_layers": get("block_count"),
                              "num_attention_heads": heads,
                              "num_key_value_heads": (max(kv) if isinstance(kv, list) else kv) or heads,
                              "hidden_size": get("embedding_length"), "intermediate_size": get("feed_forward_length"),
                              "max_position_embeddings": get("context_length")}
    if get("attention.causal") is False:
        config["is_causal"] = False
    # head dims: key_length_swa/value_length_swa for sliding layers, key_length/value_length for the others
    k_len, k_swa = get("attention.key_length"), get("attention.key_length_swa")
    v_len, v_swa = get("attention.value_length"), get("attention.value_length_swa")
    if k_swa:
        config["head_dim"] = k_swa
        config["global_head_dim"] = k_len or None
        config["value_head_dim"] = v_swa or k_swa
        config["global_value_head_dim"] = v_len or k_len or None
    else:
        config["head_dim"] = k_len or None
        config["value_head_dim"] = v_len if v_len and v_len != k_len else None
    if get("attention.sliding_window"):
        config["sliding_window"] = get("attention.sliding_window")
        pattern = get("attention.sliding_window_pattern")
        if pattern is not None:  # an int (every n-th layer global) or one bool per layer (true = sliding)
            config["sliding_window_pattern"] = pattern
    if get("attention.kv_lora_rank"):
        config["kv_lora_rank"] = get("attention.kv_lora_rank")
        config["qk_rope_head_dim"] = get("rope.dimension_count")
    if "token_embd.weight" in tensors:  # llama.cpp stores no output.weight when the head is tied
        config["tie_word_embeddings"] = "output.weight" not in tensors
    config = {k: v for k, v in config.items() if v is not None}
    config[FROM_GGUF] = True  # cachectl's own field names: read field by field, not through transformers
    if isinstance(kv, list):  # per-layer KV head counts; 0 marks a layer without attention KV (Mamba, ...)
        if not kv or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in kv):
            raise InputError("expected per-layer KV-head counts (non-negative integers)", source=path,
                             field=f"{arch}.attention.head_count_kv")
        if len(kv) != config.get("num_hidden_layers"):
            raise InputError(f"lists {len(kv)} KV head counts for {config.get('num_hidden_layers')} layers",
                             source=path, field=f"{arch}.attention.head_count_kv")
        types = layer_types(config, path)
        config["layer_types"] = [t if h else "mamba" for t, h in zip(types, kv)]
        config["per_layer_config"] = {str(i): {"num_key_value_heads": h} for i, h in enumerate(kv) if h}
    return config


# --------------------------------------------------------------------------------------------- catalog



def catalog() -> dict:
    return load_data("models.json")["models"]


def gpu_table() -> dict:
    return load_data("gpus.json")


def resolve_model(spec: str) -> tuple[dict, str, dict | None]:
    """``(config, source, catalog_entry)`` from a dir, config.json, GGUF file, catalog name or cached HF id."""
    p = Path(spec).expanduser()
    if p.is_file() and p.suffix.lower() == ".gguf":
        return read_gguf_config(str(p)), str(p), None
    if p.exists():
        config, source = load_config(str(p))
        return config, source, None
    models = catalog()
    key = spec.lower()
    if key in models:
        m = models[key]
        return m["config"], f"cachectl catalog: {key} ({m['source']})", m
    for name, m in models.items():
        if m.get("hf_id", "").lower() == key:
            return m["config"], f"cachectl catalog: {name} ({m['source']})", m
    if "/" in spec and not spec.startswith((".", "/", "~")):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(spec, "config.json")
        except Exception:
            cached = None
        if isinstance(cached, str):
            config, source = load_config(cached)
            return config, source, None
    import difflib

    close = difflib.get_close_matches(key, list(models), n=3, cutoff=0.5)
    hint = f"close catalog names: {', '.join(close)}; " if close else f"catalog: {', '.join(models)}; "
    from ..names import is_price_model

    if is_price_model(spec):
        hint = (f"{spec!r} is a provider model of the price table (prompt-cost and lint take it as --model), while "
                f"this needs a model architecture; {hint}")
    raise UsageError(f"model {spec!r} is not a local path, a catalog name or a Hugging Face id in the local cache "
                     f"({hint}cachectl never downloads: pass a model directory, its config.json or a .gguf)")


def parse_memory(text: str) -> float:
    """``80GiB``, ``80GB``, ``80`` (GiB) -> bytes."""
    t = str(text).strip().lower().replace(" ", "")
    units = {"gib": GIB, "gb": 1e9, "mib": 1024 ** 2, "mb": 1e6, "tib": 1024 ** 4, "tb": 1e12}
    for suffix, mult in units.items():
        if t.endswith(suffix):
            t, factor = t[:-len(suffix)], mult
            break
    else:
        factor = GIB
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"cannot read a memory size from {text!r} (examples: 80GiB, 24GB)") from None
    if not 0 < value * factor <= MAX_MEMORY:
        raise UsageError(f"a memory size must be positive and at most 1 PB, got {text!r}")
    return value * factor


@dataclass(frozen=True)
class ContextRow:
    tokens: int
    bytes: float                   # one sequence
    batch_bytes: float             # --batch sequences
    max_sequences: int | None      # that fit in the KV budget
    decode_ms_per_token: float | None
    batch_fits: bool | None = None  # whether the batch fits in the KV budget (None: no budget)


@dataclass(frozen=True, kw_only=True)
class KvReport:
    schema_version: int = SCHEMA_VERSION
    model: str
    source: str
    layers: int
    kv_heads: int | None
    head_dim: int | None
    mla_dim: int | None
    dtype: str
    bytes_per_token: float
    bytes_per_token_beyond_windows: float
    layer_types: tuple[LayerGroup, ...]
    batch: int
    contexts: tuple[ContextRow, ...]
    weights_bytes: float | None
    weights_source: str | None
    gpu: str | None
    gpu_memory_bytes: float | None
    gpu_memory_utilization: float
    kv_budget_bytes: float | None
    vllm_blocks: int | None
    block_size: int
    notes: tuple[str, ...] = ()
    #: what is wrong, not only worth knowing (the weights do not fit in the GPU memory): exit 1
    findings: tuple[str, ...] = ()
    #: parameters counted from the config (every expert of an MoE), and those a token goes through
    params: int | None = None
    active_params: int | None = None
    #: whether the weights fit in the GPU memory budget (None without a GPU or --gpu-memory)
    weights_fit: bool | None = None
    #: a live run (kvlive.LiveRun) with --run
    run: Any = None
    #: multi-turn cache reuse (kvlive.TurnsRun) with --turns
    turns: Any = None
    #: a shared prefix copied per question (kvlive.SharedPrefixRun) with --shared-prefix
    shared_prefix: Any = None
    #: a quantized cache against full precision (kvlive.QuantizedRun) with --quantized
    quantized: Any = None
    #: the values used that the file does not give: transformers' defaults and the values derived from others
    defaults_used: tuple[DefaultUsed, ...] = ()


def inspect_config(config: dict, *, model: str, source: str, dtype: str = "bf16", contexts=(4096, 32768, 131072),
                   batch: int = 1, gpu: str | None = None, gpu_memory: float | None = None,
                   gpu_memory_utilization: float = 0.9, block_size: int = 16, weights_bytes: float | None = None,
                   weights_dtype: str = "bf16", published_params: int | None = None,
                   active_params: int | None = None) -> KvReport:
    """Everything the config says about the KV cache: per-token bytes, memory per context, what fits."""
    if batch < 1:
        raise UsageError("--batch must be at least 1")
    if not 0 < gpu_memory_utilization <= 1:
        raise UsageError("--gpu-memory-utilization must be in (0, 1]")
    if block_size < 1:
        raise UsageError("--block-size must be at least 1")
    if is_encoder_only(config):
        raise UsageError(f"{model} is an encoder-only model ({model_type(config) or 'not causal'}): every token "
                         "attends to the whole input at once, so it keeps no KV cache between tokens")
    if weights_bytes is not None and not 0 <= weights_bytes <= MAX_MEMORY:
        raise UsageError("--weights-gib must be between 0 and 1 PB")
    shape = kv_shape(config, dtype, source)
    groups = layer_groups(config, dtype, source)
    notes: list[str] = []
    findings: list[str] = []
    read_note = config_note(config)
    if read_note:
        notes.append(read_note)
    bandwidth = None
    if gpu is not None:
        table = gpu_table()
        gpus = table["gpus"]
        match = next((name for name, g in gpus.items() if gpu.lower() in (name.lower(), *[a.lower() for a in
                                                                                          g.get("aliases", [])])), None)
        if match is None:
            raise UsageError(f"unknown GPU {gpu!r}; known: {', '.join(gpus)}")
        gpu = match
        bandwidth = gpus[match]["bandwidth_gbps"] * 1e9
        if gpu_memory is None:  # what the driver reports (GiB), not the datasheet's decimal GB
            g = gpus[match]
            gpu_memory = g["memory_mib"] * 1024 ** 2 if g.get("memory_mib") else g["memory_gb"] * 1e9
    weights_source = None
    counted = count_params(config)
    if weights_bytes is not None:
        weights_source = "--weights-gib"
    elif published_params is not None:
        weights_bytes = published_params * DTYPE_BYTES[weights_dtype]
        weights_source = f"published parameter count x {weights_dtype}"
    elif counted is not None:
        weights_bytes = counted.total * DTYPE_BYTES[weights_dtype]
        what = f"{_size(counted.total)} parameters"
        if counted.moe_layers:
            what += (f", every one of the {counted.experts} experts of {counted.moe_layers} MoE layers in memory; "
                     f"{_size(counted.active)} active per token")
        weights_source = f"estimated from the config ({what}) x {weights_dtype}"
        if counted.approximate:
            notes.append(f"weights: {counted.approximate}")
    else:
        est = estimate_params(config)
        if est is not None:
            weights_bytes = est * DTYPE_BYTES[weights_dtype]
            weights_source = f"estimated from the config ({_size(est)} parameters) x {weights_dtype}"
    if active_params is None and counted is not None and counted.moe_layers and published_params is None:
        active_params = counted.active
    budget = None
    blocks = None
    if gpu_memory is not None:
        if weights_bytes is None:
            notes.append("weights size unknown (pass --weights-gib): the budget assumes none")
        budget = gpu_memory * gpu_memory_utilization - (weights_bytes or 0.0)
        if budget <= 0:
            assert weights_bytes is not None
            findings.append(f"the weights ({human_bytes(weights_bytes)}) do not fit in "
                            f"{gpu + ' ' if gpu else ''}memory: {human_bytes(gpu_memory)} x "
                            f"{gpu_memory_utilization:g} = {human_bytes(gpu_memory * gpu_memory_utilization)} for "
                            "weights and KV cache together; no sequence fits (more GPUs, tensor parallelism or "
                            "quantized weights)")
            budget = 0.0
        full_per_token = shape.bytes_per_token
        blocks = int(budget // (full_per_token * block_size)) if full_per_token else None
    rows = []
    for tokens in contexts:
        if not 1 <= tokens <= MAX_CONTEXT:
            raise UsageError(f"`contexts` values must be between 1 and {MAX_CONTEXT:,} tokens, got {str(tokens)[:30]}")
        one = kv_bytes(groups, tokens)
        fit = int(budget // one) if budget is not None and one else None
        decode = None
        read_weights = active_params * DTYPE_BYTES[weights_dtype] if active_params else weights_bytes
        if bandwidth is not None and read_weights is not None:
            decode = (read_weights + one * batch) / bandwidth * 1000.0
        rows.append(ContextRow(tokens=tokens, bytes=one, batch_bytes=one * batch, max_sequences=fit,
                               decode_ms_per_token=decode, batch_fits=None if fit is None else fit >= batch))
    tight = [r for r in rows if r.batch_fits is False]
    if tight and not findings:  # weights that do not fit already say no batch runs
        at = ", ".join(f"{r.tokens:,} ({r.max_sequences:,} fit)" for r in tight)
        notes.append(f"a batch of {batch} does not fit the KV budget at {'context' if len(tight) == 1 else 'contexts'} "
                     f"{at}" + (": its decode bound is for a batch that cannot run" if bandwidth is not None else ""))
    limit = _text_config(config).get("max_position_embeddings")
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        beyond_max = [t for t in contexts if t > limit]
        if beyond_max:
            which = (f"context {beyond_max[0]:,} is" if len(beyond_max) == 1 else
                     f"contexts {', '.join(f'{t:,}' for t in beyond_max)} are")
            notes.append(f"{which} beyond the model's maximum of {limit:,} tokens (max_position_embeddings): sizes "
                         "shown for arithmetic only")
    # what the file leaves out and the output used (tie_word_embeddings among them when the weights are estimated)
    defaults = defaults_used(config, source, weights_estimated=bool(weights_source
                                                                     and weights_source.startswith("estimated")))
    indexer = next((g for g in groups if g.type == INDEXER_KEYS), None)
    if indexer is not None and indexer.head_dim:
        notes.append(f"sparse attention (DSA): {indexer.layers} layers also cache the indexer's key of {indexer.head_dim} "
                     f"values per token, counted as vLLM and SGLang keep it, fp8 with an fp32 scale per 128 "
                     f"({indexer_key_bytes(indexer.head_dim):g} bytes per layer, whatever --dtype); transformers' "
                     f"DynamicCache keeps it in the model's dtype ({indexer.head_dim} x dtype bytes)")
    if any(g.window for g in groups):
        notes.append("sliding-window layers hold at most their window (transformers keeps window - 1 tokens "
                     "while get_seq_length() reports the full count)")
    unknown = sorted({g.type for g in groups} - KNOWN_LAYER_KINDS - {INDEXER_KEYS})
    if unknown:
        notes.append(f"layer type{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} counted as full attention: "
                     "cachectl does not know what else its cache holds")
    if bandwidth is not None:
        what = (f"the {active_params / 1e9:.1f}B parameters active per token (MoE)" if active_params else "weights")
        notes.append(f"decode lower bound = ({what} + KV of the batch) / peak memory bandwidth, per step")
    beyond = sum(g.bytes_per_token for g in groups if not g.window)
    return KvReport(model=model, source=source, layers=shape.layers, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                    mla_dim=shape.mla_dim, dtype=dtype, bytes_per_token=shape.bytes_per_token,
                    bytes_per_token_beyond_windows=beyond, layer_types=groups, batch=batch, contexts=tuple(rows),
                    weights_bytes=weights_bytes, weights_source=weights_source, gpu=gpu, gpu_memory_bytes=gpu_memory,
                    gpu_memory_utilization=gpu_memory_utilization, kv_budget_bytes=budget, vllm_blocks=blocks,
                    block_size=block_size, notes=tuple(notes), findings=tuple(findings),
                    params=published_params if published_params is not None else counted.total if counted else None,
                    active_params=active_params if active_params is not None else counted.active if counted else None,
                    weights_fit=None if budget is None else not findings, defaults_used=defaults)


def _size(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.2f}M"


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 1024 ** 4), ("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"

