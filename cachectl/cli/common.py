"""What every command shares: options declared once, the output sink, and the error table."""

from __future__ import annotations

import functools
import gc
import importlib
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Optional, get_args

import orjson
import typer
from typer.core import TyperCommand, TyperGroup

from ..datafiles import load_data
from ..errors import CachectlError, UsageError, printable
from ..errors import plural as plural  # the one plural helper, for the commands

if TYPE_CHECKING:
    from rich.console import Console

# click's exceptions as typer raises them: the click package, or the copy newer typer versions carry
_click_exceptions: Any = importlib.import_module(typer.BadParameter.__module__)

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


# Options with a fixed set of values: enums, so that help lists them and click validates them.


class Choice(str, Enum):
    """A fixed-choice option value that prints and formats as its value ("5m", not "Ttl.m5")."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class Dtype(Choice):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"
    fp8 = "fp8"
    int8 = "int8"
    int4 = "int4"


class Policy(Choice):
    vllm = "vllm"
    radix = "radix"
    chunk = "chunk"
    infinite = "infinite"


class HashFn(Choice):
    builtin = "builtin"
    sha256 = "sha256"


class CacheKind(Choice):
    dynamic = "dynamic"
    static = "static"


class Quantizer(Choice):
    quanto = "quanto"
    hqq = "hqq"


class Nbits(Choice):
    """Bits per value of a quantized cache (quanto: 2 or 4; hqq: 1, 2, 3, 4 or 8)."""

    b1 = "1"
    b2 = "2"
    b3 = "3"
    b4 = "4"
    b8 = "8"


class Ttl(Choice):
    m5 = "5m"
    h1 = "1h"


class Normalize(Choice):
    none = "none"
    whitespace = "whitespace"
    case = "case"


class TimeUnit(Choice):
    """The unit of numeric timestamps (``--time-unit``); without it, recognized by magnitude."""

    s = "s"
    ms = "ms"
    us = "us"


# Shared options: declared once, reused by every command that takes them.
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="Output: text for people, json for machines.",
                                           case_sensitive=False)]
TokenizerOpt = Annotated[Optional[str], typer.Option(
    "--tokenizer", "-t", metavar="T",
    help="Model directory, tokenizer.json, or a Hugging Face id already in the local cache (never downloaded).")]
ChatTemplateOpt = Annotated[Optional[str], typer.Option(
    "--chat-template", metavar="FILE", help="Jinja chat template to use instead of the tokenizer's own.")]
WindowOpt = Annotated[str, typer.Option(
    "--window", metavar="DURATION", help="Without --key: a conversation stays open this long after its last request "
                                         "(30s, 30m, 2h; a bare number is seconds).")]


PricesOpt = Annotated[Optional[str], typer.Option(
    "--prices", metavar="FILE", help="Prices that override or extend the shipped table (cachectl's format or "
                                     "LiteLLM's model_prices_and_context_window.json).")]

EveryOpt = Annotated[Optional[str], typer.Option(
    "--every", metavar="DURATION", help="Time between requests for the provider cache's simulation where the log "
                                        "gives none (a cassette, a Batch file): a line without one is sent DURATION "
                                        "after the request before it (30s, 2m).")]


TimeUnitOpt = Annotated[Optional[TimeUnit], typer.Option(
    "--time-unit", case_sensitive=False, show_default=False,
    help="Unit of numeric timestamps: epoch (or log-relative) seconds, milliseconds or microseconds. Default: "
         "recognized by magnitude (a note says when not seconds); ISO 8601 times need a zone.")]


TimeZoneOpt = Annotated[Optional[str], typer.Option(
    "--time-zone", metavar="ZONE", show_default=False,
    help="Zone of ISO 8601 times logged without one: an IANA name (Europe/Berlin), UTC, or an offset (+01:00). "
         "Times that name their zone keep it. Default: such times are refused.")]


def timestamp_reader(unit: Optional[TimeUnit], zone: Optional[str] = None) -> Any:
    """The run's reader of timestamps, for ``--time-unit`` and ``--time-zone`` (see
    :mod:`cachectl.inputs.timestamps`); a zone it cannot read is a usage error."""
    from ..inputs.timestamps import TimestampError, TimestampReader

    try:
        return TimestampReader(None if unit is None else str(unit), zone)
    except TimestampError as exc:
        raise UsageError(f"--time-zone: {exc}") from None


def timestamp_note(reader: Any) -> None:
    """Say on stderr which unit the timestamps were recognized in, when it was not seconds."""
    note = reader.note()
    if note:
        stderr.print(f"cachectl: note: {note}", markup=False, highlight=False, soft_wrap=True)


def _flag_seconds(text: str, flag: str) -> float:
    """A duration flag's seconds; a bad one is an error naming ``flag``."""
    from ..engines.provider.cache import parse_duration

    try:
        return parse_duration(text)
    except UsageError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def parse_every(text: str | None) -> float | None:
    """``--every``'s seconds (None: not given)."""
    return None if text is None else _flag_seconds(text, "--every")


def parse_window(text: str) -> float:
    return _flag_seconds(text, "--window")


JobsOpt = Annotated[Optional[int], typer.Option(
    "--jobs", "-j", min=1, metavar="N",
    help="Processes to use: parts of the run are computed side by side in forked children, with the same result "
         "(default: the cores available; 1: one process; Linux only).")]
RayRenderOpt = Annotated[Optional[str], typer.Option(
    "--ray", metavar="ADDRESS",
    help="Render and tokenize the log's prompts on a Ray cluster (HOST:PORT, ray://HOST:PORT or auto; local: a Ray "
         "instance for the run, of --jobs CPUs), the replays here: the same result (needs the ray extra).")]
BlockSizeOpt = Annotated[int, typer.Option("--block-size", min=1, metavar="N", help="KV-cache block size in tokens (vLLM: 16).")]
AsOpt = Annotated[Optional[InputKind], typer.Option("--as", help="Force the input kind instead of detecting it.",
                                                    case_sensitive=False)]
TemplateVarOpt = Annotated[Optional[list[str]], typer.Option(
    "--template-var", metavar="KEY=VALUE",
    help="Extra chat-template variable (repeatable); VALUE is parsed as JSON when it can be, e.g. date_string=...")]

# The vLLM cache size, as simulate-prefix takes it (also used by fix): blocks, or GiB of KV memory for a model.
CapacityBlocksOpt = Annotated[Optional[int], typer.Option("--capacity-blocks", min=1, metavar="N",
                                                          help="Usable KV blocks (vLLM adds one null block).")]
CapacityGibOpt = Annotated[Optional[float], typer.Option("--capacity-gib", metavar="GIB",
                                                         help="KV memory in GiB (needs --model).")]
KvDtypeOpt = Annotated[Dtype, typer.Option("--dtype", case_sensitive=False, help="KV dtype for --capacity-gib.")]


def data_names(file: str, table: str, only: Optional[str] = None) -> str:
    """The entries of a shipped data table (``links.json``'s ``links``) as help lists an option's values: each
    name, its aliases in parentheses. ``only``: just the entries another file's table of that name holds."""

    def load(name: str) -> dict:
        return load_data(name)[table]

    entries = load(file)
    keep = load(only) if only else entries
    return ", ".join(name + (f" ({', '.join(e['aliases'])})" if e.get("aliases") else "")
                     for name, e in entries.items() if name in keep)


def in_panel(option: Any, panel: str) -> Any:
    """A shared option (``BlockSizeOpt`` ...) under a help panel of one command, its declaration still the
    shared one: ``block_size: Annotated[int, in_panel(BlockSizeOpt, "Cache")] = 16`` (the type as the shared
    option has it)."""
    import copy

    info = copy.copy(get_args(option)[1])
    info.rich_help_panel = panel
    return info


class KvCapacity:
    """``--capacity-blocks`` or ``--capacity-gib`` with a model: the capacity in blocks for any block size."""

    def __init__(self, capacity_blocks: Optional[int], capacity_gib: Optional[float], model: Optional[str],
                 dtype: str, block_size: int, model_flag: str = "--model"):
        if capacity_gib is not None and capacity_blocks is not None:
            raise UsageError("give --capacity-blocks or --capacity-gib, not both")
        self.capacity_blocks, self.capacity_gib, self.block_size = capacity_blocks, capacity_gib, block_size
        self.bytes_per_token: Optional[float] = None
        self.source: Optional[str] = None
        if capacity_gib is not None:
            if model is None:
                raise UsageError(f"--capacity-gib needs {model_flag} (a catalog name, HF id, model directory or "
                                 "config.json)")
            from ..engines.kv.config import kv_shape, resolve_model

            config, self.source, _ = resolve_model(model)
            self.bytes_per_token = kv_shape(config, dtype, self.source).bytes_per_token
            if self.bytes_per_token <= 0:
                raise UsageError(f"{self.source}: the model keeps no KV cache per token (no attention layers), so "
                                 "--capacity-gib gives no block count; pass --capacity-blocks")

    def blocks(self, bs: int) -> Optional[int]:
        if self.bytes_per_token is not None and self.capacity_gib is not None:
            from ..engines.kv.config import blocks_for_memory

            blocks = blocks_for_memory(self.capacity_gib, self.bytes_per_token, bs)
            if blocks < 1:
                raise UsageError(f"--capacity-gib {self.capacity_gib:g} holds no block of {bs} tokens of the model "
                                 f"in {self.source} ({self.bytes_per_token * bs:,.0f} bytes a block)")
            return blocks
        if self.capacity_blocks is not None and bs != self.block_size:  # same memory, other block size
            return max(1, self.capacity_blocks * self.block_size // bs)
        return self.capacity_blocks


def utf8_arg(value: str, flag: str) -> str:
    """A command-line text as it was given, refused where the shell passed bytes that are not UTF-8 (Python keeps
    them as lone surrogates, which no tokenizer encodes)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{flag}: bytes that are not UTF-8 at character {exc.start + 1} of {value!r:.60}") from None
    return value


#: the names apply_chat_template passes a chat template itself: a --template-var cannot set them
_RENDER_ARGS = ("messages", "tools", "documents", "add_generation_prompt")


def parse_template_vars(items: Optional[list[str]]) -> dict:
    out: dict = {}
    for item in items or ():
        key, sep, value = utf8_arg(item, "--template-var").partition("=")
        if not sep or not key:
            raise UsageError(f"--template-var expects KEY=VALUE, got {item!r}")
        if key in _RENDER_ARGS:
            raise UsageError(f"--template-var {key}: the render passes {key} itself (from the prompt)")
        try:
            out[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key] = value
    return out


# ------------------------------------------------------------------------------------------ output

def _reader_gone() -> None:
    """The reader of stdout went away (`| head`): send the rest of the output nowhere, so that the command
    finishes quietly and exits with the code it would have had (not click's 1, not a traceback)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file descriptor (a test runner's buffer)
        pass


class _PipeSafeStdout:
    """sys.stdout as it is at each write (test runners swap it), tolerant of a closed pipe."""

    def write(self, text: str) -> int:
        try:
            return sys.stdout.write(text)
        except BrokenPipeError:
            _reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _reader_gone()

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", None) or "utf-8"


class LazyConsole:
    """A rich Console made on first use: importing rich takes about 17 ms that a command writing JSON, or
    nothing, does not need. Attribute access is passed to the console."""

    def __init__(self, make: Callable[[], Console]) -> None:
        self._make = make
        self._console: Console | None = None

    def real(self) -> Console:
        if self._console is None:
            self._console = self._make()
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)


_safe_console: Any = None


def safe_text(text: Any) -> Any:
    """A rich Text with every control character from input shown escaped (:func:`cachectl.errors.printable`),
    its styles kept; anything else as it is."""
    from rich.text import Text

    if not isinstance(text, Text) or printable(text.plain) == text.plain:
        return text
    cuts = sorted({i + d for i, ch in enumerate(text.plain) if printable(ch) != ch for d in (0, 1)})
    out = text.blank_copy()
    for part in text.divide(cuts):
        if len(part.plain) == 1 and printable(part.plain) != part.plain:  # one control character: its escape
            piece = Text(printable(part.plain), style=part.style)
            for span in part.spans:
                piece.stylize(span.style)
            part = piece
        out.append_text(part)
    return out


def _console_class() -> Any:
    """rich's Console, safe for terminals: every string it renders (printed, or a table's cell and title) and
    every Text it prints has its control characters escaped before layout, so that input (a session key, a
    tenant, a message) cannot move the cursor, retitle the window or clear the screen; and a table's cells are
    not read as markup unless a print asks for it (``[bold]`` in input stays text)."""
    global _safe_console
    if _safe_console is None:
        from rich.console import Console

        class SafeConsole(Console):
            def render_str(self, text: str, **kwargs: Any) -> Any:
                return super().render_str(printable(text), **kwargs)

            def render(self, renderable: Any, options: Any = None) -> Any:
                return super().render(safe_text(renderable), options)

            def print(self, *objects: Any, markup: Optional[bool] = None, **kwargs: Any) -> None:
                if markup is None and any(not isinstance(o, str) for o in objects):
                    markup = False  # a table's cells hold input; our own markup is in the strings we print
                super().print(*objects, markup=markup, **kwargs)

        _safe_console = SafeConsole
    return _safe_console


def _stdout_console() -> Console:
    # Off a terminal (a pipe, a file, CI logs) tables get room instead of the 80 columns rich assumes.
    return _console_class()(file=_PipeSafeStdout(), highlight=False, soft_wrap=False,
                            width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


def _stderr_console() -> Console:
    return _console_class()(stderr=True, highlight=False)


stdout: Any = LazyConsole(_stdout_console)
stderr: Any = LazyConsole(_stderr_console)


def _write_bytes(data: bytes) -> None:
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    except BrokenPipeError:
        _reader_gone()


def check_price_model(table: Any, model: str | None, flag: str = "--model") -> None:
    """Refuse an unknown --model (or ``flag``) before any work, pointing at the one command that lists the price
    table."""
    from ..engines.provider.prices import UnknownModelError

    if model is None:
        return
    try:
        table.lookup(model)
    except UnknownModelError as exc:
        hint = str(exc).split(" (see the price table")[0]
        raise UsageError(f"{flag}: {hint} (the price table: cachectl prompt-cost --list-models)") from None


#: ``(label, path)``: an input of a run, as :func:`cachectl.outputs.refuse_inputs` names it
RunInput = tuple[str, Optional[str]]


def run_inputs(log: Optional[str] = None, *, log_label: str = "the input log", tokenizer: Optional[str] = None,
               chat_template: Optional[str] = None, prices: Optional[str] = None, config: Optional[str] = None,
               models: tuple[Optional[str], ...] = ()) -> list[RunInput]:
    """Every file a run may read, labelled for the refusal: the log (``-``: the file behind stdin), the
    tokenizer's files, the chat template, the price file, a config, a model's files (a directory, a
    config.json or a .gguf)."""
    from ..outputs import path_files
    from ..tokenization import tokenizer_files

    found: list[RunInput] = [(log_label, log), ("the chat template", chat_template), ("the price file", prices),
                             ("the config", config)]
    found += [("a file of the tokenizer", f) for f in tokenizer_files(tokenizer)] if tokenizer else []
    for model in models:
        found += [("a file of the model", f) for f in path_files(model)]
    return found


def check_output(path: str, flag: str, inputs: list[RunInput]) -> None:
    """Refuse, before anything is read, an output file that is ``-`` or resolves to an input of the run (the
    same path, a symlink or hard link to it, the file behind stdin): cachectl never overwrites what it
    reads."""
    from ..outputs import refuse_inputs

    if path == "-":
        raise UsageError(f"{flag} -: give a file name (stdout carries the report)")
    refuse_inputs(path, flag, inputs)


def check_plot(path: Optional[str], inputs: list[RunInput], flag: str = "--plot") -> None:
    """``--plot FILE``: a format matplotlib writes (by the file's extension; none is PNG), not an input of the
    run; checked before any work."""
    if path is None:
        return
    check_output(path, flag, inputs)
    plot_format(path, flag)


def plot_format(path: str, flag: str = "--plot") -> str:
    """The matplotlib format of ``path`` from its extension (PNG without one); an unknown one is one line
    naming the file and the formats."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise UsageError(f"{flag} needs matplotlib (pip install 'llm-cachectl[plot]')") from None
    formats = FigureCanvasAgg.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if not ext:
        return "png"
    if ext not in formats:
        raise UsageError(f"{flag} {path}: matplotlib cannot write .{ext} files (formats: {', '.join(sorted(formats))})")
    return ext


def shown_name(name: str) -> str:
    """A file name as a text output's line shows it: its control characters escaped, a newline too (the console
    keeps newlines, which a name would break its line with)."""
    return printable(name, newlines=False)


def emit_json(obj: Any) -> None:
    """One JSON document on stdout (dataclasses serialize field by field)."""
    _write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n")


def emit_jsonl(obj: Any) -> None:
    """One JSON line on stdout, flushed so that a pipe sees it at once."""
    _write_bytes(orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS) + b"\n")


def _stderr_is_terminal() -> bool:
    """Whether progress and status lines go to stderr: a terminal (or one forced), never CI logs."""
    return bool((sys.stderr.isatty() or os.environ.get("FORCE_COLOR") or os.environ.get("FORCE_TERMINAL"))
                and stderr.is_terminal and not os.environ.get("CI"))


@contextmanager
def status(message: str) -> Iterator[None]:
    """A one-line status with a spinner on stderr (``loading all-MiniLM-L6-v2…``) while a long step without a count
    runs (a model loading), gone when it ends; silent when stderr is not a terminal, as :class:`Progress` is."""
    if not _stderr_is_terminal():
        yield
        return
    with stderr.real().status(message, spinner="dots"):
        yield


class Progress:
    """A rich progress counter on stderr, silent when stderr is not a terminal."""

    def __init__(self, description: str):
        self._progress = None
        if _stderr_is_terminal():
            from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._progress = RichProgress(SpinnerColumn(), TextColumn(description), MofNCompleteColumn(),
                                          BarColumn(), TimeElapsedColumn(), console=stderr.real(), transient=True)
            self._task = self._progress.add_task(description, total=None)

    def __enter__(self) -> Progress:
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
        raise UsageError("--plot needs matplotlib (pip install 'llm-cachectl[plot]')") from None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _readable_ticks(ax) -> None:
    """Tick labels a person reads, that never overlap: a number axis in thousands-separated integers (10,000, not
    10000 or 10^4); a log axis labelled at 1, 2 and 5 per decade over a short range, fewer over a long one (a range
    inside one decade would otherwise get matplotlib's minor labels, 2x10^3 3x10^3 ..., crowded together)."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, ScalarFormatter

    def comma(v: float, _pos: Any = None) -> str:
        return f"{v:,.0f}" if abs(v) >= 1 or v == 0 else f"{v:g}"

    for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
        if scale == "log":
            lo, hi = sorted(axis.get_view_interval())
            decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
            subs = (1.0, 2.0, 5.0) if decades <= 1.5 else (1.0, 3.0) if decades <= 3 else (1.0,)
            axis.set_major_locator(LogLocator(base=10, subs=subs))
            axis.set_major_formatter(FuncFormatter(comma))
            axis.set_minor_formatter(NullFormatter())
        elif isinstance(axis.get_major_formatter(), ScalarFormatter) and max(map(abs, axis.get_view_interval())) >= 1000:
            axis.set_major_formatter(FuncFormatter(comma))  # categories (router names) keep their own formatter


def save_figure(fig, path: str) -> None:
    """Save the figure to ``path`` whole or not at all (a temporary file renamed into place)."""
    import matplotlib.pyplot as plt

    from ..outputs import atomic_write

    fig.axes[0].legend()
    for ax in fig.axes:
        _readable_ticks(ax)
    fig.tight_layout()
    try:
        fmt = plot_format(path)
        with atomic_write(path) as fh:
            fig.savefig(fh, format=fmt)
    finally:
        plt.close(fig)


# ------------------------------------------------------------------------------------------ errors

#: Engine errors name library parameters in backticks (`default_model`); the CLI shows its flags instead.
#: The one table from parameter names to flags.
PARAM_FLAGS = {
    "default_model": "--model", "model": "--model", "tokenizer": "--tokenizer", "count_with_api": "--count-with-api",
    "every": "--every DURATION", "prices": "--prices FILE", "list_models": "cachectl prompt-cost --list-models",
    "usage": "--usage",
    "requests": "a REQUESTS.jsonl argument", "hash_block_size": "--hash-block-size", "block_size": "--block-size",
    "capacity_blocks": "--capacity-blocks", "capacity_gib": "--capacity-gib", "policy": "--policy",
    "concurrency": "--concurrency", "recompute_ratio": "--recompute-ratio", "hash": "--hash",
    "select": "--select", "ignore": "--ignore", "as_kind": "--as", "warmup": "--warmup",
    "contexts": "--context-lengths", "prefix_tokens": "--prefix-tokens", "suffix_tokens": "--suffix-tokens",
    "output_tokens": "--output-tokens", "calls": "--calls", "model_as": "--model-as", "top": "--top",
}


def flags_for_params(message: str) -> str:
    """Replace `param` names in an engine's message by the command-line flags that set them."""
    import re

    return re.sub(r"`([a-z_]+)`", lambda m: PARAM_FLAGS.get(m.group(1), m.group(0)), message)


def print_note(note: str) -> None:
    """An engine's note on stdout, as every command prints one: ``note: ...``, its `param` names as flags."""
    stdout.print(f"note: {flags_for_params(note)}", soft_wrap=True, markup=False)


#: Catch-all hits of this process, "Type: message" each: an input that lands here is a bug, and the fuzz tests
#: assert that none does.
internal_errors: list[str] = []


def fail(message: str, code: int = EXIT_ERROR) -> typer.Exit:
    # one line, whatever the message quotes, and nothing in it that a terminal would act on
    message = printable(" ".join(message.split("\n")).replace("\r", " "), newlines=False)
    if len(message) > 2000:
        message = message[:2000] + "..."
    stderr.print(f"cachectl: error: {message}", markup=False, highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _debug() -> bool:
    return os.environ.get("CACHECTL_DEBUG", "") not in ("", "0")


def provider_api_error(exc: BaseException) -> str | None:
    """One line saying what to do for an error of the Anthropic SDK (``--count-with-api``): the key refused
    (401, 403), rate limited (429), the service down or overloaded (5xx, 529), a timeout, no connection; None
    for anything else. The SDK retried already (twice) where retrying can help."""
    module = type(exc).__module__ or ""
    if module.split(".")[0] != "anthropic":
        return None
    name = type(exc).__name__
    api = "--count-with-api: the Anthropic API"
    offline = "count tokens offline with --tokenizer, or give token layouts"
    if name == "APITimeoutError":
        return (f"{api} did not answer in time (CACHECTL_API_TIMEOUT, {api_timeout():g} s): retry later, or "
                f"{offline}")
    if name == "APIConnectionError":
        return f"--count-with-api cannot reach the Anthropic API (offline, or blocked by a proxy or firewall): {offline}"
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        return None
    said = _api_message(exc)
    if status == 401:
        return f"{api} refused the key (401 authentication error{said}): check ANTHROPIC_API_KEY"
    if status == 403:
        return (f"{api} refused the request (403 permission denied{said}): check that ANTHROPIC_API_KEY's "
                "workspace may use count_tokens")
    if status == 429:
        return f"{api} is rate limiting this key (429{said}): retry later, or {offline}"
    if status == 529:
        return f"{api} is overloaded (529{said}): retry later, or {offline}"
    if status >= 500:
        return f"{api} failed ({status} server error{said}): retry later, or {offline}"
    if status == 404:
        return f"{api} answered 404 (not found{said}): check the model name and ANTHROPIC_BASE_URL"
    return f"{api} refused a request ({status}{said})"


def _api_message(exc: BaseException) -> str:
    """The API's own error message, when its answer carries one: ``": <message>"``."""
    body = getattr(exc, "body", None)
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return f": {message[:300]}" if isinstance(message, str) and message.strip() else ""


def api_timeout() -> float:
    """Seconds the SDK waits for an answer of the provider's API: CACHECTL_API_TIMEOUT, else 60."""
    text = os.environ.get("CACHECTL_API_TIMEOUT", "")
    try:
        value = float(text) if text else 60.0
    except ValueError:
        raise UsageError(f"CACHECTL_API_TIMEOUT={text!r}: expected a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise UsageError(f"CACHECTL_API_TIMEOUT={text!r}: expected a positive number of seconds")
    return value


def _os_error(exc: OSError) -> str | None:
    """One line for an operating-system error that names its file (EIO, EACCES, ENOSPC where no reader or
    writer caught it first): the environment, not a bug; None for one without a file name."""
    if exc.filename is None:
        return None
    reason = (exc.strerror or str(exc)).lower() if exc.strerror else str(exc)
    return f"{exc.filename}: {reason}"


#: set by :func:`cachectl.cli.main`: this process is the ``cachectl`` command and ends with it
process_entry = False

#: the collector's thresholds while a command runs (CPython's default: 700, 10, 10). A command's parsing allocates
#: containers by the million, nearly all of them freed by reference counting or kept to the end: with the default,
#: 5,082 young collections and 37 full ones took 10.0 of the 140.6 CPU seconds of a 20,000-request `report`; with
#: these, 2.7 s (docs/benchmarks.md). Cyclic garbage waits a little longer for its collection.
GC_THRESHOLDS = (10_000, 10, 10)


def handle_errors(fn: Callable) -> Callable:
    """Turn the errors a user can cause into one line on stderr and exit code 2.

    ``CACHECTL_DEBUG=1`` prints the traceback too, and keeps the exit code.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if process_entry:
            # What start-up made (modules, typer's and pydantic's objects) lives until the process ends: out
            # of the collector's passes, which then cost what the command allocates, not what was imported.
            # Only in the process ``cachectl`` started: an app invoked in a longer-lived process (tests, a
            # notebook) keeps its collector as it was. main() turned the collector off for start-up.
            gc.freeze()
            gc.set_threshold(*GC_THRESHOLDS)
            gc.enable()
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except BrokenPipeError:
            # the reader went away (`| head`) outside our writers: stop quietly
            _reader_gone()
            raise typer.Exit(EXIT_OK) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except CachectlError as exc:
            if _debug():
                traceback.print_exc()
            raise fail(flags_for_params(str(exc)), exc.exit_code) from None
        except Exception as exc:  # a bug of ours, or a library failing: still one line, exit 2
            known = provider_api_error(exc) or (_os_error(exc) if isinstance(exc, OSError) else None)
            if _debug():
                traceback.print_exc()
            if known is not None:  # the provider or the machine said no: what to do, in one line
                raise fail(known) from None
            internal_errors.append(f"{type(exc).__name__}: {exc}"[:500])
            raise fail(f"internal error: {type(exc).__name__}: {exc} (set CACHECTL_DEBUG=1 for the traceback)") \
                from None
        except BaseException as exc:
            if type(exc).__name__ != "PanicException":  # (pyo3's, a BaseException: a Rust library's panic)
                raise
            if _debug():
                traceback.print_exc()
            raise fail(f"the tokenizers library failed on this tokenizer ({' '.join(str(exc).split())[:200]}): is "
                       "its tokenizer.json one that transformers saved?") from None

    return wrapper


def _usage_line(exc: Any) -> str:
    """A click usage error as one line: no box, no pydantic-style 'Value error,' prefix, the help command."""
    message = " ".join(exc.format_message().split())
    message = message.replace("Value error, ", "")
    # the click types typer 0.27-0.28 carries name themselves in Python's words: "'x' is not a valid int range."
    for kind, word in (("int", "integer"), ("float", "number")):
        message = message.replace(f"is not a valid {kind} range.", f"is not a valid {word}.")
        message = message.replace(f"is not a valid {kind}.", f"is not a valid {word}.")
    ctx = exc.ctx
    path = ctx.command_path if ctx is not None else "cachectl"
    return f"{message} (see '{path} --help')"


# What an option's value is called in help when the option names no metavar (typer 0.29 would print the Python
# type, `<int range>`, `<str>`; typer 0.27-0.28, the names of the click types it carries, the same; older
# typers, click's INTEGER).
_METAVARS: dict[Any, str] = {int: "N", float: "NUMBER", str: "TEXT",
                             "integer": "N", "integer range": "N", "float": "NUMBER", "float range": "NUMBER",
                             "text": "TEXT", "int": "N", "int range": "N", "str": "TEXT"}


def _metavar_for(param: Any) -> str | None:
    desc = getattr(param, "type_descriptor", None)  # typer 0.29+ (its own click)
    if desc is not None:
        return None if desc.is_list else _METAVARS.get(desc.annotation)
    return _METAVARS.get(getattr(getattr(param, "type", None), "name", None))  # click's types


def _with_dots(make_metavar: Callable[..., str]) -> Callable[..., str]:
    def make(*args: Any, **kwargs: Any) -> str:
        text = make_metavar(*args, **kwargs)
        return text if text.endswith("...") else text + "..."

    return make


def _unbraced(usage_name: Callable[..., str]) -> Callable[..., str]:
    """typer writes a required argument ``{TRACE}`` in the usage line, which reads as a choice list: ``TRACE``,
    as click writes it (optional ones keep their ``[REQUESTS.jsonl]``)."""

    def name(*args: Any, **kwargs: Any) -> str:
        return re.sub(r"^\{(.*)\}(\.\.\.)?$", r"\1\2", usage_name(*args, **kwargs))

    return name


def _whole_defaults(help_record: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A default that is a comma-separated list (``0.7,0.75,...``) is one word to the wrapper, which then cuts
    it mid-value: show it with a space after each comma, so that help wraps between values."""

    def record(ctx: Any) -> Any:
        rv = help_record(ctx)
        if rv is None or "[default: " not in rv[1]:
            return rv
        term, text = rv
        return term, re.sub(r"\[default: ([^]]*)\]",
                            lambda m: "[default: " + re.sub(r",(?=\S)", ", ", m.group(1)) + "]", text)

    return record


def tidy_help(command: Any) -> None:
    """Help that names values, not Python types: typer 0.29 prints ``<str>`` beside every argument and the type
    beside any option without a metavar. Arguments keep their metavar alone (no braces around a required one);
    such options get N, NUMBER or TEXT. Options with a fixed set of values keep their ``<a|b>`` list; list
    defaults wrap between values."""
    for param in getattr(command, "params", ()):
        if param.param_type_name == "option" and not getattr(param, "_cachectl_tidy", False):
            param.get_help_record = _whole_defaults(param.get_help_record)
            param._cachectl_tidy = True
        if param.param_type_name == "argument":
            param.display_type_rich = lambda ctx: None
            if not getattr(param, "_cachectl_tidy", False):
                param._cachectl_tidy = True
                for method in ("make_metavar", "_usage_display_name"):  # typer 0.29 has the second for usage
                    if hasattr(param, method):
                        setattr(param, method, _unbraced(getattr(param, method)))
            # an argument of several values reads `PATH...`: typer before 0.29 drops the dots when the argument
            # names a metavar; 0.29 renders arguments without make_metavar, dots included
            make = getattr(param, "make_metavar", None)
            if param.nargs != 1 and make is not None:
                param.make_metavar = _with_dots(make)
        elif (param.param_type_name == "option" and param.metavar is None and not param.is_flag
              and not param.count):
            param.metavar = _metavar_for(param)
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub)


class LazyCommands(dict):
    """Command name -> click command, each one imported and built on first use, so that running a command
    builds only it (typer turns every parameter of every command it builds into a pydantic adapter). Names
    iterate in declaration order without building anything; values and items build them all (help does)."""

    def __init__(self, loaders: dict[str, Callable[[], Any]]) -> None:
        super().__init__()
        self._loaders = dict(loaders)

    def _load(self, name: Any) -> Any:
        if not dict.__contains__(self, name) and name in self._loaders:
            cmd = self._loaders[name]()
            tidy_help(cmd)
            dict.__setitem__(self, name, cmd)
        return dict.get(self, name)

    def __getitem__(self, name: Any) -> Any:
        cmd = self._load(name)
        if cmd is None:
            raise KeyError(name)
        return cmd

    def get(self, name: Any, default: Any = None) -> Any:
        cmd = self._load(name)
        return default if cmd is None else cmd

    def __contains__(self, name: object) -> bool:
        return name in self._loaders or dict.__contains__(self, name)

    def __iter__(self) -> Iterator[Any]:
        return iter(dict.fromkeys([*self._loaders, *dict.keys(self)]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self._loaders, *dict.keys(self)]))

    def keys(self) -> Any:
        return list(self)

    def values(self) -> Any:
        return [self[n] for n in self]

    def items(self) -> Any:
        return [(n, self[n]) for n in self]


class CachectlCommand(TyperCommand):
    """A command whose plain help groups its options under the panels they name (typer's ``rich_help_panel``,
    which typer shows only in rich help): one section per panel, in the order of their first options, then the
    options in no panel (--help) under Options; the flags in one column across the sections, as in one list.
    A command that names no panel gets typer's own help."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        shown = [(p, r) for p in self.get_params(ctx) if (r := p.get_help_record(ctx)) is not None]
        if not any(getattr(p, "rich_help_panel", None) for p, _ in shown):
            return super().format_options(ctx, formatter)
        sections: dict[str, list[tuple[str, str]]] = {"Arguments": []}
        for p, record in shown:
            panel = "Arguments" if p.param_type_name == "argument" else getattr(p, "rich_help_panel", None)
            sections.setdefault(panel or "Options", []).append(record)
        sections["Options"] = sections.pop("Options", [])  # the options in no panel last
        write_sections(formatter, sections)


def write_sections(formatter: Any, sections: dict[str, list[tuple[str, str]]]) -> None:
    """Help sections of (term, text) rows, title by title, the text in one column after every section's terms
    but the arguments' (as in one list)."""
    # click's write_dl sizes the flag column per list (at most 30): pad to the width one list would have
    terms = [term for title, rows in sections.items() if title != "Arguments" for term, _ in rows]
    width = min(max(map(len, terms), default=0), 30)
    for title, rows in sections.items():
        if title != "Arguments":
            rows = [(term.ljust(width) if text else term, text) for term, text in rows]
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


def _no_options() -> None:
    pass


def lazy_command(name: str, module: str, attribute: str = "command") -> Callable[[], Any]:
    """A loader for :class:`LazyCommands`: the click command of ``module.attribute``, a command function or a
    Typer app of subcommands, built the way ``app.command(name)`` / ``app.add_typer`` would build it."""

    def load() -> Any:
        obj = getattr(importlib.import_module(module), attribute)
        group = typer.Typer(rich_markup_mode=None, add_completion=False, pretty_exceptions_enable=False)
        group.callback()(_no_options)  # a group of one, built as the root would build its member
        if isinstance(obj, typer.Typer):
            group.add_typer(obj, name=name)
        else:
            group.command(name, cls=CachectlCommand)(obj)
        built: Any = typer.main.get_command(group)
        return built.commands[name]

    return load


class CachectlGroup(TyperGroup):
    """The root command: click's own error output (a boxed usage error, exit 1 on a closed pipe) replaced by
    cachectl's one line on stderr and its exit codes. ``lazy_commands`` (a subclass sets it): name -> loader
    of commands built on first use."""

    lazy_commands: dict[str, Callable[[], Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tidy_help(self)
        if self.lazy_commands:
            eager = dict(self.commands)
            self.commands = LazyCommands(self.lazy_commands)
            self.commands.update(eager)

    def _deepest(self, args: Any) -> Any:
        """A context of the deepest command ``args`` name (``semantic-probe dupes``), for its help's name."""
        path, group = ["cachectl"], self
        for arg in sys.argv[1:] if args is None else args:
            cmd = getattr(group, "commands", {}).get(arg) if not arg.startswith("-") else None
            if cmd is None:
                break
            path.append(arg)
            group = cmd
        return typer.Context(group, info_name=" ".join(path)) if len(path) > 1 else None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _click_exceptions.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:  # `cachectl` alone: the help
                _PipeSafeStdout().write(exc.ctx.get_help() + "\n")
                sys.exit(EXIT_OK)
            if exc.ctx is None:  # (the option parser's errors, "requires an argument", come without one)
                exc.ctx = self._deepest(args)
            stderr.print(f"cachectl: error: {_usage_line(exc)}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(EXIT_ERROR)
        except _click_exceptions.ClickException as exc:
            stderr.print(f"cachectl: error: {exc.format_message()}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(EXIT_ERROR)
        except (typer.Abort, KeyboardInterrupt):  # typer.Abort: click's Abort in older typers, its own in 0.29
            sys.exit(130)
        except BrokenPipeError:
            _reader_gone()
            sys.exit(EXIT_OK)
        sys.exit(code if isinstance(code, int) else EXIT_OK)


def iter_progress(items: Iterator, progress: Progress | Callable[[int], None]) -> Iterator:
    """``items``, each one counted by ``progress`` (a :class:`Progress`, or a function of the count)."""
    advance = progress.advance if isinstance(progress, Progress) else progress
    for item in items:
        advance(1)
        yield item
