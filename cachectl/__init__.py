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
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:  # the same names, typed, for type checkers (tests/test_packaging.py checks the two agree)
    from .engines.kv.config import (
        ContextRow,
        KvReport,
        KvShape,
        LayerGroup,
        inspect_config,
        kv_shape,
        layer_groups,
        read_gguf_config,
        resolve_model,
    )
    from .engines.kv.live import (
        LiveRun,
        QuantizedRun,
        SharedPrefixRun,
        TurnsRun,
        inspect_model,
        run_live,
        run_quantized,
        run_shared_prefix,
        run_turns,
    )
    from .engines.lint.body import lint_body
    from .engines.lint.fix import FixResult, fix_paths
    from .engines.lint.output import to_github, to_sarif
    from .engines.lint.rules import Finding, LintReport, Rule
    from .engines.lint.run import lint_paths
    from .engines.lint.templates import lint_template
    from .engines.prefix.curve import CurvePoint, CurveReport, capacity_curve
    from .engines.prefix.fleet import FleetReport, simulate_fleet, simulate_partitions
    from .engines.prefix.forks import Fork, ForkReport, ForkRequest, analyze_forks, fork_requests
    from .engines.prefix.replay import PrefixReport, RequestHit, TenantStats, simulate
    from .engines.prefix.served import ServedReport, compare_served
    from .engines.prefix.trace import TraceRequest, iter_trace, trace_records
    from .engines.prefix.value import HitsWorth, ServingTime, hits_worth
    from .engines.provider.cache import (
        CostReport,
        MissReason,
        Reconciliation,
        RequestCost,
        audit_usage,
        simulate_requests,
        what_if,
    )
    from .engines.provider.prices import ModelPrice, PriceTable
    from .engines.repair.fix import FixOptions, FixReport, fix_log
    from .engines.repair.groups import group_sessions, log_lines
    from .engines.repair.report import LogReport, build_report
    from .engines.semantic import (
        AdaptivePolicy,
        DupesReport,
        Embedder,
        PairsReport,
        PolicyRow,
        ProbeReport,
        ReplayReport,
        SweepReport,
        exact_dupes,
        load_model,
        read_pairs,
        run_probe,
        score_pairs,
        sweep_policies,
        sweep_scores,
    )
    from .engines.semantic.replay import replay  # (the function, not its module of the same name)
    from .engines.tokendiff import (
        Cause,
        LogSummary,
        PairResult,
        StabilityReport,
        StabilityStep,
        TokenDiff,
        check_stability,
        common_prefix_length,
        diff_log,
        diff_tokens,
    )
    from .errors import CachectlError, InputError, TokenizerError, UsageError
    from .inputs import (
        Position,
        PromptInput,
        Request,
        iter_log,
        parse_request,
        prompt_from_request,
        prompt_from_value,
        read_prompt,
        read_request_document,
        read_requests,
    )
    from .tokenization import Tokenized, TokenizerHandle, load_tokenizer
    from .volatile import classify_change, find_volatile

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
    "log_lines": "cachectl.engines.repair.groups",
    "group_sessions": "cachectl.engines.repair.groups",
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
    "replay": "cachectl.engines.semantic.replay",
    "exact_dupes": "cachectl.engines.semantic",
    "PairsReport": "cachectl.engines.semantic",
    "SweepReport": "cachectl.engines.semantic",
    "ProbeReport": "cachectl.engines.semantic",
    "ReplayReport": "cachectl.engines.semantic",
    "DupesReport": "cachectl.engines.semantic",
    "AdaptivePolicy": "cachectl.engines.semantic",
    "PolicyRow": "cachectl.engines.semantic",
    "sweep_policies": "cachectl.engines.semantic",
    "lint_paths": "cachectl.engines.lint.run",
    "lint_template": "cachectl.engines.lint.templates",
    "lint_body": "cachectl.engines.lint.body",
    "LintReport": "cachectl.engines.lint.rules",
    "Finding": "cachectl.engines.lint.rules",
    "Rule": "cachectl.engines.lint.rules",
    "capacity_curve": "cachectl.engines.prefix.curve",
    "CurveReport": "cachectl.engines.prefix.curve",
    "CurvePoint": "cachectl.engines.prefix.curve",
    "simulate_fleet": "cachectl.engines.prefix.fleet",
    "simulate_partitions": "cachectl.engines.prefix.fleet",
    "FleetReport": "cachectl.engines.prefix.fleet",
    "hits_worth": "cachectl.engines.prefix.value",
    "HitsWorth": "cachectl.engines.prefix.value",
    "ServingTime": "cachectl.engines.prefix.value",
    "compare_served": "cachectl.engines.prefix.served",
    "ServedReport": "cachectl.engines.prefix.served",
    "build_report": "cachectl.engines.repair.report",
    "LogReport": "cachectl.engines.repair.report",
    "fix_paths": "cachectl.engines.lint.fix",
    "FixResult": "cachectl.engines.lint.fix",
    "to_sarif": "cachectl.engines.lint.output",
    "to_github": "cachectl.engines.lint.output",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cachectl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
