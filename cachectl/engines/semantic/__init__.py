"""How wrong a semantic cache would be: cosine similarities, adversarial probes, threshold sweeps, replays (under
a static threshold or a learned per-prompt policy with an error bound, and as GPTCache or redisvl would run
them), and the exact-match duplicate rate that needs no embeddings at all.

Parts: ``embed`` (the model, offline, and the encoder), ``pairs`` (labeled pairs, sweeps and bounds), ``probe``
(adversarial variants), ``adaptive`` (the vCache-style policy), ``like`` (the conventions of the libraries users
run), ``replay`` (a log through a simulated cache), ``dupes`` (exact duplicates).
"""

from __future__ import annotations

from .adaptive import AdaptivePolicy
from .dupes import DupesReport, exact_dupes
from .embed import DEFAULT_MODEL, Embedder, load_model
from .like import LIKES, Like, like
from .pairs import (
    SCHEMA_VERSION,
    Pair,
    PairScore,
    PairsReport,
    PolicyRow,
    SweepReport,
    SweepRow,
    clopper_pearson_interval,
    clopper_pearson_upper,
    read_pairs,
    score_pairs,
    sweep_policies,
    sweep_scores,
)
from .probe import ProbeReport, ProbeResult, VariantScore, probe_rules, run_probe, variants
from .replay import ANN_THRESHOLD, LogRecord, NoText, ReplayReport, VectorStore, iter_log_prompts, replay

__all__ = [
    "ANN_THRESHOLD", "DEFAULT_MODEL", "LIKES", "SCHEMA_VERSION", "AdaptivePolicy", "DupesReport", "Embedder", "Like",
    "LogRecord", "NoText", "Pair", "PairScore", "PairsReport", "PolicyRow", "ProbeReport", "ProbeResult", "ReplayReport",
    "SweepReport", "SweepRow", "VariantScore", "VectorStore", "clopper_pearson_interval", "clopper_pearson_upper",
    "exact_dupes", "iter_log_prompts", "like", "load_model", "probe_rules", "read_pairs", "replay", "run_probe",
    "score_pairs", "sweep_policies", "sweep_scores", "variants",
]
