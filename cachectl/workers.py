"""Parts of one long run computed beside it, on a machine with more than one core: a forked child computes one
part (a measure of the log, a section of the report) from what the parent holds at the fork, and sends back its
result; the parent goes on meanwhile. The results are the same as in one process: the child runs the same code
on the same data.

    with Workers(jobs=None, progress=tick) as workers:    # None: the cores this process may use
        side = workers.submit(before_measure, lines)     # forked now (or run here, at .result(), with one job)
        ...                                              # the parent's own work; pass workers.tick as progress
        m = side.result()                                # the child's value, or its error raised here

Linux only (``os.fork``); elsewhere, with one core or ``jobs=1``, a part runs in this process when its result is
asked for. At most ``jobs`` children run at once (a submit beyond waits for the oldest): the parent, which
waits for their results at the end, is not counted. What a child must
not share with its parent is made its own at the fork: the spools (:class:`cachectl.spool.Spool`: the child
appends to a file of its own), the render watchdog (:mod:`cachectl.sandbox`), the tokenizers library's thread
pool (``TOKENIZERS_PARALLELISM`` is false in the child: a pool does not survive a fork). A child never writes to
stdout or stderr: its progress ticks and its result, or its error, reach the parent through a pipe. A child
that dies without a result (killed, out of memory) has its part run again in the parent, with a line on stderr.
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import struct
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: a message on a child's pipe: its kind (b"T": ticks, b"R": the result) and the payload's length
_HEADER = struct.Struct("<cQ")
#: a child sends its progress at most this often (seconds); the parent forwards it as it ticks itself
TICK_S = 0.5

#: this process is a worker's child: the pipe to its parent (None in the parent)
_CHILD_PIPE: int | None = None
_pending = 0        # a child's ticks not yet sent
_sent_at = 0.0      # when they were last sent


def available_jobs() -> int:
    """The processes a run may use: the cores this process may run on, 1 where ``os.fork`` is not safe to use."""
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover
        return max(1, os.cpu_count() or 1)


def in_child() -> bool:
    """Whether this process is a worker's child (where a part runs as it is, never forked again)."""
    return _CHILD_PIPE is not None


class Job(Generic[T]):
    """One part of the run: computed in a child (``pid``) or, in one process, when :meth:`result` is called."""

    def __init__(self, workers: Workers, fn: Callable[..., T], args: tuple, kwargs: dict) -> None:
        self._workers = workers
        self._call: tuple[Callable[..., T], tuple, dict] | None = (fn, args, kwargs)
        self.pid: int | None = None
        self._fd = -1
        self._buf = bytearray()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ the parent's side

    def result(self) -> T:
        """The part's value (waiting for its child), or its error raised here."""
        if not self._done:
            if self.pid is not None:
                self._wait()
            if not self._done:  # one process, or a child that left no result: the part runs here
                assert self._call is not None
                fn, args, kwargs = self._call
                try:
                    self._value = fn(*args, **kwargs)
                except BaseException as exc:
                    self._error = exc
                self._done = True
            self._call = None
        if self._error is not None:
            raise self._error
        return self._value

    def _wait(self) -> None:
        while self.pid is not None:
            select.select([self._fd], [], [], TICK_S)
            self._drain()

    def _drain(self) -> None:
        """Read what the child sent (non-blocking): ticks go to the progress; at the end of the pipe, reap it."""
        if self.pid is None:
            return
        ended = False
        while True:
            try:
                chunk = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                break
            except InterruptedError:  # pragma: no cover
                continue
            if not chunk:
                ended = True
                break
            self._buf += chunk
        while len(self._buf) >= _HEADER.size:
            kind, n = _HEADER.unpack_from(self._buf)
            if len(self._buf) < _HEADER.size + n:
                break
            payload = bytes(self._buf[_HEADER.size:_HEADER.size + n])
            del self._buf[:_HEADER.size + n]
            if kind == b"T":
                self._workers._forward(int.from_bytes(payload, "little"))
            elif kind == b"R":
                self._received(payload)
        if ended:
            self._reap()

    def _received(self, payload: bytes) -> None:
        try:
            status, value, where = pickle.loads(payload)  # noqa: S301 (our own child's, through our own pipe)
        except Exception as exc:  # pragma: no cover - a payload that does not load: the part runs here
            self._workers._say(f"a worker's result did not load ({exc}); its part runs in this process")
            return
        if status == "ok":
            self._value = value
        else:
            if where and os.environ.get("CACHECTL_DEBUG"):
                sys.stderr.write(where)
            self._error = value
        self._done = True

    def _reap(self) -> None:
        assert self.pid is not None
        _, status = os.waitpid(self.pid, 0)
        os.close(self._fd)
        self.pid, self._fd = None, -1
        self._workers._running.remove(self)
        if not self._done:
            how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"exit status {os.WEXITSTATUS(status)}")
            self._workers._say(f"a worker process ended without its result ({how}); its part runs in this process")

    def _kill(self) -> None:
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # pragma: no cover
            pass
        os.waitpid(self.pid, 0)
        os.close(self._fd)
        self.pid, self._fd = None, -1


class Workers:
    """The children of one run (see the module docstring). ``progress(n)``: the run's progress, which the
    children's ticks join; pass :meth:`tick` to the work itself, in the parent and in the children alike."""

    def __init__(self, jobs: int | None = None, progress: Callable[[int], None] | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        if jobs is not None and jobs < 1:
            raise ValueError("jobs must be at least 1")
        most = available_jobs()
        self.jobs = 1 if in_child() else most if jobs is None else min(jobs, most)
        self._progress = progress
        self._say_to = say
        self._running: list[Job] = []
        self._last_drain = 0.0
        self._parent = os.getpid()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Kill and reap the children still running (an error or an interrupt in the parent)."""
        for job in list(self._running):
            job._kill()
        self._running.clear()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Job[T]:
        job: Job[T] = Job(self, fn, args, kwargs)
        if self.jobs < 2 or in_child():  # (a child's parts run in it: no child of a child)
            return job
        while len(self._running) >= self.jobs:  # (the parent mostly waits while its children compute)
            self._running[0]._wait()
        self._fork(job)
        return job

    def tick(self, n: int = 1) -> None:
        """Progress: in the parent, ``progress(n)`` (and what the children sent since); in a child, to its parent."""
        if _CHILD_PIPE is not None:
            _child_tick(n)
            return
        self._forward(n)
        if self._running:
            now = time.monotonic()
            if now - self._last_drain >= TICK_S:
                self._last_drain = now
                for job in list(self._running):
                    job._drain()

    def _forward(self, n: int) -> None:
        if self._progress is not None:
            self._progress(n)

    def _say(self, line: str) -> None:
        if self._say_to is not None:
            self._say_to(line)
        else:
            sys.stderr.write(f"cachectl: {line}\n")

    def _fork(self, job: Job) -> None:
        r, w = os.pipe()
        before = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the child's: its parent's thread pool is not there
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # what the parent holds now is left alone by the child's collector (fewer pages copied)
        try:
            with warnings.catch_warnings():  # (3.12+ warns of fork with threads: ours are made anew in the child)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            gc.unfreeze()
            os.close(r)
            os.close(w)
            _restore(before)
            return  # (no child: the part runs here when its result is asked for)
        if pid == 0:  # pragma: no cover - the child (its coverage is not collected)
            _child(job, r, w)
        gc.unfreeze()
        _restore(before)
        os.close(w)
        os.set_blocking(r, False)
        job.pid, job._fd = pid, r
        self._running.append(job)


def _restore(before: str | None) -> None:
    if before is None:
        os.environ.pop("TOKENIZERS_PARALLELISM", None)
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = before


def _child(job: Job, r: int, w: int) -> None:  # pragma: no cover - runs in the forked child
    global _CHILD_PIPE
    code = 0
    try:
        os.close(r)
        for other in job._workers._running:  # the pipes of the parent's other children are not this one's
            try:
                os.close(other._fd)
            except OSError:
                pass
        job._workers._running = []
        _CHILD_PIPE = w
        os.set_blocking(w, False)  # (ticks: never wait for a busy parent)
        for sig in (signal.SIGINT, signal.SIGTERM):  # an interrupt ends the child; the parent says what happened
            signal.signal(sig, signal.SIG_DFL)
        _die_with_parent(job._workers._parent)
        assert job._call is not None
        fn, args, kwargs = job._call
        try:
            out = ("ok", fn(*args, **kwargs), None)
            payload = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:
            payload = _error_payload(exc)
        _flush_ticks()
        os.set_blocking(w, True)  # (the result: all of it, however long the parent takes to read it)
        _send(w, b"R", payload)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the forked child
    """Linux: the child is killed when its parent dies (killed itself, it cannot kill its children)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # (the parent died before the call)
        os._exit(1)


def _error_payload(exc: BaseException) -> bytes:  # pragma: no cover - runs in the forked child
    where = "".join(traceback.format_exception(exc))
    try:
        payload = pickle.dumps(("err", exc, where), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(payload)  # noqa: S301 (it must load in the parent)
        return payload
    except Exception:
        from .errors import CachectlError

        again: BaseException = (CachectlError(str(exc)) if isinstance(exc, CachectlError)
                                else RuntimeError(f"{type(exc).__name__}: {exc}"))
        return pickle.dumps(("err", again, where), protocol=pickle.HIGHEST_PROTOCOL)


def _send(w: int, kind: bytes, payload: bytes) -> None:  # pragma: no cover - runs in the forked child
    view = memoryview(_HEADER.pack(kind, len(payload)) + payload)
    while view:
        n = os.write(w, view)
        view = view[n:]


def _child_tick(n: int) -> None:  # pragma: no cover - runs in the forked child
    global _pending
    _pending += n
    if time.monotonic() - _sent_at >= TICK_S:
        _flush_ticks()


def _flush_ticks() -> None:  # pragma: no cover - runs in the forked child
    """The ticks counted since the last ones sent, in one message of less than ``PIPE_BUF`` bytes (written whole or
    not at all): when the pipe is full (the parent busy), they wait for the next time and the child goes on."""
    global _pending, _sent_at
    _sent_at = time.monotonic()
    if _CHILD_PIPE is None or not _pending:
        return
    try:
        os.write(_CHILD_PIPE, _HEADER.pack(b"T", 8) + _pending.to_bytes(8, "little"))
    except BlockingIOError:
        return
    _pending = 0
