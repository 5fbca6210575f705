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
    "simulate": "cachectl.engines.prefix",
    "iter_trace": "cachectl.engines.prefix",
    "trace_records": "cachectl.engines.prefix",
    "TraceRequest": "cachectl.engines.prefix",
    "PrefixReport": "cachectl.engines.prefix",
    "TenantStats": "cachectl.engines.prefix",
    "RequestHit": "cachectl.engines.prefix",
    "what_if": "cachectl.engines.promptcache",
    "audit_usage": "cachectl.engines.promptcache",
    "simulate_requests": "cachectl.engines.promptcache",
    "MissReason": "cachectl.engines.promptcache",
    "Reconciliation": "cachectl.engines.promptcache",
    "CostReport": "cachectl.engines.promptcache",
    "RequestCost": "cachectl.engines.promptcache",
    "fix_log": "cachectl.engines.fix",
    "log_lines": "cachectl.engines.fix",
    "group_sessions": "cachectl.engines.fix",
    "FixOptions": "cachectl.engines.fix",
    "FixReport": "cachectl.engines.fix",
    "PriceTable": "cachectl.engines.pricing",
    "ModelPrice": "cachectl.engines.pricing",
    "inspect_config": "cachectl.engines.kvmath",
    "resolve_model": "cachectl.engines.kvmath",
    "read_gguf_config": "cachectl.engines.kvmath",
    "kv_shape": "cachectl.engines.kvmath",
    "layer_groups": "cachectl.engines.kvmath",
    "KvReport": "cachectl.engines.kvmath",
    "KvShape": "cachectl.engines.kvmath",
    "LayerGroup": "cachectl.engines.kvmath",
    "ContextRow": "cachectl.engines.kvmath",
    "run_live": "cachectl.engines.kvlive",
    "inspect_model": "cachectl.engines.kvlive",
    "run_turns": "cachectl.engines.kvlive",
    "run_shared_prefix": "cachectl.engines.kvlive",
    "run_quantized": "cachectl.engines.kvlive",
    "LiveRun": "cachectl.engines.kvlive",
    "TurnsRun": "cachectl.engines.kvlive",
    "SharedPrefixRun": "cachectl.engines.kvlive",
    "QuantizedRun": "cachectl.engines.kvlive",
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
    "lint_paths": "cachectl.engines.lint",
    "lint_template": "cachectl.engines.lint",
    "lint_body": "cachectl.engines.lint",
    "LintReport": "cachectl.engines.lint",
    "Finding": "cachectl.engines.lint",
    "Rule": "cachectl.engines.lint",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cachectl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
