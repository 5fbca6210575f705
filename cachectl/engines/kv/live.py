"""Live KV-cache inspection with transformers: prefill into a DynamicCache, decode greedily, measure.

torch and transformers are imported inside :func:`run_live` only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import InputError, UsageError
from . import config as kvmath

_TORCH_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}


def cache_keyword(model: Any) -> str:
    """The keyword the model's forward takes its cache by: ``cache`` (transformers 5.24+) or
    ``past_key_values`` (5.0-5.23, where ``cache=`` would vanish into ``**kwargs`` and leave the cache empty)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _forward(model: Any, ids: Any, cache: Any) -> Any:
    return model(input_ids=ids, use_cache=True, **{cache_keyword(model): cache})


@dataclass(frozen=True)
class LiveLayer:
    index: int
    keys_shape: tuple[int, ...]
    values_shape: tuple[int, ...]
    dtype: str
    bytes: int
    #: the DSA indexer's keys (DeepSeek-V3.2, GLM-MoE-DSA: ``indexer_keys`` of a DynamicIndexedLayer), counted in bytes
    indexer_keys_shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class LiveRun:
    prompt_tokens: int
    generated_tokens: int
    #: what the cache reports (get_seq_length())
    seq_length: int
    #: prompt + generated - 1: the last generated token's K/V is computed only when it is fed back
    expected_seq_length: int
    measured_bytes: int
    #: from the model's config and dtype at expected_seq_length tokens (not from the cache itself), as the installed
    #: transformers caches it (Falcon new_decoder_architecture before 5.25: the KV heads repeated to the query heads)
    predicted_bytes: float
    #: seq_length == expected_seq_length and measured_bytes == predicted_bytes
    agree: bool
    dtype: str
    layers: tuple[LiveLayer, ...]
    prefill_tokens_per_s: float
    decode_ms_per_token: float | None
    weights: str                 # "pretrained" or "random (from config)"


def available_memory_bytes() -> int | None:
    """Memory this process can still take: MemAvailable, bounded by a cgroup v2 limit; None where unknown."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            room = int(limit) - used
            available = room if available is None else min(available, room)
    except (OSError, ValueError):
        pass
    return available


def check_random_weights_memory(config: dict, params: int | None = None, available: int | None = None) -> None:
    """Refuse, with the numbers, to build a random-weight model that would not fit in memory (transformers builds
    it in fp32: 4 bytes per parameter) instead of being killed by the OOM killer half-way."""
    if not params:  # the larger of the two counts: the rough one was 4x low for Falcon (and the model was built)
        counted = kvmath.count_params(config)
        params = max((n for n in (counted.total if counted is not None else None,
                                   kvmath.estimate_total_params(config)) if n), default=None)
    if available is None:
        available = available_memory_bytes()
    if params is None or available is None:
        return
    need = params * 4
    if need > available:
        raise UsageError(f"--random-weights builds the model in fp32: about {kvmath.human_bytes(need)} for "
                         f"{params / 1e9:.2f}B parameters, but {kvmath.human_bytes(available)} of memory is "
                         "available: use a smaller config (fewer layers) or a machine with more memory")


def _load_model(spec: str, config: dict, random_weights: bool):
    import torch  # noqa: F401 - transformers needs it here
    import transformers

    transformers.utils.logging.set_verbosity_error()
    if random_weights:
        cfg = dict(config)
        model_type = cfg.pop("model_type", None)
        if not model_type:
            raise UsageError("--random-weights needs a config with model_type")
        check_random_weights_memory(config)
        try:
            hf_config = transformers.AutoConfig.for_model(model_type, **cfg)
            return transformers.AutoModelForCausalLM.from_config(hf_config), "random (from config)"
        except Exception as exc:
            raise UsageError(f"cannot build a {model_type} model from this config: {str(exc).splitlines()[0]}") from None
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise UsageError("--run loads weights from a local model directory; for a config alone (or a catalog "
                         "name) add --random-weights")
    if not any(next(path.glob(pattern), None) for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth")):
        raise UsageError(f"{spec} has a config but no weights (*.safetensors, *.bin): add --random-weights to "
                         "build random weights from its config")
    try:
        return (transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True),
                "pretrained")
    except Exception as exc:
        raise InputError(f"cannot load the model: {str(exc).strip().splitlines()[0]}", source=str(path)) from None


def transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def cache_note(config: dict) -> str | None:
    """A note where the installed transformers' cache holds more than the config arithmetic (what vLLM and SGLang
    cache): Falcon's new_decoder_architecture before transformers 5.25."""
    return kvmath.transformers_cache_note(config, transformers_version())


def run_live(spec: str, config: dict, prompt_ids: Sequence[int], *, max_new_tokens: int = 20,
             random_weights: bool = False, seed: int = 0, threads: int | None = None) -> LiveRun:
    """Prefill ``prompt_ids`` into a DynamicCache, decode greedily, and measure the cache."""
    if max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    if not prompt_ids:
        raise UsageError("the prompt has no tokens")
    model, weights = _prepare(spec, config, random_weights, seed, threads)
    return inspect_model(model, prompt_ids, max_new_tokens=max_new_tokens, weights=weights)


def _learned_positions(model: Any) -> int | None:
    """How many positions a model with learned absolute position embeddings holds (GPT-2's ``wpe``, OPT's
    ``embed_positions`` past its offset): a token past them was an IndexError inside the model. None for models
    without them (rotary and ALiBi positions go on)."""
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in ("wpe", "position_embeddings",
                                                                                  "embed_positions"):
            return int(module.num_embeddings) - int(getattr(module, "offset", 0) or 0)
    return None


def inspect_model(model: Any, prompt_ids: Sequence[int], *, max_new_tokens: int = 20,
                  weights: str = "pretrained") -> LiveRun:
    """The measurement itself, on a loaded model (the benchmark calls this against ``generate``)."""
    import torch
    from transformers import DynamicCache

    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and max(prompt_ids) >= vocab:
        raise UsageError(f"token ID {max(prompt_ids)} is outside the model's vocabulary of {vocab}: the tokenizer "
                         "does not belong to this model")
    positions = len(prompt_ids) + max_new_tokens - 1  # (the last token decoded is not fed back)
    learned = _learned_positions(model)
    if learned is not None and positions > learned:
        raise UsageError(f"the prompt ({len(prompt_ids):,} tokens) and --max-new-tokens {max_new_tokens:,} need "
                         f"{positions:,} positions, and the model's learned position embeddings hold {learned:,}: "
                         "a shorter prompt or fewer new tokens")
    ids = torch.tensor([list(prompt_ids)])
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = _forward(model, ids, cache)
        prefill = time.perf_counter() - t0
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        generated = 1
        t1 = time.perf_counter()
        while generated < max_new_tokens:
            out = _forward(model, nxt, cache)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            generated += 1
        decode = time.perf_counter() - t1
    seq_length = int(cache.get_seq_length())
    expected = len(prompt_ids) + generated - 1
    layers = []
    measured = 0
    for i, layer in enumerate(cache.layers):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if k is None or v is None or not hasattr(k, "shape") or k.numel() == 0:
            continue
        nbytes = k.numel() * k.element_size() + v.numel() * v.element_size()
        # sparse attention (DSA) keeps the indexer's keys beside the latent (transformers cache_utils.py
        # DynamicIndexedLayer, 5.24 lines 316-349): part of what the cache holds
        ik = getattr(layer, "indexer_keys", None)
        ik_shape = None
        if isinstance(ik, torch.Tensor) and ik.numel() > 0:
            nbytes += ik.numel() * ik.element_size()
            ik_shape = tuple(ik.shape)
        layers.append(LiveLayer(i, tuple(k.shape), tuple(v.shape), _TORCH_DTYPES.get(str(k.dtype), str(k.dtype)),
                                int(nbytes), ik_shape))
        measured += nbytes
    # The prediction comes from the config and the model's dtype at the length the decode loop implies,
    # never from the cache being checked: an empty or mis-fed cache cannot agree with it.
    dtype = _TORCH_DTYPES.get(str(getattr(model, "dtype", "torch.float32")), "fp32")
    # what the installed transformers caches, which is not always what the model needs (Falcon before 5.25)
    groups = kvmath.transformers_cache_groups(model.config.to_dict(), transformers_version(), dtype, "model config")
    # transformers keeps window - 1 tokens in a sliding layer
    predicted = sum(g.bytes_per_token * (min(expected, g.window - 1) if g.window else expected) for g in groups)
    agree = seq_length == expected and abs(measured - predicted) < 1
    return LiveRun(prompt_tokens=len(prompt_ids), generated_tokens=generated, seq_length=seq_length,
                   expected_seq_length=expected, measured_bytes=int(measured), predicted_bytes=predicted, agree=agree,
                   dtype=dtype, layers=tuple(layers), prefill_tokens_per_s=len(prompt_ids) / prefill if prefill else 0.0,
                   decode_ms_per_token=decode / (generated - 1) * 1000.0 if generated > 1 else None, weights=weights)


# --------------------------------------------------------------------------------------- multi-turn


@dataclass(frozen=True)
class TurnReport:
    turn: int                    # index of the message the request ends with
    input_tokens: int
    cached_tokens: int           # tokens in the kept cache before this turn
    common_prefix: int           # of the cached tokens and the new prompt
    mismatch_index: int | None   # where the cached tokens stop being a prefix of the new prompt
    prefilled_kept: int          # tokens prefilled with the cache kept (after any crop)
    prefilled_rebuilt: int       # tokens prefilled from scratch
    ms_kept: float
    ms_rebuilt: float
    same_next_token: bool        # greedy next token of kept == rebuilt
    max_logit_diff: float
    #: on a mismatch: how far the logits of a loop that trusts the stale cache (no crop) are from the truth
    stale_max_logit_diff: float | None = None


@dataclass(frozen=True)
class TurnsRun:
    turns: tuple[TurnReport, ...]
    prefilled_kept: int
    prefilled_rebuilt: int
    ms_saved: float
    mismatches: int
    all_match: bool


def _timed_forward(model, cache, ids):
    import torch

    t0 = time.perf_counter()
    with torch.no_grad():
        out = _forward(model, torch.tensor([list(ids)]), cache)
    return out.logits[0, -1], (time.perf_counter() - t0) * 1000.0


def _prepare(spec: str, config: dict, random_weights: bool, seed: int, threads: int | None):
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model, weights = _load_model(spec, config, random_weights)
    model.eval()
    return model, weights


def run_turns(spec: str, config: dict, tokenizer: Any, conversation: Any, *, random_weights: bool = False,
              seed: int = 0, threads: int | None = None) -> TurnsRun:
    """Keep one DynamicCache across the requests of a conversation, as a chat loop that reuses it would.

    Each request ends with a user (or tool) message and is rendered with the generation prompt. The
    assistant reply that follows is fed into the cache as the model would have generated it (its tokens
    and then the end-of-turn token, the last one not fed back). Before each request the cached tokens are
    checked against the new prompt: where they stop being a token prefix (a template that rewrites history,
    a reply that re-tokenizes differently) the cache is cropped to the common prefix, the correct fix.
    The kept-cache result is compared with a prefill from scratch.
    """
    import torch
    from transformers import DynamicCache

    from ..tokendiff import common_prefix_length

    if not conversation.is_chat:
        raise UsageError("--turns needs a conversation (a chat message list or a request body)")
    model, _ = _prepare(spec, config, random_weights, seed, threads)
    msgs = conversation.messages
    points = [k for k, m in enumerate(msgs) if m.get("role") in ("user", "tool")
              and (k + 1 == len(msgs) or msgs[k + 1].get("role") == "assistant")]
    if not points:
        raise UsageError(f"{conversation.source}: no user turn to answer")
    eos = tokenizer.hf.eos_token_id
    cache = DynamicCache(config=model.config)
    cached: list[int] = []
    reports = []
    from dataclasses import replace as _replace

    for k in points:
        prompt = _replace(conversation, messages=msgs[:k + 1], field_paths=conversation.field_paths[:k + 1])
        ids = list(tokenizer.tokenize(prompt, add_generation_prompt=True).ids)
        common = common_prefix_length(cached, ids)
        mismatch = common if common < len(cached) else None
        keep = min(common, len(ids) - 1)  # the last prompt token is always computed, for its logits
        stale = None
        if mismatch is not None and len(ids) > len(cached):
            # what transformers would silently do: feed only the new tail on top of the stale cache
            import copy

            logits_stale, _ = _timed_forward(model, copy.deepcopy(cache), ids[len(cached):])
            stale = logits_stale
        if keep < len(cached):
            cache.crop(-(len(cached) - keep))
        logits_kept, ms_kept = _timed_forward(model, cache, ids[keep:])
        logits_full, ms_full = _timed_forward(model, DynamicCache(config=model.config), ids)
        diff = float((logits_kept - logits_full).abs().max())
        reports.append(TurnReport(turn=k, input_tokens=len(ids), cached_tokens=len(cached), common_prefix=common,
                                  mismatch_index=mismatch, prefilled_kept=len(ids) - keep, prefilled_rebuilt=len(ids),
                                  ms_kept=ms_kept, ms_rebuilt=ms_full,
                                  same_next_token=bool(torch.argmax(logits_kept) == torch.argmax(logits_full)),
                                  max_logit_diff=diff,
                                  stale_max_logit_diff=None if stale is None else
                                  float((stale - logits_full).abs().max())))
        cached = ids
        reply = msgs[k + 1] if k + 1 < len(msgs) and msgs[k + 1].get("role") == "assistant" else None
        if reply is not None:
            generated = tokenizer.backend.encode(reply.get("content") or "", add_special_tokens=False).ids
            generated = list(generated) + ([eos] if eos is not None else [])
            if len(generated) > 1:  # the last generated token is not fed back
                _timed_forward(model, cache, generated[:-1])
                cached = cached + generated[:-1]
    kept = sum(r.prefilled_kept for r in reports)
    rebuilt = sum(r.prefilled_rebuilt for r in reports)
    return TurnsRun(turns=tuple(reports), prefilled_kept=kept, prefilled_rebuilt=rebuilt,
                    ms_saved=sum(r.ms_rebuilt - r.ms_kept for r in reports),
                    mismatches=sum(r.mismatch_index is not None for r in reports),
                    all_match=all(r.same_next_token for r in reports))


# ------------------------------------------------------------------------------------ shared prefix


@dataclass(frozen=True)
class QuestionReport:
    index: int
    input_tokens: int
    reused_tokens: int
    boundary_merge: bool         # prefix + question tokenizes differently at the seam: the cache was cropped
    same_output: bool            # greedy tokens from the copied cache == from a fresh prefill
    ms_shared: float
    ms_fresh: float


@dataclass(frozen=True)
class SharedPrefixRun:
    cache: str
    prefix_tokens: int
    prefix_ms: float
    questions: tuple[QuestionReport, ...]
    ms_saved: float
    all_equal: bool


def _greedy(model, cache, ids: list[int], n: int) -> tuple[list[int], float]:
    import torch

    t0 = time.perf_counter()
    out_ids = []
    with torch.no_grad():
        out = _forward(model, torch.tensor([ids]), cache)
        nxt = int(out.logits[0, -1].argmax())
        out_ids.append(nxt)
        for _ in range(n - 1):
            out = _forward(model, torch.tensor([[nxt]]), cache)
            nxt = int(out.logits[0, -1].argmax())
            out_ids.append(nxt)
    return out_ids, (time.perf_counter() - t0) * 1000.0


def run_shared_prefix(spec: str, config: dict, tokenizer: Any, prefix: str, questions: Sequence[str], *,
                      cache_kind: str = "dynamic", max_new_tokens: int = 8, random_weights: bool = False,
                      seed: int = 0, threads: int | None = None) -> SharedPrefixRun:
    """Prefill a shared prefix once, copy the cache per question, and check outputs equal fresh prefills."""
    import copy

    from transformers import DynamicCache, StaticCache

    from ...inputs import PromptInput
    from ..tokendiff import common_prefix_length

    if cache_kind not in ("dynamic", "static"):
        raise UsageError("--cache must be dynamic or static")
    if not questions:
        raise UsageError("--questions is empty")
    model, _ = _prepare(spec, config, random_weights, seed, threads)

    def ids_of(text: str) -> list[int]:
        return list(tokenizer.tokenize(PromptInput(kind="text", source="--shared-prefix", text=text,
                                                   field_paths=("text",))).ids)

    prefix_ids = ids_of(prefix)
    full_ids = [ids_of(prefix + q) for q in questions]
    longest = max(len(x) for x in full_ids) + max_new_tokens + 1

    def new_cache():
        if cache_kind == "static":
            return StaticCache(config=model.config, max_cache_len=longest)
        return DynamicCache(config=model.config)

    base = new_cache()
    _, prefix_ms = _timed_forward(model, base, prefix_ids[:-1] or prefix_ids)
    base_len = len(prefix_ids[:-1] or prefix_ids)
    reports = []
    for i, ids in enumerate(full_ids):
        reuse = min(common_prefix_length(prefix_ids, ids), base_len, len(ids) - 1)
        cache = copy.deepcopy(base)
        if reuse < base_len:  # the seam tokenizes differently: keep only what still matches
            if cache_kind == "static":
                cache = new_cache()
                _timed_forward(model, cache, ids[:reuse]) if reuse else None
            else:
                cache.crop(-(base_len - reuse))
        shared, ms_shared = _greedy(model, cache, ids[reuse:], max_new_tokens)
        fresh, ms_fresh = _greedy(model, new_cache(), ids, max_new_tokens)
        reports.append(QuestionReport(index=i, input_tokens=len(ids), reused_tokens=reuse,
                                      boundary_merge=common_prefix_length(prefix_ids, ids) < len(prefix_ids),
                                      same_output=shared == fresh, ms_shared=ms_shared, ms_fresh=ms_fresh))
    return SharedPrefixRun(cache=cache_kind, prefix_tokens=len(prefix_ids), prefix_ms=prefix_ms,
                           questions=tuple(reports), ms_saved=sum(r.ms_fresh - r.ms_shared for r in reports) - prefix_ms,
                           all_equal=all(r.same_output for r in reports))


# ---------------------------------------------------------------------------------------- quantized


@dataclass(frozen=True)
class QuantizedRun:
    backend: str
    nbits: int
    residual_length: int
    seq_length: int
    full_bytes: int
    quantized_bytes: int
    ratio: float
    generated_tokens: int
    first_divergence: int | None     # first generated token where greedy output differs; None: identical


def tensor_bytes(t: Any) -> int:
    """Bytes held by a tensor, including the packed data and scales inside quantized tensor subclasses."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None and type(t).__name__ != "Tensor":
        names, _ = flatten()
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return int(t.numel() * t.element_size())


def cache_bytes(cache: Any) -> int:
    import torch

    total = 0
    for layer in cache.layers:
        for name in ("keys", "values", "_quantized_keys", "_quantized_values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                total += tensor_bytes(t)
    return total


def run_quantized(spec: str, config: dict, prompt_ids: Sequence[int], *, backend: str = "quanto", nbits: int = 4,
                  max_new_tokens: int = 20, random_weights: bool = False, seed: int = 0,
                  threads: int | None = None) -> QuantizedRun:
    """Greedy decode with a full-precision and a quantized cache: memory and the first divergence."""
    if backend not in ("quanto", "hqq"):
        raise UsageError("--quantized must be quanto or hqq")
    package = {"quanto": "optimum-quanto", "hqq": "hqq"}[backend]
    try:
        __import__({"quanto": "optimum.quanto", "hqq": "hqq"}[backend])
    except ImportError:
        raise UsageError(f"--quantized {backend} needs the {package} package: pip install "
                         f"'llm-cachectl[{backend}]'") from None
    from transformers import DynamicCache, QuantizedCache

    model, _ = _prepare(spec, config, random_weights, seed, threads)
    import math

    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    # transformers' default group of 64 values must divide what is quantized: with a head_dim below 64 (small
    # models) a group of 64 fails whenever the token count is odd, so the group follows the head dim there
    group = math.gcd(64, int(head_dim))
    try:
        quant = QuantizedCache(backend=backend, config=model.config, nbits=nbits, q_group_size=group)
    except (ValueError, ImportError) as exc:
        raise UsageError(f"cannot build a {backend} cache with {nbits} bits: {str(exc).splitlines()[0]}") from None
    full = DynamicCache(config=model.config)
    ref, _ = _greedy(model, full, list(prompt_ids), max_new_tokens)
    got, _ = _greedy(model, quant, list(prompt_ids), max_new_tokens)
    diverge = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    full_b, quant_b = cache_bytes(full), cache_bytes(quant)
    return QuantizedRun(backend=backend, nbits=nbits, residual_length=int(getattr(quant.layers[0], "residual_length",
                                                                                   0) or 0),
                        seq_length=int(full.get_seq_length()), full_bytes=full_b, quantized_bytes=quant_b,
                        ratio=quant_b / full_b if full_b else 0.0, generated_tokens=len(ref), first_divergence=diverge)
