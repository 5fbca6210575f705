"""Kept on disk, not in memory, by the whole-log commands: :class:`Spool`, values appended to a temporary file
and read back by index, :class:`ZlibStreams`, payloads compressed against the first one, and :class:`DigestTable`, a compact map from a 64-bit digest to such an index (16 to 24
bytes an entry, where a dict of ints takes about a hundred).

Nothing here imports an engine: the tokenizer's render memo, the fork analysis and the log store all use it.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pickle
import tempfile
import weakref
import zlib
from array import array
from collections.abc import Sequence
from typing import Any


def content_digest(*parts: Any, size: int = 16) -> bytes | None:
    """A ``size``-byte digest of what ``parts`` hold, whichever objects hold it (pickled with pickle's memo off, so
    a string two fields share pickles as two equal strings do: the same content read twice has one digest; a list
    and a tuple, 1 and 1.0 and True differ); None when they do not pickle, or hold themselves."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.fast = True
    try:
        pickler.dump(parts)
    except Exception:  # an object pickle refuses, a structure that holds itself
        return None
    return hashlib.blake2b(buf.getbuffer(), digest_size=size).digest()


class Spool:
    """Pickled values appended to one temporary file; ``put`` returns the index of the value stored.

    In a process forked from the one that made it (:mod:`cachectl.workers`), a spool reads what was there at the
    fork from the shared file and appends to a file of its own: the two processes never write to one file."""

    __slots__ = ("_fd", "_offsets", "_size", "_old", "_base", "__weakref__")

    def __init__(self) -> None:
        self._fd = -1
        self._old: tuple[tuple[int, int], ...] = ()  # after a fork: (base, fd) of the files before ``_base``
        self._base = 0    # after a fork: the size the file had then (offsets from there are in ``_fd``)
        self._fd = _temporary_fd()
        self._offsets = array("q", [0])
        self._size = 0
        _LIVE.add(self)

    def put_bytes(self, data: bytes) -> int:
        view, at = memoryview(data), self._size - self._base
        if self._fd == -2:
            self._fd = _temporary_fd()
        try:
            while view:  # one syscall a value, unless the kernel writes less than asked
                n = os.pwrite(self._fd, view, at)
                view, at = view[n:], at + n
        except OSError as exc:
            raise _where(exc) from None
        self._size += len(data)
        self._offsets.append(self._size)
        return len(self._offsets) - 2

    def put(self, value: Any) -> int:
        return self.put_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def get_bytes(self, k: int) -> bytes:
        start, end = self._offsets[k], self._offsets[k + 1]
        try:
            if start >= self._base:
                got = os.pread(self._fd, end - start, start - self._base)
            else:
                got = self._read_old(start, end - start)
        except OSError as exc:
            raise _where(exc) from None
        if len(got) != end - start:  # the file was cut under us: never a short value
            raise _where(OSError(errno.EIO, f"read {len(got)} of {end - start} bytes"))
        return got

    def get(self, k: int) -> Any:
        return pickle.loads(self.get_bytes(k))  # noqa: S301 (our own file, written by this process)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _forked(self) -> None:
        """In a forked child: what the parent wrote stays readable; what this process writes goes to a new file."""
        if self._fd == -1:  # closed
            return
        if self._fd >= 0:  # (-2: forked twice with nothing written between: no file of that generation)
            self._old = (*self._old, (self._base, self._fd))
        self._base = self._size
        self._fd = -2  # made on the first write

    def _read_old(self, start: int, n: int) -> bytes:
        for base, fd in reversed(self._old):  # (a process forked from a fork: one file each generation)
            if start >= base:
                return os.pread(fd, n, start - base)
        raise AssertionError("an offset before the spool's first file")  # pragma: no cover

    def close(self) -> None:
        fds = [fd for _, fd in self._old] + [self._fd]  # (-2: a child's file not made yet)
        self._fd, self._old = -1, ()
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


def _temporary_fd() -> int:
    try:
        fh = tempfile.TemporaryFile(prefix="cachectl-")  # unlinked at once on POSIX: nothing left behind
    except OSError as exc:
        raise _where(exc) from None
    fd = os.dup(fh.fileno())
    fh.close()
    return fd


#: every open spool of this process (made anew in a forked child by :func:`_after_fork`)
_LIVE: weakref.WeakSet[Spool] = weakref.WeakSet()


def _after_fork() -> None:
    for spool in list(_LIVE):
        spool._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


#: zlib's window: a preset dictionary longer than this is cut to its tail
_WINDOW = 32 * 1024


class ZlibStreams:
    """zlib streams against one preset dictionary: the first payload's bytes (what most of a log's payloads share:
    its system prompt and tools), so that each stream costs roughly what it says that the first did not."""

    __slots__ = ("_zdict", "level")

    def __init__(self, level: int = 6):
        self.level = level
        self._zdict: bytes | None = None

    def compress(self, raw: bytes) -> bytes:
        if self._zdict is None:
            self._zdict = raw[-_WINDOW:] or b"\0"
        c = zlib.compressobj(self.level, zdict=self._zdict)
        return c.compress(raw) + c.flush()

    def decompress(self, blob: bytes, limit: int = 0) -> bytes:
        assert self._zdict is not None
        d = zlib.decompressobj(zdict=self._zdict)
        return d.decompress(blob, limit) if limit else d.decompress(blob) + d.flush()


def _where(exc: OSError) -> OSError:
    """``exc`` naming where the temporary files are (the spool's own file is already unlinked), so that the
    command's one line says which disk filled or failed, and what to set."""
    where = f"{tempfile.gettempdir()} (cachectl's temporary files; set TMPDIR to another directory)"
    return OSError(exc.errno, exc.strerror or str(exc), where)


class DigestTable:
    """A map from 64-bit digests (ints in ``[0, 2**64)``) to non-negative ints below 2**31 (a spool's indices), in
    two arrays (open addressing, linear probing, at most three quarters full): 12 bytes a slot, 16 to 24 an
    entry. ``get(d)`` is None for an unknown digest."""

    __slots__ = ("_keys", "_mask", "_n", "_vals")

    def __init__(self, slots: int = 1024):
        size = 1
        while size < slots:
            size *= 2
        self._mask = size - 1
        self._keys = array("Q", bytes(8 * size))
        self._vals = array("i", [-1]) * size      # -1: an empty slot
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def get(self, digest: int) -> int | None:
        keys, vals, mask = self._keys, self._vals, self._mask
        i = digest & mask
        while True:
            v = vals[i]
            if v < 0:
                return None
            if keys[i] == digest:
                return v
            i = (i + 1) & mask

    def __setitem__(self, digest: int, value: int) -> None:
        if not 0 <= value < 2**31:
            raise ValueError(f"a value in [0, 2**31), not {value}")
        if not 0 <= digest < 2**64:
            raise ValueError(f"a 64-bit digest, not {digest}")
        if 4 * (self._n + 1) > 3 * len(self._vals):
            self._grow()
        keys, vals, mask = self._keys, self._vals, self._mask
        i = digest & mask
        while vals[i] >= 0 and keys[i] != digest:
            i = (i + 1) & mask
        if vals[i] < 0:
            self._n += 1
        keys[i] = digest
        vals[i] = value

    def __contains__(self, digest: int) -> bool:
        return self.get(digest) is not None

    def leading(self, digests: Sequence[int], limit: int) -> list[int]:
        """The values of the first ``limit`` digests, up to the first one absent (a prefix lookup in one call)."""
        get = self.get
        out: list[int] = []
        for d in digests[:limit]:
            v = get(d)
            if v is None:
                break
            out.append(v)
        return out

    def fill(self, digests: Sequence[int], value: int) -> None:
        """Each digest that has no value gets ``value`` (``dict.setdefault`` on each)."""
        if not 0 <= value < 2**31:
            raise ValueError(f"a value in [0, 2**31), not {value}")
        if digests and not (0 <= min(digests) and max(digests) < 2**64):
            raise ValueError("64-bit digests only")
        keys, vals, mask = self._keys, self._vals, self._mask
        room = 3 * len(vals) // 4 - self._n   # entries that fit before the table grows (at most 3/4 full)
        for d in digests:
            i = d & mask
            while True:
                v = vals[i]
                if v < 0:
                    if room <= 0:
                        self._grow()
                        keys, vals, mask = self._keys, self._vals, self._mask
                        room = 3 * len(vals) // 4 - self._n
                        i = d & mask
                        continue
                    keys[i] = d
                    vals[i] = value
                    self._n += 1
                    room -= 1
                    break
                if keys[i] == d:
                    break
                i = (i + 1) & mask

    def _grow(self) -> None:
        """Twice the slots, the entries moved one at a time (no list of them: the table is most of what it holds)."""
        old_keys, old_vals = self._keys, self._vals
        size = 2 * len(old_vals)
        mask = self._mask = size - 1
        keys = self._keys = array("Q", bytes(8 * size))
        vals = self._vals = array("i", [-1]) * size
        for k, v in zip(old_keys, old_vals):
            if v >= 0:
                i = k & mask
                while vals[i] >= 0:
                    i = (i + 1) & mask
                keys[i] = k
                vals[i] = v
