"""Parts of one long run computed beside it, on a machine with more than one core: a forked child computes one
part (a measure of the log, a section of the report) from what the parent holds at the fork, and sends back its
result; the parent goes on meanwhile. The results are the same as in one process: the child runs the same code
on the same data.

    with Workers(jobs=None, progress=tick) as workers:    # None: the cores this process may use
        side = workers.submit(before_measure, lines)     # forked now (or run here, at .result(), with one job)
        ...                                              # the parent's own work; pass workers.tick as progress
        m = side.result()                                # the child's value, or its error raised here

A child is a :mod:`multiprocessing` process of the ``fork`` context: it starts from the parent's memory as it is at
the submit, so a part is any callable, closures over the run's state included, never pickled (which is why this
is not a ``concurrent.futures`` pool: its workers take pickled callables, and it cannot stop a running one before
Python 3.14). Its result comes back through a :func:`multiprocessing.Pipe`, its progress through a shared counter
(:func:`multiprocessing.Value`: a busy parent never makes a child wait). Linux only; elsewhere, with one core or
``jobs=1``, a part runs in this process when its result is asked for. At most ``jobs`` children run at once (a
submit beyond waits for the oldest): the parent, which waits for their results at the end, is not counted.

What a child must not share with its parent is made its own at the fork: the spools (:class:`cachectl.spool.Spool`:
the child appends to a file of its own), the render watchdog (:mod:`cachectl.sandbox`), the tokenizers library's
thread pool (``TOKENIZERS_PARALLELISM`` is false in the child: a pool does not survive a fork). A child never
writes to stdout or stderr. A child that dies without a result (killed, out of memory) has its part run again in
the parent, with a line on stderr; a child dies with its parent.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: a child sends its progress at most this often (seconds); the parent forwards it as it ticks itself
TICK_S = 0.5

#: in a worker's child: its progress counter, shared with the parent (None in the parent)
_CHILD_TICKS: Any = None
_pending = 0        # a child's ticks not yet added to the counter
_sent_at = 0.0      # when they were last added


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
    return _CHILD_TICKS is not None


class Job(Generic[T]):
    """One part of the run: computed in a child (``pid``) or, in one process, when :meth:`result` is called."""

    def __init__(self, workers: Workers, fn: Callable[..., T], args: tuple, kwargs: dict) -> None:
        self._workers = workers
        self._call: tuple[Callable[..., T], tuple, dict] | None = (fn, args, kwargs)
        self._proc: Any = None      # the child (a multiprocessing Process)
        self._conn: Any = None      # the parent's end of its pipe
        self._ticks: Any = None     # its progress counter, and how much of it was forwarded
        self._forwarded = 0
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (None: in this process, or reaped)."""
        return self._proc.pid if self._proc is not None else None

    def result(self) -> T:
        """The part's value (waiting for its child), or its error raised here."""
        if not self._done:
            while self._proc is not None:
                self._drain(TICK_S)
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

    def _drain(self, wait: float = 0.0) -> None:
        """Forward the child's progress; take its result once sent (waiting up to ``wait`` s); reap it at the end."""
        if self._proc is None:
            return
        self._forward_ticks()
        try:
            if not self._conn.poll(wait):
                return
            payload = self._conn.recv_bytes()
        except (EOFError, OSError):  # the child ended without a result
            self._reap()
            return
        self._received(payload)
        self._reap()

    def _forward_ticks(self) -> None:
        now = self._ticks.value
        if now > self._forwarded:
            self._workers._forward(now - self._forwarded)
            self._forwarded = now

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
        proc, self._proc = self._proc, None
        proc.join()
        code = proc.exitcode or 0
        self._forward_ticks()  # (what it counted after its last look)
        self._conn.close()
        proc.close()
        self._workers._running.remove(self)
        if not self._done:
            how = f"signal {-code}" if code < 0 else f"exit status {code}"
            self._workers._say(f"a worker process ended without its result ({how}); its part runs in this process")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.join()
        proc.close()
        self._conn.close()


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
            self._running[0]._drain(TICK_S)
        self._fork(job)
        return job

    def tick(self, n: int = 1) -> None:
        """Progress: in the parent, ``progress(n)`` (and what the children counted since); in a child, to its
        parent."""
        if _CHILD_TICKS is not None:
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
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        mine, theirs = ctx.Pipe(duplex=False)
        ticks = ctx.Value("q", 0)
        proc = ctx.Process(target=_child, args=(job, theirs, ticks, os.getpid()))
        before = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the child's: its parent's thread pool is not there
        sys.stdout.flush()
        sys.stderr.flush()
        gc.freeze()  # what the parent holds now is left alone by the child's collector (fewer pages copied)
        try:
            with warnings.catch_warnings():  # (3.12+ warns of fork with threads: ours are made anew in the child)
                warnings.simplefilter("ignore", DeprecationWarning)
                proc.start()
        except OSError:
            mine.close()
            return  # (no child: the part runs here when its result is asked for)
        finally:
            gc.unfreeze()
            _restore(before)
            theirs.close()
        job._proc, job._conn, job._ticks = proc, mine, ticks
        self._running.append(job)


def _restore(before: str | None) -> None:
    if before is None:
        os.environ.pop("TOKENIZERS_PARALLELISM", None)
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = before


def _child(job: Job, conn: Any, ticks: Any, parent: int) -> None:  # pragma: no cover - runs in the forked child
    """The part, in the child; it ends the process itself (nothing of the parent's exit handlers runs here, and
    nothing is written to stderr: the parent says what happened)."""
    global _CHILD_TICKS
    code = 0
    try:
        _CHILD_TICKS = ticks
        for other in job._workers._running:  # the pipes of the parent's other children are not this one's
            other._conn.close()
        job._workers._running = []
        for sig in (signal.SIGINT, signal.SIGTERM):  # an interrupt ends the child; the parent says what happened
            signal.signal(sig, signal.SIG_DFL)
        _die_with_parent(parent)
        assert job._call is not None
        fn, args, kwargs = job._call
        try:
            payload = pickle.dumps(("ok", fn(*args, **kwargs), None), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:
            payload = _error_payload(exc)
        _flush_ticks()
        conn.send_bytes(payload)  # (all of it, however long the parent takes to read it)
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


def _child_tick(n: int) -> None:  # pragma: no cover - runs in the forked child
    global _pending
    _pending += n
    if time.monotonic() - _sent_at >= TICK_S:
        _flush_ticks()


def _flush_ticks() -> None:  # pragma: no cover - runs in the forked child
    """Add the ticks counted since the last time to the shared counter (a lock held for an addition)."""
    global _pending, _sent_at
    _sent_at = time.monotonic()
    if _CHILD_TICKS is None or not _pending:
        return
    with _CHILD_TICKS.get_lock():
        _CHILD_TICKS.value += _pending
    _pending = 0
