"""KV-cache size arithmetic from a model's configuration (shared by kv-inspect and simulate-prefix).

bytes per token = 2 (K and V) x layers x KV heads x head_dim x dtype bytes, with ``head_dim`` from the
config when it has one, GQA/MQA through ``num_key_value_heads``, MLA caches as ``kv_lora_rank +
qk_rope_head_dim`` per layer (one latent, no separate V), sliding-window layers capped at their window,
and layers without attention KV (linear attention, Mamba) counted as zero.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import InputError, UsageError

SCHEMA_VERSION = 1
DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0,
               "fp8": 1.0, "int8": 1.0, "int4": 0.5}
GIB = 1024 ** 3
MAX_MEMORY = 1e15               # bytes: larger sizes are typos (and would overflow the JSON integers)
MAX_CONTEXT = 2 ** 40           # tokens
MAX_LAYERS = 100_000            # no model has more; a bigger count is corrupt (and is materialized per layer)
MAX_CONFIG_INT = 2 ** 40        # any other integer of a config
_NO_KV = {"linear_attention", "mamba", "mamba2", "recurrent", "conv", "ssm"}


@dataclass(frozen=True)
class KvShape:
    layers: int
    kv_heads: int | None
    head_dim: int | None
    mla_dim: int | None          # kv_lora_rank + qk_rope_head_dim for MLA caches (no separate V)
    dtype: str
    bytes_per_token: float


@dataclass(frozen=True)
class LayerGroup:
    """Layers that cache the same way."""

    type: str                    # full_attention | sliding_attention | mla | no_kv
    layers: int
    window: int | None
    bytes_per_token: float       # for all layers of the group together


# ------------------------------------------------------------------------------------------- configs


def load_config(path: str) -> tuple[dict, str]:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise InputError("no such model config (pass a model directory or its config.json)", source=str(path))
    from ..inputs import parse_json_document, read_text

    config = parse_json_document(*read_text(str(p)))
    if not isinstance(config, dict):
        raise InputError("expected a JSON object", source=str(p))
    return config, str(p)


def _int(config: dict, key: str, source: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"expected a positive integer, got {value!r:.60}", source=source, field=key)
    return value


_OPTIONAL_INTS = ("num_key_value_heads", "head_dim", "sliding_window", "kv_lora_rank", "qk_rope_head_dim",
                  "hidden_size", "num_attention_heads")


def check_config(config: dict, source: str = "config.json") -> None:
    """The fields the KV arithmetic reads, checked where they are read: integers in range, KV heads that
    divide the attention heads, a head_dim that hidden_size gives when the config has none."""
    cfg = _text_config(config)
    for key in ("num_hidden_layers", *_OPTIONAL_INTS):
        value = cfg.get(key)
        if value is None or (value == 0 and key != "num_hidden_layers" and not isinstance(value, bool)):
            continue  # absent (0 means absent for the optional ones, as configs write it)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONFIG_INT:
            raise InputError(f"expected a positive integer up to {MAX_CONFIG_INT:,}, got {value!r:.60}",
                             source=source, field=key)
    kinds = set(layer_types(config, source))  # checks the layer count
    if cfg.get("kv_lora_rank"):
        return
    if not kinds - _NO_KV:
        return
    heads = _int(cfg, "num_attention_heads", source)
    kv_heads = cfg.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise InputError(f"{kv_heads} KV heads do not divide the {heads} attention heads (grouped-query attention "
                         "shares each KV head among a whole number of query heads)", source=source,
                         field="num_key_value_heads")
    if not cfg.get("head_dim"):
        hidden = _int(cfg, "hidden_size", source)
        if hidden % heads:
            raise InputError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} and there is "
                             "no head_dim", source=source, field="hidden_size")


def _text_config(config: dict) -> dict:
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def layer_types(config: dict, source: str = "config.json") -> list[str]:
    """The attention kind of every layer: from ``layer_types`` when the config lists them, else derived."""
    cfg = _text_config(config)
    n = _int(cfg, "num_hidden_layers", source)
    if n > MAX_LAYERS:
        raise InputError(f"{n:,} layers is more than any model has ({MAX_LAYERS:,})", source=source,
                         field="num_hidden_layers")
    listed = cfg.get("layer_types")
    if isinstance(listed, list):
        if len(listed) != n:
            raise InputError(f"lists {len(listed)} layer types for {n} layers", source=source, field="layer_types")
        return [str(t) for t in listed]
    if cfg.get("kv_lora_rank"):
        return ["mla"] * n
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window", True) is not False:
        if cfg.get("model_type") == "gemma2":  # Gemma 2 alternates: sliding on even layers, global on odd
            return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
        pattern = cfg.get("sliding_window_pattern")
        if isinstance(pattern, int) and pattern > 1:  # every pattern-th layer is global
            return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
        return ["sliding_attention"] * n
    return ["full_attention"] * n


def layer_groups(config: dict, dtype: str = "bf16", source: str = "config.json") -> tuple[LayerGroup, ...]:
    if dtype not in DTYPE_BYTES:
        raise UsageError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    check_config(config, source)
    cfg = _text_config(config)
    nbytes = DTYPE_BYTES[dtype]
    types = layer_types(config, source)
    counts: dict[str, int] = {}
    for t in types:
        key = "no_kv" if t in _NO_KV else t
        counts[key] = counts.get(key, 0) + 1
    groups = []
    for kind, n in counts.items():
        if kind == "no_kv":
            groups.append(LayerGroup("no_kv", n, None, 0.0))
            continue
        if kind == "mla":
            per = (_int(cfg, "kv_lora_rank", source) + _int(cfg, "qk_rope_head_dim", source)) * nbytes
            groups.append(LayerGroup("mla", n, None, n * per))
            continue
        heads = _int(cfg, "num_attention_heads", source)
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or _int(cfg, "hidden_size", source) // heads
        window = cfg.get("sliding_window") if kind == "sliding_attention" else None
        groups.append(LayerGroup(kind, n, window, n * 2 * kv_heads * head_dim * nbytes))
    return tuple(groups)


def kv_shape(config: dict[str, Any], dtype: str = "bf16", source: str = "config.json") -> KvShape:
    """Bytes of K and V per token over all layers (below any sliding window)."""
    groups = layer_groups(config, dtype, source)
    cfg = _text_config(config)
    layers = _int(cfg, "num_hidden_layers", source)
    if cfg.get("kv_lora_rank"):
        mla = _int(cfg, "kv_lora_rank", source) + _int(cfg, "qk_rope_head_dim", source)
        return KvShape(layers, None, None, mla, dtype, sum(g.bytes_per_token for g in groups))
    heads = _int(cfg, "num_attention_heads", source)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or _int(cfg, "hidden_size", source) // heads)
    return KvShape(layers, kv_heads, head_dim, None, dtype, sum(g.bytes_per_token for g in groups))


def kv_bytes(groups: tuple[LayerGroup, ...], tokens: int) -> float:
    """Bytes one sequence of ``tokens`` holds: sliding layers keep at most their window."""
    return sum(g.bytes_per_token * (min(tokens, g.window) if g.window else tokens) for g in groups)


def estimate_params(config: dict) -> int | None:
    """Dense-transformer parameter count from the config (embeddings, attention, gated MLP); None for MoE."""
    cfg = _text_config(config)
    if any(cfg.get(k) for k in ("n_routed_experts", "num_local_experts", "num_experts")):
        return None
    try:
        hidden, layers, heads = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
        vocab, inter = cfg["vocab_size"], cfg["intermediate_size"]
    except KeyError:
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_CONFIG_INT
               for v in (hidden, layers, heads, vocab, inter)):
        return None
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    attn = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    mlp = 3 * hidden * inter
    embed = vocab * hidden * (1 if cfg.get("tie_word_embeddings", False) else 2)
    norms = (2 * layers + 1) * hidden
    return int(embed + layers * (attn + mlp) + norms)


def blocks_for_memory(gib: float, bytes_per_token: float, block_size: int) -> int:
    if not 0 < gib < float("inf"):
        raise UsageError("--capacity-gib must be a positive number")
    if bytes_per_token <= 0:
        raise UsageError("the model keeps no KV cache per token (no attention layers): --capacity-gib cannot "
                         "be turned into blocks; pass --capacity-blocks")
    return int(gib * GIB // (bytes_per_token * block_size))


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

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
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
            if itype in _GGUF_SCALARS and itype != 7 and count > 64:  # skip big arrays (the vocabulary)
                self.fh.seek(size * count, 1)
                return None
            return [self.value(itype, key, depth + 1) for _ in range(count)]
        raise InputError(f"unknown GGUF value type {vtype} for {key!r:.80}", source=self.source)


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
        _tensors = gf.unpack("<Q", "header")
        kv_count = gf.count(gf.unpack("<Q", "header"), 13, "metadata count")  # key length, type, a byte at least
        meta: dict[str, Any] = {}
        for _ in range(kv_count):
            klen = gf.count(gf.unpack("<Q", "key length"), 1, "key")
            key = gf.read(klen, "key").decode("utf-8", "replace")
            meta[key] = gf.value(gf.unpack("<I", f"value type of {key!r:.80}"), key)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise InputError("GGUF metadata has no general.architecture", source=path)

    def get(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    config: dict[str, Any] = {"model_type": arch, "num_hidden_layers": get("block_count"),
                              "num_attention_heads": get("attention.head_count"),
                              "num_key_value_heads": get("attention.head_count_kv") or get("attention.head_count"),
                              "hidden_size": get("embedding_length"), "intermediate_size": get("feed_forward_length"),
                              "max_position_embeddings": get("context_length")}
    if get("attention.key_length"):
        config["head_dim"] = get("attention.key_length")
    if get("attention.sliding_window"):
        config["sliding_window"] = get("attention.sliding_window")
    if get("attention.kv_lora_rank"):
        config["kv_lora_rank"] = get("attention.kv_lora_rank")
        config["qk_rope_head_dim"] = get("rope.dimension_count")
    if isinstance(config["num_key_value_heads"], list):  # per-layer counts: 0 marks a layer without KV
        per_layer = config["num_key_value_heads"]
        if not per_layer or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in per_layer):
            raise InputError("expected per-layer KV-head counts (non-negative integers)", source=path,
                             field=f"{arch}.attention.head_count_kv")
        config["layer_types"] = ["full_attention" if h else "mamba" for h in per_layer]
        config["num_key_value_heads"] = max(per_layer)
    return {k: v for k, v in config.items() if v is not None}


# --------------------------------------------------------------------------------------------- catalog


def _data(name: str) -> dict:
    return json.loads(resources.files("cachectl.data").joinpath(name).read_text(encoding="utf-8"))


def catalog() -> dict:
    return _data("models.json")["models"]


def gpu_table() -> dict:
    return _data("gpus.json")


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
    #: a live run (kvlive.LiveRun) with --run
    run: Any = None
    #: multi-turn cache reuse (kvlive.TurnsRun) with --turns
    turns: Any = None
    #: a shared prefix copied per question (kvlive.SharedPrefixRun) with --shared-prefix
    shared_prefix: Any = None
    #: a quantized cache against full precision (kvlive.QuantizedRun) with --quantized
    quantized: Any = None


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
    if weights_bytes is not None and not 0 <= weights_bytes <= MAX_MEMORY:
        raise UsageError("--weights-gib must be between 0 and 1 PB")
    shape = kv_shape(config, dtype, source)
    groups = layer_groups(config, dtype, source)
    notes: list[str] = []
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
        if gpu_memory is None:
            gpu_memory = gpus[match]["memory_gb"] * 1e9
    weights_source = None
    if weights_bytes is not None:
        weights_source = "--weights-gib"
    elif published_params is not None:
        weights_bytes = published_params * DTYPE_BYTES[weights_dtype]
        weights_source = f"published parameter count x {weights_dtype}"
    else:
        est = estimate_params(config)
        if est is not None:
            weights_bytes = est * DTYPE_BYTES[weights_dtype]
            size = f"{est / 1e9:.2f}B" if est >= 1e8 else f"{est / 1e6:.2f}M"
            weights_source = f"estimated from the config ({size} parameters) x {weights_dtype}"
    budget = None
    blocks = None
    if gpu_memory is not None:
        if weights_bytes is None:
            notes.append("weights size unknown (pass --weights-gib): the budget assumes none")
        budget = gpu_memory * gpu_memory_utilization - (weights_bytes or 0.0)
        if budget <= 0:
            notes.append("the weights do not fit in the GPU memory budget")
            budget = 0.0
        full_per_token = shape.bytes_per_token
        blocks = int(budget // (full_per_token * block_size)) if full_per_token else None
    rows = []
    for tokens in contexts:
        if not 1 <= tokens <= MAX_CONTEXT:
            raise UsageError(f"--context values must be between 1 and {MAX_CONTEXT:,} tokens, got {str(tokens)[:30]}")
        one = kv_bytes(groups, tokens)
        fit = int(budget // one) if budget is not None and one else None
        decode = None
        read_weights = active_params * DTYPE_BYTES[weights_dtype] if active_params else weights_bytes
        if bandwidth is not None and read_weights is not None:
            decode = (read_weights + one * batch) / bandwidth * 1000.0
        rows.append(ContextRow(tokens=tokens, bytes=one, batch_bytes=one * batch, max_sequences=fit,
                               decode_ms_per_token=decode))
    if any(g.window for g in groups):
        notes.append("sliding-window layers hold at most their window (transformers keeps window - 1 tokens "
                     "while get_seq_length() reports the full count)")
    if bandwidth is not None:
        what = (f"the {active_params / 1e9:.1f}B parameters active per token (MoE)" if active_params else "weights")
        notes.append(f"decode lower bound = ({what} + KV of the batch) / peak memory bandwidth, per step")
    beyond = sum(g.bytes_per_token for g in groups if not g.window)
    return KvReport(model=model, source=source, layers=shape.layers, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
                    mla_dim=shape.mla_dim, dtype=dtype, bytes_per_token=shape.bytes_per_token,
                    bytes_per_token_beyond_windows=beyond, layer_types=groups, batch=batch, contexts=tuple(rows),
                    weights_bytes=weights_bytes, weights_source=weights_source, gpu=gpu, gpu_memory_bytes=gpu_memory,
                    gpu_memory_utilization=gpu_memory_utilization, kv_budget_bytes=budget, vllm_blocks=blocks,
                    block_size=block_size, notes=tuple(notes))


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("TiB", 1024 ** 4), ("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"

