"""``cachectl prompt-cost``: what provider prompt caching costs and saves."""

from __future__ import annotations

import os
from collections import deque
from typing import Annotated, Any, Optional

import typer

from ..errors import CachectlError, InputError, UsageError
from .common import (
    EXIT_OK,
    Format,
    FormatOpt,
    PricesOpt,
    Progress,
    TimeUnitOpt,
    TimeZoneOpt,
    TokenizerOpt,
    Ttl,
    _write_bytes,
    check_price_model,
    emit_json,
    handle_errors,
    iter_progress,
    plural,
    print_note,
    stdout,
    timestamp_note,
    timestamp_reader,
)
from .logformat import LogFormatOpt, log_format_name

HELP = """What provider prompt caching costs and saves.

\b
Modes:
  --usage RESPONSES.jsonl  audit logged responses (or their usage objects):
                           exact cost, with and without caching
  REQUESTS.jsonl           simulate a timed request log (Anthropic bodies with
                           cache_control, OpenAI bodies, or token layouts):
                           each request's usage counters and cost
  --prefix-tokens N ...    what-if in the shell: N calls sharing a prefix,
                           every D apart
  --list-models            the price table: the caching rule, source and date
                           per entry

A model is priced only by its own entry or an alias the table declares (dated snapshots, -latest): an unknown
name is refused with the close names; --model-as NAME prices unknown names as NAME, with a note.
"""


@handle_errors
def command(
    requests: Annotated[Optional[str], typer.Argument(
        metavar="REQUESTS.jsonl", help="Timed request log to simulate (- for stdin).", show_default=False)] = None,
    usage: Annotated[Optional[str], typer.Option(
        "--usage", metavar="RESPONSES.jsonl", help="Audit logged responses from their usage counters.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL", help="Provider model for lines that name none (and for what-if).")] = None,
    prices: PricesOpt = None,
    list_models: Annotated[bool, typer.Option("--list-models", help="Show the price table and exit.")] = False,
    model_as: Annotated[Optional[str], typer.Option(
        "--model-as", metavar="NAME", help="Price (and simulate) models the table does not know as NAME, "
                                           "with a note.")] = None,
    tokenizer: TokenizerOpt = None,
    count_with_api: Annotated[bool, typer.Option(
        "--count-with-api", help="Count tokens with Anthropic's count_tokens endpoint (key from ANTHROPIC_API_KEY; "
                                 "free, online, an estimate).")] = False,
    prefix_tokens: Annotated[Optional[int], typer.Option("--prefix-tokens", metavar="N", help="What-if: cached prefix tokens.")] = None,
    suffix_tokens: Annotated[int, typer.Option("--suffix-tokens", metavar="N", help="What-if: tokens after the prefix.")] = 0,
    output_tokens: Annotated[int, typer.Option("--output-tokens", metavar="N", help="What-if: output tokens per call.")] = 0,
    calls: Annotated[int, typer.Option("--calls", metavar="N", help="What-if: number of calls.")] = 1,
    every: Annotated[Optional[str], typer.Option(
        "--every", metavar="DURATION", help="What-if: time between calls (30s, 2m, 1h); simulate: spacing for "
                                            "lines without a timestamp.")] = None,
    ttl: Annotated[Ttl, typer.Option("--ttl", help="What-if: cache TTL of the prefix breakpoint.")] = Ttl.m5,
    time_unit: TimeUnitOpt = None,
    time_zone: TimeZoneOpt = None,
    log_format: LogFormatOpt = None,
    fmt: FormatOpt = Format.text,
) -> None:
    from ..engines.provider.prices import PriceTable
    from ..inputs import read_json_file

    table = PriceTable.load(read_json_file(prices) if prices else None)
    # REQUESTS.jsonl --usage OUTPUT.jsonl: a batch input joined to its output's usage by custom_id (simulate)
    joined = requests is not None and usage is not None
    modes = [m for m, on in (("list", list_models), ("audit", usage is not None and not joined),
                             ("simulate", requests is not None), ("what-if", prefix_tokens is not None)) if on]
    if len(modes) != 1:
        raise UsageError("choose one mode: --usage RESPONSES.jsonl, REQUESTS.jsonl, --prefix-tokens N (what-if), "
                         "or --list-models")
    if model_as is not None:
        check_price_model(table, model_as, "--model-as")
    if modes[0] == "list":
        _render_models(table, fmt)
        raise typer.Exit(EXIT_OK)
    # the rows go to the output as they are priced, and are not kept (memory bounded however long the log)
    out: _JsonOut | _TextOut = _JsonOut(modes[0]) if fmt is Format.json else _TextOut()
    stamps = timestamp_reader(time_unit, time_zone)  # (the audit's and the simulation's: one reader of the times)
    match modes[0]:
        case "what-if":
            assert prefix_tokens is not None  # the mode says so
            report = _what_if(table, model, prefix_tokens, suffix_tokens, output_tokens, calls, every, ttl, model_as)
            for q in report.requests:
                out.add(q)
        case "audit":
            assert usage is not None
            report = _audit(table, usage, model, model_as, out.add, log_format_name(log_format), stamps)
        case _:
            assert requests is not None
            report = _simulate(table, requests, model, model_as, tokenizer, count_with_api, every, stamps,
                               out.add, log_format_name(log_format), usage)
    out.finish(report)
    raise typer.Exit(EXIT_OK)


def _what_if(table, model: Optional[str], prefix_tokens: int, suffix_tokens: int, output_tokens: int, calls: int,
             every: Optional[str], ttl: Ttl, model_as: Optional[str]):
    from ..engines.provider import cache as promptcache

    if model is None:
        raise UsageError("what-if needs --model")
    if ttl not in ("5m", "1h"):
        raise UsageError("--ttl must be 5m or 1h")
    if calls > 1 and every is None:
        raise UsageError("what-if with several --calls needs --every DURATION (calls at the same moment "
                         "all miss: an entry is readable only once its writer has started)")
    return promptcache.what_if(table=table, model=model, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens,
                               output_tokens=output_tokens, calls=calls,
                               every=promptcache.parse_duration(every) if every else 0.0,
                               ttl=getattr(ttl, "value", ttl), model_as=model_as)


def _audit(table, usage: str, model: Optional[str], model_as: Optional[str], on_request,
           log_format: Optional[str] = None, stamps: Any = None):
    from ..engines.provider import cache as promptcache
    from ..inputs import display_name
    from ..inputs.formats import log_values

    try:
        return promptcache.audit_usage(log_values(usage, log_format), source=display_name(usage), table=table,
                                       default_model=model, model_as=model_as, keep_requests=False,
                                       on_request=on_request, timestamps=stamps)
    except InputError as exc:
        if not exc.message.startswith("this is a request, not a response"):
            raise
        raise InputError("a request, not a response: --usage audits logged responses (their usage counters); "
                         f"simulate a request log as the argument: cachectl prompt-cost {usage} --tokenizer T",
                         source=exc.source, line=exc.line) from None


def _joined(requests: str, usage: str, model: Optional[str], stamps, log_format: Optional[str] = None):
    """A batch input's requests, each with its billed usage from the batch output (joined by custom_id)."""
    from ..inputs import display_name, parse_request
    from ..inputs.formats import log_values
    from ..inputs.formats.openai_batch_output import join, usage_index

    source = display_name(requests)
    for line, value in join(log_values(requests, log_format), usage_index(usage), source=source,
                            output=display_name(usage)):
        yield parse_request(value, source=source, line=line, default_model=model, timestamps=stamps)


def _simulate(table, requests: str, model: Optional[str], model_as: Optional[str], tokenizer: Optional[str],
              count_with_api: bool, every: Optional[str], stamps: Any, on_request,
              log_format: Optional[str] = None, usage: Optional[str] = None):
    from ..engines.provider import cache as promptcache
    from ..inputs import display_name, read_requests

    text_counter = None
    token_source = "layout"
    if tokenizer is not None:
        from ..tokenization import load_tokenizer

        text_counter = promptcache.tokenizer_counter(load_tokenizer(tokenizer))
        token_source = f"tokenizer {tokenizer}"
    api = _anthropic_client() if count_with_api else None
    with Progress("prompt-cost: requests") as progress:
        report = promptcache.simulate_requests(
            iter_progress(_joined(requests, usage, model, stamps, log_format) if usage is not None else
                          read_requests(requests, default_model=model, timestamps=stamps, log_format=log_format),
                          progress),
            table=table, source=display_name(requests), text_counter=text_counter, api=api,
            every=promptcache.parse_duration(every) if every else None, token_source=token_source,
            model_as=model_as, keep_requests=False, on_request=on_request)
    timestamp_note(stamps)
    return report


command.__doc__ = HELP


def _anthropic_client():
    if not os.environ.get("ANTHROPIC_API_KEY") and not os.environ.get("ANTHROPIC_AUTH_TOKEN"):
        raise UsageError("--count-with-api needs ANTHROPIC_API_KEY in the environment")
    try:
        import anthropic
    except ImportError:
        raise UsageError("--count-with-api needs the anthropic package (pip install 'llm-cachectl[anthropic]')") from None
    from .common import api_timeout

    # errors (401, 429, 529, timeouts, no connection) become one line in common.provider_api_error
    timeout = api_timeout()
    return _Deadlined(anthropic.Anthropic(max_retries=2, timeout=timeout), 3 * timeout + 5)


class _Deadlined:
    """``client.messages.count_tokens`` whole within ``seconds`` a call: the SDK's timeout bounds each read, so a
    server (a proxy) that sends its answer a byte at a time was waited on without end. The call runs in a daemon
    thread; past the deadline it is left there (the command ends with one line). ``seconds``: three timeouts (the
    SDK tries three times) and its backoff."""

    def __init__(self, client: Any, seconds: float) -> None:
        self.messages, self._client, self._seconds = self, client, seconds

    def count_tokens(self, **kwargs: Any) -> Any:
        import threading

        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = self._client.messages.count_tokens(**kwargs)
            except BaseException as exc:  # raised in the caller's thread
                box["error"] = exc

        worker = threading.Thread(target=run, name="count_tokens", daemon=True)
        worker.start()
        worker.join(self._seconds)
        if worker.is_alive():
            raise CachectlError(f"--count-with-api: the Anthropic API did not finish its answer within "
                                f"{self._seconds:g} s (CACHECTL_API_TIMEOUT bounds each read, three tries): retry "
                                "later, or count tokens offline with --tokenizer, or give token layouts")
        if "error" in box:
            raise box["error"]
        return box["value"]


# ------------------------------------------------------------------------------------------- renderers


def _money(x: float) -> str:
    return f"${x:,.4f}" if abs(x) < 100 else f"${x:,.2f}"


def _render_models(table, fmt: Format) -> None:
    if fmt is Format.json:
        from dataclasses import asdict

        emit_json({"schema_version": 1, "models": [{**asdict(p), "rule": p.rule} for p in table.models.values()],
                   "not_shipped": table.not_shipped, "withheld": table.withheld})
        return
    from rich.table import Table

    t = Table(title="USD per million tokens", header_style="bold", box=None, pad_edge=False)
    for col in ("model", "provider", "caching rule", "input", "write", "1h write", "read", "output",
                "min tokens", "as of"):
        t.add_column(col, justify="left" if col in ("model", "provider", "caching rule", "as of") else "right")

    def f(v):
        return "-" if v is None else f"{v:g}"

    for p in table.models.values():
        # the default write: Anthropic 5m, OpenAI GPT-5.6+ 30m (its one write price)
        t.add_row(p.model, p.provider, p.rule, f(p.input), f(p.cache_write_5m if p.cache_write is None else
                                                           p.cache_write), f(p.cache_write_1h), f(p.cache_read),
                  f(p.output), f"{p.min_cacheable_tokens:,}", p.as_of)
    stdout.print(t)
    history = [line for p in table.models.values() for line in _history_lines(p)]
    if history:
        stdout.print("price history (a call with a date is priced at the rates in force that day, UTC; one without, "
                     "at today's):", soft_wrap=True, markup=False)
        for line in history:
            stdout.print(f"  {line}", soft_wrap=True, markup=False)
    last_turn = [p.model for p in table.models.values() if p.prior_thinking == "last_turn"]
    if last_turn:
        stdout.print("earlier turns' thinking blocks are stripped (and the cache from the first of them), keeping only "
                     f"the last assistant turn's, on: {', '.join(last_turn)}", soft_wrap=True, markup=False)
    for name, why in table.withheld.items():
        stdout.print(f"{name}: not priced: {why}", soft_wrap=True, markup=False)
    if table.not_shipped:
        stdout.print(f"not shipped: {table.not_shipped}", soft_wrap=True, markup=False)


def _history_lines(p) -> list[str]:
    """``--list-models``' lines of one entry's history: each earlier price set with its window and source, the
    day today's rates began, and the records that priced nothing (a cancelled change, an earlier docs revision)."""
    from datetime import date, timedelta

    def f(v):
        return "-" if v is None else f"{v:g}"

    lines = []
    for s in p.price_sets:
        last = (date.fromisoformat(s.effective_to) - timedelta(days=1)).isoformat()
        write = s.cache_write_5m if s.cache_write is None else s.cache_write
        what = (f"{p.model}: {s.effective_from} to {last}: input {f(s.input)}, write {f(write)}"
                + (f", 1h write {f(s.cache_write_1h)}" if s.cache_write_1h is not None else "")
                + f", read {f(s.cache_read)}, output {f(s.output)}")
        lines.append(what + "".join(f"; {x}" for x in (s.note, s.source) if x))
    if p.price_sets or p.effective_from:
        since = p.effective_from or p.price_sets[-1].effective_to
        lines.append(f"{p.model}: since {since}: today's rates (the table above)")
    for h in p.history:
        if "from" not in h:
            rest = ", ".join(f"{k} {v}" for k, v in h.items() if k not in ("note", "source"))
            lines.append(f"{p.model}: no date, not used to price calls: {h.get('note') or ''}"
                         + (f" ({rest})" if rest else ""))
    return lines


_MISS_LABEL = {"cold": "cold", "content_changed": "changed", "ttl_expired": "TTL expired",
               "lookback_exceeded": "lookback", "breakpoint_moved": "bp moved", "below_minimum": "below min",
               "concurrent": "concurrent", "no_breakpoint": "no marker", "scope_changed": "scope",
               "implicit_breakpoint_after_change": "implicit bp after change", "breakpoint_limit": "bp limit",
               "thinking_stripped": "thinking stripped"}


#: the JSON document of a report, in this order: these first, then ``requests``, then the other fields
_JSON_HEAD = ("schema_version", "mode")
#: report fields that are not in the JSON document (what the rows already say)
_JSON_LEFT_OUT = ("miss_tallies",)


class _JsonOut:
    """The report's JSON document (``emit_json``'s layout), its rows written as they are priced, so that none
    is kept: ``schema_version`` and ``mode``, then ``requests``, then the totals and the rest, known at the end.

    The first MiB is held back, so that an input error early in the log leaves stdout empty (as it did when the
    whole report was built first); past it, an error leaves a document cut short (and exit code 2)."""

    HOLD = 1 << 20
    CHUNK = 1 << 16

    def __init__(self, mode: str) -> None:
        import orjson

        self._dumps = orjson.dumps
        self._opt = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
        self._mode = mode
        self._buf = bytearray()
        self._held = True
        self._rows = 0

    def _write(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) >= (self.HOLD if self._held else self.CHUNK):
            self._held = False
            _write_bytes(bytes(self._buf))
            self._buf.clear()

    def _head(self) -> bytes:
        from ..engines.provider.cache import SCHEMA_VERSION

        head = self._dumps({"schema_version": SCHEMA_VERSION, "mode": self._mode}, option=self._opt)
        return head[:-2] + b',\n  "requests": ['

    def add(self, row) -> None:
        row_json = self._dumps(row, option=self._opt).replace(b"\n", b"\n    ")
        self._write((self._head() if not self._rows else b",") + b"\n    " + row_json)
        self._rows += 1

    def finish(self, report) -> None:
        from dataclasses import fields

        doc = _json_document(report)
        head = [doc.pop(k) for k in _JSON_HEAD]
        assert head == [report.schema_version, self._mode] and [f.name for f in fields(report)][:2] == list(_JSON_HEAD)
        doc.pop("requests")
        rest = self._dumps(doc, option=self._opt)
        self._write((self._head() + b"]" if not self._rows else b"\n  ]") + b"," + rest[1:] + b"\n")
        _write_bytes(bytes(self._buf))
        self._buf.clear()


def _json_document(report) -> dict[str, Any]:
    """The report's fields as the JSON document has them (its rows among them, if the report kept them)."""
    from dataclasses import fields

    return {f.name: getattr(report, f.name) for f in fields(report) if f.name not in _JSON_LEFT_OUT}


class _TextOut:
    """What the text report shows of the rows, gathered as they are priced: the first and last
    :data:`TABLE_ENDS` rows of a longer log in the table, and the miss and disagreement lines of the first
    :data:`DETAILED` requests that have any (then how many more have)."""

    TABLE_ENDS = 25
    DETAILED = 100

    def __init__(self) -> None:
        self.count = 0
        self.head: list = []
        self.tail: deque = deque(maxlen=self.TABLE_ENDS)
        self.recon = self.why = self.numbered = self.lined = False
        self.details: list[str] = []
        self.detailed = 0
        self.more_details = 0

    def add(self, q) -> None:
        self.count += 1
        if len(self.head) < 2 * self.TABLE_ENDS:
            self.head.append(q)
        self.tail.append(q)
        self.recon = self.recon or q.reconciliation is not None
        self.why = self.why or q.miss is not None
        self.numbered = self.numbered or q.line is None
        self.lined = self.lined or q.line is not None
        lines = _detail_lines(q)
        if lines and self.detailed < self.DETAILED:
            self.details += lines
            self.detailed += 1
        elif lines:
            self.more_details += 1

    def rows(self) -> list:
        return self.head if self.count <= 2 * self.TABLE_ENDS else [*self.head[:self.TABLE_ENDS], *self.tail]

    def finish(self, report) -> None:
        _render_report(report, self)


def _detail_lines(q) -> list[str]:
    """The lines the text report prints under the totals for one request: why it missed, why its bill disagrees."""
    out = []
    c = q.reconciliation
    where = f"line {q.line:,}" if q.line is not None else f"#{q.index + 1:,}"
    if q.miss is not None and q.miss.code not in ("cold",) and (c is None or not c.agree):
        out.append(f"miss at {where}: {q.miss.detail}")
    if c is not None and not c.agree and c.reason:
        out.append(f"disagree at {where}: {c.reason}")
    return out


def _render_report(r, seen: _TextOut) -> None:
    from rich.table import Table
    from rich.text import Text

    recon, why = seen.recon, seen.why
    t = Table(header_style="bold", box=None, pad_edge=False)
    # one index base: a row is named by its line of the log (1-based); a what-if call has no line, only its number
    # (from 1, as the lines count)
    numbered, lined = seen.numbered, seen.lined
    cols = [*(["#"] if numbered else []), *(["line"] if lined else []), "model", "input", "cache write", "cache read", "output", "cost", "uncached"]
    if why:
        cols.append("miss")
    if recon:
        cols += ["billed read/write", "agree"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("model", "miss", "agree") else "right")
    shown = seen.rows()
    ends = seen.TABLE_ENDS
    for i, q in enumerate(shown):
        if seen.count > 2 * ends and i == ends:
            gap = [""] * len(cols)
            gap[0], gap[cols.index("model")] = "...", f"{seen.count - 2 * ends:,} more"
            t.add_row(*gap)
        write = f"{q.cache_creation_input_tokens:,}"
        if q.cache_creation.get("ephemeral_1h_input_tokens"):
            write += f" ({q.cache_creation['ephemeral_1h_input_tokens']:,} 1h)"
        cells = [*([f"{q.index + 1:,}"] if numbered else []), *(["" if q.line is None else f"{q.line:,}"] if lined else []), q.model, f"{q.input_tokens:,}", write,
                 f"{q.cache_read_input_tokens:,}", f"{q.output_tokens:,}", _money(q.cost_usd),
                 _money(q.uncached_cost_usd)]
        if why:
            cells.append(_MISS_LABEL.get(q.miss.code, q.miss.code) if q.miss is not None else "")
        if recon:
            c = q.reconciliation
            cells += ["" if c is None else f"{c.billed['cache_read_input_tokens']:,}/"
                                           f"{c.billed['cache_creation_input_tokens']:,}",
                      "" if c is None else ("yes" if c.agree else Text("no", "red"))]
        t.add_row(*cells)
    stdout.print(t)
    hit = f"{r.hit_rate:.1%}" if r.hit_rate is not None else "n/a"
    label = " (estimate)" if r.estimate else ""
    effect = f"saves {_money(r.savings_usd)}" if r.savings_usd >= 0 else f"[red]costs {_money(-r.savings_usd)} more[/]"
    stdout.print(f"[bold]total {_money(r.total_cost_usd)}[/] vs {_money(r.uncached_cost_usd)} without caching: "
                 f"{effect}; cache hit rate {hit} of prompt tokens{label}", soft_wrap=True)
    if r.break_even_reads:  # 0: the write costs no premium, so there is nothing to pay back
        stdout.print(f"break-even: the prefix pays for its write after {plural(r.break_even_reads, 'read')}",
                     soft_wrap=True)
    if recon:
        stdout.print(f"billed {_money(r.billed_cost_usd or 0.0)}: {r.agreed:,} of {plural(r.reconciled, 'request')} agree with "
                     "the prediction", soft_wrap=True, markup=False)
    stdout.print(f"tokens from: {r.token_source}", soft_wrap=True, markup=False)
    for line in seen.details:
        stdout.print(line, soft_wrap=True, markup=False)
    if seen.more_details:
        stdout.print(f"... and {plural(seen.more_details, 'more request')} with a miss or a disagreement (--format "
                     "json lists every request)", soft_wrap=True, markup=False)
    for f in r.findings:
        lines = f" (lines {', '.join(map(str, f.lines[:8]))}{', ...' if len(f.lines) > 8 else ''})" if f.lines else ""
        stdout.print(f"finding {f.code}: {f.message}{lines}", soft_wrap=True, markup=False)
    for note in r.notes:
        print_note(note)
