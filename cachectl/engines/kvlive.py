"""Live KV-cache inspection with transformers: prefill into a DynamicCache, decode greedily, measure.

torch and transformers are imported inside :func:`run_live` only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import InputError, UsageError
from . import kvmath

_TORCH_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


@dataclass(frozen=True)
class LiveLayer:
    index: int
    keys_shape: tuple[int, ...]
    values_shape: tuple[int, ...]
    dtype: str
    bytes: int


@dataclass(frozen=True)
class LiveRun:
    prompt_tokens: int
    generated_tokens: int
    #: prompt + generated - 1: the last generated token's K/V is computed only when it is fed back
    seq_length: int
    measured_bytes: int
    predicted_bytes: float
    agree: bool
    dtype: str
    layers: tuple[LiveLayer, ...]
    prefill_tokens_per_s: float
    decode_ms_per_token: float | None
    weights: str                 # "pretrained" or "random (from config)"


def _load_model(spec: str, config: dict, random_weights: bool):
    import torch  # noqa: F401 - transformers needs it here
    import transformers

    transformers.utils.logging.set_verbosity_error()
    if random_weights:
        cfg = dict(config)
        model_type = cfg.pop("model_type", None)
        if not model_type:
            raise UsageError("--random-weights needs a config with model_type")
        try:
            hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
            return transformers.AutoModelForCausalLM.from_config(hf_config), "random (from config)"
        except Exception as exc:
            raise UsageError(f"cannot build a {model_type} model from this config: {str(exc).splitlines()[0]}") from None
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise UsageError("--run loads weights from a local model directory; for a config alone (or a catalog "
                         "name) add --random-weights")
    try:
        return (transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True),
                "pretrained")
    except Exception as exc:
        raise InputError(f"cannot load the model: {str(exc).strip().splitlines()[0]}", source=str(path)) from None


def run_live(spec: str, config: dict, prompt_ids: Sequence[int], *, max_new_tokens: int = 20,
             random_weights: bool = False, seed: int = 0, threads: int | None = None) -> LiveRun:
    """Prefill ``prompt_ids`` into a DynamicCache, decode greedily, and measure the cache."""
    if max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    if not prompt_ids:
        raise UsageError("the prompt has no tokens")
    import torch
    from transformers import DynamicCache

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model, weights = _load_model(spec, config, random_weights)
    model.eval()
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and max(prompt_ids) >= vocab:
        raise UsageError(f"token ID {max(prompt_ids)} is outside the model's vocabulary of {vocab}: the tokenizer "
                         "does not belong to this model")
    ids = torch.tensor([list(prompt_ids)])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(input_ids=ids, cache=cache, use_cache=True)
        prefill = time.perf_counter() - t0
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        generated = 1
        t1 = time.perf_counter()
        while generated < max_new_tokens:
            out = model(input_ids=nxt, cache=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            generated += 1
        decode = time.perf_counter() - t1
    seq_length = int(cache.get_seq_length())
    layers = []
    measured = 0
    dtype = "fp32"
    for i, layer in enumerate(cache.layers):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if k is None or v is None or not hasattr(k, "shape"):
            continue
        nbytes = k.numel() * k.element_size() + v.numel() * v.element_size()
        dtype = _TORCH_DTYPES.get(str(k.dtype), str(k.dtype))
        layers.append(LiveLayer(i, tuple(k.shape), tuple(v.shape), dtype, int(nbytes)))
        measured += nbytes
    hf_config = model.config.to_dict()
    groups = kvmath.layer_groups(hf_config, dtype if dtype in kvmath.DTYPE_BYTES else "fp32", "model config")
    # transformers keeps window - 1 tokens in a sliding layer
    predicted = sum(g.bytes_per_token * (min(seq_length, g.window - 1) if g.window else seq_length) for g in groups)
    return LiveRun(prompt_tokens=len(prompt_ids), generated_tokens=generated, seq_length=seq_length,
                   measured_bytes=int(measured), predicted_bytes=predicted, agree=abs(measured - predicted) < 1,
                   dtype=dtype, layers=tuple(layers), prefill_tokens_per_s=len(prompt_ids) / prefill if prefill else 0.0,
                   decode_ms_per_token=decode / (generated - 1) * 1000.0 if generated > 1 else None, weights=weights)
