"""``cachectl diff-tokens``: where two prompts stop matching, in token IDs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ..errors import InputError, UsageError, printable
if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

    from ..engines.tokendiff import LogSummary, PairResult, Side, StabilityReport, TokenDiff
from .common import (EXIT_FINDING, EXIT_OK, AsOpt, BlockSizeOpt, ChatTemplateOpt, Format, FormatOpt, Progress,
                     TemplateVarOpt, TimeUnitOpt, TimeZoneOpt, TokenizerOpt, emit_json, emit_jsonl, handle_errors,
                     iter_progress, parse_template_vars, plural, print_note, shown_name, stdout,
                     timestamp_reader)
from .logformat import LogFormatOpt, log_format_name

HELP = """Where two prompts stop matching in token space, and why.

A and B are files (or - for stdin), each a raw text prompt, a JSON chat message list, an OpenAI or
Anthropic request body, or a JSON list of token IDs. With --text, A and B are the prompts themselves:
diff-tokens --text "hello world" "hello there" (raw text; --as chat|openai|anthropic|ids reads them as that
JSON); --as ids '[1,2,3]' '[1,2,4]' reads a JSON list given in place of a file. Chat inputs are rendered
through the tokenizer's own chat template. Exit code 0 when the token IDs are identical, 1 when they differ, 2 on bad input.

Modes: two files (A B); --log FILE.jsonl pairs each request with the previous one of its conversation
(--key FIELD, else conversations found automatically as fix and report find them) and summarizes the forks
of the log's shared prefix across requests; --stability CONVERSATION.json checks that each turn's render is a
token prefix of the next.
"""


@handle_errors
def command(
    a: Annotated[Optional[str], typer.Argument(metavar="A", help="First prompt (the earlier request), or - for stdin.",
                                               show_default=False)] = None,
    b: Annotated[Optional[str], typer.Argument(metavar="B", help="Second prompt (the later request).", show_default=False)] = None,
    tokenizer: TokenizerOpt = None,
    chat_template: ChatTemplateOpt = None,
    block_size: BlockSizeOpt = 16,
    context: Annotated[int, typer.Option("--context", min=0, help="Tokens of context around the divergence.")] = 6,
    add_generation_prompt: Annotated[bool, typer.Option(
        "--add-generation-prompt", help="Render chat inputs with the assistant generation prompt.")] = False,
    special_tokens: Annotated[bool, typer.Option(
        "--special-tokens/--no-special-tokens",
        help="Add the tokenizer's special tokens (BOS...) when encoding raw text, as a completions API does.")] = True,
    as_kind: AsOpt = None,
    inline: Annotated[bool, typer.Option(
        "--text", help="A and B are the prompts themselves, not files: raw text, or with --as the JSON of that "
                       "kind.")] = False,
    template_var: TemplateVarOpt = None,
    log: Annotated[Optional[str], typer.Option(
        "--log", metavar="FILE.jsonl", help="Batch mode: compare each logged request with the previous one.")] = None,
    key: Annotated[Optional[str], typer.Option(
        "--key", "--session-field", metavar="FIELD",
        help="With --log: conversation key field (dotted path, e.g. metadata.session); default: conversations "
             "found automatically, as fix and report find them. --session-field is the same, named as in "
             "simulate-prefix.")] = None,
    max_open: Annotated[int, typer.Option(
        "--max-open", min=1, help="With --log: conversations remembered at once (least recently seen "
                                  "forgotten first).")] = 10_000,
    stability: Annotated[Optional[str], typer.Option(
        "--stability", metavar="CONVERSATION.json",
        help="Check that rendering turns[:k] is a token prefix of rendering turns[:k+1] for every k.")] = None,
    fmt: FormatOpt = Format.text,
    log_format: LogFormatOpt = None,
    time_unit: TimeUnitOpt = None,
    time_zone: TimeZoneOpt = None,
) -> None:
    # Imported here, not at the top: `cachectl --help` and the other commands start without them.
    from ..engines import tokendiff
    from ..inputs import iter_log, read_prompt
    from ..tokenization import Tokenized, load_tokenizer

    modes = sum(x is not None for x in (log, stability)) + (a is not None or b is not None)
    if modes != 1:
        raise UsageError("give two prompts A B, or --log FILE.jsonl, or --stability CONVERSATION.json "
                         "(exactly one of these)")
    kind = as_kind.value if as_kind is not None else None
    tvars = parse_template_vars(template_var)
    tok = load_tokenizer(tokenizer, chat_template_file=chat_template) if tokenizer else None
    if chat_template and not tokenizer:
        raise UsageError("--chat-template needs --tokenizer")

    if stability is not None:
        if tok is None:
            raise UsageError("--stability needs --tokenizer (a tokenizer with a chat template)")
        report = tokendiff.check_stability(read_prompt(stability, kind), tok, block_size=block_size,
                                           context=context, template_vars=tvars)
        _render_stability(report, fmt)
        raise typer.Exit(EXIT_OK if report.stable else EXIT_FINDING)

    if log is not None:
        mismatches = 0
        forks = None
        ends = None
        stamps = timestamp_reader(time_unit, time_zone)
        with Progress("requests") as progress:
            if key is None:  # fix's and report's grouping, and the log's shared prefix across requests
                forks, records, ends = _auto_log(log, tok, block_size, add_generation_prompt, fmt,
                                                 log_format_name(log_format), stamps)
            else:
                records = iter_log(log, key, kind, log_format_name(log_format), timestamps=stamps)
            for item in tokendiff.diff_log(iter_progress(records, progress), tok, block_size=block_size,
                                           context=context, add_generation_prompt=add_generation_prompt,
                                           add_special_tokens=special_tokens, template_vars=tvars,
                                           max_open=max_open, end_indices=ends):
                if isinstance(item, tokendiff.LogSummary):
                    if not item.requests:  # (lines of its shape, none a request: as fix and report say it)
                        from ..inputs import display_name

                        raise InputError("no requests", source=display_name(log))
                    if fmt is Format.json and forks is not None:
                        emit_jsonl({"record": "forks", **forks.report.to_dict()})
                    _render_log_summary(item, fmt)
                else:
                    mismatches += item.diff.kind == "mismatch"
                    _render_pair(item, fmt)
        if forks is not None and fmt is not Format.json:
            _render_forks(forks)
        found = mismatches or (forks is not None and forks.fixable)
        raise typer.Exit(EXIT_FINDING if found else EXIT_OK)

    if a is None or b is None:
        raise UsageError("diff-tokens needs two prompts, A and B")
    given = [flag for flag, value, default in (("--key", key, None), ("--max-open", max_open, 10_000),
                                               ("--log-format", log_format, None), ("--time-unit", time_unit, None),
                                               ("--time-zone", time_zone, None)) if value != default]
    if given:  # (they were taken and unused, bad values unchecked)
        raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to --log; two prompts A B "
                         "take none")
    if a == "-" and b == "-":
        raise UsageError("only one of A and B can be stdin (-)")
    pa, pb = _prompt(a, "A", kind, inline), _prompt(b, "B", kind, inline)
    for name, p in (("A", pa), ("B", pb)):
        if p.ids is None and tok is None:
            raise UsageError(f"{name} ({p.source}) is a {p.kind} prompt: pass --tokenizer to turn it into token IDs "
                             "(a model directory, a tokenizer.json, or a cached Hugging Face id)")
    if tok is not None:
        ta = tok.tokenize(pa, add_generation_prompt=add_generation_prompt, add_special_tokens=special_tokens,
                          template_vars=tvars)
        tb = tok.tokenize(pb, add_generation_prompt=add_generation_prompt, add_special_tokens=special_tokens,
                          template_vars=tvars)
    else:
        ta, tb = Tokenized(pa, list(pa.ids or ())), Tokenized(pb, list(pb.ids or ()))
    result = tokendiff.diff_tokens(ta, tb, block_size=block_size, context=context, tokenizer=tok)
    if fmt is Format.json:
        emit_json(result)
    else:
        _render_diff(result)
    raise typer.Exit(EXIT_FINDING if result.differs else EXIT_OK)


command.__doc__ = HELP


def _prompt(arg: str, name: str, kind: Optional[str], inline: bool) -> Any:
    """Prompt A or B: the file ``arg`` names, or with ``--text`` (or ``--as ids`` and a JSON list that is no
    file) the prompt written in ``arg`` itself."""
    import os

    from ..errors import InputError
    from ..inputs import prompt_from_document, read_prompt

    shown = arg if len(arg) <= 40 else arg[:37] + "..."
    if inline:
        from .common import utf8_arg

        return prompt_from_document(utf8_arg(arg, f"--text {name}"), repr(shown), kind or "text")
    if kind == "ids" and arg.lstrip().startswith("[") and not os.path.exists(arg):
        return prompt_from_document(arg, repr(shown), kind)
    try:
        return read_prompt(arg, kind)
    except InputError:
        if arg != "-" and not os.path.exists(arg):
            raise UsageError(f"{shown}: no such file (prompt {name}); to compare prompts written on the command "
                             "line, pass --text (raw text, or --as KIND for JSON)") from None
        raise

# -------------------------------------------------------------------------------------- renderers

_KIND_TEXT = {
    "identical": "identical",
    "a_prefix_of_b": "A is a token prefix of B",
    "b_prefix_of_a": "B is a token prefix of A",
    "mismatch": "mismatch",
}


def _blocks(n: int, size: int) -> str:
    return f"{plural(n, 'full block')} of {size:,}"


def _side_title(name: str, side: "Side") -> str:
    return f"{name}: {shown_name(side.source)} ({side.input_kind}, {plural(side.tokens, 'token')})"


def _render_diff(d: "TokenDiff") -> None:
    from rich.text import Text

    stdout.print(_side_title("A", d.a), markup=False)
    stdout.print(_side_title("B", d.b), markup=False)
    if d.kind == "identical":
        stdout.print(f"[green]identical[/]: {plural(d.tokens_a, 'token')}, {_blocks(d.reusable_blocks, d.block_size)}")
        return
    style = "red" if d.kind == "mismatch" else "yellow"
    stdout.print(f"[{style}]{_KIND_TEXT[d.kind]}[/] at token {d.first_diff_index:,}: common prefix "
                 f"{plural(d.common_prefix_tokens, 'token')} = {_blocks(d.reusable_blocks, d.block_size)} reusable")
    for name, side in (("A", d.a), ("B", d.b)):
        if side.location is not None:
            stdout.print(f"  {name} diverges at: {side.location.describe()}", markup=False)
    if d.cause is not None:
        stdout.print(Text.assemble(("cause: ", "bold"), (d.cause.id, "bold magenta"), f" - {printable(d.cause.message)}"),
                     soft_wrap=True)
    stdout.print(_window_table(d))


def _window_table(d: "TokenDiff") -> "Table":
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("index", "A id", "A token", "B id", "B token"):
        table.add_column(col, justify="right" if "id" in col or col == "index" else "left")
    start = min(d.a.window_start, d.b.window_start)
    stop = max(d.a.window_start + len(d.a.window_ids), d.b.window_start + len(d.b.window_ids))
    for i in range(start, stop):
        cells = [f"{i:,}"]  # a position; token ids are names, shown as they are
        for side in (d.a, d.b):
            j = i - side.window_start
            if 0 <= j < len(side.window_ids):
                cells += [str(side.window_ids[j]), side.window_tokens[j]]
            else:
                cells += ["", ""]
        style = "bold red" if i == d.first_diff_index else ("dim" if i < (d.first_diff_index or 0) else "")
        table.add_row(*(Text(printable(c)) for c in cells), style=style)  # escaped before Text drops BEL, CR
    return table


def _render_pair(p: "PairResult", fmt: Format) -> None:
    from rich.markup import escape

    if fmt is Format.json:
        emit_jsonl(p.to_json_obj())
        return
    d = p.diff
    key = escape(f" [{p.key}]") if p.key is not None else ""
    if d.kind == "mismatch":
        loc = escape(d.b.location.describe()) if d.b.location else ""
        cause = f" cause={d.cause.id}" if d.cause else ""
        stdout.print(f"line {p.line_b}{key}: [red]mismatch[/] at token {d.first_diff_index:,} of "
                     f"{d.tokens_b:,} (prefix {d.common_prefix_tokens:,}, {_blocks(d.reusable_blocks, d.block_size)}) {loc}{cause}",
                     soft_wrap=True)
    else:
        stdout.print(f"line {p.line_b}{key}: [green]{_KIND_TEXT[d.kind]}[/] ({plural(d.common_prefix_tokens, 'token')} reused)")


def _auto_log(log: str, tok, block_size: int, add_generation_prompt: bool, fmt: Format,
              log_format: Optional[str] = None, stamps: Any = None):
    """Without --key: the conversations found as fix and report find them (one grouping for the three), said
    before the pairs, and the log's shared-prefix analysis (its forks, summarized after the pairs)."""
    from ..engines.repair.groups import group_sessions, log_lines
    from ..engines.repair.shared_prefix import auto_records, log_forks
    from ..inputs import display_name
    from ..inputs.formats import log_values

    source = display_name(log)
    lines = log_lines(log_values(log, log_format, need_body=True), source=source, timestamps=stamps)
    if not lines:  # (lines of its shape, none a request: as fix and report say it)
        raise InputError("no requests", source=source)
    grouping = group_sessions(lines, tokenizer=tok)
    forks, notes = log_forks(lines, tokenizer=tok, block_size=block_size, add_generation_prompt=add_generation_prompt,
                             source=source)
    how = (f"a request joins the conversation whose last request it extends, within {grouping.window_s:g} s, as "
           "fix and report group; --key FIELD names them")
    if fmt is Format.json:
        emit_jsonl({"record": "grouping", "how": grouping.how, "conversations": grouping.count,
                    "window_s": grouping.window_s, "requests": len(lines), "notes": notes})
    else:
        stdout.print(f"{shown_name(source)}: {plural(len(lines), 'request')}, {plural(grouping.count, 'conversation')} found "
                     f"automatically ({how})", soft_wrap=True, markup=False)
        for note in notes:
            print_note(note)
    return forks, auto_records(lines, grouping), set(grouping.last_indices())


def _render_forks(forks) -> None:
    from .forks_view import print_forks

    r = forks.report
    if not r.forks:
        return
    fixable = sum(1 for f in r.forks if f.fixable)
    stdout.print()
    stdout.print(f"[bold]across requests: {len(r.forks)} fork{'s' if len(r.forks) != 1 else ''} in the shared "
                 f"prefix, {fixable} with a fix[/]" + (f" (vLLM hits {r.hit_tokens:,} -> {r.fixed_hit_tokens:,} tokens "
                                                       "with them fixed, no eviction; cachectl fix --unsafe-fixes "
                                                       "applies them)" if fixable else ""), soft_wrap=True)
    print_forks(r.forks)


def _render_log_summary(s: "LogSummary", fmt: Format) -> None:
    if fmt is Format.json:
        emit_jsonl(s.to_dict())
        return
    stdout.print()
    stdout.print(f"[bold]{plural(s.requests, 'request')}, {plural(s.conversations, 'conversation')}, "
                 f"{plural(s.pairs, 'pair')}[/]")
    stdout.print("  " + ", ".join(f"{_KIND_TEXT[k]}: {n:,}" for k, n in s.kinds.items()), soft_wrap=True)
    ratio = f"{s.reuse_ratio:.1%}" if s.reuse_ratio is not None else "n/a"
    stdout.print(f"  reusable {plural(s.reusable_tokens, 'token')}, reused {s.reused_tokens:,} ({ratio}); in full "
                 f"blocks of {s.block_size:,}: {s.reused_block_tokens:,}", soft_wrap=True)
    if s.kinds.get("mismatch"):
        stdout.print("  divergence point (share of the shorter prompt): " +
                     ", ".join(f"{h['bucket']}: {h['pairs']:,}" for h in s.divergence_histogram if h["pairs"]), soft_wrap=True)
    if s.evicted_conversations:
        stdout.print(f"  {plural(s.evicted_conversations, 'conversation')} forgotten (--max-open); their next request "
                     "counted as a new conversation", soft_wrap=True)
    if s.top_causes:
        stdout.print("  causes: " + ", ".join(f"{c['cause']} x{c['pairs']:,}" for c in s.top_causes), soft_wrap=True)


def _render_stability(r: "StabilityReport", fmt: Format) -> None:
    from rich.table import Table
    from rich.text import Text

    if fmt is Format.json:
        emit_json(r)
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("k", "adds", "tokens k", "tokens k+1", "result", "first diff", "cause"):
        table.add_column(col)
    for s in r.steps:
        result = Text("prefix", "green") if s.stable else Text("REWRITTEN", "bold red")
        cause = s.diff.cause.id if s.diff.cause else ""
        first = "" if s.stable else f"{s.diff.first_diff_index:,}"
        table.add_row(str(s.k), s.role_added, f"{s.tokens_prev:,}", f"{s.tokens_next:,}", result, first, cause)
    stdout.print(f"{shown_name(r.source)}: {plural(r.turns, 'message')}", markup=False)
    stdout.print(table)
    if r.stable:
        stdout.print("[green]stable[/]: every turn's render is a token prefix of the next")
    else:
        bad = next(s for s in r.steps if not s.stable)
        stdout.print(Text.assemble(
            ("unstable", "red"), f" at k={r.first_unstable_k}: adding message {bad.k} ({bad.role_added}) changes "
            f"earlier tokens at index {bad.diff.first_diff_index:,}" +
            (f" - {printable(bad.diff.cause.message)}" if bad.diff.cause else "")), soft_wrap=True)
