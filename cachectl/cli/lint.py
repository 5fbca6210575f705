"""``cachectl lint``: CI lint of prompt templates and request bodies for cache-breaking patterns."""

from __future__ import annotations

import json
from enum import Enum
from typing import Annotated, Optional

import typer

from .. import __version__
from ..errors import UsageError
from .common import EXIT_FINDING, EXIT_OK, TokenizerOpt, handle_errors, stdout

HELP = """Lint prompt templates and request bodies for patterns that break prefix and prompt caches.

PATHs are Jinja prompt templates (.j2, .jinja, .prompt), chat templates (tokenizer_config.json,
chat_template.jinja), Anthropic/OpenAI request bodies (JSON or YAML), or directories of them.
Exit codes: 0 clean, 1 findings, 2 tool or input error (--exit-zero: 0 with findings too).
Ignore a rule on a line with a Jinja comment {# cachectl: ignore[CC001] #} on it or the line before;
configure in [tool.cachectl.lint] of pyproject.toml (select, ignore, per-file-ignores, model, tail-tokens).
"""


class LintFormat(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"
    github = "github"


@handle_errors
def command(
    paths: Annotated[list[str], typer.Argument(help="Templates, request bodies, or directories.", show_default=False)],
    fmt: Annotated[LintFormat, typer.Option("--format", "-f", case_sensitive=False,
                                            help="text, json, sarif (2.1.0) or github (workflow commands).")]
    = LintFormat.text,
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="Provider model, for the minimum cacheable "
                                                                       "length (CC005).")] = None,
    tokenizer: TokenizerOpt = None,
    select: Annotated[Optional[str], typer.Option("--select", metavar="IDS", help="Only these rules (comma-separated).")]
    = None,
    ignore: Annotated[Optional[str], typer.Option("--ignore", metavar="IDS", help="Skip these rules.")] = None,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even with findings (report only).")] = False,
    config: Annotated[Optional[str], typer.Option("--config", metavar="pyproject.toml",
                                                  help="Read [tool.cachectl.lint] from this file.")] = None,
) -> None:
    from ..engines import lint

    cfg = lint.load_config(config, select=(select or "").split(",") if select else (),
                           ignore=(ignore or "").split(",") if ignore else (), model=model)
    min_tokens = None
    if cfg.model:
        from ..engines.pricing import PriceTable, UnknownModelError

        try:
            min_tokens = PriceTable.load().lookup(cfg.model).min_cacheable_tokens
        except UnknownModelError as exc:
            where = "--model" if model else f"{cfg.source}: field 'tool.cachectl.lint.model'"
            raise UsageError(f"{where}: {exc}") from None
    tok = None
    if tokenizer:
        from ..tokenization import load_tokenizer

        tok = load_tokenizer(tokenizer)
    if not paths:
        raise UsageError("lint needs at least one PATH")
    report = lint.lint_paths(paths, cfg, tokenizer=tok, min_tokens=min_tokens)
    if fmt is LintFormat.json:
        out = {"schema_version": report.schema_version, "files": report.files,
               "findings": [{"rule": f.rule, "severity": f.severity, "path": f.path, "line": f.line,
                             "column": f.column, "message": f.message, "fix": f.fix} for f in report.findings]}
        typer.echo(json.dumps(out, indent=2, ensure_ascii=False))
    elif fmt is LintFormat.sarif:
        typer.echo(json.dumps(to_sarif(report), indent=2, ensure_ascii=False))
    elif fmt is LintFormat.github:
        for f in report.findings:
            typer.echo(to_github(f))
    else:
        _render_text(report)
    raise typer.Exit(EXIT_FINDING if report.findings and not exit_zero else EXIT_OK)


command.__doc__ = HELP


def to_sarif(report) -> dict:
    from ..engines.lint import RULES

    ids = list(RULES)
    rules = [{"id": r.id, "name": r.name, "shortDescription": {"text": r.summary}, "fullDescription": {"text": r.summary},
              "help": {"text": r.fix}, "defaultConfiguration": {"level": r.severity}} for r in RULES.values()]
    results = [{"ruleId": f.rule, "ruleIndex": ids.index(f.rule), "level": f.severity,
                "message": {"text": f.message},
                "locations": [{"physicalLocation": {"artifactLocation": {"uri": f.path.replace("\\", "/")},
                                                    "region": {"startLine": max(1, f.line),
                                                               "startColumn": max(1, f.column)}}}]}
               for f in report.findings]
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "cachectl", "version": __version__, "rules": rules}},
                      "results": results}]}


def _escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def to_github(f) -> str:
    kind = "error" if f.severity == "error" else "warning"
    return (f"::{kind} file={_escape(f.path, True)},line={f.line},col={f.column},title={f.rule}::"
            f"{_escape(f.message + ' (' + f.fix + ')')}")


def _render_text(report) -> None:
    from rich.text import Text

    by_file: dict[str, list] = {}
    for f in report.findings:
        by_file.setdefault(f.path, []).append(f)
    for path, items in by_file.items():
        stdout.print(Text(path, "bold underline"))
        for f in sorted(items, key=lambda x: (x.line, x.column)):
            style = "red" if f.severity == "error" else "yellow"
            stdout.print(Text.assemble(f"  {f.line}:{f.column} ", (f.rule, f"bold {style}"), f" {f.message}"),
                         soft_wrap=True)
            stdout.print(Text(f"      fix: {f.fix}", "dim"), soft_wrap=True)
    n = len(report.findings)
    summary = f"{report.files} file(s) checked: " + (f"{n} finding(s)" if n else "clean")
    stdout.print(Text(summary, "bold red" if n else "bold green"))
