"""Predicted against served: does the simulator agree with the server that logged the traffic?

vLLM (``usage.prompt_tokens_details.cached_tokens``) and SGLang (``meta_info.cached_tokens``) report per
request the prompt tokens they served from their prefix cache (read by :mod:`cachectl.inputs.usage` into
:class:`~.trace.TraceRequest`). :func:`compare_served` puts them beside the replay's hits and names, for each
request where they differ, the likely reason, from evidence in the log itself:

- the row alone contradicts the assumed set-up (certain): the server counted another prompt length than
  the trace holds (another chat template or tokenizer), or a served count is not a multiple of the block
  size (another block size, or a token-level cache);
- a replay of the same log under another set-up reproduces the served count: a smaller (or larger)
  capacity, another block size, requests in flight at once (timestamps and output tokens), the request's
  ``model`` (a LoRA adapter keys every block) as a salt;
- the pool would be overcommitted when the request arrived, counting the output tokens of the requests in
  flight (vLLM then preempts one and recomputes it, evicting cached blocks): preemption, possible;
- nothing was served although the prompt's first blocks were cached (the replay hits them): the server's
  prompt differs from this one at its start (a chat template that puts a date or an id at the top, a BOS
  added twice), likely.

How sure each reason is: ``certain`` (the row contradicts the assumption), ``likely`` (a replay under the
reason reproduces the row, and agrees on most of the log; or the zero-hit pattern), ``possible`` (a replay
reproduces the row but disagrees elsewhere; or only circumstantial evidence).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .pools import CapacityError
from .replay import PrefixReport, simulate
from .trace import TraceRequest

#: block sizes vLLM and SGLang run with (vLLM's --block-size choices, SGLang's page sizes)
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
#: vLLM's default --max-num-seqs: requests in flight at once when the log's timestamps let them overlap
SERVER_CONCURRENCY = 256
#: capacities tried on a log of up to SEARCH_TOKENS prompt tokens (a third of them above), before refining
SEARCH_POINTS, SEARCH_TOKENS = 48, 2_000_000
#: share of the log a replay must agree on for the reasons it reproduces to be called likely
LIKELY_SHARE = 0.9

REASONS = {
    "capacity": "capacity smaller than assumed",
    "capacity_larger": "capacity larger than assumed",
    "block_size": "another block size",
    "concurrency": "requests in flight at once",
    "preemption": "preemption",
    "template": "another chat template or tokenizer",
    "salt_or_lora": "salt or LoRA keys",
    "unexplained": "unexplained",
}


@dataclass(frozen=True)
class ServedRow:
    """One request: the replay's hit tokens beside what the server served, and why they differ."""

    index: int
    line: int | None
    prompt_tokens: int
    predicted_hit_tokens: float
    served_cached_tokens: int
    served_prompt_tokens: int | None
    agrees: bool
    reason: str | None = None          # a key of REASONS; None when they agree
    confidence: str | None = None      # certain | likely | possible
    evidence: str | None = None


@dataclass(frozen=True)
class Hypothesis:
    """A replay of the same log under another set-up, and how many served counts it reproduces."""

    reason: str
    setting: str                       # what was changed, in words ("capacity 120 blocks")
    params: dict                       # the replay's parameters that differ from the run's
    agreeing_requests: int             # requests whose served count the replay reproduces
    explained: int                     # of the run's disagreements


@dataclass(frozen=True)
class ReasonCount:
    reason: str
    label: str
    requests: int
    confidence: str                    # the most common confidence of its rows
    evidence: str
    by_confidence: dict = dataclasses.field(default_factory=dict)   # rows per confidence


@dataclass(frozen=True, kw_only=True)
class ServedReport:
    requests: int                      # counted requests that carry a served count
    requests_without_served: int
    agree: int
    disagree: int
    agreement_rate: float | None
    served_below: int                  # disagreements where the server served less than predicted
    served_above: int
    predicted_hit_tokens: float
    served_hit_tokens: int
    reasons: tuple[ReasonCount, ...]
    hypotheses: tuple[Hypothesis, ...]
    rows: tuple[ServedRow, ...]
    notes: tuple[str, ...] = ()


def compare_served(requests: Sequence[TraceRequest] | None, report: PrefixReport, *,
                   settings: dict[str, Any]) -> ServedReport:
    """Compare ``report`` (a replay of ``requests`` run with the :func:`~.replay.simulate` keyword arguments
    ``settings``; its rows hold the served counts) with what the server served. ``requests`` None: the log
    was not kept, so no other set-up is replayed (the reasons come from the rows alone)."""
    if report.per_request is None:
        raise ValueError("compare_served needs the replay's rows: the requests carry no served count")
    if requests is None:
        notes_first = ["the log's first request carries no served count, so the log was not kept for replays "
                       "under other set-ups: the reasons come from each row alone"]
    else:
        notes_first = []
    policy, bs = settings.get("policy", "vllm"), settings.get("block_size", 16)
    base_rows = [q for q in report.per_request if q.served_cached_tokens is not None]
    without = len(report.per_request) - len(base_rows)
    notes: list[str] = notes_first
    hypotheses: list[Hypothesis] = []
    # rows the set-up cannot produce at all
    certain: dict[int, tuple[str, str]] = {}
    for q in base_rows:
        served = q.served_cached_tokens or 0
        if q.served_prompt_tokens is not None and q.served_prompt_tokens != q.prompt_tokens:
            d = q.served_prompt_tokens - q.prompt_tokens
            certain[q.index] = ("template", f"the server counted {q.served_prompt_tokens:,} prompt tokens, the "
                                            f"trace holds {q.prompt_tokens:,} ({d:+,}): it tokenized another prompt")
        elif served % bs and policy in ("vllm", "radix"):
            certain[q.index] = ("block_size", f"{served:,} served tokens are not whole blocks of {bs}")
    disagreeing = {q.index for q in base_rows if q.hit_tokens != q.served_cached_tokens}
    reproduced: dict[int, list[int]] = {}          # row -> hypotheses (indexes) whose replay reproduces it
    settled: dict[int, int] = {}                   # hypothesis -> rows it reproduces that no certain reason took
    if disagreeing and requests is not None:
        served_of = {q.index: q.served_cached_tokens for q in base_rows}
        view, shift = _server_view(requests, certain)
        found = list(_hypotheses(view, report, settings, served_of, disagreeing, notes))
        if shift:
            hits = _replay(view, settings)
            if hits is not None:
                found.insert(0, (Hypothesis(reason="template", setting=shift, params={"prompt_shift": True},
                                            agreeing_requests=0, explained=0), hits))
        for h, hits in found:
            if shift and h.reason != "template":   # replayed on the prompts as the server saw them
                h = dataclasses.replace(h, setting=f"{h.setting}, and {shift}")
            agreeing = {i for i, v in hits.items() if v == served_of.get(i)}
            hypotheses.append(dataclasses.replace(h, agreeing_requests=len(agreeing),
                                                  explained=len(agreeing & disagreeing)))
            settled[len(hypotheses) - 1] = len(agreeing - set(certain))
            for i in agreeing & disagreeing:
                reproduced.setdefault(i, []).append(len(hypotheses) - 1)
    overcommit = _overcommitted(requests, settings) if disagreeing and requests is not None else {}
    n = len(base_rows)
    rows = []
    for q in base_rows:
        served = q.served_cached_tokens or 0
        row = ServedRow(index=q.index, line=q.line, prompt_tokens=q.prompt_tokens, predicted_hit_tokens=q.hit_tokens,
                        served_cached_tokens=served, served_prompt_tokens=q.served_prompt_tokens,
                        agrees=q.index not in disagreeing)
        if not row.agrees:
            row = dataclasses.replace(row, **_reason(q, served, certain, reproduced, hypotheses, settled, overcommit,
                                                     n - len(certain), bs))
        rows.append(row)
    reasons = _tally(rows)
    agree = n - len(disagreeing)
    served_total = sum(r.served_cached_tokens for r in rows)
    if n and served_total == 0 and report.hit_tokens:
        notes.append("the server served no cached token at all: prefix caching may be off on it "
                     "(vLLM --no-enable-prefix-caching), or every prompt differs from the trace's at its start")
    return ServedReport(requests=n, requests_without_served=without, agree=agree, disagree=len(disagreeing),
                        agreement_rate=agree / n if n else None,
                        served_below=sum(1 for r in rows if not r.agrees and r.served_cached_tokens < r.predicted_hit_tokens),
                        served_above=sum(1 for r in rows if not r.agrees and r.served_cached_tokens > r.predicted_hit_tokens),
                        predicted_hit_tokens=sum(r.predicted_hit_tokens for r in rows), served_hit_tokens=served_total,
                        reasons=reasons, hypotheses=tuple(hypotheses), rows=tuple(rows), notes=tuple(notes))


def _reason(q, served: int, certain: dict, reproduced: dict, hypotheses: list[Hypothesis], settled: dict,
            overcommit: dict, open_rows: int, bs: int) -> dict:
    """A disagreeing row's reason. ``settled[h]``: rows hypothesis h reproduces among the ``open_rows`` that
    no certain reason took (its share there says how likely it is)."""
    if q.index in certain:
        reason, evidence = certain[q.index]
        if reason == "block_size" and q.index in reproduced:   # the replay says which block size
            h = max((hypotheses[i] for i in reproduced[q.index]), key=lambda h: h.agreeing_requests)
            if h.reason == "block_size":
                evidence += f"; a replay with {h.setting} reproduces it"
        return {"reason": reason, "confidence": "certain", "evidence": evidence}
    replayed = None
    if q.index in reproduced:
        k = max(reproduced[q.index], key=lambda i: (hypotheses[i].agreeing_requests, -len(hypotheses[i].params)))
        h = hypotheses[k]
        sure = "likely" if open_rows and settled[k] >= LIKELY_SHARE * open_rows else "possible"
        replayed = {"reason": h.reason, "confidence": sure,
                    "evidence": f"a replay with {h.setting} reproduces it (and {settled[k]:,} of the {open_rows:,} "
                                "requests no certain reason explains)"}
        if sure == "likely":
            return replayed
    if served == 0 and q.hit_tokens >= bs:
        return {"reason": "template", "confidence": "likely",
                "evidence": "nothing served although its first blocks were cached by earlier requests: the server's "
                            "prompt differs from this one at its start (a date or id at the top, a BOS twice)"}
    if replayed is not None:
        return replayed
    if served < q.hit_tokens and q.index in overcommit:
        need, cap = overcommit[q.index]
        return {"reason": "preemption", "confidence": "possible",
                "evidence": f"the requests in flight at its arrival need {need:,} blocks with their output tokens, "
                            f"more than the {cap:,}-block pool: vLLM preempts one and recomputes it"}
    if served > q.hit_tokens:
        return {"reason": "unexplained", "confidence": "possible",
                "evidence": "the server found more: blocks of generated tokens (vLLM caches full output blocks, the "
                            "trace has no output token IDs), a KV connector (LMCache), or a larger pool"}
    return {"reason": "unexplained", "confidence": "possible", "evidence": "no replay tried reproduces it"}


def _tally(rows: list[ServedRow]) -> tuple[ReasonCount, ...]:
    groups: dict[str, list[ServedRow]] = {}
    for r in rows:
        if r.reason is not None:
            groups.setdefault(r.reason, []).append(r)
    out = []
    for reason, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        counts = Counter(r.confidence for r in rs)
        conf = counts.most_common(1)[0][0]
        evidence = Counter(_generic(r.evidence or "") for r in rs).most_common(1)[0][0]
        out.append(ReasonCount(reason=reason, label=REASONS[reason], requests=len(rs), confidence=conf or "possible",
                               evidence=evidence, by_confidence={k: counts[k] for k in ("certain", "likely", "possible")
                                                                 if counts[k]}))
    return tuple(out)


def _generic(evidence: str) -> str:
    """A row's evidence without its own numbers where they differ row by row (the summary's wording)."""
    if evidence.startswith("the server counted"):
        delta = evidence.split("(", 1)[1].split(")", 1)[0]
        return f"the server counted another prompt length than the trace holds ({delta} tokens): it tokenized " \
               "another prompt"
    if "served tokens are not whole blocks" in evidence:
        return evidence.split(" served tokens ", 1)[1].replace("are not", "served counts that are not", 1)
    if evidence.startswith("the requests in flight"):
        return "the requests in flight at its arrival need more blocks than the pool, with their output tokens"
    return evidence


# ------------------------------------------------------------------------------------------ hypotheses


def _replay(requests: Sequence[TraceRequest], settings: dict, **changes: Any) -> dict[int, float] | None:
    """Per-request hit tokens of a replay with ``changes``; None when the set-up cannot hold the trace."""
    try:
        r = simulate(requests, **{**settings, **changes, "per_request": True})
    except CapacityError:
        return None
    assert r.per_request is not None
    return {q.index: q.hit_tokens for q in r.per_request}


def _min_blocks(requests: Sequence[TraceRequest], bs: int) -> int:
    return max((-(-r.prompt_tokens // bs) for r in requests), default=1)


def _hypotheses(requests: Sequence[TraceRequest], report: PrefixReport, settings: dict, served_of: dict,
                disagreeing: set, notes: list[str]):
    """``(hypothesis, per-request hits)`` for each other set-up worth trying on this log."""
    policy, bs, cap = settings.get("policy", "vllm"), settings.get("block_size", 16), settings.get("capacity_blocks")
    tokens = all(r.tokens is not None for r in requests)

    def agreement(hits: dict | None) -> int:
        return -1 if hits is None else sum(1 for i, v in hits.items() if served_of.get(i) == v)

    def h(reason: str, setting: str, **params: Any) -> Hypothesis:
        return Hypothesis(reason=reason, setting=setting, params=params, agreeing_requests=0, explained=0)

    # another block size: every served count a multiple of a larger one, or of none but a smaller one
    served = [v for v in served_of.values() if v]
    if len(served) >= 3 and policy in ("vllm", "radix"):
        fits = [b for b in BLOCK_SIZES if all(v % b == 0 for v in served)]
        other = max(fits) if fits else 1
        if other != bs:
            if not tokens and other != bs:
                notes.append(f"the served counts are whole blocks of {other}, not of {bs}: a replay at another block "
                             "size needs the token IDs (this log was read pre-keyed: rerun with --read-jobs 1)")
            else:
                pol = "radix" if other == 1 else policy
                cap_tokens = None if cap is None else cap * bs
                cap_b = None if cap_tokens is None else max(cap_tokens // other, _min_blocks(requests, other))
                best = _best_capacity(requests, settings, agreement, cap_b, other, pol)
                what = (f"block size {other}" if other > 1 else "a token-level cache (SGLang's radix, page size 1)")
                if best[0] is not None and best[0] != cap_b:
                    what += f", capacity {best[0]:,} blocks"
                yield h("block_size", what, block_size=other, policy=pol, capacity_blocks=best[0]), best[1]
    # another capacity
    if cap is not None and policy in ("vllm", "radix"):
        below = any(served_of[i] < report_hits for i, report_hits in _base_hits(report).items() if i in disagreeing)
        best_cap, hits = _best_capacity(requests, settings, agreement, cap, bs, policy)
        if best_cap is not None and best_cap != cap and hits is not None:
            reason = "capacity" if best_cap < cap else "capacity_larger"
            if below or reason == "capacity_larger":
                yield h(reason, f"capacity {best_cap:,} blocks ({best_cap * bs:,} tokens)", capacity_blocks=best_cap), hits
    # requests in flight at once
    if settings.get("concurrency", 1) == 1 and any(r.timestamp is not None for r in requests) and policy == "vllm":
        hits = _replay(requests, settings, concurrency=SERVER_CONCURRENCY)
        if hits is not None:
            yield h("concurrency", f"requests overlapping by their timestamps and output tokens (up to "
                                   f"{SERVER_CONCURRENCY}, vLLM's default --max-num-seqs)",
                    concurrency=SERVER_CONCURRENCY), hits
    # the model a request names (a LoRA adapter) as a key of every block
    models = {r.served_model for r in requests if r.served_model is not None}
    if len(models) > 1 and tokens:
        keyed = [dataclasses.replace(r, salt=(r.salt, ("lora", r.served_model))) for r in requests]
        hits = _replay(keyed, settings)
        if hits is not None:
            yield h("salt_or_lora", f"the request's model ({len(models)} names: LoRA adapters) as a block key",
                    lora_keys=True), hits


#: the most tokens :func:`_server_view` models at the top of a prompt (a template's line, its default system prompt):
#: a server's count past the trace's by more is not such a line, and is not replayed
MAX_SHIFT_TOKENS = 1 << 16


def _server_view(requests: Sequence[TraceRequest], certain: dict) -> tuple[Sequence[TraceRequest], str]:
    """The requests as the server saw them where its prompt length differs by the same count on every such row
    (``d`` tokens more: a template's line at the top, modelled as ``d`` tokens no trace holds; ``d`` fewer: the
    first ``d`` dropped, a BOS the server does not add), and that change in words; else the requests and ""."""
    deltas = {r.served_prompt_tokens - r.prompt_tokens for r in requests
              if certain.get(r.index, ("",))[0] == "template" and r.served_prompt_tokens is not None}
    if len(deltas) != 1 or not all(r.tokens is not None for r in requests):
        return requests, ""
    (d,) = deltas
    if d > MAX_SHIFT_TOKENS:  # (not a line a template writes: a count the replay would hold for every request)
        return requests, ""
    top = [-1 - k for k in range(d)] if d > 0 else []
    view = []
    for r in requests:
        if r.index in certain and certain[r.index][0] == "template":
            tokens = top + list(r.tokens or ()) if d > 0 else list(r.tokens or ())[-d:]
            r = dataclasses.replace(r, tokens=tokens, prompt_tokens=len(tokens))
        view.append(r)
    what = (f"{d} tokens no trace line holds at the top of those prompts (a template's line)" if d > 0 else
            f"the first {-d} tokens of those prompts dropped (a BOS the server does not add)")
    return view, what


def _base_hits(report: PrefixReport) -> dict[int, float]:
    assert report.per_request is not None
    return {q.index: q.hit_tokens for q in report.per_request}


def _best_capacity(requests: Sequence[TraceRequest], settings: dict, agreement, cap: int | None, bs: int,
                   policy: str) -> tuple[int | None, dict | None]:
    """The capacity (blocks of ``bs``) at which a replay agrees with the most served counts, searched on a
    log-spaced grid from the smallest that fits to 4x ``cap``, then refined between the best's neighbours."""
    base = {"block_size": bs, "policy": policy}
    if cap is None:
        return None, _replay(requests, settings, **base, capacity_blocks=None)
    lo = _min_blocks(requests, bs)
    top = max(cap * 4, lo)
    steps = SEARCH_POINTS if sum(r.prompt_tokens for r in requests) <= SEARCH_TOKENS else SEARCH_POINTS // 3
    grid = sorted({max(lo, round(lo * (top / lo) ** (k / (steps - 1)))) for k in range(steps)} | {cap, lo})
    scores: dict[int, tuple[int, dict | None]] = {}

    def score(c: int) -> int:
        if c not in scores:
            hits = _replay(requests, settings, **base, capacity_blocks=c)
            scores[c] = (agreement(hits), hits)
        return scores[c][0]

    for c in grid:
        score(c)
    for _ in range(12):  # refine: halve the gaps beside the three best (the agreement is not monotone)
        known = sorted(scores)
        mids: set[int] = set()
        for best in sorted(scores, key=lambda c: (scores[c][0], c == cap, -c))[-3:]:
            k = known.index(best)
            mids |= {(known[k - 1] + best) // 2 if k else best, (best + known[k + 1]) // 2 if k + 1 < len(known) else best}
        mids -= set(scores)
        if not mids:
            break
        for c in mids:
            score(c)
    best = max(scores, key=lambda c: (scores[c][0], c == cap, -c))
    return best, scores[best][1]


def _overcommitted(requests: Sequence[TraceRequest], settings: dict) -> dict[int, tuple[int, int]]:
    """Requests that arrive while the requests in flight (by timestamps and output tokens) would need more
    blocks than the pool with their output tokens: ``index -> (blocks needed, capacity)``."""
    cap, bs = settings.get("capacity_blocks"), settings.get("block_size", 16)
    decode = settings.get("decode_s_per_token", 0.02)
    if cap is None or not any(r.timestamp is not None and r.output_tokens for r in requests):
        return {}
    out: dict[int, tuple[int, int]] = {}
    running: list[tuple[float, int]] = []    # (end, blocks with the output)
    for r in requests:
        if r.timestamp is None:
            continue
        t = r.timestamp
        running = [(e, b) for e, b in running if e > t]
        running.append((t + r.output_tokens * decode, -(-(r.prompt_tokens + r.output_tokens) // bs)))
        need = sum(b for _, b in running)
        if need > cap:
            out[r.index] = (need, cap)
    return out
