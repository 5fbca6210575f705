"""``cachectl lint``: CI lint of prompt templates and request bodies for cache-breaking patterns."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated

import typer

from .. import __version__
from ..errors import UsageError, printable
from .common import (
    EXIT_ERROR,
    EXIT_FINDING,
    EXIT_OK,
    Progress,
    TokenizerOpt,
    handle_errors,
    stdout,
)

HELP = """Lint templates and request bodies for what breaks caches.

The patterns that break prefix and prompt caches.

PATHs are Jinja prompt templates (.j2, .jinja, .prompt), chat templates (tokenizer_config.json,
chat_template.jinja), Anthropic/OpenAI request bodies (JSON or YAML), or directories of them.
Every file is reported: its findings, or one error line (file:line) when it could not be checked; the
others are checked all the same. Exit codes: the worst outcome, 0 clean, 1 findings, 2 when a file could
not be checked or a PATH holds no lintable file (--exit-zero: 0 with findings, still 2 on errors).
Ignore a rule on a line with a Jinja comment {# cachectl: ignore[CC001] #} on it or the line before;
configure in [tool.cachectl.lint] of pyproject.toml (select, ignore, per-file-ignores, model, tail-tokens,
render-timeout, render-memory). Each render of a template runs under a budget (5 s and 256 MB by default).
--fix applies the safe template fixes in place (CC006: tojson(sort_keys=true) on tool schemas) and prints
their unified diff, then reports what remains (exit 1 when findings remain); --diff prints the diff
without writing (exit 1 when there is something to fix), as ruff does.
"""


class LintFormat(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    github = "github"


@handle_errors
def command(
    paths: Annotated[list[str], typer.Argument(metavar="PATH", help="Templates, request bodies, or directories.", show_default=False)],
    fmt: Annotated[LintFormat, typer.Option("--format", "-f", case_sensitive=False,
                                            help="text, json, sarif (2.1.0) or github (workflow commands).")]
    = LintFormat.text,
    model: Annotated[str | None, typer.Option("--model", "-m", metavar="MODEL", help="Provider model, for the minimum cacheable "
                                                                       "length (CC005).")] = None,
    tokenizer: TokenizerOpt = None,
    select: Annotated[str | None, typer.Option("--select", metavar="IDS", help="Only these rules (comma-separated).")]
    = None,
    ignore: Annotated[str | None, typer.Option("--ignore", metavar="IDS", help="Skip these rules.")] = None,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even with findings (report only).")] = False,
    config: Annotated[str | None, typer.Option("--config", metavar="pyproject.toml",
                                                  help="Read [tool.cachectl.lint] from this file.")] = None,
    fix: Annotated[bool, typer.Option("--fix", help="Apply the safe template fixes in place and print their diff; "
                                                    "then report the findings that remain.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Print the diff of the safe fixes without writing them "
                                                      "(exit 1 when there is something to fix).")] = False,
    render_timeout: Annotated[float | None, typer.Option(
        "--render-timeout", metavar="SECONDS", show_default=False,
        help="Wall-clock budget of one render of a template [default: 5, or render-timeout in [tool.cachectl.lint]]; "
             "past it, the file is one error line and lint goes on.")] = None,
    render_memory: Annotated[int | None, typer.Option(
        "--render-memory", metavar="MB", show_default=False,
        help="Memory budget of one render of a template [default: 256, or render-memory in [tool.cachectl.lint]].")]
    = None,
) -> None:
    from .. import sandbox
    from ..engines import lint

    cfg = lint.load_config(config, select=(select or "").split(",") if select else (),
                           ignore=(ignore or "").split(",") if ignore else (), model=model,
                           render_timeout=render_timeout, render_memory=render_memory)
    sandbox.set_hard_stop(_hard_stop)
    min_tokens = None
    if cfg.model:
        from ..engines.provider.prices import PriceTable, UnknownModelError

        try:
            min_tokens = PriceTable.load().lookup(cfg.model).min_cacheable_tokens
        except UnknownModelError as exc:
            where = "--model" if model else f"{cfg.source}: field 'tool.cachectl.lint.model'"
            message = str(exc).split(" (see ")[0]  # lint has no --prices: point at the table prompt-cost shows
            raise UsageError(f"{where}: {message} (the known models: cachectl prompt-cost --list-models)") from None
    tok = None
    if tokenizer:
        from ..tokenization import load_tokenizer

        tok = load_tokenizer(tokenizer)
    if not paths:
        raise UsageError("lint needs at least one PATH")
    if diff:  # with or without --fix: nothing written
        raise typer.Exit(_show_diff(paths, cfg, fmt))
    unfixed = _apply_fixes(paths, cfg, fmt) if fix else False  # (a file lint reads but could not fix)
    with Progress("lint: files") as progress:
        report = lint.lint_paths(paths, cfg, tokenizer=tok, min_tokens=min_tokens, progress=progress.advance)
    _emit(report, fmt)
    code = 2 if unfixed else report.exit_code
    raise typer.Exit(EXIT_ERROR if code == 2 else EXIT_FINDING if code == 1 and not exit_zero else EXIT_OK)


command.__doc__ = HELP


def _show_diff(paths: list[str], cfg, fmt: LintFormat) -> int:
    """--diff, as ruff's: the diff of the safe fixes on stdout, nothing written; the exit code (1 when there is
    something to fix)."""
    from ..engines.lint import fix as lint_fix

    fixes = lint_fix.fix_paths(paths, cfg)
    patch = "".join(f.diff() for f in fixes.files)
    if fmt is LintFormat.json:  # per file: its fixes and its diff
        typer.echo(json.dumps({"files": [f.to_dict() for f in fixes.files],
                               "errors": [*fixes.errors, *fixes.skipped]}, indent=2, ensure_ascii=False))
    elif fmt is not LintFormat.text:
        raise UsageError(f"--diff prints a unified diff (or JSON with --format json), not {fmt.value}")
    elif patch:
        typer.echo(_patch_text(patch), nl=False)
    failed = [*fixes.errors, *fixes.skipped]
    for message in failed:  # one line each: the files that could not be read, parsed or fixed
        typer.echo(_line("error", message), err=True)
    for message in fixes.outside:  # a symlink out of the directory: not fixed
        typer.echo(_line("note", message), err=True)
    if not failed:
        typer.echo(f"{fixes.fixed} fixable finding(s) in {len(fixes.files)} file(s)"
                   + (" (not written: --diff)" if fixes.fixed else ""), err=True)
    _bodies_note(fixes)
    return EXIT_ERROR if failed else EXIT_FINDING if fixes.fixed else EXIT_OK


def _apply_fixes(paths: list[str], cfg, fmt: LintFormat) -> bool:
    """--fix: the safe fixes written in place and the diff of those written printed (before the findings that
    remain); whether a file could not be fixed (read, or written)."""
    from ..engines.lint import fix as lint_fix

    fixes = lint_fix.fix_paths(paths, cfg)
    written, failed = lint_fix.write_fixes(fixes)
    patch = "".join(f.diff() for f in written)
    for message in (*fixes.skipped, *failed):  # lint reports the files it cannot read; these it reads, unfixed
        typer.echo(_line("error", message), err=True)
    for message in fixes.outside:  # a symlink out of the directory: linted below, not rewritten
        typer.echo(_line("note", message), err=True)
    # the diff goes where it cannot corrupt machine output: stdout for text, stderr for the others
    if patch:
        typer.echo(_patch_text(patch, err=fmt is not LintFormat.text), nl=False, err=fmt is not LintFormat.text)
    fixed = sum(len(f.edits) for f in written)
    if fixed:
        typer.echo(f"fixed {fixed} finding(s) in {len(written)} file(s)", err=fmt is not LintFormat.text)
    _bodies_note(fixes)
    return bool(fixes.skipped or failed)


def _bodies_note(fixes) -> None:
    """--fix and --diff edit templates: the request bodies among the files are said to be cachectl fix's."""
    if fixes.bodies:
        from .common import plural

        typer.echo(_line("note", f"{plural(len(fixes.bodies), 'JSON or YAML file')} not edited: lint --fix fixes "
                                 "templates; cachectl fix applies the safe fixes of request bodies (their "
                                 "breakpoints, FX006) to a request log"), err=True)


def _emit(report, fmt: LintFormat) -> None:
    """The report in its format on stdout; the files that could not be checked on stderr, whatever the format."""
    from ..engines.lint import output as lint_output

    if fmt is LintFormat.json:
        typer.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    elif fmt is LintFormat.sarif:
        typer.echo(json.dumps(lint_output.to_sarif(report, __version__), indent=2, ensure_ascii=False))
    elif fmt is LintFormat.github:
        for e in report.errors:
            typer.echo(lint_output.github_error(e))
        for f in report.findings:
            typer.echo(lint_output.to_github(f))
    else:
        _render_text(report)
    for e in report.errors:  # one line each on stderr too, whatever the format
        typer.echo(_line("error", e.describe()), err=True)


def _hard_stop(message: str) -> None:
    """A render over budget that reaches no checkpoint (stuck inside one operation): one line, exit 2."""
    import os
    import sys

    sys.stderr.write(_line("error", message) + "\n")
    sys.stderr.flush()
    os._exit(EXIT_ERROR)


def _line(kind: str, message: str) -> str:
    """``cachectl: error: ...`` (or note) on one line, control characters from the files shown escaped."""
    from .common import flags_for_params

    return f"cachectl: {kind}: {printable(' '.join(flags_for_params(message).split()), newlines=False)}"


def _patch_text(patch: str, err: bool = False) -> str:
    """The unified diff as ``patch -p0`` applies it, byte for byte, into a file or a pipe; on a terminal, with
    the control characters of the templates shown escaped."""
    import sys

    stream = sys.stderr if err else sys.stdout
    return printable(patch) if stream.isatty() else patch


def _render_text(report) -> None:
    from rich.text import Text

    by_file: dict[str, list] = {}
    for f in report.findings:
        by_file.setdefault(f.path, []).append(f)
    # rich's Text drops some control characters (BEL, CR) where it is made: they are escaped before
    for path, items in by_file.items():
        # a name on one line: a file named "a\n::warning ...::x" prints no workflow command of its own
        stdout.print(Text(printable(path, newlines=False), "bold underline"))
        for f in sorted(items, key=lambda x: (x.line, x.column)):
            style = "red" if f.severity == "error" else "yellow"
            stdout.print(Text.assemble(f"  {f.line}:{f.column} ", (f.rule, f"bold {style}"),
                                       f" {printable(f.message)}"), soft_wrap=True)
            stdout.print(Text(printable(f"      fix: {f.fix} ({f.fix_label})"), "dim"), soft_wrap=True)
    n = len(report.findings)
    # "clean" only where every file could be checked
    summary = f"{report.checked} file(s) checked: " + (f"{n} finding(s)" if n else "no findings" if report.errors
                                                       else "clean")
    if report.errors:
        summary += f"; {len(report.errors)} error(s) on stderr: not everything could be checked"
    stdout.print(Text(summary, "bold red" if n or report.errors else "bold green"))
