"""KV-cache size arithmetic from a model's config.json (shared by simulate-prefix and, later, kv-inspect)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, UsageError

DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0, "float16": 2.0,
               "fp8": 1.0, "int8": 1.0, "int4": 0.5}
GIB = 1024 ** 3


@dataclass(frozen=True)
class KvShape:
    layers: int
    kv_heads: int | None
    head_dim: int | None
    mla_dim: int | None          # kv_lora_rank + qk_rope_head_dim for MLA caches (no separate V)
    dtype: str
    bytes_per_token: float


def load_config(path: str) -> tuple[dict, str]:
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise InputError("no such model config (pass a model directory or its config.json)", source=str(path))
    try:
        config = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", source=str(p)) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", source=str(p), line=exc.lineno) from None
    if not isinstance(config, dict):
        raise InputError("expected a JSON object", source=str(p))
    return config, str(p)


def _int(config: dict, key: str, source: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"expected a positive integer, got {value!r}", source=source, field=key)
    return value


def kv_shape(config: dict[str, Any], dtype: str = "bf16", source: str = "config.json") -> KvShape:
    """Bytes of K and V per token, summed over layers, for full-attention caching."""
    if dtype not in DTYPE_BYTES:
        raise UsageError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = _int(cfg, "num_hidden_layers", source)
    nbytes = DTYPE_BYTES[dtype]
    if cfg.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3): one compressed latent plus the rope key per layer
        mla = _int(cfg, "kv_lora_rank", source) + _int(cfg, "qk_rope_head_dim", source)
        return KvShape(layers, None, None, mla, dtype, layers * mla * nbytes)
    heads = _int(cfg, "num_attention_heads", source)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or _int(cfg, "hidden_size", source) // heads
    return KvShape(layers, int(kv_heads), int(head_dim), None, dtype, 2 * layers * kv_heads * head_dim * nbytes)


def blocks_for_memory(gib: float, bytes_per_token: float, block_size: int) -> int:
    if gib <= 0:
        raise UsageError("--capacity-gib must be positive")
    return int(gib * GIB // (bytes_per_token * block_size))
