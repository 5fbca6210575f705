"""One report over a request log, joining the engines a person would otherwise run one by one.

- the token diff of each request against the previous one of its conversation (diff-tokens' log mode):
  tokens a prefix cache could have reused and did not, per cause, and the worst conversations with the
  tokens around their first divergence;
- the provider-cache simulation with the price table (prompt-cost): dollars paid, dollars without caching,
  cache hit rate, and why requests missed; the tokens lost per cause priced at the difference between the
  model's input and cache-read prices;
- the vLLM prefix-cache replay (simulate-prefix): the hit rate with no eviction and the whole
  hit-rate-vs-capacity curve (prefix_curve);
- what ``cachectl fix`` would change (:mod:`cachectl.engines.repair.fix`): the log measured before, after the safe
  fixes, and after all fixes (the unsafe ones too), and the tokens and dollars each fix code gains.

Everything here is computed by those engines; this module only groups their results. It returns a frozen
:class:`LogReport`; the CLI renders it (text, JSON, or one HTML page).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ...errors import CachectlError
from ..causes import cause_label
from .losses import LostTokenPrice, ModelOf, PairLosses, lost_token_prices, no_figure
from .sections import CostSection, CurveSection, cost_section, curve_section
from .shared_prefix import with_forks

if TYPE_CHECKING:
    from ...inputs import LogRecord, Request
    from ...workers import Workers
    from ..prefix.forks import Fork
    from ..prefix.trace import TraceRequest
    from ..provider.prices import PriceTable
    from ..tokendiff import PairResult
    from .fix import FirstRead, FixOptions, FixReport
    from .groups import LogLine
    from .sections import Costed, OneRead
    from .shared_prefix import LogForks, SharedPrefixSection

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class CauseLoss:
    cause: str | None          # the token diff's cause id; None: a divergence no rule explains
    label: str
    pairs: int
    tokens_lost: int           # tokens of the predecessor that the successor did not share as a prefix
    usd_lost: float | None     # those tokens at (input - cache read) prices; None without a price table


@dataclass(frozen=True)
class PairView:
    """One request beside the previous one of its conversation, around the first token that differs."""

    key: Any
    line_a: int
    line_b: int
    tokens_a: int
    tokens_b: int
    common_prefix_tokens: int
    first_diff_index: int | None
    cause: str | None
    cause_message: str | None
    tokens_lost: int
    where_a: str | None        # the field the first differing token belongs to (message, tools ...)
    where_b: str | None
    start_a: int               # index of the first token shown
    start_b: int
    window_a: tuple[str, ...]  # decoded tokens from start_a
    window_b: tuple[str, ...]


@dataclass(frozen=True)
class ConversationLoss:
    key: Any
    requests: int
    tokens_lost: int
    usd_lost: float | None
    causes: tuple[str, ...]    # cause ids, in order of first appearance
    worst: PairView | None     # the pair that lost most


@dataclass(frozen=True)
class FixColumn:
    """One version of the log, measured by fix's measure (the same engines as above)."""

    label: str                          # before | safe fixes | all fixes
    fixes_applied: int
    vllm_hit_rate: float | None         # no eviction, blocks of the report's size
    provider_cost_usd: float | None
    provider_uncached_usd: float | None
    provider_hit_rate: float | None
    pair_reused_tokens: int | None      # tokens each request shares with the previous one of its conversation
    pair_tokens: int | None
    causes: dict                        # diff-tokens causes of the pairs that still diverge
    #: the most those pairs could share (the shorter request's tokens, summed): prefix reuse is
    #: ``pair_reused_tokens / pair_reusable_tokens``, as the report's ``reuse_ratio`` is in the before column
    pair_reusable_tokens: int | None = None


@dataclass(frozen=True)
class FixGain:
    code: str
    name: str
    safe: bool
    fixes: int
    reused_tokens: int                  # pair-reuse tokens this code gains (codes applied one after another)
    provider_saved_usd: float | None


@dataclass(frozen=True)
class FixExample:
    code: str
    name: str
    safe: bool
    line: int
    path: str
    message: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class BeforeAfter:
    grouping: str                       # "key FIELD" | "automatic"
    conversations: int
    columns: tuple[FixColumn, ...]
    gains: tuple[FixGain, ...]
    examples: tuple[FixExample, ...]    # the first fix of each code
    notes: tuple[str, ...] = ()


def before_after(safe: FixReport, full: FixReport, *, safe_applied: int | None = None,
                 full_applied: int | None = None) -> BeforeAfter:
    """The fix engine's two runs (safe fixes only; unsafe ones too) as the report's before/after section.
    ``safe_applied``, ``full_applied``: a run's applied fixes, when its ``fixes`` were let go (all but the first of
    each code; ``.applied`` otherwise)."""
    from .fixes import FIXES

    def column(label: str, m, applied: int) -> FixColumn:
        p = m.provider if m is not None else None
        v = m.vllm if m is not None else None
        return FixColumn(label=label, fixes_applied=applied, vllm_hit_rate=v.hit_rate if v else None,
                         provider_cost_usd=p.cost_usd if p else None,
                         provider_uncached_usd=p.uncached_cost_usd if p else None,
                         provider_hit_rate=p.hit_rate if p else None,
                         pair_reused_tokens=m.pair_reused_tokens if m is not None else None,
                         pair_tokens=m.pair_tokens if m is not None else None,
                         causes=dict(m.causes) if m is not None else {},
                         pair_reusable_tokens=m.pair_reusable_tokens if m is not None else None)

    cols = (column("before", safe.before, 0),
            column("safe fixes", safe.after, safe.applied if safe_applied is None else safe_applied),
            column("all fixes", full.after, full.applied if full_applied is None else full_applied))
    gains = tuple(FixGain(code=g.code, name=g.name, safe=FIXES[g.code].safe, fixes=g.fixes,
                          reused_tokens=g.reused_tokens, provider_saved_usd=g.provider_saved_usd)
                  for g in full.per_cause)
    examples = []
    seen = set()
    for f in full.fixes:
        if f.applied and f.code not in seen:
            seen.add(f.code)
            examples.append(FixExample(code=f.code, name=f.name, safe=f.safe, line=f.line, path=f.path,
                                       message=f.message, before=f.before, after=f.after))
    return BeforeAfter(grouping=safe.grouping.how, conversations=safe.grouping.count, columns=cols, gains=gains,
                       examples=tuple(examples), notes=tuple(dict.fromkeys(safe.notes + full.notes)))


@dataclass(frozen=True, kw_only=True)
class LogReport:
    schema_version: int = SCHEMA_VERSION
    source: str
    requests: int
    conversations: int
    pairs: int
    block_size: int
    reusable_tokens: int
    reused_tokens: int
    tokens_lost: int
    reuse_ratio: float | None
    usd_lost: float | None
    price_model: str | None             # whose prices turned lost tokens into dollars (None: each request's own)
    causes: tuple[CauseLoss, ...]
    worst: tuple[ConversationLoss, ...]
    cost: CostSection | None
    curve: CurveSection | None
    fixes: BeforeAfter | None = None
    tokenizer: str
    notes: tuple[str, ...] = field(default=())
    #: the headline: ``tokens_lost`` (within conversations) plus what the forks of the log's shared prefix add
    #: beyond it, each request's tokens counted once (:mod:`.shared_prefix`); priced as ``usd_lost`` is
    total_tokens_lost: int = 0
    total_usd_lost: float | None = None
    #: the forks of the log's shared prefix, sorted by ``tokens_lost`` (each ``path, char, cause,
    #: distinct_values, requests, tokens_lost, fixable``, and more); the section's figures and tree picture
    forks: tuple[Fork, ...] = ()
    shared_prefix: SharedPrefixSection | None = None
    #: the models whose prices turned lost tokens into dollars: ``price_model``, or, for a log that mixes models of
    #: different prices, each model its requests name (each request's tokens at its own model's price)
    price_models: tuple[str, ...] = ()

    def prices_named(self) -> str:
        """Whose prices the dollars lost are at, for a person: one model's, or each request's own."""
        return (f"{self.price_model} prices" if self.price_model is not None
                else f"each request's model's prices ({', '.join(self.price_models)})")

    def to_dict(self) -> dict:
        return asdict(self)


def _lost(tokens_a: int, tokens_b: int, common: int) -> int:
    """The tokens a pair loses: what the shorter side holds beyond the prefix the two share."""
    return max(0, min(tokens_a, tokens_b) - common)


def _where(side) -> str | None:
    return side.location.describe() if side.location is not None else None


def _view(p: PairResult) -> PairView:
    d = p.diff
    return PairView(key=p.key, line_a=p.line_a, line_b=p.line_b, tokens_a=d.tokens_a, tokens_b=d.tokens_b,
                    common_prefix_tokens=d.common_prefix_tokens, first_diff_index=d.first_diff_index,
                    cause=d.cause.id if d.cause else None, cause_message=d.cause.message if d.cause else None,
                    tokens_lost=_lost(d.tokens_a, d.tokens_b, d.common_prefix_tokens), where_a=_where(d.a),
                    where_b=_where(d.b), start_a=d.a.window_start, start_b=d.b.window_start,
                    window_a=tuple(d.a.window_tokens), window_b=tuple(d.b.window_tokens))


def build_report(*, source: str, log: Iterable[LogRecord], tokenizer: Any, tokenizer_name: str,
                 requests: Iterable[Request] | None = None, table: PriceTable | None = None,
                 trace: Iterable[TraceRequest] | None = None, block_size: int = 16, top: int = 5,
                 context: int = 24, curve_points: int = 16, price_model: str | None = None,
                 text_counter: Any = None, fixes: BeforeAfter | None = None,
                 forks: LogForks | None = None, progress: Callable[[int], None] | None = None,
                 prompt_of: Callable[[int], Any] | None = None, end_indices: Container[int] | None = None,
                 add_generation_prompt: bool = False, ends: Container[int] | None = None) -> LogReport:
    """Run diff-tokens' log mode over ``log``, prompt-cost's simulation over ``requests`` (with ``table``) and
    simulate-prefix's capacity curve over ``trace``, and keep what the report shows.

    ``price_model`` names the model whose prices turn lost tokens into dollars (default: the model of the
    first request priced). Memory: one pair view per conversation (its worst) and the per-cause tallies.

    ``forks``: the log's shared-prefix analysis (:func:`.shared_prefix.log_forks`; ``fix_log`` keeps it as
    ``FixReport.forks``): its forks are listed, and the tokens they cost beyond each request's within-conversation
    loss join the headline (``total_tokens_lost``; :func:`.shared_prefix.cross_request_loss`).
    ``progress(n)``: called as pairs are compared and requests replayed (the iterables' own reading is the
    caller's to count). ``prompt_of(line)``: the prompt of the log's line ``line``, for a log too long to keep a
    pair view per conversation: each conversation then keeps the line numbers of its worst pair, and the worst
    conversations' pairs are tokenized and compared again at the end (the same comparison ``diff_log`` made).
    ``end_indices``: the places in ``log`` (from 0) of the requests that end their conversation (``diff_log``
    forgets a conversation there; :meth:`.groups.Grouping.last_indices`); ``ends``: line numbers, as before it
    (:func:`~cachectl.engines.tokendiff.diff_log`).
    ``add_generation_prompt``: the pairs are compared as rendered with it (as ``report`` compares them).
    """
    r, price, losses = pairs_report(source=source, log=log, tokenizer=tokenizer, tokenizer_name=tokenizer_name,
                                   requests=requests, table=table, trace=trace, block_size=block_size, top=top,
                                   context=context, curve_points=curve_points, price_model=price_model,
                                   text_counter=text_counter, fixes=fixes, progress=progress, prompt_of=prompt_of,
                                   end_indices=end_indices, lines_of_losses=forks.gains_by_line() if forks is not None else (),
                                   add_generation_prompt=add_generation_prompt, ends=ends)
    return with_forks(r, forks, losses, price) if forks is not None else r


class _Conversations:
    """What the report keeps of each conversation while the pairs are compared, a row each (by first appearance):
    its requests, the tokens it lost, its causes in order (a tuple shared by the conversations with the same), and
    the tokens its worst pair lost and where that pair is (its lines; its view, where it is not compared again at
    the end). 123 bytes a conversation, where a dict each took 494 (tracemalloc, 100,000 conversations of three
    pairs, their keys held elsewhere)."""

    def __init__(self) -> None:
        self.keys: list[Any] = []
        self._row: dict[Any, int] = {}
        self.requests, self.lost, self.worst_lost = array("q"), array("q"), array("q")
        self.worst_a, self.worst_b = array("q"), array("q")
        self.causes: list[tuple] = []
        self.views: dict[int, PairView] = {}
        self._tuples: dict[tuple, tuple] = {(): ()}

    def row(self, key: Any) -> int:
        k = self._row.get(key)
        if k is None:
            k = self._row[key] = len(self.keys)
            self.keys.append(key)
            for col, v in ((self.requests, 1), (self.lost, 0), (self.worst_lost, -1), (self.worst_a, 0),
                           (self.worst_b, 0)):
                col.append(v)
            self.causes.append(())
        return k

    def interned(self, causes: tuple) -> tuple:
        return self._tuples.setdefault(causes, causes)


class PairTally:
    """The token diff's figures of a log's pairs (each request beside the previous one of its conversation), kept
    as the pairs are compared: the tokens reused and reusable, the tokens lost by cause and by conversation (with
    where its worst pair is), and each request's loss. :meth:`request` sees every request, :meth:`pair` every
    pair; ``lines_of_losses``: the requests whose loss is kept (None: every request that lost tokens)."""

    def __init__(self, lines_of_losses: Container[int] | None = None) -> None:
        self.requests = self.conversations = self.pairs = self.reusable = self.reused = 0
        self._names: set[Any] = set()
        self.by_cause: dict[str | None, list[int]] = {}
        self.convs = _Conversations()
        self.losses = PairLosses()
        self._lines_of_losses = lines_of_losses

    def request(self, key: Any) -> None:
        self.requests += 1
        if key not in self._names:
            self._names.add(key)
            self.conversations += 1

    def pair(self, key: Any, line_a: int, line_b: int, tokens_a: int, tokens_b: int, common: int, mismatch: bool,
             cause: str | None, view: Callable[[], PairView] | None = None) -> None:
        """One pair: ``common`` tokens shared as a prefix; ``mismatch``: they diverge before either ends, for
        ``cause`` (None: no rule explains it). ``view``: the pair's view, kept where it is its conversation's worst
        (else only its lines are, to be compared again at the end)."""
        self.pairs += 1
        self.reusable += min(tokens_a, tokens_b)
        self.reused += common
        convs = self.convs
        k = convs.row(key)
        convs.requests[k] += 1
        if not mismatch:
            return
        lost = _lost(tokens_a, tokens_b, common)
        if self._lines_of_losses is None or line_b in self._lines_of_losses:
            self.losses.add(line_b, lost, cause, k)
        tally = self.by_cause.setdefault(cause, [0, 0])
        tally[0] += 1
        tally[1] += lost
        convs.lost[k] += lost
        if cause not in convs.causes[k]:
            convs.causes[k] = convs.interned(convs.causes[k] + (cause,))
        if lost > convs.worst_lost[k]:
            if view is None:
                convs.worst_a[k], convs.worst_b[k] = line_a, line_b
            else:
                convs.views[k] = view()
            convs.worst_lost[k] = lost


def pairs_report(*, source: str, log: Iterable[LogRecord], tokenizer: Any, tokenizer_name: str,
                 requests: Iterable[Request] | None = None, table: PriceTable | None = None,
                 trace: Iterable[TraceRequest] | None = None, block_size: int = 16, top: int = 5,
                 context: int = 24, curve_points: int = 16, price_model: str | None = None,
                 text_counter: Any = None, fixes: BeforeAfter | None = None,
                 progress: Callable[[int], None] | None = None, prompt_of: Callable[[int], Any] | None = None,
                 end_indices: Container[int] | None = None,
                 lines_of_losses: Container[int] | None = None,
                 add_generation_prompt: bool = False,
                 ends: Container[int] | None = None) -> tuple[LogReport, LostTokenPrice | None, PairLosses]:
    """:func:`build_report` without the forks of the log's shared prefix (which :func:`with_forks` adds): the
    report, the dollars a lost token costs (None without prices), and the within-conversation loss of the requests
    on ``lines_of_losses`` (None: of every request that lost tokens). ``add_generation_prompt``: the pairs are
    compared as rendered with it (as a server renders what it serves)."""
    from ..tokendiff import MISMATCH, LogSummary, diff_log

    if top < 1:
        raise CachectlError("`top` must be at least 1")
    costed = (cost_section(requests, table, source, text_counter, tokenizer_name)
              if requests is not None and table is not None else None)
    tally = PairTally(lines_of_losses)
    for item in diff_log(log, tokenizer, block_size=block_size, context=context, end_indices=end_indices, ends=ends,
                         add_generation_prompt=add_generation_prompt):
        if progress is not None:
            progress(1)
        if isinstance(item, LogSummary):
            tally.requests, tally.conversations = item.requests, item.conversations
            continue
        d = item.diff
        tally.pair(item.key, item.line_a, item.line_b, d.tokens_a, d.tokens_b, d.common_prefix_tokens,
                   d.kind == MISMATCH, d.cause.id if d.cause else None,
                   None if prompt_of is not None else partial(_view, item))
    curved = curve_section(trace, block_size, curve_points, source, progress) if trace is not None else None
    return tallied(tally, source=source, tokenizer=tokenizer, tokenizer_name=tokenizer_name, table=table,
                   costed=costed, curve=curved, block_size=block_size, top=top, context=context,
                   price_model=price_model, fixes=fixes, prompt_of=prompt_of,
                   add_generation_prompt=add_generation_prompt)


def tallied(tally: PairTally, *, source: str, tokenizer: Any, tokenizer_name: str, table: PriceTable | None,
            costed: Costed | None, curve: CurveSection | None, block_size: int, top: int = 5, context: int = 24,
            price_model: str | None = None, fixes: BeforeAfter | None = None,
            prompt_of: Callable[[int], Any] | None = None, add_generation_prompt: bool = False,
            models: Sequence[str] | None = None, model_of: ModelOf | None = None
            ) -> tuple[LogReport, LostTokenPrice | None, PairLosses]:
    """The report of a log's pairs (``tally``), with its provider section (``costed``) and capacity curve: the
    report, the price of a lost token (None without prices: :func:`.losses.lost_token_prices`, over ``models``, the
    models the log names, or the provider section's; with ``model_of``, the model a line's request names, a log that
    mixes models of different prices is priced at each request's own), and the requests' within-conversation losses.
    ``prompt_of(line)``: the prompt of the log's line ``line``, where the conversations kept only the lines of
    their worst pair: the worst conversations' pairs are tokenized and compared again (as ``diff_log`` compares
    them)."""
    if top < 1:
        raise CachectlError("`top` must be at least 1")
    convs, losses = tally.convs, tally.losses
    notes: list[str] = list(costed.notes) if costed is not None else []
    cost = costed.section if costed is not None else None
    named = models if models is not None else (cost.models if cost is not None else ())
    price, why = lost_token_prices(table, named, price_model, per_request=model_of is not None)
    worst_rows = heapq.nlargest(top, (k for k in range(len(convs.keys)) if convs.lost[k] > 0),
                                key=convs.lost.__getitem__)
    # (each request's tokens at its own model's price: the losses by cause, by conversation, in all, by model)
    by_cause, by_row, everyone = (losses.by_model(model_of, set(worst_rows))
                                  if price is not None and price.rate is None and model_of is not None else ({}, {}, {}))
    lost_total = tally.reusable - tally.reused
    if price is not None and price.dollars(lost_total, everyone) is None:
        price, why = None, no_figure("lost tokens", "the log's models are priced differently and some requests "
                                     "name no model")
    notes += [why] if why else []

    def usd(tokens: int, by_model: dict | None) -> float | None:
        return None if price is None else price.dollars(tokens, by_model)

    causes = tuple(sorted((CauseLoss(cause=c, label=cause_label(c), pairs=n, tokens_lost=t,
                                     usd_lost=usd(t, by_cause.get(c)))
                           for c, (n, t) in tally.by_cause.items()), key=lambda c: (-c.tokens_lost, str(c.cause))))
    if prompt_of is not None:
        for k in worst_rows:
            if convs.worst_lost[k] >= 0:
                convs.views[k] = _view(_pair_again(convs.keys[k], convs.worst_a[k], convs.worst_b[k], prompt_of,
                                                   tokenizer, block_size, context, add_generation_prompt))
    worst = tuple(ConversationLoss(key=convs.keys[k], requests=convs.requests[k], tokens_lost=convs.lost[k],
                                   usd_lost=usd(convs.lost[k], by_row.get(k)),
                                   causes=tuple(c or "unexplained" for c in convs.causes[k]),
                                   worst=convs.views.get(k)) for k in worst_rows)
    if price is not None:
        notes.append(price.note(tokenizer_name))
    return LogReport(source=source, requests=tally.requests, conversations=tally.conversations, pairs=tally.pairs,
                     block_size=block_size, reusable_tokens=tally.reusable, reused_tokens=tally.reused,
                     tokens_lost=lost_total, reuse_ratio=(tally.reused / tally.reusable) if tally.reusable else None,
                     usd_lost=usd(sum(c.tokens_lost for c in causes), everyone),
                     price_model=price.model if price is not None else None,
                     price_models=price.models if price is not None else (), causes=causes, worst=worst, cost=cost,
                     curve=curve, fixes=fixes, tokenizer=tokenizer_name, notes=tuple(notes),
                     total_tokens_lost=lost_total, total_usd_lost=usd(lost_total, everyone)), price, losses


def log_report(lines: Sequence[LogLine], options: FixOptions, *, tokenizer: Any, tokenizer_name: str,
               table: PriceTable | None = None, source: str = "", default_model: str | None = None,
               timestamps: Any = None, top: int = 5, price_model: str | None = None,
               progress: Callable[[int], None] | None = None, workers: Workers | None = None,
               first_read: FirstRead | None = None, sections_read: OneRead | None = None) -> LogReport:
    """What ``cachectl report`` shows of a log (``lines``: :func:`.groups.log_lines`' store): :func:`build_report`
    over the log, with the fix engine's two runs (safe fixes only; unsafe ones too, with the tokens each code gains)
    as its before/after section and the forks of the log's shared prefix. The provider and curve sections are fed
    from one read of ``lines`` (:class:`.sections.OneRead`), not from the log file: ``default_model`` and
    ``timestamps`` (the run's :class:`~cachectl.inputs.TimestampReader`) are what reading its requests takes.

    In one process, every version of the log (as it is, after the safe fixes, as each code of the full run left it,
    after all fixes) is measured in one sweep (:func:`.fix.measured_pass`); the report's pairs are the log's as it
    is, as the sweep compares them (:class:`PairTally`). With ``workers`` (:class:`cachectl.workers.Workers` of more
    than one job) a child measures the log as it is (its pairs too) in one sweep that feeds the provider and curve
    sections each line with its token IDs (those ``first_read`` packed for the fork analysis, where it packed them:
    the child renders no prompt again; else the tokens the child encoded), while this process finds the forks,
    rewrites the log and sweeps the fixes' versions (100,000 requests: a tenth less time than a child building the
    sections alone, 1.9-2.0 KB a request summed against 1.8; the safe fixes' version measured in a child instead was
    no faster, for a fifth more CPU; the sections read in a pass of their own before the sweep took the child a fifth
    more CPU, 12.2 s against 10.0 s on 20,000 requests).
    The report is the same as in one process (``workers`` None or of one job). ``progress``: pass ``workers.tick``
    (it is called in the children too). ``first_read`` (:class:`.fix.FirstRead`): what the lines' first read found (the
    conversations, the requests packed for the forks), not read from them again. ``sections_read``
    (:func:`.sections.sections_reader`): the provider and curve sections fed as the lines were first read (in one
    process: no read of the lines for them), not fed here."""
    from ...workers import Workers
    from .fix import assembled, forked, measured_pass, rewrites, started
    from .groups import left_out_note, line_models, log_models
    from .sections import feeding, sections_reader

    if tokenizer is None:
        raise CachectlError("a report compares the log's requests as tokens: pass `tokenizer`")
    if top < 1:
        raise CachectlError("`top` must be at least 1")
    workers = workers if workers is not None else Workers(jobs=1)
    fixed_lines, grouping, counter, measured = started(
        lines, options, tokenizer=tokenizer, table=table, source=source, progress=progress, first_read=first_read,
        counter=sections_read.text_counter if sections_read is not None else None)

    def side(fed: OneRead | None = None, measure_before: bool = False) -> tuple:
        first = tally = None
        if fed is None:  # (the sweep's token counter: the positions the fixes leave as they were are encoded once)
            fed = sections_reader(source=source, tokenizer=tokenizer, tokenizer_name=tokenizer_name, table=table,
                                  default_model=default_model, timestamps=timestamps, block_size=options.block_size,
                                  progress=progress, counter=counter, every=options.every)
            if measure_before:
                # one sweep of the log as it is: its measure and its pairs (the main sweep measures the fixes'), each
                # line fed to the sections as it goes, the curve taking the tokens the sweep encoded for the
                # line (the provider measure is the section's simulation, once it is done)
                tally, sections = PairTally(), fed
                first = measured_pass([], measured, fixed_lines, before=True,
                                      before_provider=lambda: sections.measure_before(len(lines)),
                                      pairs=feeding(_tallying(tally, lines, grouping), fed, lines, options),
                                      packed=first_read.packed if first_read is not None else None)[1]
            else:
                for ln in lines:
                    fed(ln)
        # (where the provider section read every line, the log before the fixes is that same simulation)
        before_provider = fed.measure_before(len(lines))
        costed = fed.costed()
        curve = fed.curve()
        return before_provider, None if costed is None else replace(costed, simulated=None), curve, first, tally

    # in a child (with two processes), beside the forks and rewrites: the log as it is, feeding the sections
    apart = sections_read is None and workers.jobs > 1
    side_job = workers.submit(side, measure_before=apart) if sections_read is None else None
    forks, fork_notes, rewrite = forked(fixed_lines, grouping, options, tokenizer=tokenizer, table=table,
                                        counter=counter, source=source, progress=progress, first_read=first_read)
    # (the report shows the tokens reused per fix code of the full run only)
    safe_options, full_options = replace(options, per_cause=False, list_unsafe=False), replace(options, unsafe=True)
    rws = rewrites(rewrite, full_options, safe_options, examples_only=True)  # (the safe one takes up the full one)
    if apart:  # (the fixes' versions measured while the child measures the log as it is)
        (full_pass, safe_pass), _ = measured_pass(rws, measured, fixed_lines, examples_only=True)
    before_provider, costed, curve, first, tally = side_job.result() if side_job is not None else side(sections_read)
    if not apart:
        # (one sweep measures every version: a line the fixes leave as it is is measured once for all of them; the
        # report's pairs are the log's as it is, compared there)
        tally = PairTally()
        (full_pass, safe_pass), first = measured_pass(rws, measured, fixed_lines, before=True,
                                                      before_provider=before_provider, examples_only=True,
                                                      pairs=_tallying(tally, lines, grouping),
                                                      packed=forks.requests if forks is not None else None)
    assert first is not None and tally is not None
    before, before_notes = first
    safe = assembled(fixed_lines, safe_options, grouping, forks, fork_notes, before, before_notes, safe_pass,
                     table=table, source=source, tokenizer=tokenizer)
    full = assembled(fixed_lines, full_options, grouping, forks, (), before, (), full_pass, table=table,
                     source=source, tokenizer=tokenizer)
    model_of = line_models(lines)
    r, price, losses = tallied(
        tally, source=source, tokenizer=tokenizer, tokenizer_name=tokenizer_name, table=table, costed=costed,
        curve=curve, block_size=options.block_size, top=top, price_model=price_model,
        fixes=before_after(safe, full, safe_applied=safe_pass.applied, full_applied=full_pass.applied),
        prompt_of=lambda line: lines[lines.index_of(line)].prompt,  # type: ignore[attr-defined]
        add_generation_prompt=options.add_generation_prompt, models=log_models(lines), model_of=model_of)
    left = left_out_note(lines)  # (lines of parts no tokenizer renders: said first)
    r = replace(r, notes=(left, *r.notes)) if left else r
    return with_forks(r, forks, losses, price, model_of) if forks is not None else r


def _tallying(tally: PairTally, lines: Sequence[LogLine], grouping: Any) -> Callable[..., None]:
    """The sweep's ``pairs`` (:func:`.measure.measure_versions`) feeding ``tally``: each line keyed by its
    conversation of ``grouping`` (named by the log's own ids where it has them: :func:`.shared_prefix.auto_records`),
    paired with the previous line of it."""
    from .shared_prefix import conversation_names

    names = None if grouping.how != "automatic" else conversation_names(lines, grouping.groups)
    groups, ends = grouping.groups, grouping.last_indices()
    open_line: dict[int, int] = {}   # conversation -> the line number of its last request so far

    def add(i: int, ln: LogLine, prev: Any, tok: Any, common: int, cause: str | None) -> None:
        key = ln.key if names is None else names[i]
        tally.request(key)
        g = groups[i]
        line_a = open_line.pop(g, None)
        if ends[g] != i:
            open_line[g] = ln.line
        if prev is not None:
            assert line_a is not None
            n_a, n_b = len(prev.ids), len(tok.ids)
            tally.pair(key, line_a, ln.line, n_a, n_b, common, common < min(n_a, n_b),
                       None if cause == "unexplained" else cause)
    return add


def _pair_again(key: Any, line_a: int, line_b: int, prompt_of: Callable[[int], Any], tokenizer: Any,
                block_size: int, context: int, add_generation_prompt: bool = False) -> PairResult:
    """The pair ``diff_log`` compared (lines ``line_a`` then ``line_b`` of conversation ``key``), compared again as
    it compares them."""
    from ..tokendiff import PairResult, diff_tokens

    pa, pb = prompt_of(line_a), prompt_of(line_b)
    if tokenizer is None:
        from ...tokenization import Tokenized

        ta, tb = Tokenized(pa, list(pa.ids)), Tokenized(pb, list(pb.ids))
    else:
        ta, tb = tokenizer.tokenize_many([pa, pb], add_generation_prompt=add_generation_prompt)
    d = diff_tokens(ta, tb, block_size=block_size, context=context, tokenizer=tokenizer)
    return PairResult(line_a=line_a, line_b=line_b, key=key, diff=d)
