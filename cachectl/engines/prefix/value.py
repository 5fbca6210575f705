"""What prefix-cache hits are worth: prefill FLOPs not spent, as GPU-seconds and dollars.

A hit token skips every transformer layer for that token: about 2 x (parameters outside the embedding and
the LM head) FLOPs for the matrix products (the LM head runs in prefill only for the last token, which is
never a hit), plus attention: a query at position p reads p keys, 4 x head_dim FLOPs per key and head
(QK^T and AV), so a prefix of h hit tokens costs about 2 x layers x heads x head_dim x h^2, summed over the
requests (``hit_square_sum``). Sliding-window layers are counted as full attention (an overestimate there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from ...errors import UsageError


@dataclass(frozen=True)
class HitsWorth:
    hit_tokens: float
    active_params: int
    flops_per_token: float
    matmul_flops: float
    attention_flops: float
    flops_saved: float
    gpu: str
    peak_tflops: float
    utilization: float
    gpu_seconds_at_peak: float
    gpu_seconds_at_utilization: float
    gpu_hour_usd: float | None
    usd: float | None
    model_source: str
    flops_source: str


def gpu_peak(name: str) -> tuple[str, float, str]:
    """``(canonical name, dense BF16 TFLOPS, source)`` for a GPU name or alias of ``gpus.json``."""
    from ..kv.config import gpu_table

    gpus = gpu_table()["gpus"]
    match = next((n for n, g in gpus.items() if name.lower() in (n.lower(), *[a.lower() for a in g.get("aliases", [])])),
                 None)
    flops = json.loads(resources.files("cachectl.data").joinpath("gpu_flops.json").read_text(encoding="utf-8"))
    if match is None or match not in flops["gpus"]:
        raise UsageError(f"no peak throughput for GPU {name!r}; known: {', '.join(flops['gpus'])}")
    return match, float(flops["gpus"][match]["dense_bf16_tflops"]), f"{flops['source']} (as of {flops['as_of']})"


def active_params(config: dict) -> int:
    """Parameters a token's prefill goes through, without the embedding and the LM head."""
    from ..kv.config import _text_config, estimate_params, tied_embeddings

    total = estimate_params(config)
    if total is None:
        raise UsageError("cannot count this model's active parameters from its configuration (MoE, MLA or "
                         "non-attention layers): the worth of hits needs a dense transformer config")
    cfg = _text_config(config)
    embed = cfg["vocab_size"] * cfg["hidden_size"] * (1 if tied_embeddings(config)[0] else 2)
    return int(total - embed)


def hits_worth(hit_tokens: float, *, hit_square_sum: float, config: dict, model_source: str, gpu: str,
               gpu_hour_usd: float | None = None, utilization: float = 0.4) -> HitsWorth:
    from ..kv.config import _layers, _text_config

    if not 0 < utilization <= 1:
        raise UsageError("utilization must be in (0, 1]")
    if gpu_hour_usd is not None and gpu_hour_usd < 0:
        raise UsageError("the GPU-hour price must not be negative")
    name, tflops, source = gpu_peak(gpu)
    params = active_params(config)
    cfg = _text_config(config)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    layers = len(_layers(config, model_source))
    attention = 2.0 * layers * heads * head_dim * hit_square_sum
    matmul = 2.0 * params * hit_tokens
    total = matmul + attention
    at_peak = total / (tflops * 1e12)
    at_util = at_peak / utilization
    usd = None if gpu_hour_usd is None else at_util / 3600.0 * gpu_hour_usd
    return HitsWorth(hit_tokens=hit_tokens, active_params=params, flops_per_token=2.0 * params,
                     matmul_flops=matmul, attention_flops=attention, flops_saved=total, gpu=name,
                     peak_tflops=tflops, utilization=utilization, gpu_seconds_at_peak=at_peak,
                     gpu_seconds_at_utilization=at_util, gpu_hour_usd=gpu_hour_usd, usd=usd,
                     model_source=model_source, flops_source=source)
