"""The ``cachectl`` command line: a Typer app with one thin module per command."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from .common import CachectlGroup, lazy_command

HELP = """Diagnose the caches around LLMs: token diffs, prefix-cache replay, prompt-cache cost, semantic-cache
probes, KV-cache math, template lint, and the repair of a request log (fix, report). Data goes to stdout, progress and errors to stderr.

Exit codes: 0 success (identical, clean); 1 a finding (prompts differ, lint findings, a template rewrites
history, wrong semantic-cache hits, fixes found, prefix tokens lost); 2 usage or input error (one line on stderr; CACHECTL_DEBUG=1 adds the
traceback and keeps the code).
"""

#: the commands, in the order help lists them; each module is imported and its command built when it runs
COMMANDS = {
    "diff-tokens": "diff_tokens",
    "simulate-prefix": "simulate_prefix",
    "prompt-cost": "prompt_cost",
    "kv-inspect": "kv_inspect",
    "lint": "lint",
    "fix": "fix",
    "report": "report",
    "semantic-probe": "semantic_probe",
}

#: the commands whose module holds a Typer app of subcommands (``app``), not one command function (``command``)
GROUPS = ("simulate-prefix", "semantic-probe")


class _Root(CachectlGroup):
    lazy_commands = {name: lazy_command(name, f"{__name__}.{module}", "app" if name in GROUPS else "command")
                     for name, module in COMMANDS.items()}


app = typer.Typer(
    name="cachectl",
    help=HELP,
    cls=_Root,
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


def main() -> None:
    import gc

    from . import common

    # Start-up (typer building its parsers, the pydantic import under them) makes many long-lived objects
    # and no garbage worth a collection: the collector is off until the command starts (handle_errors
    # freezes what start-up made and turns it back on); about 15 ms.
    gc.disable()
    common.process_entry = True
    try:
        app(prog_name="cachectl")
    finally:
        # The process ends here: leave its objects to the operating system instead of a last garbage
        # collection over every module (about 30 ms of typer's and pydantic's; atexit handlers still run).
        gc.freeze()
