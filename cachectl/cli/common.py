"""What every command shares: options declared once, the output sink, and the error table."""

from __future__ import annotations

import functools
import os
import sys
from enum import Enum
from typing import Annotated, Any, Callable, Iterator, Optional

import orjson
import typer
from rich.console import Console

from ..errors import CachectlError, UsageError

EXIT_OK, EXIT_FINDING, EXIT_ERROR = 0, 1, 2


class Format(str, Enum):
    text = "text"
    json = "json"


class InputKind(str, Enum):
    text = "text"
    chat = "chat"
    openai = "openai"
    anthropic = "anthropic"
    ids = "ids"


# Shared options: declared once, reused by every command that takes them.
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output: text for people, json for machines.",
                                           case_sensitive=False)]
TokenizerOpt = Annotated[Optional[str], typer.Option(
    "--tokenizer", "-t", metavar="T",
    help="Model directory, tokenizer.json, or a Hugging Face id already in the local cache (never downloaded).")]
ChatTemplateOpt = Annotated[Optional[str], typer.Option(
    "--chat-template", metavar="FILE", help="Jinja chat template to use instead of the tokenizer's own.")]
BlockSizeOpt = Annotated[int, typer.Option("--block-size", min=1, help="KV-cache block size in tokens (vLLM: 16).")]
AsOpt = Annotated[Optional[InputKind], typer.Option("--as", help="Force the input kind instead of detecting it.",
                                                    case_sensitive=False)]
TemplateVarOpt = Annotated[Optional[list[str]], typer.Option(
    "--template-var", metavar="KEY=VALUE",
    help="Extra chat-template variable (repeatable); VALUE is parsed as JSON when it can be, e.g. date_string=...")]


def parse_template_vars(items: Optional[list[str]]) -> dict:
    out: dict = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--template-var expects KEY=VALUE, got {item!r}")
        try:
            out[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key] = value
    return out


# ------------------------------------------------------------------------------------------ output

# Off a terminal (a pipe, a file, CI logs) tables get room instead of the 80 columns rich assumes.
stdout = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS")
                 else 160)
stderr = Console(stderr=True, highlight=False)


def emit_json(obj: Any) -> None:
    """One JSON document on stdout (dataclasses serialize field by field)."""
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()


def emit_jsonl(obj: Any) -> None:
    """One JSON line on stdout, flushed so that a pipe sees it at once."""
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()


class Progress:
    """A rich progress counter on stderr, silent when stderr is not a terminal."""

    def __init__(self, description: str):
        self._progress = None
        if stderr.is_terminal and not os.environ.get("CI"):
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, SpinnerColumn, \
                TextColumn, TimeElapsedColumn

            self._progress = RichProgress(SpinnerColumn(), TextColumn(description), MofNCompleteColumn(),
                                          BarColumn(), TimeElapsedColumn(), console=stderr, transient=True)
            self._task = self._progress.add_task(description, total=None)

    def __enter__(self) -> "Progress":
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)


# ------------------------------------------------------------------------------------------- plots


def new_figure(title: str, xlabel: str, ylabel: str):
    """A matplotlib figure on the Agg backend (matplotlib imported here, for --plot only)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib (pip install 'cachectl[plot]')") from None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def save_figure(fig, path: str) -> None:
    import matplotlib.pyplot as plt

    fig.axes[0].legend()
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc}") from None
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------------------ errors


#: Catch-all hits of this process, "Type: message" each: an input that lands here is a bug, and the fuzz tests
#: assert that none does.
internal_errors: list[str] = []


def fail(message: str, code: int = EXIT_ERROR) -> "typer.Exit":
    message = " ".join(message.split("\n")).replace("\r", " ")  # one line, whatever the message quotes
    if len(message) > 2000:
        message = message[:2000] + "..."
    stderr.print(f"cachectl: error: {message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def handle_errors(fn: Callable) -> Callable:
    """Turn the errors a user can cause into one line on stderr and exit code 2.

    ``CACHECTL_DEBUG=1`` lets the traceback through instead.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        debug = os.environ.get("CACHECTL_DEBUG", "") not in ("", "0")
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except CachectlError as exc:
            if debug:
                raise
            raise fail(str(exc), exc.exit_code) from None
        except BrokenPipeError:
            # the reader went away (`| head`): stop quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(EXIT_OK) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except Exception as exc:  # a bug of ours: still one line, unless debugging
            internal_errors.append(f"{type(exc).__name__}: {exc}"[:500])
            if debug:
                raise
            raise fail(f"internal error: {type(exc).__name__}: {exc} (set CACHECTL_DEBUG=1 for the traceback)") \
                from None

    return wrapper


def iter_progress(items: Iterator, progress: Progress) -> Iterator:
    for item in items:
        progress.advance()
        yield item
