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
from . import langfuse, litellm, native
from .base import HEAD_BYTES, HEAD_LINES, Head, HeadLine, LogShape, Record, Verdict, json_value

#: the foreign shapes' modules, in the order their detectors are asked (the more specific first); cachectl's
#: own shapes (native) are asked last
MODULES: tuple[ModuleType, ...] = (
    litellm,
    langfuse,
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
    cachectl's own shapes; a file in no known shape is one line naming the closest shape and what it lacked, or
    the shapes cachectl reads."""
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
    names = ", ".join(SHAPES)
    raise InputError(f"not a log shape cachectl reads (it reads: {names}; see `--log-format`)",
                     source=head.source, line=line)


def log_values(path: str, log_format: str | None = None) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` of each record of a log in any shape, as cachectl's own wrapper line; cachectl's own
    shapes pass through as they stand. ``log_format``: a name of :data:`LOG_FORMATS` (None or ``auto``: found by
    itself)."""
    from ..files import display_name, iter_raw_lines, parse_jsonl_line

    source = display_name(path)
    lines = iter_raw_lines(path)
    head, taken = _head(lines, source)
    if log_format in (None, "auto"):
        _, module = detect(head)
    elif log_format == "native":
        module = None
    elif log_format in READERS:
        module = READERS[log_format]
    else:
        raise UsageError(f"unknown log format {log_format!r} (known: {', '.join(LOG_FORMATS)})")
    rest = itertools.chain(taken, lines)
    if module is None:
        for n, raw, src in rest:
            yield n, parse_jsonl_line(raw, src, n)
        return
    records: Iterator[Record] = module.read(((n, raw) for n, raw, _ in rest), source)
    for record in records:
        yield record.line, record.value()


def shape_of(path: str) -> str:
    """The shape name of the log ``path`` (``native`` for cachectl's own), from its first lines."""
    from ..files import display_name, iter_raw_lines

    head, _ = _head(iter_raw_lines(path), display_name(path))
    return detect(head)[0]


__all__ = ["CONTAINERS", "LOG_FORMATS", "MODULES", "READERS", "SHAPES", "LogShape", "Record", "detect",
           "log_values", "shape_of"]
