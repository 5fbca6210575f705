"""The ``cachectl`` command line: a Typer app with one thin module per command."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from . import diff_tokens, kv_inspect, lint, prompt_cost, semantic_probe, simulate_prefix

app = typer.Typer(
    name="cachectl",
    help="Diagnose the caches around LLMs: token diffs, prefix-cache replay, prompt-cache cost, "
         "semantic-cache probes, KV-cache math and template lint.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cachectl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """Diagnose the caches around LLMs. Data goes to stdout, progress and errors to stderr.

    Exit codes: 0 success or identical, 1 a finding (prompts differ, instability), 2 usage or input error.
    """


app.command("diff-tokens")(diff_tokens.command)
app.command("simulate-prefix")(simulate_prefix.command)
app.command("prompt-cost")(prompt_cost.command)
app.command("kv-inspect")(kv_inspect.command)
app.command("lint")(lint.command)
app.add_typer(semantic_probe.app, name="semantic-probe")


def main() -> None:
    app(prog_name="cachectl")
