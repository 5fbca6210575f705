"""Writes that cannot destroy input: every output file of cachectl goes through here.

* An output is refused, before anything is read, when it resolves to an input of the run
  (:func:`refuse_inputs`): the same path after ``realpath``, the same file (device and inode: a hard link, a
  symlink), or, for an input ``-``, the file behind stdin.
* It is written to a temporary file in the target's directory, fsynced, and renamed over the target only when
  complete (:class:`AtomicFile`, :func:`atomic_write`). A write error (disk full, I/O error, permission
  denied), SIGINT or SIGTERM removes the temporary file and leaves the target as it was; the error is one line
  naming the file (:class:`~cachectl.errors.OutputError`, :class:`~cachectl.errors.Interrupted`).

A target that exists and is not a regular file (``/dev/null``, a FIFO, a terminal) is written in place: there
is nothing to rename over. A target that is a symlink is written where the link points, and the link stays.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import IO, Any

from .errors import Interrupted, OutputError, UsageError

# -------------------------------------------------------------------------------- input = output refusals


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def _stdin_stat() -> os.stat_result | None:
    try:
        return os.fstat(0)
    except OSError:
        return None


def _same(a: os.stat_result | None, b: os.stat_result | None) -> bool:
    return a is not None and b is not None and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def resolves_to(output: str, source: str) -> bool:
    """Whether writing ``output`` would write the input ``source`` (``-``: the file behind stdin)."""
    out_stat = _stat(output)
    if source == "-":
        return _same(out_stat, _stdin_stat())
    if os.path.realpath(output) == os.path.realpath(source):
        return True
    return _same(out_stat, _stat(source))


def refuse_inputs(output: str, flag: str, inputs: Iterable[tuple[str, str | None]]) -> None:
    """Raise :class:`UsageError` when ``output`` (the value of ``flag``) resolves to one of ``inputs``:
    ``(label, path)`` pairs such as ``("the input log", "log.jsonl")``; a None path is skipped. An empty
    ``output`` is refused too (it names no file: the directory it would resolve to is the current one)."""
    if not output:
        raise UsageError(f"{flag} takes a file name, and was given an empty one")
    for label, source in inputs:
        if source is None or not resolves_to(output, source):
            continue
        named = "" if source == output or source == "-" else f" {source}"
        via = " (stdin)" if source == "-" else ""
        raise UsageError(f"{flag} {output} is {label}{named}{via} (refusing to overwrite an input)")


def path_files(spec: str | None) -> list[str]:
    """The files a path option may read: the file itself, or the regular files directly in a directory (a
    model or tokenizer directory). Nothing for a name that is not a local path."""
    if spec is None or spec == "-":
        return []
    path = os.path.expanduser(spec)
    if os.path.isfile(path):
        return [path]
    if os.path.isdir(path):
        try:
            return sorted(e.path for e in os.scandir(path) if e.is_file())
        except OSError:
            return []
    return []


# ------------------------------------------------------------------------------------- atomic writes


def _write(fd: int, data: Any) -> int:
    """One ``os.write``: the only place bytes reach an output (tests inject ENOSPC and EIO here)."""
    return os.write(fd, data)


class _FdWriter(io.RawIOBase):
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return _write(self._fd, data)

    def fileno(self) -> int:
        return self._fd


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread while an output is open (the default action would leave the
    temporary file behind); an interrupt to whoever does not know it."""


_signals_lock = threading.Lock()
_open_outputs = 0
_previous_sigterm: Any = None


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def _guard_signals(on: bool) -> None:
    """Turn SIGTERM into an exception while at least one output is open (SIGINT is one already)."""
    global _open_outputs, _previous_sigterm
    if threading.current_thread() is not threading.main_thread():
        return
    with _signals_lock:
        if on:
            _open_outputs += 1
            if _open_outputs == 1:
                try:
                    _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
                except (ValueError, OSError):  # pragma: no cover - not the main interpreter
                    _previous_sigterm = None
        else:
            _open_outputs -= 1
            if _open_outputs == 0 and _previous_sigterm is not None:
                with contextlib.suppress(ValueError, OSError):
                    signal.signal(signal.SIGTERM, _previous_sigterm)
                _previous_sigterm = None


@contextlib.contextmanager
def signals_held(raise_after: bool = True) -> Iterator[list[int]]:
    """SIGINT and SIGTERM held back for a few steps that must not be cut (a temporary file made and its name
    kept; the rename and the name it leaves; a fork, whose own hooks would print and drop an interrupt): a signal
    that comes meanwhile is raised again right after, or, with ``raise_after`` false, left in the list yielded
    for the caller to raise once it is ready (:func:`signal.raise_signal`). In the main thread only, where
    handlers are set."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in held}
    try:
        yield pending
    finally:
        for s, handler in previous.items():
            if handler is not None:  # None: a handler set outside Python, which cannot be put back
                signal.signal(s, handler)
        if pending and raise_after:
            signal.raise_signal(pending[0])


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.EROFS:
        return "read-only file system"
    if exc.errno == errno.EIO:
        return "input/output error"
    return (exc.strerror or str(exc)).lower() if exc.strerror else str(exc)


class AtomicFile:
    """A temporary file beside ``target``: write to :attr:`file` (binary) or have a library write to
    :attr:`path`, then :meth:`commit` (fsync, rename over the target) or :meth:`discard`. Used as a context
    manager, it commits when the block ends and discards when it raises; errors name ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target
        real = os.path.realpath(target)
        st = _stat(real)
        self._direct = st is not None and not stat.S_ISREG(st.st_mode)  # /dev/null, a FIFO, a terminal
        self._real = real
        self._fd: int | None = None
        self._file: IO[bytes] | None = None
        self.path = real
        self._done = False
        self._renamed = False  # (the temporary file has the target's name: an interrupt after it finds it written)
        _guard_signals(True)
        try:
            if self._direct:
                self._fd = os.open(real, os.O_WRONLY)
            else:
                directory = os.path.dirname(real) or "."
                with signals_held():  # an interrupt between making the file and keeping its name would leak it
                    self._fd, self.path = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.",
                                                           suffix=".cachectl-tmp", dir=directory)
                fd = self._fd
                if st is not None:  # keep the replaced file's permissions (and owner, where allowed)
                    os.fchmod(fd, stat.S_IMODE(st.st_mode))
                    with contextlib.suppress(OSError):
                        if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
                            os.fchown(fd, st.st_uid, st.st_gid)
                else:
                    os.fchmod(fd, 0o666 & ~_umask())
        except BaseException as exc:
            raise self.fail(exc) from None

    @property
    def file(self) -> IO[bytes]:
        if self._file is None:
            assert self._fd is not None
            self._file = io.BufferedWriter(_FdWriter(self._fd), buffer_size=1 << 20)
        assert self._file is not None
        return self._file

    def _error(self, exc: OSError) -> OutputError:
        kept = "" if self._direct else f" (nothing written: {self.target} is as it was)"
        return OutputError(f"cannot write {self.target}: {_reason(exc)}{kept}")

    def _cleanup(self) -> None:
        if self._file is not None:
            with contextlib.suppress(Exception):
                self._file.close()
            self._file = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if not self._direct and self.path != self._real:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        if not self._done:
            self._done = True
            _guard_signals(False)

    def commit(self) -> None:
        """Flush, fsync and rename the temporary file over the target (or close a device written in place)."""
        try:
            if self._file is not None:
                self._file.flush()
            assert self._fd is not None
            if not self._direct:
                os.fsync(self._fd)
            if self._file is not None:
                self._file.close()
                self._file = None
            os.close(self._fd)
            self._fd = None
            if not self._direct:
                with signals_held():  # renamed and known to be: an interrupt now comes after, not between
                    os.replace(self.path, self._real)
                    self.path = self._real
                    self._renamed = True
                with contextlib.suppress(OSError):  # the rename itself, on disk
                    dfd = os.open(os.path.dirname(self._real) or ".", os.O_RDONLY)
                    try:
                        os.fsync(dfd)
                    finally:
                        os.close(dfd)
        except BaseException as exc:
            raise self.fail(exc) from None
        self._cleanup()

    def discard(self) -> None:
        """Remove the temporary file; the target stays as it was."""
        self._cleanup()

    def _interrupted(self, exc: BaseException) -> BaseException:
        what = "terminated" if isinstance(exc, _Terminated) else "interrupted"
        if not isinstance(exc, (_Terminated, KeyboardInterrupt)):
            return exc
        code = 143 if isinstance(exc, _Terminated) else 130
        if self._renamed:  # (the signal came as the rename ended: it was held back until then)
            return Interrupted(f"{what} once {self.target} was written: it is written whole", code)
        return Interrupted(f"{what} while writing {self.target}: nothing written ({self.target} is as it was)", code)

    def fail(self, exc: BaseException) -> BaseException:
        """Discard, and the error to raise for ``exc`` (one line naming the target for OS errors and signals)."""
        self._cleanup()
        if isinstance(exc, OSError):
            return self._error(exc)
        return self._interrupted(exc)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.commit()
            return
        err = self.fail(exc)
        if err is not exc:
            raise err from None


@contextlib.contextmanager
def atomic_write(target: str) -> Iterator[IO[bytes]]:
    """``with atomic_write(path) as fh: fh.write(...)``: the bytes reach ``path`` whole, or not at all."""
    out = AtomicFile(target)
    try:
        yield out.file
    except BaseException as exc:
        err = out.fail(exc)
        if err is exc:
            raise
        raise err from None
    out.commit()


def write_bytes(target: str, data: bytes) -> None:
    """Write ``data`` to ``target`` whole, or not at all."""
    with atomic_write(target) as fh:
        fh.write(data)


def write_text(target: str, text: str) -> None:
    write_bytes(target, text.encode("utf-8"))
