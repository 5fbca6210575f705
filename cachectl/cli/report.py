"""``cachectl report``: one report over a request log (diff-tokens, prompt-cost and simulate-prefix joined),
as text, JSON, or one self-contained HTML page."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from .. import __version__
from ..errors import UsageError
from .common import (
    EXIT_FINDING,
    EXIT_OK,
    BlockSizeOpt,
    ChatTemplateOpt,
    EveryOpt,
    Format,
    FormatOpt,
    JobsOpt,
    PricesOpt,
    Progress,
    RayRenderOpt,
    TimeUnit,
    TimeUnitOpt,
    TimeZoneOpt,
    WindowOpt,
    check_output,
    check_price_model,
    emit_json,
    flags_for_params,
    handle_errors,
    iter_progress,
    parse_every,
    parse_window,
    plural,
    print_note,
    run_inputs,
    shown_name,
    stdout,
    timestamp_note,
    timestamp_reader,
)
from .logformat import LogFormatOpt, log_format_name

HELP = """One page over a request log: what its caches missed.

The tokens a prefix cache could have reused and did not, per
cause (diff-tokens --log), the worst conversations with their token diff side by side, the provider cache's
cost and misses (prompt-cost, with the model's prices) and the vLLM prefix hit rate against capacity
(simulate-prefix --curve), and what `cachectl fix` would gain: the log measured before, after the safe fixes
and after all fixes (unsafe ones too). Without --key, requests are grouped into conversations automatically
(a request joins the conversation whose last request it extends, within --window), as fix does.

Across requests: the log's shared-prefix tree (every request, whatever its conversation) and its forks, where
requests that share a prefix split (a clock line, a request id, a user's e-mail, tools in another order), each
with its cause and the tokens a counterfactual replay recovers; the headline's lost tokens add what the forks
cost beyond each request's within-conversation loss (a request's tokens are counted once).

--html FILE writes one self-contained page (inline CSS and SVG, no script, no network). The text summary goes
to stdout (--format json: the report's data). Exit codes: 0 when every request extends the previous one of
its conversation and no fork has a fix, 1 when prefix tokens were lost or a fork has a fix, 2 on bad input.

A Claude Code transcript (~/.claude/projects/<project>/<session>.jsonl, or a folder of them) gets its cache
timeline instead, without a tokenizer: per session, where cache reads broke and why (cold start, model switch,
compaction, a gap past the TTL, or a prefix rewritten mid-session), what each break cost, the hit rate, and
whether the 1-hour TTL would have been cheaper; exit 1 when breaks other than cold starts cost money.
"""


@handle_errors
def command(
    log: Annotated[str, typer.Argument(metavar="LOG.jsonl", help="Logged requests: cachectl's JSON lines or any "
                                                               "log shape it reads (a folder, a cassette too; "
                                                               "--log-format).",
                                       show_default=False)],
    tokenizer: Annotated[Optional[str], typer.Option(
        "--tokenizer", "-t", metavar="T", help="Required: model directory, tokenizer.json, or a Hugging Face id "
                                               "already in the local cache (never downloaded).")] = None,
    key: Annotated[Optional[str], typer.Option(
        "--key", "--session-field", metavar="FIELD", help="Conversation key field (dotted path, e.g. metadata.session); "
                                       "default: conversations found automatically.")] = None,
    window: WindowOpt = "30m",
    every: EveryOpt = None,
    time_unit: TimeUnitOpt = None,
    time_zone: TimeZoneOpt = None,
    chat_template: ChatTemplateOpt = None,
    model: Annotated[Optional[str], typer.Option(
        "--model", "-m", metavar="MODEL", help="Price table model for requests that name none (and whose prices "
                                               "turn lost tokens into dollars).")] = None,
    prices: PricesOpt = None,
    html: Annotated[Optional[str], typer.Option("--html", metavar="FILE.html",
                                                help="Write the report as one self-contained HTML page.")] = None,
    block_size: BlockSizeOpt = 16,
    top: Annotated[int, typer.Option("--top", min=1, help="Worst conversations shown.")] = 5,
    fmt: FormatOpt = Format.text,
    jobs: JobsOpt = None,
    ray: RayRenderOpt = None,
    log_format: LogFormatOpt = None,
) -> None:
    from ..inputs.files import display_name, spooled
    from ..inputs.formats import refuse_unread, shape_of
    from .transcript_view import is_transcript_log, report_transcript

    forced = log_format_name(log_format)
    if forced == "claude-code" or (forced in (None, "auto") and is_transcript_log(log)):
        # Claude Code transcripts (a file or a folder of them): their cache timeline
        if html is not None:  # (it was ignored: no page, no error)
            raise UsageError("--html draws a request log's report; a Claude Code transcript's cache timeline is text "
                             "or JSON (-f json)")
        report_transcript(log, fmt=fmt, model_as=model, top=top, prices=prices)
    if not tokenizer:
        raise UsageError("report needs --tokenizer (requests become tokens through its chat template)")
    if html is not None:  # before anything is read
        check_output(html, "--html", run_inputs(log, tokenizer=tokenizer, chat_template=chat_template, prices=prices))
    # its shape is found from its first lines, then it is read: stdin or a pipe is copied once
    with spooled(log) as path:
        shape = forced if forced not in (None, "auto") else shape_of(path)
        refuse_unread(shape, "report", display_name(path))
        _report(path, tokenizer, key, window, chat_template, model, html, block_size, top, fmt, time_unit, jobs,
                shape, ray, every, prices, time_zone)


command.__doc__ = HELP


def _report(log: str, tokenizer: str, key: Optional[str], window: str, chat_template: Optional[str],
            model: Optional[str], html: Optional[str], block_size: int, top: int, fmt: Format,
            time_unit: Optional[TimeUnit] = None, jobs: Optional[int] = None, shape: str = "native",
            ray: Optional[str] = None, every: Optional[str] = None, prices: Optional[str] = None,
            time_zone: Optional[str] = None) -> None:
    from dataclasses import replace

    from ..engines.provider.prices import PriceTable
    from ..engines.repair import fix, report
    from ..engines.repair.groups import log_lines
    from ..engines.repair.sections import sections_reader
    from ..inputs import display_name, read_json_file
    from ..inputs.formats import REWRITABLE, SHAPES, log_values, rewritable
    from ..tokenization import load_tokenizer
    from ..workers import Workers

    tok = load_tokenizer(tokenizer, chat_template_file=chat_template)
    table = PriceTable.load(read_json_file(prices) if prices else None)
    check_price_model(table, model)
    source = display_name(log)
    options = fix.FixOptions(key=key, window_s=parse_window(window), block_size=block_size, model=model,
                             every=parse_every(every))
    stamps = timestamp_reader(time_unit, time_zone)
    with Progress("report: lines read, rewritten, compared and replayed") as progress, \
            Workers(jobs, progress=progress.advance, say=print_note) as workers:
        # fix's reader and grouping: conversations by --key, else found automatically, as the lines are read; the
        # requests packed for the fork analysis as they are read too (with --ray: rendered on the cluster first)
        first = fix.FirstRead(options, tokenizer=tok, source=source, forks=ray is None)
        tick = workers.tick  # (a part computed in a child process ticks through its parent)
        sections = None
        if ray is None and workers.jobs == 1:  # (with a child, it reads the lines for them beside the forks)
            # the provider and curve sections fed as the lines are read (their token IDs: those the forks'
            # requests are packed with)
            sections = sections_reader(source=source, tokenizer=tok, tokenizer_name=tokenizer, table=table,
                                       default_model=model, timestamps=stamps, block_size=block_size, progress=tick,
                                       first_read=first, every=options.every)
            # (each line once its batch is packed: the curve takes its token IDs there; as it is read, the provider's
            # texts are handed to the encoding thread)
            first.then(sections, ahead=sections.ahead)
        lines = log_lines(iter_progress(log_values(log, shape), progress), source=source, key=key,
                          timestamps=stamps, each=first.add, leave_out=True)
        if ray is not None:  # (every part renders with the generation prompt, as a server does)
            from ..engines.repair.prefill import prefill

            prefill(lines, tok, generation_prompts=(True,), ray_address=ray, jobs=workers.jobs)
        # (the provider and curve sections read the lines read here, not the file again)
        result = report.log_report(lines, options, tokenizer=tok, tokenizer_name=tokenizer, table=table,
                                   source=source, default_model=model, timestamps=stamps, top=top,
                                   price_model=model, progress=tick, workers=workers, first_read=first,
                                   sections_read=sections)
    if result.fixes is not None and not rewritable(shape):  # (the fixes are real; this log is not theirs to rewrite)
        result = replace(result, notes=(*result.notes, f"the fixes are made where the requests are built: `cachectl "
                                        f"fix` rewrites {REWRITABLE}, not {SHAPES[shape].title}"))
    if html is not None:
        from ..outputs import write_text
        from .report_html import render

        write_text(html, render(result, __version__))
    if fmt is Format.json:
        emit_json(result)
    else:
        _render_text(result, html, rewritable(shape))
    timestamp_note(stamps)
    found = result.total_tokens_lost or result.tokens_lost or any(f.fixable for f in result.forks)
    raise typer.Exit(EXIT_FINDING if found else EXIT_OK)


def _which_rate(r: Any) -> None:
    """One line saying which of the headline percentages matters, and for whom."""
    def reuse(under: str) -> str:
        return "" if r.reuse_ratio is None else (f"; prefix reuse ({r.reuse_ratio:.1%}) is the cause under {under}: how "
                                                 "much of each request the previous one of its conversation sent")

    if r.cost is not None and r.cost.hit_rate is not None:
        stdout.print(f"which rate matters: the provider's hit rate ({r.cost.hit_rate:.1%}) sets the bill of API calls; "
                     "the vLLM rate is for a model you serve yourself" + reuse("both"),
                     soft_wrap=True, markup=False)
    elif r.curve is not None and r.curve.ceiling_hit_rate is not None:
        stdout.print(f"which rate matters: the vLLM hit rate ({r.curve.ceiling_hit_rate:.1%}), what a prefix cache of a "
                     "model you serve would hit (no provider cache was simulated)" + reuse("it"),
                     soft_wrap=True, markup=False)


def _usd(x: Any) -> str:
    return "n/a" if x is None else f"${x:,.4f}" if abs(x) < 100 else f"${x:,.2f}"


def _render_text(r, html: str | None, rewritten: bool = True) -> None:
    """``rewritten``: ``cachectl fix`` rewrites a log of this shape (else its fixes are said as made at the
    source)."""
    from rich.table import Table

    ratio = f"{r.reuse_ratio:.1%}" if r.reuse_ratio is not None else "n/a"
    how = "" if r.fixes is None else (" (by key)" if r.fixes.grouping.startswith("key") else " (found automatically)")
    stdout.print(f"{shown_name(r.source)}: {plural(r.requests, 'request')}, {plural(r.conversations, 'conversation')}{how}, "
                 f"{plural(r.pairs, 'pair')} "
                 f"(tokens from {r.tokenizer})", soft_wrap=True, markup=False)
    sp = r.shared_prefix
    lost = f"{r.tokens_lost:,} lost" if sp is None else (
        f"{r.total_tokens_lost:,} lost ({r.tokens_lost:,} within conversations, {sp.tokens_lost:,} more across "
        "requests)")
    money = r.usd_lost if sp is None else r.total_usd_lost
    stdout.print(f"prefix reuse: {r.reused_tokens:,} of {r.reusable_tokens:,} reusable tokens ({ratio}); "
                 + lost + (f", {_usd(money)} at {r.prices_named()}" if money is not None else ""),
                 soft_wrap=True, markup=False)
    if r.causes:
        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("cause", "pairs", "tokens lost", "dollars lost"):
            t.add_column(col, justify="left" if col == "cause" else "right")
        for c in r.causes:
            t.add_row(c.cause or "unexplained", f"{c.pairs:,}", f"{c.tokens_lost:,}", _usd(c.usd_lost))
        stdout.print(t)
    if sp is not None and r.forks:
        from .forks_view import print_forks

        stdout.print(f"shared prefix across requests: {plural(sp.fixable_forks, 'fork')} with a fix; vLLM hits {sp.hit_tokens:,} -> {sp.fixed_hit_tokens:,} tokens with them fixed "
                     "(no eviction)", soft_wrap=True, markup=False)
        print_forks(r.forks)
    if r.worst:
        stdout.print("worst conversations: " + ", ".join(f"{w.key} ({w.tokens_lost:,} tokens)" for w in r.worst),
                     soft_wrap=True, markup=False)
    if r.cost is not None:
        c = r.cost
        hit = f"{c.hit_rate:.1%}" if c.hit_rate is not None else "n/a"
        stdout.print(f"provider cache ({', '.join(c.models)}): {_usd(c.total_usd)} vs {_usd(c.uncached_usd)} without "
                     f"caching, hit rate {hit}", soft_wrap=True, markup=False)
        if c.reconciled:
            billed = f"{_usd(c.billed_usd)} billed" if c.billed_usd is not None else "billed"
            stdout.print(f"  against the logged usage: {billed} for {plural(c.reconciled, 'request')}; the prediction "
                         f"agrees on {c.agreed:,} (read or not, written or not)", soft_wrap=True, markup=False)
        for said in (*c.findings, *c.notes):  # (what the rate and the dollars rest on: a minimum, a batch rate)
            stdout.print(f"  {flags_for_params(said)}", soft_wrap=True, markup=False)
    if r.curve is not None:
        cv = r.curve
        ceil = f"{cv.ceiling_hit_rate:.1%}" if cv.ceiling_hit_rate is not None else "n/a"
        stdout.print(f"vLLM prefix cache (blocks of {cv.block_size:,}): {ceil} hit rate with no eviction, reached "
                     f"with {cv.ceiling_capacity_tokens:,} tokens of cache; "
                     f"{plural(len(cv.points), 'capacity', 'capacities')} on the curve",
                     soft_wrap=True, markup=False)
    _which_rate(r)
    if r.fixes is not None:
        before, safe, full = r.fixes.columns

        def rate(x: Any) -> str:
            return "n/a" if x is None else f"{x:.1%}"

        label = "cachectl fix" if rewritten else "fixed at the source"
        stdout.print(f"{label}: vLLM hit rate {rate(before.vllm_hit_rate)} -> {rate(safe.vllm_hit_rate)} (safe "
                     f"fixes) -> {rate(full.vllm_hit_rate)} (all fixes); provider {_usd(before.provider_cost_usd)} -> "
                     f"{_usd(safe.provider_cost_usd)} -> {_usd(full.provider_cost_usd)}", soft_wrap=True, markup=False)
    for note in r.notes:
        if not note.startswith("dollars lost:"):  # that one explains the page's estimate; the rest matter here
            print_note(note)
    if html is not None:
        stdout.print(f"wrote {shown_name(html)}", soft_wrap=True, markup=False)
