"""A large token trace read and keyed by several processes, handed on in file order.

Parsing token IDs (orjson builds one Python int per token) and hashing blocks are most of a replay's time,
and they do not depend on the cache: only the replay does, and it needs the requests in order. So a plain
JSONL file is cut into chunks at line ends; forked workers read, parse, validate and key whole chunks with
the code one process uses (:func:`~cachectl.inputs.parse_jsonl_line`,
:func:`~cachectl.engines.prefix.iter_trace`, :func:`~cachectl.engines.prefix.request_keys`), and each sends
its chunks back, one frame per chunk, through a pipe of its own. The parent yields the keyed requests chunk
after chunk, in file order, so the replay sees what one process would have read, errors included: a
worker that meets a bad line sends what it read before it and the error, which the parent raises when the
replay reaches that line (a capacity error earlier in the file still comes first). A pipe holds one frame
at a time, so memory stays flat in the trace length.

The chunks and their lines come from :class:`~cachectl.inputs.files.JsonlChunks`, with the line rules of
every reader. Forked workers share the parent's hash secret, so a salted key (a hashed string) is the same
in every process. Where ``fork`` is missing (Windows), on stdin, gzip, zstd and Parquet, the caller reads in
one process.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import CachectlError, InputError
from ...inputs import parse_jsonl_line
from ...inputs.files import JsonlChunks, plain_size
from .trace import TraceRequest, _may_hold_bool, iter_trace, request_keys

#: files smaller than this are read in one process (forking and pickling would cost more than they save)
MIN_BYTES = 8 << 20
MAX_JOBS = 8
_HEADER = struct.Struct("<Q")
_new = object.__new__


def default_jobs() -> int:
    """Reading processes by default: the CPUs this process may run on, at most :data:`MAX_JOBS`."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_JOBS))


def can_read_in_parallel(path: str, jobs: int, *, min_bytes: int | None = None) -> bool:
    """Whether ``path`` is worth reading in ``jobs`` forked processes: a plain file
    (:func:`~cachectl.inputs.files.plain_size`) of at least ``min_bytes``, ``jobs`` > 1, and ``os.fork``."""
    if jobs < 2 or not hasattr(os, "fork") or sys.platform == "win32":
        return False
    size = plain_size(path)
    return size is not None and size >= max(1, MIN_BYTES if min_bytes is None else min_bytes)


def _key_chunk(chunks: JsonlChunks, index: int, block_size: int, hash_fn: str,
               trace_opts: dict[str, Any]) -> tuple[int, bool, list, tuple | None]:
    """``(lines, any_non_blank, items, error)`` of one chunk; ``items`` hold each request's keys."""
    source = chunks.source
    items: list = []
    error: tuple | None = None
    count, seen = 0, False
    try:
        lines = chunks.lines(index)
        records = ((lineno, parse_jsonl_line(raw, source, lineno), _may_hold_bool(raw)) for lineno, raw in lines)
        for req in iter_trace(records, source=source, tokenizer=None, **trace_opts):
            keys: Sequence = request_keys(req, block_size, hash_fn)
            try:  # 8 bytes a key where they are 64-bit integers (the builtin hash, Mooncake ids)
                keys = array("q", keys)
            except (TypeError, OverflowError):
                keys = list(keys)
            items.append((req.line, req.prompt_tokens, keys,
                          req.hash_block_size if req.hash_ids is not None else block_size, req.tenant,
                          req.timestamp, req.output_tokens, req.unsalted, req.no_tenant, req.session,
                          None if req.served_cached_tokens is None else
                          (req.served_cached_tokens, req.served_prompt_tokens, req.served_model)))
        count, seen = lines.count, lines.seen
    except InputError as exc:
        error = ("input", exc.message, exc.source, exc.line, exc.field)
    except CachectlError as exc:
        error = ("error", exc)
    except Exception as exc:   # a bug: carried to the parent, which raises it as one process would have
        error = ("crash", _portable(exc))
    return count, seen, items, error


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling (to be raised again in the parent), else a RuntimeError that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 (any failure to pickle)
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _serve(chunks: JsonlChunks, mine: list[int], out: int, block_size: int, hash_fn: str,
           trace_opts: dict[str, Any]) -> None:
    """A worker: key its chunks, in order, and write one frame per chunk; stop after an error."""
    with open(out, "wb", buffering=0, closefd=True) as pipe:
        for index in mine:
            frame = _key_chunk(chunks, index, block_size, hash_fn, trace_opts)
            payload = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
            pipe.write(_HEADER.pack(len(payload)))
            view = memoryview(payload)
            while view:
                view = view[pipe.write(view) or 0:]
            if frame[3] is not None:
                return


def _ended(pid: int) -> str:
    """How worker ``pid``, which sent no more, ended (reaped here)."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped by the system (SIGCHLD ignored, as a parent may pass it on): no status
        return "stopped"
    code = os.waitstatus_to_exitcode(status)
    return f"was killed by signal {-code}" if code < 0 else f"stopped with exit code {code}"


def _read_frame(pipe: Any) -> Any:
    head = pipe.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    payload = pipe.read(size)
    if len(payload) < size:
        return None
    return pickle.loads(payload)


class KeyedTrace:
    """The requests of a JSONL trace, cut into ``chunks``, keyed at ``block_size`` by ``jobs`` forked workers,
    in file order, as pre-keyed requests (``hash_ids`` = their block keys; a Mooncake request keeps its own
    block size, so a replay at another one refuses it as it would have). ``trace_opts`` go to
    :func:`~cachectl.engines.prefix.iter_trace` (salt, tenant and session fields, ``no_salt``, ...).

    The workers are forked by :meth:`start` (call it before any thread starts, e.g. a progress bar's) or by
    the first request asked for; :meth:`close` (also on leaving a ``with`` block) ends them, read or not.
    """

    def __init__(self, chunks: JsonlChunks, *, block_size: int, hash_fn: str = "builtin", jobs: int = 2,
                 **trace_opts: Any) -> None:
        self.chunks, self.source, self.block_size, self.hash_fn = chunks, chunks.source, block_size, hash_fn
        self.jobs, self.trace_opts = jobs, trace_opts
        self._procs: list[tuple[int, Any]] = []
        self._started = False
        self._inline = False

    def __enter__(self) -> KeyedTrace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        workers = max(1, min(self.jobs, len(self.chunks)))
        plan = [list(range(w, len(self.chunks), workers)) for w in range(workers)]
        try:
            for w in range(workers):
                r, wfd = os.pipe()
                try:
                    pid = os.fork()
                except BaseException:
                    os.close(r)
                    os.close(wfd)
                    raise
                if pid == 0:  # pragma: no cover (a child: coverage is not collected there)
                    code = 1
                    try:
                        # a worker makes no reference cycles: no collector passes over its (and the parent's
                        # copy-on-write) objects
                        gc.disable()
                        os.close(r)
                        for _, pipe in self._procs:
                            pipe.close()
                        _serve(self.chunks, plan[w], wfd, self.block_size, self.hash_fn, self.trace_opts)
                        code = 0
                    except BaseException:  # noqa: BLE001,S110 (a child never returns into the parent's code)
                        pass
                    finally:
                        os._exit(code)
                os.close(wfd)
                self._procs.append((pid, open(r, "rb", buffering=1 << 20)))
        except OSError:  # no more processes or file descriptors: the chunks are keyed here, one after another
            self.close()
            self._inline = True
        except BaseException:
            self.close()
            raise

    def __iter__(self) -> Iterator[TraceRequest]:
        self.start()
        try:
            yield from self._collect()
        finally:
            self.close()

    def _collect(self) -> Iterator[TraceRequest]:
        procs, workers = self._procs, len(self._procs)
        index = 0
        line_base = 0                 # lines of the chunks before this one
        seen = False
        for i in range(len(self.chunks)):
            if self._inline:
                frame = _key_chunk(self.chunks, i, self.block_size, self.hash_fn, self.trace_opts)
            else:
                pid, pipe = procs[i % workers]
                frame = _read_frame(pipe)
                if frame is None:
                    procs[i % workers] = (0, pipe)
                    raise CachectlError(f"{self.source}: a reading process {_ended(pid)}; rerun with --read-jobs 1")
            lines, any_line, items, error = frame
            shift = line_base + 1 - self.chunks.first_line(i)
            for (line, prompt_tokens, keys, hbs, tenant, timestamp, output_tokens, unsalted, no_tenant,
                 session, served) in items:
                # the frozen dataclass's __init__ sets each field through object.__setattr__ (4x the time of
                # one dict update); the fields not given keep their class defaults, as __init__ would
                req = _new(TraceRequest)
                req.__dict__.update(index=index, line=line + shift, prompt_tokens=prompt_tokens, hash_ids=keys,
                                    hash_block_size=hbs, tenant=tenant, timestamp=timestamp,
                                    output_tokens=output_tokens, unsalted=unsalted, no_tenant=no_tenant,
                                    session=session)
                if served is not None:  # what the server reported beside the request (absent: the defaults)
                    req.__dict__.update(served_cached_tokens=served[0], served_prompt_tokens=served[1],
                                        served_model=served[2])
                yield req
                index += 1
            if error is not None:
                if error[0] == "input":
                    _, message, src, line, field = error
                    raise InputError(message, source=src, line=None if line is None else line + shift,
                                     field=field)
                raise error[1]
            seen = seen or any_line
            line_base += lines
        if not seen:
            raise InputError("file is empty", source=self.source)

    def close(self) -> None:
        procs, self._procs = self._procs, []
        for pid, pipe in procs:
            pipe.close()
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:  # reaped by the system already: this process ignores SIGCHLD
                    pass
