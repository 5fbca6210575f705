"""Parts of one long run computed beside it, on a machine with more than one core: a forked child computes one
part (a measure of the log, a section of the report) from what the parent holds at the fork, and sends back its
result; the parent goes on meanwhile. The results are the same as in one process: the child runs the same code
on the same data.

    with Workers(jobs=None, progress=tick) as workers:    # None: the cores this process may use
        side = workers.submit(before_measure, lines)     # forked now (or run here, at .result(), with one job)
        ...                                              # the parent's own work; pass workers.tick as progress
        m = side.result()                                # the child's value, or its error raised here

A part runs in a :class:`concurrent.futures.ProcessPoolExecutor` of one process, of the ``fork`` context, made
for it at the submit: the child starts from the parent's memory as it is then, so a part is any callable,
closures over the run's state included. The executor pickles only the part's number; the child finds the part
itself in :data:`_PARTS`, as the parent left it at the fork. Its progress comes back through a shared counter
(:func:`multiprocessing.Value`: a busy parent never makes a child wait). Linux only; elsewhere, with one core or
``jobs=1``, a part runs in this process when its result is asked for. At most ``jobs`` children run at once (a
submit beyond waits for the oldest): the parent, which waits for their results at the end, is not counted.

What a child must not share with its parent is made its own at the fork: the spools (:class:`cachectl.spool.Spool`:
the child appends to a file of its own), the render watchdog (:mod:`cachectl.sandbox`), the tokenizers library's
thread pool (``TOKENIZERS_PARALLELISM`` is false in the child: a pool does not survive a fork). A child never
writes to stdout or stderr. A child that dies without a result (killed, out of memory) has its part run again in
the parent, with a line on stderr; a child dies with its parent, and :meth:`Workers.close` kills the children
still running (an executor cannot stop a running call before Python 3.14, so its process is killed).
"""

from __future__ import annotations

import gc
import itertools
import os
import pickle
import signal
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: a child sends its progress at most this often (seconds); the parent forwards it as it ticks itself
TICK_S = 0.5

#: in a worker's child: its progress counter, shared with the parent (None in the parent)
_CHILD_TICKS: Any = None
_pending = 0        # a child's ticks not yet added to the counter
_sent_at = 0.0      # when they were last added

#: the parts being forked, by number: (callable, args, kwargs), found by the child in the memory it forked from
_PARTS: dict[int, tuple[Callable[..., Any], tuple, dict]] = {}
_numbers = itertools.count()


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

    def __init__(self, workers: Workers, call: tuple[Callable[..., T], tuple, dict]) -> None:
        self._workers = workers
        self._call: tuple[Callable[..., T], tuple, dict] | None = call
        self._executor: ProcessPoolExecutor | None = None
        self._future: Future | None = None
        self._proc: Any = None      # the child (the executor's one process)
        self._ticks: Any = None     # its progress counter, and how much of it was forwarded
        self._forwarded = 0
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (None: in this process, or reaped)."""
        return self._proc.pid if self._proc is not None else None

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the part has ended (in its child: waiting up to ``timeout`` s; in this process: whether it ran)."""
        if self._future is None:
            return self._done
        return bool(wait([self._future], timeout=timeout).done)

    def result(self) -> T:
        """The part's value (waiting for its child), or its error raised here."""
        if not self._done:
            while self._future is not None:
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

    def _drain(self, timeout: float | None = 0.0) -> None:
        """Forward the child's progress; take its result once it ended (waiting up to ``timeout`` s; None: until it
        ends), and reap it."""
        if self._future is None:
            return
        self._forward_ticks()
        if not self.wait(timeout):
            return
        try:
            self._value, self._done = self._future.result(), True
        except BrokenProcessPool:  # the child ended without a result
            pass
        except BaseException as exc:
            self._error, self._done = exc, True
        self._reap()

    def _forward_ticks(self) -> None:
        now = self._ticks.value
        if now > self._forwarded:
            self._workers._forward(now - self._forwarded)
            self._forwarded = now

    def _reap(self, kill: bool = False) -> None:
        executor, proc = self._executor, self._proc
        self._executor = self._future = self._proc = None
        if executor is None:
            return
        if kill and proc is not None:
            proc.kill()
        executor.shutdown(wait=True, cancel_futures=True)
        self._workers._running.remove(self)
        if kill:
            return
        self._forward_ticks()  # (what it counted after its last look)
        if not self._done:
            self._workers._say(f"a worker process ended without its result ({_how(proc)}); its part runs in this "
                               "process")


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
            job._reap(kill=True)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Job[T]:
        job: Job[T] = Job(self, (fn, args, kwargs))
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
        assert job._call is not None
        forked, held = _forked(job._call)
        if forked is not None:  # (None: no child; the part runs here when its result is asked for)
            job._ticks, job._executor, job._future, job._proc = forked
            self._running.append(job)
        if held:  # an interrupt that came during the fork, raised now that the child is known (and killed by close)
            signal.raise_signal(held[0])


def _forked(call: tuple[Callable[..., Any], tuple, dict]
            ) -> tuple[tuple[Any, ProcessPoolExecutor, Future, Any] | None, list[int]]:
    """A child forked for ``call`` (a :class:`ProcessPoolExecutor` of one process of the fork context, at its one
    call, :func:`_run`: the child finds ``call`` by number in :data:`_PARTS`): its progress counter, executor,
    future and process (None when no process could be forked); and the signals (SIGINT, SIGTERM) that came during
    the fork, held back: raised in the fork's own hooks (the interpreter's, threading's, logging's, in parent and
    child), an interrupt would be printed and ignored there, or leave the child stuck before its first call."""
    import multiprocessing

    from .outputs import signals_held
    from .tokenization import serial_encoding

    ctx = multiprocessing.get_context("fork")
    ticks = ctx.Value("q", 0)
    executor = ProcessPoolExecutor(1, mp_context=ctx, initializer=_child_start, initargs=(ticks, os.getpid()))
    number = next(_numbers)
    _PARTS[number] = call
    restore = serial_encoding()  # the child's: its parent's thread pool is not there
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # what the parent holds now is left alone by the child's collector (fewer pages copied)
    try:
        # (signals held: the child sets its own handlers at its start, _child_start; 3.12+ warns of fork with
        # threads: ours are made anew in the child)
        with signals_held(raise_after=False) as held, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            future = executor.submit(_run, number)  # (the fork context starts its process here)
    except OSError:
        executor.shutdown(wait=False, cancel_futures=True)
        return None, held
    finally:
        gc.unfreeze()
        restore()
        del _PARTS[number]  # (the child has its copy)
    return (ticks, executor, future, next(iter(getattr(executor, "_processes", {}).values()), None)), held


def _how(proc: Any) -> str:
    """How a child (a :class:`multiprocessing.Process`, or None) ended: ``signal N`` or ``exit status N``."""
    code = (proc.exitcode if proc is not None else None) or 0
    return f"signal {-code}" if code < 0 else f"exit status {code}"


def _child_start(ticks: Any, parent: int) -> None:  # pragma: no cover - runs in the forked child
    """The child's set-up: its progress counter; an interrupt ends it (the parent says what happened); it dies with
    its parent."""
    global _CHILD_TICKS
    _CHILD_TICKS = ticks
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    _die_with_parent(parent)


def _run(number: int) -> Any:  # pragma: no cover - runs in the forked child
    """Part ``number``, in the child. An error that would not load in the parent is sent as one that does."""
    fn, args, kwargs = _PARTS[number]
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:
        raise _loadable(exc) from None
    finally:
        _flush_ticks()


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the forked child
    """Linux: the child is killed when its parent dies (killed itself, it cannot kill its children)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # (the parent died before the call)
        os._exit(1)


def _loadable(exc: BaseException) -> BaseException:  # pragma: no cover - runs in the forked child
    try:
        pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))  # noqa: S301 (it must load in the parent)
        return exc
    except Exception:
        from .errors import CachectlError

        return (CachectlError(str(exc)) if isinstance(exc, CachectlError)
                else RuntimeError(f"{type(exc).__name__}: {exc}"))


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
