"""The log shapes cachectl reads: one module each, found by itself from the first lines of a file.

Every whole-log command reads a log through :func:`log_values`: it detects the shape (``--log-format NAME``
forces one), and yields each record as cachectl's own wrapper line ``{timestamp, body, usage, model, ...keys}``
with the line it came from. cachectl's own shapes (:mod:`.native`: the wrapper, bare bodies, token layouts,
usage lines, traces) are read as they stand; a foreign shape's module turns each of its calls into a
:class:`~.base.Record`.

A new shape is one module here (``SHAPE``, ``detect``, ``read``: see :mod:`.base`) and one line in
:data:`MODULES`. Containers (gzip, zstd, Parquet, stdin) are orthogonal: any JSONL shape may come in one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from ...errors import InputError, UsageError
from . import claude_code, codex, langfuse, litellm, native, openai_batch_input, openai_batch_output, otel, vcr, vllm_log
from .base import HEAD_BYTES, HEAD_LINES, Head, HeadLine, LogShape, Record, Verdict, json_value

#: the foreign shapes' modules, in the order their detectors are asked (the more specific first); cachectl's
#: own shapes (native) are asked last
MODULES: tuple[ModuleType, ...] = (
    claude_code,
    litellm,
    langfuse,
    openai_batch_output,
    openai_batch_input,
    codex,
    otel,
    vcr,
    vllm_log,
)

#: every shape, by name: the foreign modules' and cachectl's own
SHAPES: dict[str, LogShape] = {s.name: s for s in (*(m.SHAPE for m in MODULES), *native.SHAPES)}
#: a shape name -> the module that reads it (None: read as cachectl's own lines)
READERS: dict[str, ModuleType | None] = {**{m.SHAPE.name: m for m in MODULES}, **{s.name: None for s in native.SHAPES}}
#: the names ``--log-format`` takes: ``auto`` and every shape a log can be (documents are not logs)
LOG_FORMATS: tuple[str, ...] = ("auto", *(m.SHAPE.name for m in MODULES), "native")

#: containers any JSONL shape may come in
CONTAINERS: dict[str, str] = {
    "gzip": "`.gz` or gzip magic bytes: decompressed while streaming",
    "zstd": "zstd magic bytes: decompressed while streaming",
    "parquet": "a Parquet file (the `parquet` extra): each row a record, nested columns as JSON",
    "stdin": "`-` reads standard input",
}


def _head(lines: Iterable[tuple[int, bytes, str]], source: str) -> tuple[Head, list[tuple[int, bytes, str]]]:
    taken = list(itertools.islice(lines, HEAD_LINES))
    heads = tuple(HeadLine(n, raw[:HEAD_BYTES], json_value(raw) if len(raw) <= HEAD_BYTES else None)
                  for n, raw, _ in taken)
    text = b"".join(raw for _, raw, _ in taken)[:HEAD_BYTES]
    return Head(source, heads, text), taken


def detect(head: Head) -> tuple[str, ModuleType | None]:
    """``(shape name, its reader)`` of a file from its head: the first foreign module that says yes, else
    cachectl's own shapes (read as they stand, whose readers name any problem on its line). A file that one
    shape almost fits is one line naming that shape and what it lacked; one that is no JSON and that no shape
    reads is one line listing the shapes cachectl reads."""
    best: tuple[Verdict, str] | None = None
    for module in MODULES:
        verdict = module.detect(head)
        if verdict.score == 2:
            return module.SHAPE.name, module
        if verdict.score == 1 and best is None:
            best = (verdict, module.SHAPE.title)
    if native.detect(head).score == 2:
        return "native", None
    line = head.lines[0].line if head.lines else None
    if best is not None:
        raise InputError(f"looks like {best[1]} but {best[0].lacks}", source=head.source, line=line)
    text = head.text.lstrip()
    if head.lines and not head.values and text[:1] not in (b"{", b"[") and not text.startswith(b"PAR1") \
            and b"\0" not in text:  # JSON over several lines, binary files, a bad JSON line: named by their readers
        raise InputError(f"not a log shape cachectl reads (it reads: {', '.join(SHAPES)}; JSONL, gzip, zstd or "
                         "Parquet)", source=head.source, line=line)
    return "native", None


def open_log(path: str, log_format: str | None = None) -> tuple[str, ModuleType | None,
                                                                Iterator[tuple[int, bytes, str]]]:
    """``(shape name, its reader or None for cachectl's own, the file's non-empty lines)``: the shape forced by
    ``log_format`` (None or ``auto``: found from the first lines, read once from the same stream, so a pipe or
    stdin works)."""
    from ..files import display_name, iter_raw_lines

    lines = iter_raw_lines(path)
    if log_format not in (None, "auto"):
        if log_format == "native":
            return "native", None, lines
        if log_format not in READERS:
            raise UsageError(f"unknown log format {log_format!r} (known: {', '.join(LOG_FORMATS)})")
        module = READERS[log_format]
        if module is None:
            return log_format, None, lines
        # a forced shape its detector does not see at all is said now (its reader would skip every line)
        head, taken = _head(lines, display_name(path))
        if head.lines and module.detect(head).score == 0:
            raise InputError(f"not {module.SHAPE.title} (--log-format {log_format}): expected "
                             f"{module.SHAPE.recognized}; leave --log-format out to have the shape found",
                             source=head.source, line=head.lines[0].line)
        return log_format, module, itertools.chain(taken, lines)
    head, taken = _head(lines, display_name(path))
    name, module = detect(head)
    return name, module, itertools.chain(taken, lines)


def log_values(path: str, log_format: str | None = None, *, need_body: bool = False,
               responses: bool = False) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` of each record of a log in any shape, as cachectl's own wrapper line; cachectl's own
    shapes pass through as they stand. ``log_format``: a name of :data:`LOG_FORMATS` (None or ``auto``: found by
    itself). ``need_body``: the command needs request bodies (diff-tokens --log): a shape whose record has none
    is one line saying so (the module's ``NO_BODY``, naming the command that reads it). ``responses``: each
    record's answer as its wrapper's ``response`` text, where the shape logs it (:attr:`.base.Record.response`)."""
    from ..files import display_name, parse_jsonl_line

    _, module, lines = open_log(path, log_format)
    if module is None:
        for n, raw, src in lines:
            yield n, parse_jsonl_line(raw, src, n)
        return
    yield from record_values(module, lines, display_name(path), need_body=need_body, responses=responses)


def record_values(module: ModuleType, lines: Iterator[tuple[int, bytes, str]], source: str, *,
                  need_body: bool = False, responses: bool = False) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` of each record ``module`` reads from ``lines`` (as :func:`open_log` gives them), each as
    cachectl's own wrapper line (the module's ``values`` where it has one and neither a body nor the responses
    are asked for); ``responses``: with each record's answer (:meth:`.base.Record.value`)."""
    values = getattr(module, "values", None)
    if values is not None and not need_body and not responses:
        yield from values(((n, raw) for n, raw, _ in lines), source)
        return
    for record in module.read(((n, raw) for n, raw, _ in lines), source):
        if need_body and record.body is None:
            from ..request import USAGE_ONLY

            plain = f"{module.SHAPE.title}: this record has no request body"
            raise InputError(getattr(module, "NO_BODY", USAGE_ONLY if record.usage is not None else plain),
                             source=source, line=record.line)
        yield record.line, record.value(responses)


def raw_log_values(path: str, log_format: str | None = None, *, command: str) -> Iterator[tuple[int, bytes, Any]]:
    """``(line, raw_line, value)`` of a log whose lines are themselves the requests (cachectl's own shapes: the
    raw bytes are what an unchanged line is written back as; one pretty-printed body is a log of one line); any
    other shape is one line saying that ``command`` rewrites logs whose lines hold request bodies, and naming
    ``report`` for the shape. A shape whose lines are requests at cachectl's ``body`` (``REWRITTEN_AS_NATIVE``:
    OpenAI Batch input) is read as cachectl's own."""
    from ..files import display_name, iter_log_values

    name, _, lines = open_log(path, log_format)
    refuse_unread(name, command, display_name(path))
    check = getattr(READERS.get(name), "check_line", None)  # (a shape read as cachectl's own: its lines checked)
    if check is None:
        yield from iter_log_values(path, lines)
        return
    source = display_name(path)
    for n, raw, value in iter_log_values(path, lines):
        check(value, source, n)
        yield n, raw, value


#: the logs ``fix`` rewrites, as its refusals and ``report``'s note name them
REWRITABLE = "logs whose lines are request bodies (cachectl's wrapper, bare bodies, OpenAI Batch input)"


def rewritable(name: str) -> bool:
    """Whether ``fix`` rewrites a log of the shape ``name``: cachectl's own shapes, and a shape whose lines are
    requests at cachectl's ``body`` (``REWRITTEN_AS_NATIVE``: OpenAI Batch input)."""
    module = READERS.get(name)
    return module is None or getattr(module, "REWRITTEN_AS_NATIVE", False)


def refuse_unread(name: str, command: str, source: str) -> None:
    """One line, where ``command`` (``fix``, ``report``) does not read a log of the shape ``name``: the shape's
    ``NO_BODY`` where its records have no request body (it names what reads them), else what ``fix`` rewrites
    and the commands the shape names (:attr:`~.base.LogShape.commands`). cachectl's own shapes pass (their
    readers name any line a command cannot use)."""
    module = READERS.get(name)
    if module is None or (rewritable(name) if command == "fix" else command in module.SHAPE.commands):
        return
    readers = [f"`cachectl {c}`" for c in module.SHAPE.commands if c != command]
    what = f"{command} rewrites {REWRITABLE}; " if command == "fix" else ""
    verb = "reads" if len(readers) == 1 else "read"
    raise InputError(getattr(module, "NO_BODY", None) or f"{what}this is {SHAPES[name].title}: "
                     f"{', '.join(readers)} {verb} it", source=source)


def shape_of(path: str) -> str:
    """The shape name of the log ``path`` (``native`` for cachectl's own), from its first lines."""
    return open_log(path)[0]


__all__ = ["CONTAINERS", "LOG_FORMATS", "MODULES", "READERS", "REWRITABLE", "SHAPES", "LogShape", "Record", "detect",
           "log_values", "open_log", "raw_log_values", "record_values", "refuse_unread", "rewritable",
           "shape_of"]
