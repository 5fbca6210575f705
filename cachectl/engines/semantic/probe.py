"""Adversarial variants of a prompt (negation, numbers, units, entities, comparisons) and paraphrases."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ...datafiles import load_data
from .embed import Embedder
from .pairs import SCHEMA_VERSION, _check_threshold


def probe_rules() -> dict:
    return load_data("probe_rules.json")


def _swap_word(text: str, a: str, b: str) -> str | None:
    """Swap the whole words a and b (either direction), keeping case of the first letter."""
    pat = re.compile(rf"\b({re.escape(a)}|{re.escape(b)})\b", re.I)
    if not pat.search(text):
        return None

    def repl(m: re.Match) -> str:
        w = m.group(0)
        other = b if w.lower() == a.lower() else a
        return other[:1].upper() + other[1:] if w[:1].isupper() else other

    return pat.sub(repl, text)


def variants(prompt: str, rules: dict | None = None) -> list[tuple[str, str, str]]:
    """``(kind, rule, text)``: must_not variants (the answer changes) and should variants (paraphrases)."""
    rules = rules or probe_rules()
    out: list[tuple[str, str, str]] = []
    seen = {prompt}

    def push(kind: str, rule: str, text: str | None) -> None:
        if text and text not in seen:
            seen.add(text)
            out.append((kind, rule, text))

    for pattern, repl in rules["negation"]:
        new = re.sub(pattern, repl, prompt, count=1, flags=re.I)
        if new != prompt:
            push("must_not", "negation", new)
            break
    m = re.search(r"\b(\d+(?:\.\d+)?)\b", prompt)
    if m:
        n = m.group(1)
        changed = f"{float(n) + 1:g}" if "." in n else str(int(n) * 2 if int(n) else 1)
        push("must_not", "number_changed", prompt[:m.start()] + changed + prompt[m.end():])
    for a, b in rules["units"]:
        push("must_not", "units_swapped", _swap_word(prompt, a, b))
    for a, b in rules["entities"]:
        push("must_not", "entity_swapped", _swap_word(prompt, a, b))
    for a, b in rules["comparisons"]:
        push("must_not", "comparison_reversed", _swap_word(prompt, a, b))
    for pattern, repl in rules["paraphrases"]:
        new = re.sub(pattern, repl, prompt, count=1, flags=re.I)
        if new != prompt:
            push("should", "paraphrase", new[:1].upper() + new[1:])
    return out


@dataclass(frozen=True)
class VariantScore:
    kind: str
    rule: str
    text: str
    cosine: float
    hit: bool
    flagged: bool      # a must-not variant that would be served the original's answer


@dataclass(frozen=True)
class ProbeResult:
    prompt: str
    variants: tuple[VariantScore, ...]


@dataclass(frozen=True, kw_only=True)
class ProbeReport:
    schema_version: int = SCHEMA_VERSION
    model: str
    threshold: float
    prompts: tuple[ProbeResult, ...]
    must_not: int
    wrong_hits: int
    should: int
    paraphrase_hits: int


def run_probe(prompts: Sequence[str], embedder: Embedder, threshold: float, model: str) -> ProbeReport:
    _check_threshold(threshold)
    rules = probe_rules()
    plan = [(p, variants(p, rules)) for p in prompts]
    embedder.add([p for p, _ in plan] + [v[2] for _, vs in plan for v in vs])
    results = []
    for p, vs in plan:
        scored = []
        for kind, rule, text in vs:
            c = embedder.cosine(p, text)
            hit = c >= threshold
            scored.append(VariantScore(kind=kind, rule=rule, text=text, cosine=round(c, 6), hit=hit,
                                       flagged=hit and kind == "must_not"))
        results.append(ProbeResult(prompt=p, variants=tuple(scored)))
    allv = [v for r in results for v in r.variants]
    return ProbeReport(model=model, threshold=threshold, prompts=tuple(results),
                       must_not=sum(v.kind == "must_not" for v in allv), wrong_hits=sum(v.flagged for v in allv),
                       should=sum(v.kind == "should" for v in allv),
                       paraphrase_hits=sum(v.kind == "should" and v.hit for v in allv))
