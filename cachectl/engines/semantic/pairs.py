"""Labeled prompt pairs: their cosines, and per threshold the recall and false-hit rate with exact bounds."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import InputError, UsageError
from .embed import Embedder

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Pair:
    line: int
    text_a: str
    text_b: str
    label: int | None = None


def read_pairs(path: str, columns: Sequence[str] | None = None, need_label: bool = False) -> list[Pair]:
    """TSV, CSV (with a header) or JSONL pairs; ``text_a``/``text_b``/``label`` unless ``columns`` maps them."""
    from ...inputs import decode_text, parse_jsonl_line, read_bytes

    data, source = read_bytes(path)
    text = decode_text(data, source)
    a_col, b_col, l_col = (list(columns) + ["label"])[:3] if columns else ("text_a", "text_b", "label")
    rows: list[tuple[int, dict]] = []
    if source.endswith(".jsonl") or text.lstrip().startswith("{"):
        for lineno, raw in enumerate(text.split("\n"), start=1):  # "\n" only: U+2028 may sit in a JSON string
            if not raw.strip():
                continue
            value = parse_jsonl_line(raw.encode("utf-8"), source, lineno)
            if not isinstance(value, dict):
                raise InputError("expected a JSON object", source=source, line=lineno)
            rows.append((lineno, value))
    else:
        delimiter = "\t" if (source.endswith(".tsv") or "\t" in text.split("\n", 1)[0]) else ","
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
        try:
            header = next(reader)
            wanted = [a_col, b_col] + ([l_col] if need_label else [])
            absent = [c for c in wanted if c not in header]
            if absent:
                raise InputError(f"the header has no column {absent[0]!r} (it has {', '.join(map(repr, header))}): "
                                 f"name yours with --columns A,B[,LABEL]", source=source, line=1)
            for cells in reader:
                lineno = reader.line_num  # the row's last physical line (quoted fields may span lines)
                if not cells or not any(cell.strip() for cell in cells):
                    continue
                if len(cells) != len(header):
                    raise InputError(f"{len(cells)} fields where the header has {len(header)}", source=source,
                                     line=lineno)
                rows.append((lineno, dict(zip(header, cells))))
        except StopIteration:
            raise InputError("file is empty", source=source) from None
        except csv.Error as exc:
            raise InputError(f"invalid {'TSV' if delimiter == chr(9) else 'CSV'}: {exc}", source=source,
                             line=reader.line_num) from None
    pairs = []
    for lineno, row in rows:
        for col in (a_col, b_col):
            if col not in row:
                raise InputError(f"no such field (the line has {', '.join(map(repr, row))}): name yours with "
                                 "--columns A,B[,LABEL]", source=source, line=lineno, field=col)
            cell = row.get(col)
            if not isinstance(cell, str) or not cell.strip():
                raise InputError("missing or empty text", source=source, line=lineno, field=col)
        label = row.get(l_col)
        if label is None or label == "":
            if need_label:
                raise InputError("missing label (0 or 1)", source=source, line=lineno, field=l_col)
            label_v = None
        else:
            if str(label).strip() not in ("0", "1"):
                raise InputError(f"label must be 0 or 1, got {label!r}", source=source, line=lineno, field=l_col)
            label_v = int(str(label).strip())
        pairs.append(Pair(lineno, row[a_col], row[b_col], label_v))
    if not pairs:
        raise InputError("no pairs", source=source)
    return pairs


@dataclass(frozen=True)
class PairScore:
    text_a: str
    text_b: str
    cosine: float
    hit: bool
    label: int | None = None
    line: int | None = None


@dataclass(frozen=True, kw_only=True)
class PairsReport:
    schema_version: int = SCHEMA_VERSION
    model: str
    threshold: float
    pairs: tuple[PairScore, ...]


def score_pairs(pairs: Sequence[Pair], embedder: Embedder, threshold: float, model: str) -> PairsReport:
    _check_threshold(threshold)
    embedder.add(t for p in pairs for t in (p.text_a, p.text_b))
    scores = []
    for p in pairs:
        c = embedder.cosine(p.text_a, p.text_b)
        scores.append(PairScore(text_a=p.text_a, text_b=p.text_b, cosine=round(c, 6), hit=c >= threshold,
                                label=p.label, line=p.line))
    return PairsReport(model=model, threshold=threshold, pairs=tuple(scores))


def _check_threshold(t: float) -> None:
    if not -1.0 <= t <= 1.0:
        raise UsageError(f"a cosine threshold must be between -1 and 1, got {t}")


def _beta_cf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p): I_{1-p}(n - k, k + 1)."""
    if k >= n:
        return 1.0
    return _betainc(n - k, k + 1, 1.0 - p)


def clopper_pearson_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """One-sided upper confidence bound on a binomial proportion (exact, by bisection on the CDF)."""
    if n == 0:
        return 1.0
    if k >= n:
        return 1.0
    alpha = 1.0 - confidence
    lo, hi = k / n, 1.0
    guess = min(1.0, k / n + 8 * math.sqrt((k + 1) * (n - k + 1)) / n ** 1.5 + 8 / n)  # far past the bound
    if _binom_cdf(k, n, guess) <= alpha:
        hi = guess
    for _ in range(50):
        mid = (lo + hi) / 2
        if _binom_cdf(k, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def clopper_pearson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided exact interval on a binomial proportion (each tail ``(1 - confidence) / 2``)."""
    if n == 0:
        return 0.0, 1.0
    one_sided = 1.0 - (1.0 - confidence) / 2
    lower = 0.0 if k == 0 else 1.0 - clopper_pearson_upper(n - k, n, one_sided)
    return lower, clopper_pearson_upper(k, n, one_sided)


@dataclass(frozen=True)
class PolicyRow:
    """One policy over a stream of requests: a static threshold or the adaptive policy at an error bound."""

    policy: str                      # static | adaptive
    threshold: float | None          # static: the threshold (in the unit of the cache replayed)
    threshold_cosine: float | None   # static: the same as a cosine of unit vectors
    delta: float | None              # adaptive: the error bound
    requests: int
    hits: int
    hit_rate: float | None
    hit_rate_low: float | None
    hit_rate_high: float | None
    judged: int                      # requests whose right answer is known (a response, a label)
    wrong_hits: int
    wrong_hit_rate: float | None     # wrong hits per judged request (the error rate vCache bounds)
    wrong_hit_low: float | None
    wrong_hit_high: float | None


def policy_row(policy: str, threshold: float | None, delta: float | None, requests: int, hits: int, judged: int,
               wrong: int, confidence: float = 0.95, cosine: float | None = None) -> PolicyRow:
    h_lo, h_hi = clopper_pearson_interval(hits, requests, confidence) if requests else (None, None)
    w_lo, w_hi = clopper_pearson_interval(wrong, judged, confidence) if judged else (None, None)
    return PolicyRow(policy=policy, threshold=threshold, threshold_cosine=cosine, delta=delta, requests=requests,
                     hits=hits, hit_rate=hits / requests if requests else None, hit_rate_low=h_lo, hit_rate_high=h_hi,
                     judged=judged, wrong_hits=wrong, wrong_hit_rate=wrong / judged if judged else None,
                     wrong_hit_low=w_lo, wrong_hit_high=w_hi)


def sweep_policies(cosines: Sequence[float], labels: Sequence[int], thresholds: Sequence[float],
                   deltas: Sequence[float] = (), scope: str = "global", seed: int = 0, keys: Sequence[str] | None = None,
                   confidence: float = 0.95) -> tuple[PolicyRow, ...]:
    """Labeled pairs taken as a stream of requests (in an order shuffled by ``seed``): each pair is a request
    (``text_b``) whose nearest cached prompt is ``text_a`` at the pair's cosine, and serving it is right when the
    label is 1. A static threshold serves it when the cosine reaches the threshold; the adaptive policy decides
    online and, when it does not serve, learns the label (observations shared by all pairs with ``scope``
    "global", or per ``text_a`` given in ``keys`` with "prompt")."""
    import random

    from .adaptive import AdaptivePolicy

    if len(cosines) != len(labels):
        raise UsageError("cosines and labels differ in length")
    if scope == "prompt" and keys is None:
        raise UsageError("the prompt scope needs the cached prompt of each pair")
    n = len(labels)
    rows = []
    for t in sorted(set(thresholds)):
        _check_threshold(t)
        hits = sum(1 for c in cosines if c >= t)
        wrong = sum(1 for c, y in zip(cosines, labels) if c >= t and y == 0)
        rows.append(policy_row("static", t, None, n, hits, n, wrong, confidence, cosine=t))
    order = list(range(n))
    random.Random(seed).shuffle(order)
    for i, d in enumerate(deltas):
        if not 0 < d < 1:
            raise UsageError(f"delta must be between 0 and 1, got {d}")
        pol = AdaptivePolicy(d, seed=seed + 1 + i)
        hits = wrong = 0
        for j in order:
            key = keys[j] if (scope == "prompt" and keys is not None) else ""
            if pol.decide(key, cosines[j]):
                hits += 1
                wrong += labels[j] == 0
            else:
                pol.observe(key, cosines[j], labels[j] == 1)
        rows.append(policy_row("adaptive", None, d, n, hits, n, wrong, confidence))
    return tuple(rows)


@dataclass(frozen=True)
class SweepRow:
    threshold: float
    recall: float | None
    false_hit_rate: float | None
    false_hit_upper: float | None
    precision: float | None
    hits: int
    wrong_hits: int


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    schema_version: int = SCHEMA_VERSION
    model: str
    pairs: int
    positives: int
    negatives: int
    target_false_hit: float
    confidence: float
    method: str
    sweep: tuple[SweepRow, ...]
    recommended: float | None
    statement: str
    #: static thresholds and (with --policy adaptive) the learned policy at each delta, side by side over the
    #: same pairs taken as a stream of requests: hit rate and wrong-hit rate (wrong hits per pair) with 95%
    #: Clopper-Pearson intervals
    policies: tuple[PolicyRow, ...] = ()
    policy: str = "static"
    scope: str | None = None
    seed: int | None = None


def sweep_scores(cosines: Sequence[float], labels: Sequence[int], thresholds: Sequence[float],
                 target_false_hit: float = 0.01, confidence: float = 0.95, model: str = "") -> SweepReport:
    """Per threshold: recall, false-hit rate (with an exact upper bound), precision; and a recommendation."""
    if len(cosines) != len(labels):
        raise UsageError("cosines and labels differ in length")
    if not 0 < target_false_hit < 1:
        raise UsageError("--target-false-hit must be between 0 and 1")
    pos = sum(1 for y in labels if y == 1)
    neg = len(labels) - pos
    pairs = sorted(zip(cosines, labels))
    rows = []
    for t in sorted(set(thresholds)):
        _check_threshold(t)
        tp = sum(1 for c, y in pairs if c >= t and y == 1)
        fp = sum(1 for c, y in pairs if c >= t and y == 0)
        rows.append(SweepRow(threshold=t, recall=tp / pos if pos else None, false_hit_rate=fp / neg if neg else None,
                             false_hit_upper=clopper_pearson_upper(fp, neg, confidence) if neg else None,
                             precision=tp / (tp + fp) if tp + fp else None, hits=tp + fp, wrong_hits=fp))
    ok = [r for r in rows if r.false_hit_upper is not None and r.false_hit_upper <= target_false_hit
          and (r.recall or 0) > 0]
    if ok:
        best = min(ok, key=lambda r: r.threshold)
        statement = (f"threshold {best.threshold:g}: recall {best.recall:.1%}, false hits {best.wrong_hits}/{neg} "
                     f"(upper bound {best.false_hit_upper:.2%} at {confidence:.0%} confidence, Clopper-Pearson)")
        rec = best.threshold
    else:
        rec = None
        if not neg:  # (no false-hit rate to bound: it said "do not serve these prompts")
            statement = ("no negative pairs (label 0): the false-hit rate cannot be measured: label pairs that must "
                         "not share an answer")
        elif not pos:
            statement = "no positive pairs (label 1): recall cannot be measured: label pairs that may share an answer"
        elif clopper_pearson_upper(0, neg, confidence) > target_false_hit:
            statement = (f"{neg} negative pairs cannot show a false-hit rate below {target_false_hit:.2%} at "
                         f"{confidence:.0%} confidence even with no false hit: label more pairs")
        else:
            statement = (f"no threshold keeps the false-hit rate's upper bound under {target_false_hit:.2%} with any "
                         "recall: do not serve these prompts from a semantic cache")
    return SweepReport(model=model, pairs=len(labels), positives=pos, negatives=neg, target_false_hit=target_false_hit,
                       confidence=confidence, method="Clopper-Pearson exact one-sided upper bound on the false-hit rate",
                       sweep=tuple(rows), recommended=rec, statement=statement)
