"""``cachectl fix``: rewrite a logged workload so that its cacheable prefix is stable, with the before/after."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ..errors import UsageError
from .common import (
    EXIT_FINDING,
    EXIT_OK,
    BlockSizeOpt,
    CapacityBlocksOpt,
    CapacityGibOpt,
    ChatTemplateOpt,
    Dtype,
    EveryOpt,
    Format,
    FormatOpt,
    JobsOpt,
    KvCapacity,
    KvDtypeOpt,
    PricesOpt,
    Progress,
    RayRenderOpt,
    TimeUnitOpt,
    TimeZoneOpt,
    TokenizerOpt,
    WindowOpt,
    check_output,
    check_price_model,
    emit_json,
    handle_errors,
    parse_every,
    parse_window,
    plural,
    print_note,
    run_inputs,
    shown_name,
    stderr,
    stdout,
    timestamp_note,
    timestamp_reader,
)
from .logformat import LogFormatOpt, log_format_name

if TYPE_CHECKING:  # pragma: no cover
    from ..engines.repair.fix import FixReport
    from ..engines.repair.measure import Measure
    from ..engines.repair.shared_prefix import CrossRequestGain

HELP = """Rewrite a request log so its cacheable prefix is stable.

LOG is JSONL: OpenAI Chat/Responses or Anthropic bodies, {timestamp, body, usage} wrappers, chat message
lists, raw-text prompts ({"prompt": ...}) or token IDs. One named fix per cause (FX001 volatile value moved to
the end, FX002 tool keys sorted, FX003 tool order, FX004 doubled BOS, FX005 reasoning kept out consistently,
FX006 cache breakpoints for Anthropic and OpenAI GPT-5.6+, FX007 per-user value moved to the end), each
labelled safe (the model sees the same content) or unsafe (content moves):
only safe fixes are applied unless --unsafe-fixes. --out writes the fixed log (each line keeps its shape and
every field); --diff shows the changes without writing. The log is measured before and after by the vLLM
replay (--tokenizer; --capacity-blocks or --capacity-gib with --model, else no eviction) and the provider
cache simulation (--model prices lines that name no model).

Conversations: --key FIELD, else requests are grouped automatically (a request joins the conversation whose
last request it extends, within --window). Exit code 0 when nothing needs fixing, 1 when fixes were found,
2 on bad input.
"""


@handle_errors
def command(
    log: Annotated[str, typer.Argument(metavar="LOG.jsonl", help="Logged requests (- for stdin).", show_default=False)],
    out: Annotated[Optional[str], typer.Option("--out", "-o", metavar="FIXED.jsonl",
                                               help="Write the fixed log here.")] = None,
    diff: Annotated[bool, typer.Option("--diff", help="Show each changed request, pretty-printed, as a diff before "
                                                      "the summary; write nothing (a review aid, not a patch: "
                                                      "--out writes the log).")] = False,
    unsafe_fixes: Annotated[bool, typer.Option("--unsafe-fixes", help="Also apply the fixes that move content "
                                                                     "the model sees.")] = False,
    select: Annotated[Optional[str], typer.Option("--select", metavar="CODES",
                                                  help="Only these fixes (comma-separated, e.g. FX001,FX002).")] = None,
    key: Annotated[Optional[str], typer.Option(
        "--key", "--session-field", metavar="FIELD", help="Conversation key field (dotted path, e.g. metadata.session); default: "
                                       "conversations are found automatically.")] = None,
    window: WindowOpt = "30m",
    every: EveryOpt = None,
    time_unit: TimeUnitOpt = None,
    time_zone: TimeZoneOpt = None,
    tokenizer: TokenizerOpt = None,
    chat_template: ChatTemplateOpt = None,
    block_size: BlockSizeOpt = 16,
    capacity_blocks: CapacityBlocksOpt = None,
    capacity_gib: CapacityGibOpt = None,
    dtype: KvDtypeOpt = Dtype.bf16,
    model: Annotated[Optional[str], typer.Option("--model", "-m", metavar="MODEL",
                                                 help="Provider model for lines that name none (prices, minimum "
                                                      "cacheable length); with --capacity-gib and no --kv-model, "
                                                      "also the model whose KV size is used.")] = None,
    kv_model: Annotated[Optional[str], typer.Option("--kv-model", metavar="MODEL",
                                                    help="For --capacity-gib: the served model (catalog name, "
                                                         "cached HF id, model directory, config.json or .gguf).")] = None,
    prices: PricesOpt = None,
    no_generation_prompt: Annotated[bool, typer.Option(
        "--no-generation-prompt", help="Tokenize chat requests without the assistant header (completion-style "
                                       "logs).")] = False,
    fmt: FormatOpt = Format.text,
    jobs: JobsOpt = None,
    ray: RayRenderOpt = None,
    log_format: LogFormatOpt = None,
) -> None:
    from ..engines.provider.prices import PriceTable
    from ..engines.repair import fix, fixes, sections
    from ..engines.repair.groups import log_lines
    from ..inputs import display_name, read_json_file
    from ..inputs.files import spooled
    from ..inputs.formats import raw_log_values
    from ..workers import Workers

    if diff and out:
        raise UsageError("--diff shows the changes without writing: drop --out (or --diff)")
    if out is not None:  # before anything is read: the log, the tokenizer, the template, the prices, a config
        check_output(out, "--out", run_inputs(log, tokenizer=tokenizer, chat_template=chat_template, prices=prices,
                                              models=(kv_model, model)))
    codes = None
    if select:
        codes = tuple(c.strip().upper() for c in select.split(",") if c.strip())
        bad = [c for c in codes if c not in fixes.FIXES]
        if bad:
            raise UsageError(f"--select: unknown fix code(s) {', '.join(bad)} (known: {', '.join(fixes.CODES)})")
    window_s, every_s, stamps = parse_window(window), parse_every(every), timestamp_reader(time_unit, time_zone)
    capacity = KvCapacity(capacity_blocks, capacity_gib, kv_model or model, dtype.value, block_size,
                          model_flag="--kv-model (or --model)")
    table = PriceTable.load(read_json_file(prices) if prices else None)
    if kv_model is not None or capacity_gib is None:  # else --model may name the architecture for --capacity-gib
        check_price_model(table, model)
    tok = None
    if tokenizer is not None:
        from ..tokenization import load_tokenizer

        tok = load_tokenizer(tokenizer, chat_template_file=chat_template)
    elif chat_template:
        raise UsageError("--chat-template needs --tokenizer")
    with contextlib.ExitStack() as stack:
        source = display_name(log)
        # --out: the log is read again as it is written (stdin or a pipe is copied once, to a temporary file)
        path = stack.enter_context(spooled(log)) if out is not None else log
        whole: list[bytes] = []  # a log of one line with no line end (one pretty-printed body): its bytes

        def records():  # each line parsed and checked before the next is read: the first bad line is the one named
            # one pretty-printed body is a log of one line; a shape whose lines are not requests is refused
            for lineno, line, value in raw_log_values(path, log_format_name(log_format), command="fix"):
                if lineno == 1 and not line.endswith(b"\n"):
                    whole.append(line)
                progress.advance()
                yield lineno, value

        options = fix.FixOptions(unsafe=unsafe_fixes, key=key, window_s=window_s, select=codes, block_size=block_size,
                                 capacity_blocks=capacity.blocks(block_size), model=model,
                                 add_generation_prompt=not no_generation_prompt, every=every_s)
        # full: what --unsafe-fixes would add, measured as report measures it (the log is not written so)
        with Progress("fix: lines read, rewritten and measured") as progress, \
                Workers(jobs, progress=progress.advance, say=print_note) as workers:
            # (read with the lines: conversations, the forks' requests and, in one process, the provider cache)
            first = fix.FirstRead(options, tokenizer=tok, source=source, forks=ray is None)
            provider = sections.provider_read(first, options, tok, tokenizer, table=table, source=source,
                                              timestamps=stamps) if workers.jobs == 1 else None
            lines = log_lines(records(), source=source, key=key, timestamps=stamps, each=first.add, leave_out=True)
            if ray is not None:
                _on_ray(lines, tok, options, ray, workers.jobs)
            report = fix.fix_log(lines, options, tokenizer=tok, table=table, source=source, progress=workers.tick,
                                 workers=workers, preview_unsafe=True, first_read=first, provider_read=provider)
            full = report.unsafe_preview
        changes = _changes(lines, report.output)
        changed = (_write(out, [(0, whole[0])] if whole else _raw_lines(path, lines), changes) if out is not None
                   else [i for i, _ in changes])
    if fmt is Format.json:
        emit_json({**report.to_dict(), "out": out, "changed_lines": [lines.line_number(i) for i in changed],
                   **({"with_unsafe_fixes": _preview(full)} if full is not None else {})})
        if diff:  # (stdout is the JSON document)
            stderr.print("cachectl: note: --diff shows with the text output; the JSON lists the lines rewritten "
                         "(changed_lines), and -o writes them", markup=False, highlight=False, soft_wrap=True)
    else:
        if diff:
            _render_diff(source, lines, report.output, changed)
        _render(report, out, len(changed), len(getattr(lines, "left_out", ())))
        if full is not None:
            _render_unsafe_preview(report, full)
    timestamp_note(stamps)
    raise typer.Exit(EXIT_FINDING if report.fixes else EXIT_OK)


command.__doc__ = HELP


def _raw_lines(path: str, lines: Any) -> Iterator[tuple[int | None, bytes]]:
    """``(i, bytes)`` of each line of the log ``path`` (read again) as the file holds it, blank lines and line 1's
    BOM too, ``i`` its index in ``lines`` (read from it), or None for a blank line or a line ``lines`` left out
    (:func:`~cachectl.engines.repair.groups.log_lines`' ``leave_out``): a log that changed in between is an
    error."""
    from ..errors import InputError
    from ..inputs import display_name
    from ..inputs.files import iter_raw_lines, line_text

    n = 0
    left = {exc.line for exc in lines.left_out}
    for lineno, raw, source in iter_raw_lines(path, every=True):
        if lineno in left or line_text(lineno, raw) is None:
            yield None, raw
            continue
        if n >= len(lines) or lines.line_number(n) != lineno:
            raise InputError("changed while it was being fixed (read it again)", source=source, line=lineno)
        yield n, raw
        n += 1
    if n != len(lines):
        raise InputError("changed while it was being fixed (read it again)", source=display_name(path))


def _on_ray(lines: Any, tok: Any, options: Any, address: str, jobs: int) -> None:
    """--ray: the log's chat prompts rendered and tokenized on the Ray cluster at ``address``, before the passes."""
    if tok is None:
        raise UsageError("--ray renders and tokenizes the log's prompts: it needs --tokenizer")
    from ..engines.repair.prefill import prefill

    prefill(lines, tok, generation_prompts=(options.add_generation_prompt,), ray_address=address, jobs=jobs)


def _changes(lines: Any, output: Any) -> Iterator[tuple[int, Any]]:
    """``(i, value)`` of each line whose rewritten value's JSON differs from its own, in order (a line no fix code
    rewrote is its original value: it is not read)."""
    edited = getattr(output, "changed", None)
    for i in range(len(output)):
        if edited is None or edited(i):
            value = output[i]
            if lines.differs(i, value):
                yield i, value


def _write(path: str, raw: Iterable[tuple[int | None, bytes]], changes: Iterator[tuple[int, Any]]) -> list[int]:
    """The log written once as its lines are read again, ``changes`` (:func:`_changes`) taken as they come:
    unchanged lines (blank ones too) are copied byte for byte; a rewritten line keeps the input's separators
    style, its own line end (``\r\n`` in a CRLF file; none on a last line without one) and line 1's BOM. The log
    reaches ``path`` whole or not at all (a temporary file renamed into place). The indices of the lines
    rewritten."""
    import json

    from ..inputs.files import BOM
    from ..outputs import atomic_write

    changed: list[int] = []
    nxt = next(changes, None)
    with atomic_write(path) as fh:
        for i, line in raw:
            if nxt is None or nxt[0] != i:  # (unchanged, blank, or a line left out)
                fh.write(line)
                continue
            spaced = b'": ' in line or b'", "' in line
            text = json.dumps(nxt[1], ensure_ascii=False, separators=(", ", ": ") if spaced else (",", ":"))
            end = b"\r\n" if line.endswith(b"\r\n") else b"\n" if line.endswith(b"\n") else b""
            fh.write((BOM if line.startswith(BOM) else b"") + text.encode("utf-8") + end)
            changed.append(i)
            nxt = next(changes, None)
    return changed


def _render_diff(source: str, lines: Any, values: Any, changed: list[int]) -> None:
    import difflib
    import json

    def rows(value: Any) -> list[str]:
        # a string's own newlines start new diff rows, so that a moved line shows as one
        return json.dumps(value, ensure_ascii=False, indent=2).replace("\\n", "\\n\n").splitlines()

    for i in changed:
        a, b = rows(lines[i].value), rows(values[i])
        for row in difflib.unified_diff(a, b, f"{shown_name(source)}:{lines[i].line}", f"{shown_name(source)}:{lines[i].line} (fixed)",
                                        n=1, lineterm=""):
            style = "green" if row.startswith("+") else "red" if row.startswith("-") else \
                "cyan" if row.startswith("@@") else ""
            if len(row) > 220:
                row = row[:217] + "..."
            stdout.print(row, style=style or None, markup=False, soft_wrap=True)


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _money(x: float) -> str:
    sign = "-" if x < 0 else ""
    return f"{sign}${abs(x):,.4f}" if abs(x) < 100 else f"{sign}${abs(x):,.2f}"


def _render(r: FixReport, out: Optional[str], changed: int, left_out: int = 0) -> None:
    from rich.table import Table

    g = r.grouping
    how = f"by {g.how}" if g.how != "automatic" else \
        f"found automatically (a request joins the conversation it extends, within {g.window_s:g} s)"
    stdout.print(f"{shown_name(r.source)}: {plural(r.requests, 'request')}, {plural(g.count, 'conversation')} {how}",
                 soft_wrap=True, markup=False)
    if r.fixes:
        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("line", "fix", "safety", "applied", "where", "what"):
            t.add_column(col, justify="right" if col == "line" else "left", overflow="fold")
        shown = r.fixes if len(r.fixes) <= MAX_ROWS else r.fixes[:MAX_ROWS // 2]
        for f in shown:
            t.add_row(f"{f.line:,}", f"{f.code} {f.name}", "safe" if f.safe else "unsafe", "yes" if f.applied else "no",
                      f.path, f.message)
        stdout.print(t)
        if len(shown) < len(r.fixes):
            stdout.print(f"... {len(r.fixes) - len(shown):,} more (--diff shows every change, --format json lists "
                         "every fix)", soft_wrap=True, markup=False)
    else:
        stdout.print("nothing to fix", markup=False)
    _render_measures(r.before, r.after)
    if r.cross_request is not None:
        _render_cross(r.cross_request)
    if r.per_cause:
        hits = any(c.vllm_hit_tokens is not None for c in r.per_cause)
        t = Table(title="tokens reused per fix (each applied after the ones above it)", header_style="bold",
                  box=None, pad_edge=False)
        for col in ("fix", "applied", "tokens reused") + (("vLLM hits",) if hits else ()) + (
                "provider cache reads", "provider saves"):
            t.add_column(col, justify="left" if col == "fix" else "right")
        for c in r.per_cause:
            t.add_row(f"{c.code} {c.name}", f"{c.fixes:,}", f"{c.reused_tokens:+,}",
                      *((f"{c.vllm_hit_tokens:+,}" if c.vllm_hit_tokens is not None else "",) if hits else ()),
                      "" if c.provider_read_tokens is None else f"{c.provider_read_tokens:+,}",
                      "" if c.provider_saved_usd is None else _money(c.provider_saved_usd))
        stdout.print(t)
    safe = sum(1 for f in r.fixes if f.applied and f.safe)
    unsafe = sum(1 for f in r.fixes if f.applied and not f.safe)
    line = f"{plural(len(r.fixes), 'fix')} found: {safe:,} safe and {unsafe:,} unsafe applied"
    if r.unsafe_skipped:
        line += f"; {r.unsafe_skipped:,} unsafe not applied (--unsafe-fixes)"
    stdout.print(line, soft_wrap=True, markup=False)
    if out is not None:
        # (a line left out is a line copied as it was: the count of rewritable lines does not hold it)
        kept = f"; {plural(left_out, 'line')} left out, copied as it was" if left_out else ""
        stdout.print(f"wrote {shown_name(out)} ({changed:,} of {plural(r.requests, 'request')} rewritten{kept})", soft_wrap=True,
                     markup=False)
    from .common import print_note

    for note in r.notes:
        print_note(note)


#: fix rows shown in the text table (half of them when there are more)
MAX_ROWS = 24


def _render_cross(c: CrossRequestGain) -> None:
    from .forks_view import print_forks

    fixable = [f for f in c.forks if f.fixable]
    stdout.print(f"across requests (the log's shared-prefix tree): {len(fixable)} fork{'s' if len(fixable) != 1 else ''}"
                 " with a fix", soft_wrap=True, markup=False)
    print_forks(fixable)
    if c.hit_tokens_before is None or c.hit_tokens_after is None:
        return
    line = (f"vLLM hits across requests: {c.hit_tokens_before:,.0f} -> {c.hit_tokens_after:,.0f} tokens with no "
            f"eviction (the tree's replay with every fork fixed: {c.predicted_hit_tokens:,})")
    if c.capacity_blocks is not None and c.hit_tokens_before_at_capacity is not None \
            and c.hit_tokens_after_at_capacity is not None:
        line += (f", {c.hit_tokens_before_at_capacity:,.0f} -> {c.hit_tokens_after_at_capacity:,.0f} at "
                 f"{c.capacity_blocks:,} blocks")
    if c.usd_saved is not None:
        at = (f"{c.price_model} prices" if c.price_model is not None
              else f"each request's model's prices ({', '.join(c.price_models)})")
        line += f"; {_money(c.usd_saved)} saved at {at} (input less cache read)"
    stdout.print(line, soft_wrap=True, markup=False)


def _preview(full: FixReport) -> dict:
    """What --unsafe-fixes would give (JSON): fixes applied, and the log measured after them."""
    m = full.after
    return {"applied": full.applied,
            "vllm_hit_rate": m.vllm.hit_rate if m is not None and m.vllm is not None else None,
            "provider_cost_usd": m.provider.cost_usd if m is not None and m.provider is not None else None}


def _render_unsafe_preview(r: FixReport, full: FixReport) -> None:
    """One line, as report's: the hit rate and cost before, after the safe fixes, and after all fixes."""
    def rate(m: Measure | None) -> str:
        return "n/a" if m is None or m.vllm is None else _pct(m.vllm.hit_rate)

    def cost(m: Measure | None) -> str:
        return "n/a" if m is None or m.provider is None else _money(m.provider.cost_usd)

    stdout.print(f"with --unsafe-fixes ({plural(r.unsafe_skipped, 'more fix', 'more fixes')}, which move content the "
                 f"model reads): vLLM hit rate {rate(r.before)} -> {rate(r.after)} (safe fixes) -> {rate(full.after)} "
                 f"(all fixes); provider {cost(r.before)} -> {cost(r.after)} -> {cost(full.after)}",
                 soft_wrap=True, markup=False)


def _render_measures(before: Measure | None, after: Measure | None) -> None:
    from rich.table import Table

    if before is None or after is None:
        return
    rows: list[tuple[str, str, str]] = []
    if before.vllm is not None and after.vllm is not None:
        v = before.vllm
        cap = "no eviction" if v.capacity_blocks is None else f"{v.capacity_blocks:,} blocks"
        rows.append((f"vLLM prefix hit rate (block size {v.block_size:,}, {cap})", _pct(v.hit_rate),
                     _pct(after.vllm.hit_rate)))
        rows.append(("vLLM prefill tokens saved", f"{v.hit_tokens:,.0f}", f"{after.vllm.hit_tokens:,.0f}"))
        if before.vllm_no_eviction is not None and after.vllm_no_eviction is not None:
            rows.append(("vLLM prefix hit rate (no eviction)", _pct(before.vllm_no_eviction.hit_rate),
                         _pct(after.vllm_no_eviction.hit_rate)))
    if before.pair_reused_tokens is not None and after.pair_reused_tokens is not None:
        rows.append(("tokens shared with the conversation's previous request", f"{before.pair_reused_tokens:,}",
                     f"{after.pair_reused_tokens:,}"))
    if before.provider is not None and after.provider is not None:
        p, q = before.provider, after.provider
        rows.append((f"provider cache read tokens ({plural(p.requests, 'request')})", f"{p.cache_read_tokens:,}",
                     f"{q.cache_read_tokens:,}"))
        rows.append(("provider cache write tokens", f"{p.cache_write_tokens:,}", f"{q.cache_write_tokens:,}"))
        rows.append(("provider cost (uncached)", f"{_money(p.cost_usd)} ({_money(p.uncached_cost_usd)})",
                     f"{_money(q.cost_usd)} ({_money(q.uncached_cost_usd)})"))
    if rows:
        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("", "before", "after"):
            t.add_column(col, justify="left" if not col else "right", overflow="fold")
        for row in rows:
            t.add_row(*row)
        stdout.print(t)
    if before.causes or after.causes:
        def causes(m: Measure) -> str:
            return ", ".join(f"{k} x{n}" for k, n in m.causes.items()) or "none"

        stdout.print(f"diff-tokens causes between consecutive requests: before {causes(before)}; after "
                     f"{causes(after)}", soft_wrap=True, markup=False)
