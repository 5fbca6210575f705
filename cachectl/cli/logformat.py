"""``--log-format``: the one option of every whole-log command that forces a log's shape (by default each log's
shape is found from its first lines). Its own module, imported by the commands that read logs, so that the
registry of shapes is loaded only by them. The name is checked where the log is opened
(:func:`cachectl.inputs.formats.open_log`: an unknown one is one line listing the names, exit 2)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..inputs.formats import LOG_FORMATS

LogFormatOpt = Annotated[Optional[str], typer.Option(
    "--log-format", metavar="NAME", show_default=False,
    help=f"The log's shape, instead of finding it from its first lines: {', '.join(LOG_FORMATS)} (native: "
         "cachectl's own shapes: its request wrapper, bare bodies, token layouts, traces).")]


def log_format_name(value: Optional[str]) -> Optional[str]:
    """The registry's name of a --log-format value (None: find the shape by itself)."""
    return None if value is None else value.strip().lower()
