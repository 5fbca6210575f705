"""The report's provider and capacity-curve sections (:mod:`.report`): each built from its engine's run over the
log (prompt-cost's simulation, simulate-prefix's capacity curve), and :class:`OneRead`, which feeds both from the
one read of the log's lines that the token diff makes, where each read the log file again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ...errors import InputError, MalformedInput
from .rows import AsPacked

if TYPE_CHECKING:
    from ...inputs import Request
    from ..prefix.trace import TraceRequest
    from ..provider.prices import PriceTable
    from .fix import FirstRead, FixOptions
    from .groups import LogLine

@dataclass(frozen=True)
class MissTally:
    code: str                  # prompt-cost's miss reason code
    requests: int
    uncached_input_tokens: int


@dataclass(frozen=True)
class CostSection:
    models: tuple[str, ...]
    token_source: str
    total_usd: float
    uncached_usd: float
    savings_usd: float
    hit_rate: float | None
    misses: tuple[MissTally, ...]
    findings: tuple[str, ...]
    notes: tuple[str, ...]
    #: with billed usage on the log's lines (any shape that carries it): the requests reconciled, how many of them
    #: agree with the prediction (read / no read, write / no write), and what the provider billed for them
    reconciled: int = 0
    agreed: int = 0
    billed_usd: float | None = None


@dataclass(frozen=True)
class CurveSection:
    block_size: int
    requests: int
    query_tokens: int
    ceiling_hit_rate: float | None      # no eviction
    ceiling_capacity_tokens: int
    min_capacity_tokens: int
    points: tuple[tuple[int, float], ...]   # (capacity in tokens, hit rate), the capacities that fit
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Costed:
    """The provider cache simulated over a log's requests: the report's section and the simulation's totals
    (None, with a note, where it could not run), and the requests it read."""

    section: CostSection | None
    simulated: Any = None       # the simulation's CostReport
    requests: int = 0
    notes: tuple[str, ...] = ()
    skipped: int = 0            # lines without a request body, not simulated


def cost_section(requests: Iterable[Request], table: PriceTable, source: str, text_counter: Any,
                 tokenizer_name: str, every: float | None = None) -> Costed:
    """prompt-cost's simulation over ``requests`` (with ``table``; ``every``: its ``every``), as the report's provider
    section; a log it cannot simulate (no model, no timestamps, out of order) gives a note, and the rest of the
    report stands."""
    feed = CostFeed(table, source, text_counter, tokenizer_name, batch=1, every=every)  # (it reads no request past an error)
    try:
        for req in requests:
            feed.add(req)
            if feed.error is not None:  # (the simulation stops at its first error: the rest is not read)
                break
    except InputError as exc:  # (reading the requests: the simulation stops there)
        feed.add(exc)
    return feed.result()


class CostFeed:
    """:func:`cost_section` fed one request at a time (:meth:`add`), in the caller's thread: an item that is an
    :class:`InputError` (a line that could not be read) stops the simulation there, as any error of a request
    does; :meth:`result` gives the section, or a note for an :class:`InputError` (what the log lacks), and raises
    any other error (a :class:`MalformedInput` among them).

    The requests are simulated :data:`BATCH` at a time, in order, their position texts encoded in one batch first
    (:meth:`~cachectl.engines.provider.cache.TextTokens.prime`): ``error`` says what stopped the simulation once
    the batch that holds it was simulated (``batch=1``: each request is simulated as it is added)."""

    #: requests held before they are simulated (their texts encoded together)
    BATCH = 128

    def __init__(self, table: PriceTable, source: str, text_counter: Any, tokenizer_name: str,
                 batch: int = BATCH, every: float | None = None) -> None:
        from ..provider.cache import CostRun

        self._run = CostRun(table=table, source=source, text_counter=text_counter, every=every,
                            token_source=f"tokenizer {tokenizer_name}" if text_counter is not None else "layout",
                            keep_requests=False)  # the misses in a few numbers, not a row per request
        self._prime = getattr(text_counter, "prime_requests", None)
        self._held: list[Request] = []
        self._batch = batch
        self.read = 0
        #: lines left out: no request body (said in the section's notes)
        self.skipped = 0
        self.error: Exception | None = None

    def add(self, item: Request | InputError) -> None:
        if self.error is not None:
            return
        if isinstance(item, InputError):
            self.flush()  # (the requests before it are simulated first: an error among them stops it there)
            if self.error is None:
                self.error = item
            return
        self._held.append(item)
        if len(self._held) >= self._batch:
            self.flush()

    def flush(self) -> None:
        """Simulate the requests held (up to the first that fails)."""
        held, self._held = self._held, []
        if self.error is not None or not held:
            return
        if self._prime is not None and len(held) > 1:
            self._prime(held)
        for req in held:
            self.read += 1
            try:
                self._run.add(req)
            except Exception as exc:  # noqa: BLE001 (raised, or noted, by result())
                self.error = exc
                return

    def result(self) -> Costed:
        self.flush()
        if not self.read and self.skipped:  # (a server's log: token IDs or texts, which no provider bills as such)
            return Costed(None, notes=(f"provider cache not simulated: none of the {self.skipped:,} lines is an API "
                                       "request body (each is a prompt's text or token IDs)",))
        try:
            if self.error is not None:
                raise self.error
            r = self._run.report()
        except MalformedInput:  # (a malformed value ends the run, as on a first read)
            raise
        except InputError as exc:
            return Costed(None, notes=(f"provider cache not simulated: {exc}",))
        misses = tuple(MissTally(code=c, requests=n, uncached_input_tokens=tok) for c, n, tok in r.miss_tallies)
        notes = r.notes + ((f"{self.skipped:,} line(s) without a request body (a prompt's text or token IDs) not "
                            "priced",) if self.skipped else ())
        return Costed(CostSection(models=r.models, token_source=r.token_source, total_usd=r.total_cost_usd,
                                  uncached_usd=r.uncached_cost_usd, savings_usd=r.savings_usd, hit_rate=r.hit_rate,
                                  misses=misses, findings=tuple(f.message for f in r.findings), notes=notes,
                                  reconciled=r.reconciled, agreed=r.agreed, billed_usd=r.billed_cost_usd),
                      r, self.read, skipped=self.skipped)


def curve_section(trace: Iterable[TraceRequest], block_size: int, points: int, source: str,
                  progress: Callable[[int], None] | None = None) -> CurveSection:
    return _curve_of(_keyed(block_size, source, trace), points, source, progress)


def _curve_of(kt: Any, points: int, source: str, progress: Callable[[int], None] | None = None) -> CurveSection:
    """The capacity curve of a keyed trace (:func:`~cachectl.engines.prefix.curve.key_trace`), as the report's
    section."""
    from ..prefix.curve import capacity_curve

    block_size = kt.block_size
    c = capacity_curve(kt, points=points, source=source, progress=progress)
    pts = tuple((p.capacity_tokens, p.hit_rate) for p in c.points if p.fits and p.hit_rate is not None)
    return CurveSection(block_size=block_size, requests=c.counted_requests, query_tokens=c.query_tokens,
                        ceiling_hit_rate=c.ceiling_hit_rate, ceiling_capacity_tokens=c.ceiling_capacity_blocks * block_size,
                        min_capacity_tokens=c.min_capacity_blocks * block_size, points=pts, notes=c.notes)


class OneRead:
    """The provider section and the capacity curve fed from one read of the log's lines (call it with each
    :class:`~.groups.LogLine` as the token diff reads it: :func:`.shared_prefix.auto_records`' ``each``), instead of
    each reading the log file again. A line's canonical request and prompt are those that read parsed: the provider
    section prices the requests ``fix``'s measures price (``default_model`` for a line that names none; a line
    without a request body left out, and counted in a note). The provider simulation and the curve's keying are fed as
    the lines come, in the reader's thread (:class:`CostFeed`, :class:`.measure._Pushed`); the curve's prompts are
    rendered here, by the reader, or their token IDs are taken from the caller (a line's ``tokens``: the sweep that
    measures the log as it is encoded them) or (``known``: the :class:`.shared_prefix.ForkLines` fed each line just
    before) from the batch the fork records tokenized. :meth:`costed` and :meth:`curve` give the sections once every
    line was fed; an error reading a line for the curve is raised by :meth:`curve`, as reading the trace for it
    raised it there."""

    def __init__(self, *, source: str, tokenizer: Any, tokenizer_name: str, table: PriceTable | None,
                 text_counter: Any, default_model: str | None, timestamps: Any, block_size: int, points: int = 16,
                 progress: Callable[[int], None] | None = None, known: Any = None, encoder: Any = None,
                 every: float | None = None, curve: bool = True) -> None:
        from ..prefix.curve import TraceKeyer
        from ..prefix.trace import TraceReader
        from .measure import _Pushed

        self._source, self._points, self._progress, self._model = source, points, progress, default_model
        #: the provider simulation's token counter (a run's other simulations may share it)
        self.text_counter = text_counter
        self._provider = (CostFeed(table, source, text_counter, tokenizer_name, every=every) if table is not None
                          else None)
        # (``encoder``: the thread the first read encodes on; :meth:`ahead` hands it the provider's texts to encode)
        self._encoder = encoder if self._provider is not None and hasattr(text_counter, "prime_requests") else None
        self._ahead: list[Request] = []
        # (``known``: the reader fed each line before this one, whose token IDs the curve takes:
        # :class:`.shared_prefix.ForkLines`; in batches as long as its, a batch of the curve's finds its lines there)
        self._known = known.known if known is not None else None
        #: id of a prompt -> (the prompt, add_generation_prompt, its token IDs), as the caller gave them with its line
        self._given: dict[int, tuple[Any, bool, Sequence[int]]] = {}
        # (``curve`` False: no reader, no keying; nothing is read for a curve)
        self._reader: Any = None
        self._keys: Any = None
        if curve:
            self._reader = TraceReader(source=source, tokenizer=_Known(tokenizer, self._ids_of),
                                       timestamps=timestamps,
                                       **({"batch_size": known.batch_size} if known is not None else {}))
            keyer = TraceKeyer([block_size], source=source)
            self._keys = _Pushed(keyer.add, lambda: keyer.result()[block_size])
        self._fed = 0                               # requests fed to the curve
        self._error: Exception | None = None        # reading a line for the curve
        self._costed: tuple[Costed | None] | None = None

    def _ids_of(self, prompt: Any, add_generation_prompt: bool) -> Sequence[int] | None:
        given = self._given.pop(id(prompt), None)
        if given is not None and given[0] is prompt and given[1] == add_generation_prompt:
            return given[2]
        return self._known(prompt, add_generation_prompt) if self._known is not None else None

    def ahead(self, ln: LogLine) -> None:
        """``ln`` as it is read, before it is fed (:meth:`.fix.FirstRead.then`): with an ``encoder``, the position
        texts of its request are encoded there, :data:`CostFeed.BATCH` requests at a time, and kept by the token
        counter, where the provider simulation finds them once the line is fed (the counter encodes what it does
        not find)."""
        if self._encoder is None or ln.request is None:
            return
        self._ahead.append(ln.request)
        if len(self._ahead) >= CostFeed.BATCH:
            self._encoder.submit(self.text_counter.prime_requests, self._ahead)
            self._ahead = []

    def __call__(self, ln: LogLine, tokens: tuple[bool, Sequence[int]] | None = None) -> None:
        """Feed ``ln``. ``tokens``: its prompt's token IDs where the caller has them (``(add_generation_prompt,
        ids)``): the curve takes them, not rendering and tokenizing the prompt again."""
        if self._provider is not None and self._provider.error is None:  # (it reads no more after an error)
            # the requests fix's measures price (groups.with_model): a line without a request body (a prompt's text
            # or token IDs) is left out, a bare chat list priced as the Chat request it is
            req = ln.request
            if req is None:
                self._provider.skipped += 1
            else:
                self._provider.add(replace(req, model=self._model) if self._model and not req.model else req)
        if self._error is None and self._keys is not None:
            value, prompt = ln.value, ln.prompt if ln.prompt.request is not None else None
            if isinstance(value, list):  # a bare chat list or token IDs: the trace reader wants an object
                value, prompt = {"messages" if ln.prompt.kind == "chat" else "tokens": value}, None
            if tokens is not None and prompt is not None:
                self._given[id(prompt)] = (prompt, *tokens)
            trace: list[TraceRequest] = []
            try:
                trace.extend(self._reader.feed((ln.line, value, True), prompt))
            except Exception as exc:  # noqa: BLE001 (raised by curve())
                self._error = exc
            if not self._reader.pending:  # (what the reader did not tokenize is not kept)
                self._given.clear()
            self._key(trace)

    def _key(self, trace: list[TraceRequest]) -> None:
        self._fed += len(trace)
        self._keys.put(trace)

    def costed(self) -> Costed | None:
        """The provider section (None without a price table)."""
        if self._costed is None:
            got = None
            if self._provider is not None:
                got = self._provider.result()
                self._provider = None  # (what the simulation held goes with it)
            self._costed = (got,)
        return self._costed[0]

    def measure_before(self, lines: int) -> Any:
        """The provider measure of the log as it is (:func:`.measure.provider_measure`), the one a sweep makes of its
        ``lines`` lines, where the simulation read every one of them (as a request, or left out without a request
        body); else None (a sweep then simulates them again)."""
        from .measure import provider_measure

        c = self.costed()
        return (provider_measure(c.simulated, c.requests, c.skipped)
                if c is not None and c.simulated is not None and c.requests + c.skipped == lines else None)

    def curve(self) -> CurveSection:
        """The capacity curve, once (the keyed trace it is read from, a few bytes a block of every request, is let
        go: the run goes on for minutes after)."""
        if self._keys is None:
            raise RuntimeError("the curve was made already, or this read makes none")
        trace: list[TraceRequest] = []
        if self._error is None:
            try:
                trace.extend(self._reader.end())
            except Exception as exc:  # noqa: BLE001
                self._error = exc
        self._key(trace)
        keys, self._keys = self._keys, None
        try:
            kt = keys.result()
        except Exception:
            if self._error is None or self._fed:  # (with nothing fed, the keying only says the trace is empty)
                raise
        if self._error is not None:
            raise self._error
        return _curve_of(kt, self._points, self._source, self._progress)


class _Known:
    """A tokenizer for the curve's reader that takes a prompt's token IDs where ``known(prompt,
    add_generation_prompt)`` has them (the fork records, which tokenized the same prompt objects just before), and
    tokenizes the others."""

    def __init__(self, tokenizer: Any, known: Callable[[Any, bool], Sequence[int] | None]) -> None:
        self._tok, self._known = tokenizer, known

    def tokenize_many(self, prompts: Sequence[Any], *, add_generation_prompt: bool = False) -> list[Any]:
        out: list[Any] = [None] * len(prompts)
        todo = []
        for i, p in enumerate(prompts):
            ids = self._known(p, add_generation_prompt)
            if ids is None:
                todo.append(i)
            else:
                out[i] = _Ids(ids)
        got = self._tok.tokenize_many([prompts[i] for i in todo], add_generation_prompt=add_generation_prompt) \
            if todo else ()
        for i, t in zip(todo, got):
            out[i] = t
        return out


@dataclass(frozen=True)
class _Ids:
    ids: Sequence[int]


def _keyed(block_size: int, source: str, trace: Iterable[TraceRequest]) -> Any:
    from ..prefix.curve import key_trace

    return key_trace(trace, [block_size], source=source)[block_size]


def sections_reader(*, source: str, tokenizer: Any, tokenizer_name: str, table: PriceTable | None,
                    default_model: str | None, timestamps: Any, block_size: int,
                    progress: Callable[[int], None] | None = None, counter: Any = None,
                    first_read: FirstRead | None = None, every: float | None = None, curve: bool = True) -> OneRead:
    """What feeds :func:`.report.log_report`'s provider and curve sections (a :class:`OneRead`, with the provider
    token counter the run's measures share: ``counter``, else a new one): call it with each line as it is read.
    ``first_read``: the run's :class:`.fix.FirstRead`, fed each line just before: the curve takes the token IDs its
    fork records tokenized. ``curve`` False: the provider simulation alone (``fix``'s measure of the log as it
    is: :meth:`OneRead.measure_before`)."""
    from .fix import measure_counter

    forks = first_read.forks if first_read is not None else None
    return OneRead(source=source, tokenizer=tokenizer, tokenizer_name=tokenizer_name, table=table,
                   text_counter=counter if counter is not None else measure_counter(tokenizer),
                   default_model=default_model, timestamps=timestamps, block_size=block_size, progress=progress,
                   known=forks, encoder=first_read.encoder if first_read is not None else None, every=every,
                   curve=curve)


def provider_read(first: FirstRead, options: FixOptions, tokenizer: Any, tokenizer_name: str | None, *, table: Any,
                  source: str = "", timestamps: Any = None) -> OneRead | None:
    """The provider cache simulated over the lines as ``first`` reads them (each once its batch is packed; its texts
    handed to the encoding thread as it is read), as ``report``'s provider section is: pass it to :func:`.fix.fix_log`
    (``provider_read``), whose measure of the log as it is takes it. None where ``first`` packs no requests for the
    fork analysis (no tokenizer; ``--ray``)."""
    if tokenizer is None or tokenizer_name is None or first.forks is None:
        return None
    fed = sections_reader(source=source, tokenizer=tokenizer, tokenizer_name=tokenizer_name, table=table,
                          default_model=options.model, timestamps=timestamps, block_size=options.block_size,
                          first_read=first, every=options.every, curve=False)
    first.then(fed, ahead=fed.ahead)
    return fed


def feeding(pairs: Callable[..., None], fed: OneRead, lines: Sequence[LogLine], options: FixOptions
            ) -> Callable[..., None]:
    """The sweep's ``pairs`` (:func:`.measure.measure_versions`, the log as it is) calling ``pairs``, then feeding
    each line to the sections (``fed``) with the token IDs the sweep encoded, or took from the first read's packed
    requests (:class:`.rows.AsPacked`: the line store's line is fed, with those IDs). A line read with
    ``options.model`` is not the log's own: the log's is fed, with the same IDs (the model prices the request; the
    prompt is the log's)."""
    agp = options.add_generation_prompt

    def add(i: int, ln: LogLine, prev: Any, tok: Any, common: int, cause: str | None) -> None:
        pairs(i, ln, prev, tok, common, cause)
        fed(ln if options.model is None and type(ln) is not AsPacked else lines[i], (agp, tok.ids))
    return add
