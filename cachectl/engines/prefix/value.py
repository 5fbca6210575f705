"""What prefix-cache hits are worth: prefill FLOPs not spent, as GPU-seconds and dollars.

A hit token skips every transformer layer for that token: about 2 x (parameters outside the embedding and
the LM head) FLOPs for the matrix products (the LM head runs in prefill only for the last token, which is
never a hit), plus attention: a query at position p reads p keys, 4 x head_dim FLOPs per key and head
(QK^T and AV), so a prefix of h hit tokens costs about 2 x layers x heads x head_dim x h^2, summed over the
requests (``hit_square_sum``). Sliding-window layers are counted as full attention (an overestimate there).

What that is honestly worth (:class:`ServingTime`, given the trace's prompt and output tokens): a roofline of
the whole workload's GPU time. Prefill is compute bound (the FLOPs above for every prompt token, at
``utilization`` of the dense BF16 peak); decode is memory bound: each step reads the weights once and each
sequence of the batch its KV cache (at its mean context), over the datasheet bandwidth (``gpus.json``), and a
step emits one token per sequence of the batch. Hits shorten prefill only; decode time does not change, so
the share of end-to-end time the hits save is what an output-heavy workload gets. Then TTFT saved per request
(its prefill alone on an idle GPU), throughput (requests per GPU-second at the batch) with and without the
hits, and what keying every block costs on the CPU (``data/block_hash_cost.json``: measured here, and vLLM's
published figure), the whole cost on traffic with no reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...datafiles import load_data
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
    #: the honest worth, when the trace's prompt and output tokens were given (None: a fleet's bare figures)
    serving: ServingTime | None = None


@dataclass(frozen=True)
class ServingTime:
    """The workload's GPU time on a roofline, with and without the hits, and what each figure assumes."""

    requests: int
    batch: int
    dtype: str
    # prefill, compute bound
    prompt_tokens: float
    prefill_flops: float                 # every prompt token computed
    prefill_s_without_hits: float        # at the utilization
    prefill_s_saved: float
    # decode, memory bound
    output_tokens: int
    weight_bytes_per_step: float
    kv_bytes_per_sequence: float         # at the mean context of a decode step
    bandwidth_gbps: float
    decode_step_s: float                 # one step of the batch
    decode_s: float                      # output_tokens / batch steps
    # end to end
    end_to_end_s_without_hits: float
    end_to_end_s_with_hits: float
    share_saved: float | None            # prefill saved over end-to-end time without the hits
    prefill_share_saved: float | None    # prefill saved over prefill time
    ttft_s_without_hits: float | None    # mean per request
    ttft_s_saved: float | None           # mean per request
    throughput_rps_without_hits: float | None   # requests per GPU-second at the batch
    throughput_rps_with_hits: float | None
    throughput_gain: float | None
    # hashing every full block, hit or not
    hashed_tokens: float
    hash_ns_per_token: float
    hash_cpu_s: float
    hash_share_of_prefill: float | None
    hash_source: str
    hash_published: str
    bandwidth_source: str
    assumptions: tuple[str, ...] = ()


def _hash_cost(hash_fn: str) -> tuple[float, str, str]:
    """``(ns per token, where it was measured, vLLM's published figure with its source)``."""
    table = load_data("block_hash_cost.json")
    m, pub = table["measured"], table["published"]
    key = "sha256_ns_per_token" if hash_fn == "sha256" else "builtin_ns_per_token"
    what = "SHA-256 over a pickle, vLLM's default" if hash_fn == "sha256" else "Python's tuple hash"
    return (float(m[key]), f"{what}, measured by {m['by']} on {m['date']} ({m['machine']}, block size "
            f"{m['block_size']})", f"{pub['figure']}: {pub['source']}")


def gpu_peak(name: str) -> tuple[str, float, str]:
    """``(canonical name, dense BF16 TFLOPS, source)`` for a GPU name or alias of ``gpus.json``."""
    from ..kv.config import gpu_table

    gpus = gpu_table()["gpus"]
    match = next((n for n, g in gpus.items() if name.lower() in (n.lower(), *[a.lower() for a in g.get("aliases", [])])),
                 None)
    flops = load_data("gpu_flops.json")
    if match is None or match not in flops["gpus"]:
        raise UsageError(f"no peak throughput for GPU {name!r}; known: {', '.join(flops['gpus'])}")
    return match, float(flops["gpus"][match]["dense_bf16_tflops"]), f"{flops['source']} (as of {flops['as_of']})"


def active_params(config: dict) -> int:
    """Parameters a token's prefill goes through, without the embedding and the LM head (the routed experts
    a token uses, for an MoE), from :func:`~cachectl.engines.kv.config.count_params`."""
    from ..kv.config import _text_config, count_params, tied_embeddings

    counted = count_params(config)
    if counted is None:
        raise UsageError("cannot count this model's parameters from its configuration: the worth of hits "
                         "needs hidden_size, num_attention_heads, vocab_size and intermediate_size")
    cfg = _text_config(config)
    embed = cfg["vocab_size"] * cfg["hidden_size"] * (1 if tied_embeddings(config)[0] else 2)
    return int(counted.active - embed)


def _attention_dims(config: dict, model_source: str) -> tuple[int, int, float]:
    """``(layers, heads, FLOPs per key and head / 2)``: (query-key dim + value dim) / 2, head_dim for MHA/GQA,
    the MLA head's (nope + rope + v) / 2."""
    from ..kv.config import _layers, _text_config

    cfg = _text_config(config)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    if cfg.get("kv_lora_rank"):
        qk = (cfg.get("qk_nope_head_dim") or 0) + (cfg.get("qk_rope_head_dim") or 0)
        head_dim = (qk + (cfg.get("v_head_dim") or cfg.get("qk_nope_head_dim") or qk)) / 2
    return len(_layers(config, model_source)), heads, head_dim


def hits_worth(hit_tokens: float, *, hit_square_sum: float, config: dict, model_source: str, gpu: str,
               gpu_hour_usd: float | None = None, utilization: float = 0.4, requests: int | None = None,
               query_tokens: float | None = None, query_square_sum: float | None = None,
               output_tokens: int | None = None, output_context_sum: float | None = None, batch: int = 32,
               dtype: str = "bf16", hash_fn: str = "sha256") -> HitsWorth:
    """The FLOPs, GPU-seconds and dollars the hits save; with ``requests``, ``query_tokens`` (prompt tokens),
    ``query_square_sum`` (their squares summed over requests) and ``output_tokens`` also what that is worth in
    the workload's end-to-end GPU time at ``batch`` (:class:`ServingTime`). ``output_context_sum``: the
    sum over requests of output tokens x the mean context of their decode steps (default: each request's
    context taken as the mean prompt plus half its mean output)."""
    if not 0 < utilization <= 1:
        raise UsageError("utilization must be in (0, 1]")
    if gpu_hour_usd is not None and gpu_hour_usd < 0:
        raise UsageError("the GPU-hour price must not be negative")
    if batch < 1:
        raise UsageError("`batch` must be at least 1")
    name, tflops, source = gpu_peak(gpu)
    params = active_params(config)
    layers, heads, head_dim = _attention_dims(config, model_source)
    attention = 2.0 * layers * heads * head_dim * hit_square_sum
    matmul = 2.0 * params * hit_tokens
    total = matmul + attention
    at_peak = total / (tflops * 1e12)
    at_util = at_peak / utilization
    usd = None if gpu_hour_usd is None else at_util / 3600.0 * gpu_hour_usd
    serving = None
    if requests is not None and query_tokens is not None and query_square_sum is not None \
            and output_tokens is not None:
        flops = 2.0 * params * query_tokens + 2.0 * layers * heads * head_dim * query_square_sum
        serving = _serving(config, model_source, name, flops=flops, saved_s=at_util, rate=tflops * 1e12 * utilization,
                           requests=requests, query_tokens=query_tokens, output_tokens=output_tokens,
                           output_context_sum=output_context_sum, batch=batch, dtype=dtype, hash_fn=hash_fn,
                           utilization=utilization, tflops=tflops, params=params)
    return HitsWorth(hit_tokens=hit_tokens, active_params=params, flops_per_token=2.0 * params,
                     matmul_flops=matmul, attention_flops=attention, flops_saved=total, gpu=name,
                     peak_tflops=tflops, utilization=utilization, gpu_seconds_at_peak=at_peak,
                     gpu_seconds_at_utilization=at_util, gpu_hour_usd=gpu_hour_usd, usd=usd,
                     model_source=model_source, flops_source=source, serving=serving)


def _serving(config: dict, model_source: str, gpu: str, *, flops: float, saved_s: float, rate: float,
             requests: int, query_tokens: float, output_tokens: int, output_context_sum: float | None,
             batch: int, dtype: str, hash_fn: str, utilization: float, tflops: float, params: int) -> ServingTime:
    from ..kv.config import DTYPE_BYTES, count_params, gpu_table, kv_bytes, layer_groups

    gpus = gpu_table()
    bandwidth = float(gpus["gpus"][gpu]["bandwidth_gbps"])
    counted = count_params(config)
    assert counted is not None  # active_params counted it
    read = counted.active if counted.moe_layers else counted.total
    weight_bytes = read * DTYPE_BYTES.get(dtype, 2.0)
    n = max(requests, 1)
    if output_context_sum is None:
        context = query_tokens / n + output_tokens / n / 2.0
    else:
        context = output_context_sum / output_tokens if output_tokens else query_tokens / n
    kv_seq = kv_bytes(layer_groups(config, dtype, model_source), max(1, round(context)))
    step = (weight_bytes + batch * kv_seq) / (bandwidth * 1e9)
    decode = output_tokens / batch * step
    prefill = flops / rate
    without, with_hits = prefill + decode, prefill - saved_s + decode
    ns, hsource, published = _hash_cost(hash_fn)
    hash_s = query_tokens * ns * 1e-9
    moe = f" (the {counted.active:,} active of {counted.total:,}, as kv-inspect's decode estimate)" if counted.moe_layers else ""
    assumptions = (
        f"prefill: compute bound, 2 x {params:,} parameters (without embedding and LM head) per token plus attention "
        f"over the prefix, at {utilization:.0%} of {gpu}'s {tflops:,g} TFLOPS dense BF16 peak; a request alone on "
        "the GPU (TTFT without queueing)",
        f"decode: memory bound, each step reads the weights once ({weight_bytes / 1e9:,.1f} GB at {dtype}{moe}) and "
        f"{batch} sequences' KV cache ({kv_seq / 1e9:,.3f} GB each at a mean context of {context:,.0f} tokens) at "
        f"{bandwidth:,g} GB/s; {batch} sequences per step; hits do not change it",
        "end to end: prefill and decode do not overlap (no chunked prefill); the GPU is busy throughout, so "
        "requests per GPU-second is the throughput",
        f"hashing: {ns:,g} ns per prompt token on one CPU thread ({hsource}); vLLM keys every full block, hit or "
        f"not; published: {published}",
    )
    return ServingTime(
        requests=requests, batch=batch, dtype=dtype, prompt_tokens=query_tokens, prefill_flops=flops,
        prefill_s_without_hits=prefill, prefill_s_saved=saved_s, output_tokens=output_tokens,
        weight_bytes_per_step=weight_bytes, kv_bytes_per_sequence=kv_seq, bandwidth_gbps=bandwidth,
        decode_step_s=step, decode_s=decode, end_to_end_s_without_hits=without, end_to_end_s_with_hits=with_hits,
        share_saved=saved_s / without if without else None,
        prefill_share_saved=saved_s / prefill if prefill else None,
        ttft_s_without_hits=prefill / requests if requests else None,
        ttft_s_saved=saved_s / requests if requests else None,
        throughput_rps_without_hits=requests / without if without else None,
        throughput_rps_with_hits=requests / with_hits if with_hits else None,
        throughput_gain=without / with_hits if with_hits else None,
        hashed_tokens=query_tokens, hash_ns_per_token=ns, hash_cpu_s=hash_s,
        hash_share_of_prefill=hash_s / prefill if prefill else None, hash_source=hsource, hash_published=published,
        bandwidth_source=f"{gpus['source']} (as of {gpus['as_of']})", assumptions=assumptions)
