"""Parquet traces and trace partitions, read with pyarrow in record batches (memory bounded by one batch and
one row group, not by the file).

A Parquet trace has the columns a JSONL trace has fields: ``tokens`` (or ``prompt_token_ids``/``input_ids``),
a list of integers, or Mooncake's ``hash_ids`` (a list of integers) with ``input_length``; optionally
``timestamp`` (seconds, Mooncake milliseconds, or an Arrow timestamp), ``output_tokens``/``output_length``,
``salt``/``cache_salt``, ``segments``, and the columns named by ``--salt-field``/``--tenant-field``/
``--session-field`` (a dotted name reaches into a struct column). Each row becomes the dict a JSONL line
would parse to (null cells are absent fields), so the rest of the pipeline is the JSONL one and gives the
same numbers. Rows count from 1; errors name the file, the row and the column.

A trace partition (written by ``simulate-prefix --partition-dir``) is one replica's share of a routed trace:
the requests as they were read (tokens or hash_ids, salt, tenant, timestamp, output tokens, source line),
so that a worker can replay it without the original trace.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..errors import InputError, UsageError

MAGIC = b"PAR1"
#: rows per record batch (one batch of Python objects is in memory at a time)
BATCH_ROWS = 4096
#: columns a trace row may use, besides those named by --salt-field/--tenant-field/--session-field
TRACE_COLUMNS = ("tokens", "prompt_token_ids", "input_ids", "hash_ids", "input_length", "timestamp",
                 "output_tokens", "output_length", "salt", "cache_salt", "segments", "prompt", "messages", "text",
                 "body")
_INT_LISTS = ("tokens", "prompt_token_ids", "input_ids", "hash_ids", "segments")
MANIFEST = "manifest.json"
PARTITION_FORMAT = "cachectl-trace-partitions"
PARTITION_VERSION = 1


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError:
        raise UsageError("reading or writing Parquet needs pyarrow: pip install 'llm-cachectl[parquet]'") from None
    return pyarrow, pyarrow.parquet


def is_parquet(path: str) -> bool:
    """A ``.parquet`` name or a file that starts with Parquet's magic bytes ``PAR1``. Parquet keeps its index
    at the end of the file, so stdin (not seekable) is refused when it carries Parquet."""
    if path == "-":
        buf = sys.stdin.buffer
        try:
            if hasattr(buf, "peek"):
                head = buf.peek(4)[:4]
            elif buf.seekable():
                at = buf.tell()
                head = buf.read(4)
                buf.seek(at)
            else:
                head = b""
        except (OSError, ValueError):
            head = b""
        if head == MAGIC:
            raise InputError("Parquet cannot be read from stdin (its index is at the end of the file): pass the "
                             "file's path", source="<stdin>")
        return False
    if path.lower().endswith(".parquet"):
        return True
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe (`<(zcat t.jsonl.gz)`) is read once, by its reader
            return False
        with open(path, "rb") as fh:
            return fh.read(4) == MAGIC
    except OSError:
        return False


def _open(path: str):
    pa, pq = _pyarrow()
    if os.path.isdir(path):
        raise InputError("is a directory, expected a Parquet file", source=path)
    try:
        pf = pq.ParquetFile(path)
        pf.schema_arrow  # noqa: B018 - decoded here, so a damaged footer is reported as one
    except FileNotFoundError:
        raise InputError("no such file", source=path) from None
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:  # a damaged footer: names not UTF-8, ...
        raise InputError(f"not a readable Parquet file ({_first_line(exc)})", source=path) from None
    return pa, pf


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _check_types(pa, schema, source: str) -> None:
    for name in _INT_LISTS:
        i = schema.get_field_index(name)
        if i < 0:
            continue
        t = schema.field(i).type
        ok = ((pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))
              and pa.types.is_integer(t.value_type))
        if not ok:
            raise InputError(f"column '{name}' is {t}: expected a list of integers", source=source)


def parquet_records(path: str, columns: Iterable[str] | None = None,
                    batch_rows: int = BATCH_ROWS) -> Iterator[tuple[int, dict, bool]]:
    """``(row, value, False)`` for each row of a Parquet trace: the row as the dict a JSONL line would give
    (null cells left out; Arrow timestamps as seconds since the epoch), read ``batch_rows`` at a time.

    ``columns``: the top-level columns to read (the others are not decoded); None reads all. The third item
    says that no token list can hold a bool (the list columns are checked to be integer lists).
    """
    pa, pf = _open(path)
    schema = pf.schema_arrow
    _check_types(pa, schema, path)
    names = [n for n in schema.names if columns is None or n in set(columns)]
    if not names:
        raise InputError(f"no trace columns: expected 'tokens' (a list of token IDs) or 'hash_ids' with "
                         f"'input_length'; the file has {', '.join(schema.names[:12]) or 'none'}", source=path)
    stamps = {n for n in names if pa.types.is_timestamp(schema.field(n).type)}
    if pf.metadata.num_rows == 0:
        raise InputError("the trace has no rows", source=path)
    row = 0
    try:
        batches = pf.iter_batches(batch_size=batch_rows, columns=names)
        for batch in batches:
            cols = []
            for n in names:
                col = batch.column(n)
                if n in stamps:   # seconds since the epoch, as a float
                    col = pa.compute.divide(col.cast(pa.int64()).cast(pa.float64()),
                                            float(_per_second(col.type.unit)))
                cols.append(col.to_pylist())
            for values in zip(*cols):
                row += 1
                yield row, {n: v for n, v in zip(names, values) if v is not None}, False
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise InputError(f"unreadable Parquet data after row {row} ({_first_line(exc)})", source=path) from None


def _per_second(unit: str) -> int:
    return {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[unit]


def trace_columns(*dotted: str | None) -> list[str]:
    """The top-level columns a trace read needs: the standard ones and the heads of the named fields."""
    return [*TRACE_COLUMNS, *(d.split(".")[0] for d in dotted if d)]


def located_rows(items: Iterable, source: str) -> Iterator:
    """Pass ``items`` through; an input error located at ``source:N`` is re-worded for a Parquet file: row N,
    column C (the readers downstream speak of lines and fields)."""
    try:
        yield from items
    except InputError as exc:
        raise row_error(exc, source) from None


def row_error(exc: InputError, source: str) -> InputError:
    """``exc`` re-worded for a Parquet file when it is located at ``source:N``: row N, column C; else itself."""
    if exc.source != source or exc.line is None:
        return exc
    column = f"column '{exc.field}': " if exc.field else ""
    return InputError(f"{column}{exc.message}", source=f"{source}: row {exc.line}")


# -------------------------------------------------------------------------------------------- partitions


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _unjson(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class PartitionWriter:
    """One Parquet file per replica under ``directory``, written in batches as requests are routed, and a
    manifest (``manifest.json``) that says how they were made.

    Each file is written to a temporary file beside it and renamed into place by :meth:`close`, the manifest
    last; used as a context manager, an error or an interrupt before that removes every file written (and the
    directory, when this writer made it): a directory with a manifest is complete."""

    def __init__(self, directory: str, replicas: int, *, batch_rows: int = BATCH_ROWS):
        pa, pq = _pyarrow()
        self._pa, self._pq = pa, pq
        if not directory:
            raise UsageError("--partition-dir takes a directory name, and was given an empty one")
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise InputError("exists and is not a directory", source=directory)
        if os.path.isdir(directory) and os.listdir(directory):
            raise InputError("is not empty: partitions go to a new or empty directory", source=directory)
        _open_files_for(replicas)
        self._made = not os.path.isdir(directory)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create: {exc.strerror or exc}", source=directory) from None
        self.directory = directory
        self.files = [f"replica-{r:05d}.parquet" for r in range(replicas)]
        self._outputs: list = [None] * replicas   # the AtomicFile of each partition, made on its first batch
        self._committed: list[str] = []
        self.schema = pa.schema([
            ("index", pa.int64()), ("line", pa.int64()), ("prompt_tokens", pa.int64()),
            ("tokens", pa.list_(pa.uint64())), ("hash_ids", pa.list_(pa.uint64())),
            ("salt_json", pa.string()), ("tenant_json", pa.string()), ("session_json", pa.string()),
            ("timestamp", pa.float64()), ("output_tokens", pa.int64()),
            ("unsalted", pa.bool_()), ("no_tenant", pa.bool_()),
        ])
        self._writers: list = [None] * replicas
        self._rows: list[list[dict]] = [[] for _ in range(replicas)]
        self.counts = [0] * replicas
        self.tokens = [0] * replicas
        self._batch = batch_rows

    def add(self, replica: int, req: Any) -> None:
        """``req``: a :class:`cachectl.engines.prefix.trace.TraceRequest` (token IDs or hash_ids)."""
        if req.segments is not None:
            raise UsageError("partitions keep token IDs or hash_ids, not chunk segments")
        self._rows[replica].append({
            "index": req.index, "line": req.line, "prompt_tokens": req.prompt_tokens,
            "tokens": None if req.tokens is None else list(req.tokens),
            "hash_ids": None if req.hash_ids is None else list(req.hash_ids),
            "salt_json": _json(req.salt), "tenant_json": _json(req.tenant), "session_json": _json(req.session),
            "timestamp": req.timestamp, "output_tokens": req.output_tokens,
            "unsalted": req.unsalted, "no_tenant": req.no_tenant})
        self.counts[replica] += 1
        self.tokens[replica] += req.prompt_tokens
        if len(self._rows[replica]) >= self._batch:
            self._flush(replica)

    def _flush(self, replica: int) -> None:
        rows = self._rows[replica]
        if not rows and self._writers[replica] is not None:
            return
        pa, pq = self._pa, self._pq
        try:
            table = pa.Table.from_pylist(rows, schema=self.schema)
        except (pa.ArrowException, OverflowError) as exc:
            raise InputError(f"cannot store a request in a partition ({_first_line(exc)}): token IDs and hash_ids "
                             "must fit in 64 bits") from None
        out = self._outputs[replica]
        if out is None:
            from ..outputs import AtomicFile

            self._outputs[replica] = out = AtomicFile(os.path.join(self.directory, self.files[replica]))
        try:  # (one open file a partition: the writer writes to the temporary file's own descriptor)
            if self._writers[replica] is None:
                self._writers[replica] = pq.ParquetWriter(out.file, self.schema)
            self._writers[replica].write_table(table)
        except OSError as exc:  # named by its own partition, not the first one
            raise out.fail(exc) from None
        rows.clear()

    def close(self, manifest: dict) -> dict:
        """Write what is left, close every file (an empty share is an empty file), rename them into place,
        then write the manifest."""
        from ..outputs import write_text

        for r in range(len(self.files)):
            self._flush(r)
            self._writers[r].close()
        for r, out in enumerate(self._outputs):
            out.commit()
            self._committed.append(os.path.join(self.directory, self.files[r]))
        doc = {"format": PARTITION_FORMAT, "version": PARTITION_VERSION, **manifest,
               "partitions": [{"file": f, "requests": n, "prompt_tokens": t}
                              for f, n, t in zip(self.files, self.counts, self.tokens)]}
        write_text(os.path.join(self.directory, MANIFEST), json.dumps(doc, indent=2) + "\n")
        self._committed.clear()
        return doc

    def __enter__(self) -> PartitionWriter:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            return
        # nothing partial: the temporary files, the partitions already renamed, the directory this writer made
        first: BaseException | None = None
        for writer in self._writers:
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.close()
        for out in self._outputs:
            if out is not None:
                err = out.fail(exc)
                first = first or (err if err is not exc else None)
        for path in self._committed:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if self._made:
            with contextlib.suppress(OSError):
                os.rmdir(self.directory)
        if first is not None:
            raise first from None


#: open files kept for the rest of the process (the log being read, the tokenizer, libraries' own)
_SPARE_FILES = 64


def _open_files_for(replicas: int) -> None:
    """Room for one open file a partition (they are written side by side): the soft limit on open files is raised
    toward the hard one where it is lower, and a hard limit below it is one line before anything is written (it
    was an error at the partition past the limit, after writing the others)."""
    try:
        import resource
    except ImportError:  # (not on Windows)
        return
    need = replicas + _SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard == resource.RLIM_INFINITY or need <= hard:
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return
    raise UsageError(f"--replicas {replicas:,} writes {replicas:,} partition files side by side, and this process may "
                     f"open {hard if hard != resource.RLIM_INFINITY else soft:,} files (ulimit -n): raise the limit "
                     f"to {need:,} or route over fewer replicas")


def is_partition_dir(path: str) -> bool:
    return path != "-" and os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST))


def read_manifest(directory: str) -> dict:
    """The manifest of a partition directory, checked: format, version, one file per replica, all present."""
    from .files import parse_json_document, read_text

    path = os.path.join(directory, MANIFEST)
    text, source = read_text(path)
    doc = parse_json_document(text, source)
    if not isinstance(doc, dict) or doc.get("format") != PARTITION_FORMAT:
        raise InputError(f"not a manifest of trace partitions (expected format {PARTITION_FORMAT!r})", source=source)
    if doc.get("version") != PARTITION_VERSION:
        raise InputError(f"partition format version {doc.get('version')!r}; this cachectl reads version "
                         f"{PARTITION_VERSION}", source=source, field="version")
    parts = doc.get("partitions")
    if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
        raise InputError("expected a non-empty list of partitions", source=source, field="partitions")
    for i, p in enumerate(parts):
        f = p.get("file")
        if not isinstance(f, str) or os.path.basename(f) != f or not isinstance(p.get("requests"), int):
            raise InputError("expected a file name in this directory and a request count", source=source,
                             field=f"partitions[{i}]")
        if not os.path.isfile(os.path.join(directory, f)):
            raise InputError(f"partition file {f} is missing", source=source, field=f"partitions[{i}].file")
    for p in parts:  # the row counts, from each file's footer: a file replaced by another is refused
        path = os.path.join(directory, p["file"])
        _, pf = _open(path)
        rows = pf.metadata.num_rows
        if rows != p["requests"]:
            raise InputError(f"{rows:,} rows, but {MANIFEST} says {p['requests']:,} requests: the file was "
                             "replaced or changed since the partitions were written", source=path)
    _check_routing(doc, len(parts), source)
    total = doc.get("requests")
    if total != sum(p["requests"] for p in parts):
        raise InputError(f"requests {total!r} is not the sum of the partitions' requests "
                         f"({sum(p['requests'] for p in parts):,})", source=source, field="requests")
    return doc


def _check_routing(doc: dict, parts: int, source: str) -> None:
    """How the manifest says the trace was routed, as ``partition`` writes it: the router's name (which router
    it is, the fleet replay checks: :func:`cachectl.engines.prefix.fleet.simulate_partitions`), the replicas (one
    a partition), the block sizes and the router's parameters (an object)."""
    router = doc.get("router")
    if not isinstance(router, str):
        raise InputError(f"expected a router's name, got {str(router)[:40]!r}", source=source, field="router")
    replicas = doc.get("replicas")
    if type(replicas) is not int or replicas != parts:
        raise InputError(f"expected the number of partitions ({parts:,}), got {str(replicas)[:40]!r}",
                         source=source, field="replicas")
    for name in ("block_size", "hash_block_size"):
        size = doc.get(name)
        if size is not None and (type(size) is not int or size < 1):
            raise InputError(f"expected a block size, got {str(size)[:40]!r}", source=source, field=name)
    if not isinstance(doc.get("router_params", {}), dict):
        raise InputError("expected an object", source=source, field="router_params")


def partition_rows(path: str) -> Iterator[dict]:
    """The requests of one partition file, in their routed order, as the keyword arguments of a
    :class:`cachectl.engines.prefix.trace.TraceRequest` (read a batch at a time)."""
    pa, pf = _open(path)
    names = ("index", "line", "prompt_tokens", "tokens", "hash_ids", "salt_json", "tenant_json", "session_json",
             "timestamp", "output_tokens", "unsalted", "no_tenant")
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=list(names)):
            cols = [batch.column(n).to_pylist() for n in names]
            for (index, line, n, tokens, hash_ids, salt, tenant, session, ts, out, unsalted,
                 no_tenant) in zip(*cols):
                yield dict(index=index, line=line, prompt_tokens=n, tokens=tokens, hash_ids=hash_ids,
                           salt=_unjson(salt), tenant=_unjson(tenant), session=_unjson(session), timestamp=ts,
                           output_tokens=out, unsalted=unsalted, no_tenant=no_tenant)
    except (pa.ArrowException, OSError, KeyError, ValueError) as exc:
        raise InputError(f"not a trace partition ({_first_line(exc)})", source=path) from None


def partition_paths(directory: str, manifest: dict) -> Sequence[str]:
    return [os.path.join(directory, p["file"]) for p in manifest["partitions"]]
