"""The ``cachectl`` command line: a Typer app with one thin module per command."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from . import diff_tokens, fix, kv_inspect, lint, prompt_cost, report, semantic_probe, simulate_prefix
from .common import CachectlGroup

HELP = """Diagnose the caches around LLMs: token diffs, prefix-cache replay, prompt-cache cost, semantic-cache
probes, KV-cache math, template lint, and the repair of a request log (fix, report). Data goes to stdout, progress and errors to stderr.

Exit codes: 0 success (identical, clean); 1 a finding (prompts differ, lint findings, a template rewrites
history, wrong semantic-cache hits, fixes found, prefix tokens lost); 2 usage or input error (one line on stderr; CACHECTL_DEBUG=1 adds the
traceback and keeps the code).
"""

app = typer.Typer(
    name="cachectl",
    help=HELP,
    cls=CachectlGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # plain help: rich markup would eat bracketed text such as [tool.cachectl.lint]
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cachectl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    pass


app.command("diff-tokens")(diff_tokens.command)
app.command("simulate-prefix")(simulate_prefix.command)
app.command("prompt-cost")(prompt_cost.command)
app.command("kv-inspect")(kv_inspect.command)
app.command("lint")(lint.command)
app.command("fix")(fix.command)
app.command("report")(report.command)
app.add_typer(semantic_probe.app, name="semantic-probe")


def main() -> None:
    app(prog_name="cachectl")
