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

Items that come in an order the run keeps go to a child beside it while a core is free, and come back in that order
with where each was computed: a sweep's batches (:meth:`Workers.ahead`: the child takes the next item no one has
taken and sends it through a queue of one; the sweep computes the items it has not taken), or batches handed to it as
the run reads them (:meth:`Workers.beside`: a future an item, sent pickled; the run reads on, and computes the items
still waiting itself once it holds five).

    for value, here in workers.ahead(len(batches), tokens_of, rendered_here): ...
    beside = workers.beside(tokens_of, rendered_here)
    done = [x for b in batches_as_read for x in beside.put(b)] + beside.close()   # [(batch, value, here)] in order

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
import queue
import signal
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Generic, TypeVar

T = TypeVar("T")
X = TypeVar("X")

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
        self._besides: list[Beside] = []
        self._last_drain = 0.0

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Kill and reap the children still running (an error or an interrupt in the parent)."""
        for job in list(self._running):
            job._reap(kill=True)
        for b in list(self._besides):
            b.stop()

    def beside(self, fn: Callable[[Any], Any], here: Callable[[X], T],
               send: Callable[[X], Any] = lambda x: x) -> Beside[X, T]:
        """Items computed beside the run as they come (:class:`Beside`): ``fn(send(item))`` in a child, else
        ``here(item)``."""
        return Beside(self, fn, here, send)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Job[T]:
        job: Job[T] = Job(self, (fn, args, kwargs))
        if self.jobs < 2 or in_child():  # (a child's parts run in it: no child of a child)
            return job
        while len(self._running) >= self.jobs:  # (the parent mostly waits while its children compute)
            self._running[0]._drain(TICK_S)
        self._fork(job)
        return job

    def ahead(self, n: int, fn: Callable[[int], Any], here: Callable[[int], T]
              ) -> Generator[tuple[T | Any, bool], None, None]:
        """Items ``0 .. n-1`` of a sweep that takes them in order, computed beside it by a child while a core is free:
        for each, in order, ``(fn(item), False)`` as the child computed it, or ``(here(item), True)`` computed in this
        process. The child takes the next item no one has taken, computes it and sends it (at most :data:`AHEAD`
        waiting); this process computes an item the child has not taken, and while the child computes the item it is
        at, it computes the next item no one has taken (at most :data:`EARLY` ahead), so neither waits for the other.
        ``fn`` runs in the child only, on what this process held when the child was forked (when the first item is
        asked for, and only if no other child is running then); its value must pickle and must not be None. A
        child that dies leaves its items to this process."""
        shared = self._shared(n, fn)
        if shared is None:
            for item in range(n):
                yield here(item), True
            return
        job, taken, got = shared
        early: dict[int, T] = {}   # items computed here while the child computed an earlier one
        dead = done = False
        try:
            for item in range(n):
                if item in early:
                    yield early.pop(item), True
                    continue
                if dead or _take(taken, n, item) is not None:
                    yield here(item), True
                    continue
                value = _NOT_YET  # (the child took it: until it comes, the next items no one took are made here)
                while value is _NOT_YET:
                    nxt = _take(taken, n) if len(early) < EARLY and got.empty() else None
                    if nxt is not None:
                        early[nxt] = here(nxt)
                    else:
                        value = _received(got, item, job)
                if value is None:  # (the child ended without it, with a line if it was killed: its items are ours)
                    dead = True
                    yield here(item), True
                else:
                    yield value, False
            done = True
        finally:
            with taken.get_lock():
                taken.value = n  # (the child takes no more)
            if not dead and done:  # (every item it took was taken from it: it ends now)
                job._drain(None)
            elif not dead:  # (it may be waiting to send one)
                job._reap(kill=True)
            got.close()

    def _shared(self, n: int, fn: Callable[[int], Any]) -> tuple[Job, Any, Any] | None:
        """The child of :meth:`ahead`, its counter of the items taken and its queue; None without one."""
        if self.jobs < 2 or in_child() or n < 2 or not self._idle():
            return None
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        taken, got = ctx.Value("q", 0), ctx.Queue(AHEAD)
        job = self.submit(_ahead, n, fn, taken, got)
        if job._future is None:  # (no child could be forked)
            got.close()
            return None
        return job, taken, got

    def _idle(self) -> bool:
        """Whether no child of the run is running (one that ended is reaped here)."""
        for job in list(self._running):
            job._drain()
        return not self._running

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
        forked = _forked(job._call, _run)
        if forked is None:
            return  # (no child: the part runs here when its result is asked for)
        job._ticks, job._executor, job._future, job._proc, _ = forked
        self._running.append(job)


def _forked(call: tuple[Callable[..., Any], tuple, dict], run: Callable[..., Any], *args: Any
            ) -> tuple[Any, ProcessPoolExecutor, Future, Any, int] | None:
    """A child forked for ``call`` (a :class:`ProcessPoolExecutor` of one process of the fork context, at its first
    call, ``run(number, *args)``: the child finds ``call`` by number in :data:`_PARTS`): its progress counter,
    executor, first future, process and number; None when no process could be forked."""
    import multiprocessing

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
        with warnings.catch_warnings():  # (3.12+ warns of fork with threads: ours are made anew in the child)
            warnings.simplefilter("ignore", DeprecationWarning)
            future = executor.submit(run, number, *args)  # (the fork context starts its process here)
    except OSError:
        executor.shutdown(wait=False, cancel_futures=True)
        return None
    finally:
        gc.unfreeze()
        restore()
        del _PARTS[number]  # (the child has its copy)
    return ticks, executor, future, next(iter(getattr(executor, "_processes", {}).values()), None), number


#: the items :class:`Beside`'s child holds at most (the one it computes, the next one queued)
IN_FLIGHT = 2
#: the items :class:`Beside` holds at most before it gives back the first (computing the waiting ones here meanwhile)
HELD = 4


class Beside(Generic[X, T]):
    """Items that come one at a time (:meth:`put`), each computed by a child, ``fn(send(item))``, or here,
    ``here(item)``; given back in the order put, as ``(item, value, here)``. An item put waits for the child to hold
    fewer than :data:`IN_FLIGHT` (the oldest first) until more than :data:`HELD` are held: then this process computes
    the waiting ones while the child computes the first (a put is quick while the child keeps up). The child is one
    process of a :class:`ProcessPoolExecutor` of the fork context, forked at the first item it takes once no other
    child of the run runs (``fn`` may be a closure), a future an item: ``send(item)`` is pickled to it, its value
    back. A child that dies, or fails on an item, leaves that item to ``here`` (a death with the workers' line, and
    the next items are computed here); an error of ``here`` is the run's. With one job, all are computed here."""

    def __init__(self, workers: Workers, fn: Callable[[Any], Any], here: Callable[[X], T],
                 send: Callable[[X], Any]) -> None:
        self._workers, self._fn, self._here, self._send = workers, fn, here, send
        self._executor: ProcessPoolExecutor | None = None
        self._proc: Any = None   # (the executor's one process)
        self._number = -1   # (its fn in _PARTS, at the fork)
        self._started = False   # (forked, or never to be)
        # [item, its state] in the order put; the state: None (waiting), its future, or (value, here)
        self._held: deque[list[Any]] = deque()

    def put(self, item: X) -> list[tuple[X, T | Any, bool]]:
        """Item ``item`` held for the child, or computed here; the items ready now, in order."""
        self._held.append([item, None])
        return self._ready(False)

    @property
    def held(self) -> int:
        """The items put and not given back yet."""
        return len(self._held)

    def close(self) -> list[tuple[X, T | Any, bool]]:
        """The items not given back yet (waiting for the child), and the child ended."""
        try:
            return self._ready(True)
        finally:
            self._ended(False)

    def stop(self) -> None:
        """The child killed (an error in the run); its items let go."""
        self._held.clear()
        self._ended(False, kill=True)

    def _ready(self, wait_all: bool) -> list[tuple[X, T | Any, bool]]:
        out = []
        held = self._held
        while held:
            self._hand()
            item, state = held[0]
            # (else the caller goes on, and asks again at its next item; with no child, each item is computed as put)
            must = wait_all or len(held) > HELD or (self._started and self._executor is None)
            if state is None or isinstance(state, Future) and not state.done():
                if not must:
                    break
                waiting = next((e for e in held if e[1] is None), None)  # (the first, or the oldest behind it)
                if waiting is not None:  # (computed here while the child computes the first)
                    waiting[1] = (self._here(waiting[0]), True)
                    continue
            if isinstance(state, Future):
                state = self._result(item, state)
            held.popleft()
            out.append((item, state[0], state[1]))
        return out

    def _hand(self) -> None:
        """The items waiting, the oldest first, handed to the child while it holds fewer than :data:`IN_FLIGHT`."""
        if self._started and self._executor is None:
            return
        busy = sum(isinstance(e[1], Future) and not e[1].done() for e in self._held)
        for e in self._held:
            if busy >= IN_FLIGHT:
                return
            if e[1] is None:
                future = self._submit(e[0]) if self._started else self._start(e[0])
                if future is None:
                    return
                e[1] = future
                busy += 1

    def _submit(self, item: X) -> Future | None:
        assert self._executor is not None
        try:
            return self._executor.submit(_run_item, self._number, self._send(item))
        except BrokenProcessPool:  # (it died since: its items are computed here)
            self._ended(True)
            return None

    def _start(self, item: X) -> Future | None:
        """The child forked with ``item`` (its executor forks at its first call), once no other child runs; its
        future, or None."""
        workers, forks = self._workers, self._workers.jobs > 1 and not in_child()
        if forks and not workers._idle():  # (its core is taken: asked again at the next item)
            return None
        self._started = True  # (forked now, or never)
        forked = _forked((self._fn, (), {}), _run_item, self._send(item)) if forks else None
        if forked is None:
            return None
        _, self._executor, future, self._proc, self._number = forked
        workers._besides.append(self)
        return future

    def _result(self, item: X, future: Future) -> tuple[Any, bool]:
        try:
            return future.result(), False
        except BrokenProcessPool:
            self._ended(True)
        except Exception:  # (its error on this item: computed here, where it is the run's)
            pass
        return self._here(item), True

    def _ended(self, died: bool, kill: bool = False) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if kill and self._proc is not None:
            self._proc.kill()
        executor.shutdown(wait=True, cancel_futures=True)
        self._workers._besides.remove(self)
        if died:
            self._workers._say(f"a worker process ended without its result ({_how(self._proc)}); its part runs in "
                               "this process")


#: the items a child of :meth:`Workers.ahead` holds computed and not yet taken (each may be large)
AHEAD = 1
#: the items :meth:`Workers.ahead` computes here ahead of the one it is at, while its child computes that one
EARLY = 2


def _ahead(n: int, fn: Callable[[int], Any], taken: Any, got: Any) -> None:  # pragma: no cover - runs in the child
    """:meth:`Workers.ahead`'s child: the next item not taken, computed and sent, until every item is taken."""
    while (item := _take(taken, n)) is not None:
        got.put((item, fn(item)))
    got.close()
    got.join_thread()  # (all sent before the part ends)


def _take(taken: Any, n: int, item: int | None = None) -> int | None:
    """The next item of ``n`` that no one has taken (``item``: only if that is it), now taken; None if none is."""
    with taken.get_lock():
        nxt = taken.value
        if nxt >= n or (item is not None and nxt != item):
            return None
        taken.value = nxt + 1
        return nxt


#: :meth:`Workers.ahead`: an item not come yet
_NOT_YET: Any = object()


def _received(got: Any, item: int, job: Job) -> Any:
    """Item ``item`` as :func:`_ahead` sent it (the next on the queue), once it comes; None when its child ended
    without it."""
    while True:
        try:
            at, value = got.get(timeout=TICK_S)
        except queue.Empty:
            job._drain()
            if job._future is None and got.empty():  # (ended: what it sent is on the queue already)
                return None
            continue
        assert at == item, f"item {at} came where {item} was due"
        return value


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


def _run_item(number: int, item: Any) -> Any:  # pragma: no cover - runs in the forked child
    """:class:`Beside`'s ``fn`` on one item, in the child."""
    fn = _PARTS[number][0]
    try:
        return fn(item)
    except BaseException as exc:
        raise _loadable(exc) from None


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
