"""``cachectl report``: one report over a request log (diff-tokens, prompt-cost and simulate-prefix joined),
as text, JSON, or one self-contained HTML page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .. import __version__
from ..errors import InputError, UsageError
from .common import (
    EXIT_FINDING,
    EXIT_OK,
    BlockSizeOpt,
    ChatTemplateOpt,
    Format,
    FormatOpt,
    Progress,
    WindowOpt,
    check_output,
    check_price_model,
    emit_json,
    handle_errors,
    iter_progress,
    parse_window,
    stdout,
)

HELP = """One report over a JSONL request log: the tokens a prefix cache could have reused and did not, per
cause (diff-tokens --log), the worst conversations with their token diff side by side, the provider cache's
cost and misses (prompt-cost, with the model's prices) and the vLLM prefix hit rate against capacity
(simulate-prefix --curve), and what `cachectl fix` would gain: the log measured before, after the safe fixes
and after all fixes (unsafe ones too). Without --key, requests are grouped into conversations automatically
(a request joins the conversation whose last request it extends, within --window), as fix does.

--html FILE writes one self-contained page (inline CSS and SVG, no script, no network). The text summary goes
to stdout (--format json: the report's data). Exit codes: 0 when every request extends the previous one of
its conversation, 1 when prefix tokens were lost, 2 on bad input.
"""


def _trace_records(path: str) -> Iterator[tuple]:
    """simulate-prefix's trace records, with ISO 8601 timestamps read as seconds (gateway logs write them) and bare
    chat lists as ``{"messages": [...]}`` (diff-tokens' logs are often those)."""
    from ..engines.prefix.trace import trace_records
    from ..inputs import display_name
    from ..inputs.request import parse_timestamp

    for line, value, *rest in trace_records(path):
        if isinstance(value, list):  # a bare chat list: the trace reader wants an object
            value = {"messages": value}
        if isinstance(value, dict) and isinstance(value.get("timestamp"), str):
            try:
                value = {**value, "timestamp": parse_timestamp(value["timestamp"])}
            except ValueError as exc:
                raise InputError(str(exc), source=display_name(path), line=line, field="timestamp") from None
        yield (line, value, *rest)


@handle_errors
def command(
    log: Annotated[str, typer.Argument(metavar="LOG.jsonl", help="Logged requests, one JSON object per line.",
                                       show_default=False)],
    tokenizer: Annotated[Optional[str], typer.Option(
        "--tokenizer", "-t", metavar="T", help="Required: model directory, tokenizer.json, or a Hugging Face id "
                                               "already in the local cache (never downloaded).")] = None,
    key: Annotated[Optional[str], typer.Option(
        "--key", "--session-field", metavar="FIELD", help="Conversation key field (dotted path, e.g. metadata.session); "
                                       "default: conversations found automatically.")] = None,
    window: WindowOpt = "30m",
    chat_template: ChatTemplateOpt = None,
    model: Annotated[Optional[str], typer.Option(
        "--model", "-m", metavar="MODEL", help="Price table model for requests that name none (and whose prices "
                                               "turn lost tokens into dollars).")] = None,
    html: Annotated[Optional[str], typer.Option("--html", metavar="FILE.html",
                                                help="Write the report as one self-contained HTML page.")] = None,
    block_size: BlockSizeOpt = 16,
    top: Annotated[int, typer.Option("--top", min=1, help="Worst conversations shown.")] = 5,
    fmt: FormatOpt = Format.text,
) -> None:
    from dataclasses import replace

    from ..engines.prefix.trace import iter_trace
    from ..engines.provider import cache as promptcache
    from ..engines.provider.prices import PriceTable
    from ..engines.repair import fix, report
    from ..engines.repair.groups import log_lines
    from ..inputs import LogRecord, display_name, iter_jsonl, read_requests
    from ..tokenization import load_tokenizer

    if html is not None:
        check_output(html, "--html", log)
    if log == "-":
        raise UsageError("report reads the log three times (token diff, provider cache, prefix replay): give a file, "
                         "not stdin")
    if not tokenizer:
        raise UsageError("report needs --tokenizer (requests become tokens through its chat template)")
    tok = load_tokenizer(tokenizer, chat_template_file=chat_template)
    table = PriceTable.load()
    check_price_model(table, model)
    source = display_name(log)
    options = fix.FixOptions(key=key, window_s=parse_window(window), block_size=block_size, model=model)
    with Progress("report: lines read, rewritten, compared and replayed") as progress:
        # fix's reader and grouping: conversations by --key, else found automatically
        lines = log_lines(iter_progress(iter_jsonl(log), progress), source=source, key=key)
        tick = progress.advance
        safe = fix.fix_log(lines, options, tokenizer=tok, table=table, source=source, progress=tick)
        full = fix.fix_log(lines, replace(options, unsafe=True), tokenizer=tok, table=table, source=source,
                           reuse=safe, progress=tick)
        groups = safe.grouping.groups
        records = [LogRecord(line=ln.line, key=ln.key if key is not None else f"auto-{g + 1}", prompt=ln.prompt)
                   for ln, g in zip(lines, groups)]
        result = report.build_report(
            source=source, log=records, tokenizer=tok, tokenizer_name=tokenizer,
            fixes=report.before_after(safe, full),
            requests=iter_progress(read_requests(log, default_model=model), progress), table=table,
            trace=iter_trace(iter_progress(_trace_records(log), progress), source=source, tokenizer=tok),
            block_size=block_size, top=top, price_model=model, text_counter=promptcache.tokenizer_counter(tok),
            progress=tick)
    if html is not None:
        from .report_html import render

        try:
            Path(html).write_text(render(result, __version__), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write: {exc.strerror or exc}", source=html) from None
    if fmt is Format.json:
        emit_json(result)
    else:
        _render_text(result, html)
    raise typer.Exit(EXIT_FINDING if result.tokens_lost else EXIT_OK)


command.__doc__ = HELP


def _usd(x: Any) -> str:
    return "n/a" if x is None else f"${x:,.4f}" if abs(x) < 100 else f"${x:,.2f}"


def _render_text(r, html: str | None) -> None:
    from rich.table import Table

    ratio = f"{r.reuse_ratio:.1%}" if r.reuse_ratio is not None else "n/a"
    how = "" if r.fixes is None else (" (by key)" if r.fixes.grouping.startswith("key") else " (found automatically)")
    stdout.print(f"{r.source}: {r.requests} requests, {r.conversations} conversations{how}, {r.pairs} pairs "
                 f"(tokens from {r.tokenizer})", soft_wrap=True, markup=False)
    stdout.print(f"prefix reuse: {r.reused_tokens:,} of {r.reusable_tokens:,} reusable tokens ({ratio}); "
                 f"{r.tokens_lost:,} lost" + (f", {_usd(r.usd_lost)} at {r.price_model} prices" if r.usd_lost
                                               is not None else ""), soft_wrap=True, markup=False)
    if r.causes:
        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("cause", "pairs", "tokens lost", "dollars lost"):
            t.add_column(col, justify="left" if col == "cause" else "right")
        for c in r.causes:
            t.add_row(c.cause or "unexplained", str(c.pairs), f"{c.tokens_lost:,}", _usd(c.usd_lost))
        stdout.print(t)
    if r.worst:
        stdout.print("worst conversations: " + ", ".join(f"{w.key} ({w.tokens_lost:,} tokens)" for w in r.worst),
                     soft_wrap=True, markup=False)
    if r.cost is not None:
        c = r.cost
        hit = f"{c.hit_rate:.1%}" if c.hit_rate is not None else "n/a"
        stdout.print(f"provider cache ({', '.join(c.models)}): {_usd(c.total_usd)} vs {_usd(c.uncached_usd)} without "
                     f"caching, hit rate {hit}", soft_wrap=True, markup=False)
    if r.curve is not None:
        cv = r.curve
        ceil = f"{cv.ceiling_hit_rate:.1%}" if cv.ceiling_hit_rate is not None else "n/a"
        stdout.print(f"vLLM prefix cache (blocks of {cv.block_size}): {ceil} hit rate with no eviction "
                     f"({cv.ceiling_capacity_tokens:,} tokens); {len(cv.points)} capacities on the curve",
                     soft_wrap=True, markup=False)
    if r.fixes is not None:
        before, safe, full = r.fixes.columns

        def rate(x: Any) -> str:
            return "n/a" if x is None else f"{x:.1%}"

        stdout.print(f"cachectl fix: vLLM hit rate {rate(before.vllm_hit_rate)} -> {rate(safe.vllm_hit_rate)} (safe "
                     f"fixes) -> {rate(full.vllm_hit_rate)} (all fixes); provider {_usd(before.provider_cost_usd)} -> "
                     f"{_usd(safe.provider_cost_usd)} -> {_usd(full.provider_cost_usd)}", soft_wrap=True, markup=False)
    for note in r.notes:
        if not note.startswith("dollars lost:"):  # that one explains the page's estimate; the rest matter here
            stdout.print(f"note: {note}", soft_wrap=True, markup=False)
    if html is not None:
        stdout.print(f"wrote {html}", soft_wrap=True, markup=False)
