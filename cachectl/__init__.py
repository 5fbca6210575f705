"""cachectl: diagnostics for the caches around LLMs.

The library API mirrors the CLI: read prompts with :mod:`cachectl.inputs`, load a tokenizer with
:func:`load_tokenizer`, and call an engine (token diffs, prefix-cache replay, prompt-cache cost, KV-cache
arithmetic and live runs, semantic-cache probes, lint); each returns a frozen dataclass, exported here too.
Names are imported on first use so that ``import cachectl`` stays cheap.

    >>> from cachectl import load_tokenizer, read_prompt, diff_tokens
    >>> tok = load_tokenizer("fixtures/tok")
    >>> a, b = (tok.tokenize(read_prompt(p)) for p in ("a.json", "b.json"))
    >>> diff_tokens(a, b, tokenizer=tok).first_diff_index
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "CachectlError": "cachectl.errors",
    "InputError": "cachectl.errors",
    "TokenizerError": "cachectl.errors",
    "UsageError": "cachectl.errors",
    "PromptInput": "cachectl.inputs",
    "read_prompt": "cachectl.inputs",
    "iter_log": "cachectl.inputs",
    "prompt_from_value": "cachectl.inputs",
    "prompt_from_request": "cachectl.inputs",
    "parse_request": "cachectl.inputs",
    "read_requests": "cachectl.inputs",
    "read_request_document": "cachectl.inputs",
    "Request": "cachectl.inputs",
    "Position": "cachectl.inputs",
    "find_volatile": "cachectl.volatile",
    "classify_change": "cachectl.volatile",
    "load_tokenizer": "cachectl.tokenization",
    "TokenizerHandle": "cachectl.tokenization",
    "Tokenized": "cachectl.tokenization",
    "common_prefix_length": "cachectl.engines.tokendiff",
    "diff_tokens": "cachectl.engines.tokendiff",
    "diff_log": "cachectl.engines.tokendiff",
    "check_stability": "cachectl.engines.tokendiff",
    "TokenDiff": "cachectl.engines.tokendiff",
    "PairResult": "cachectl.engines.tokendiff",
    "LogSummary": "cachectl.engines.tokendiff",
    "StabilityReport": "cachectl.engines.tokendiff",
    "StabilityStep": "cachectl.engines.tokendiff",
    "Cause": "cachectl.engines.tokendiff",
    "simulate": "cachectl.engines.prefix.replay",
    "iter_trace": "cachectl.engines.prefix.trace",
    "trace_records": "cachectl.engines.prefix.trace",
    "TraceRequest": "cachectl.engines.prefix.trace",
    "PrefixReport": "cachectl.engines.prefix.replay",
    "TenantStats": "cachectl.engines.prefix.replay",
    "RequestHit": "cachectl.engines.prefix.replay",
    "analyze_forks": "cachectl.engines.prefix.forks",
    "fork_requests": "cachectl.engines.prefix.forks",
    "ForkReport": "cachectl.engines.prefix.forks",
    "ForkRequest": "cachectl.engines.prefix.forks",
    "Fork": "cachectl.engines.prefix.forks",
    "what_if": "cachectl.engines.provider.cache",
    "audit_usage": "cachectl.engines.provider.cache",
    "simulate_requests": "cachectl.engines.provider.cache",
    "MissReason": "cachectl.engines.provider.cache",
    "Reconciliation": "cachectl.engines.provider.cache",
    "CostReport": "cachectl.engines.provider.cache",
    "RequestCost": "cachectl.engines.provider.cache",
    "fix_log": "cachectl.engines.repair.fix",
    "log_lines": "cachectl.engines.repair.fix",
    "group_sessions": "cachectl.engines.repair.fix",
    "FixOptions": "cachectl.engines.repair.fix",
    "FixReport": "cachectl.engines.repair.fix",
    "PriceTable": "cachectl.engines.provider.prices",
    "ModelPrice": "cachectl.engines.provider.prices",
    "inspect_config": "cachectl.engines.kv.config",
    "resolve_model": "cachectl.engines.kv.config",
    "read_gguf_config": "cachectl.engines.kv.config",
    "kv_shape": "cachectl.engines.kv.config",
    "layer_groups": "cachectl.engines.kv.config",
    "KvReport": "cachectl.engines.kv.config",
    "KvShape": "cachectl.engines.kv.config",
    "LayerGroup": "cachectl.engines.kv.config",
    "ContextRow": "cachectl.engines.kv.config",
    "run_live": "cachectl.engines.kv.live",
    "inspect_model": "cachectl.engines.kv.live",
    "run_turns": "cachectl.engines.kv.live",
    "run_shared_prefix": "cachectl.engines.kv.live",
    "run_quantized": "cachectl.engines.kv.live",
    "LiveRun": "cachectl.engines.kv.live",
    "TurnsRun": "cachectl.engines.kv.live",
    "SharedPrefixRun": "cachectl.engines.kv.live",
    "QuantizedRun": "cachectl.engines.kv.live",
    "load_model": "cachectl.engines.semantic",
    "Embedder": "cachectl.engines.semantic",
    "read_pairs": "cachectl.engines.semantic",
    "score_pairs": "cachectl.engines.semantic",
    "sweep_scores": "cachectl.engines.semantic",
    "run_probe": "cachectl.engines.semantic",
    "replay": "cachectl.engines.semantic",
    "exact_dupes": "cachectl.engines.semantic",
    "PairsReport": "cachectl.engines.semantic",
    "SweepReport": "cachectl.engines.semantic",
    "ProbeReport": "cachectl.engines.semantic",
    "ReplayReport": "cachectl.engines.semantic",
    "DupesReport": "cachectl.engines.semantic",
    "lint_paths": "cachectl.engines.lint.run",
    "lint_template": "cachectl.engines.lint.templates",
    "lint_body": "cachectl.engines.lint.body",
    "LintReport": "cachectl.engines.lint.rules",
    "Finding": "cachectl.engines.lint.rules",
    "Rule": "cachectl.engines.lint.rules",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cachectl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
