"""``--log-format``: the one option of every whole-log command that forces a log's shape (by default each log's
shape is found from its first lines). Its own module, imported by the commands that read logs, so that the
registry of shapes is loaded only by them."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from ..inputs.formats import LOG_FORMATS

#: the names --log-format takes, as the registry lists them (typer makes the choices of an Enum)
LogFormat = Enum("LogFormat", {name: name for name in LOG_FORMATS}, type=str)  # type: ignore[misc]

LogFormatOpt = Annotated[Optional[LogFormat], typer.Option(
    "--log-format", metavar="NAME", case_sensitive=False, show_default=False,
    help=f"The log's shape, instead of finding it from its first lines: {', '.join(LOG_FORMATS)} (native: "
         "cachectl's own shapes: its request wrapper, bare bodies, token layouts, traces).")]


def log_format_name(value: Optional[LogFormat]) -> Optional[str]:
    """The registry's name of a --log-format choice (None: find the shape by itself)."""
    return None if value is None else str(value.value)
