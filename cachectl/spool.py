"""Kept on disk, not in memory, by the whole-log commands: :class:`Spool`, values appended to a temporary file
and read back by index, :class:`DictStreams`, payloads compressed against the first one, and :class:`KeyIndex`, a
compact map from a 64-bit key to such an index (about 16 bytes an entry, where a dict of ints takes about a
hundred).

Nothing here imports an engine: the fork analysis, the log store and ``--ray``'s prefilled renders all use it.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pickle
import tempfile
import threading
import weakref
from array import array
from collections.abc import Iterator, Sequence
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


#: the most of the first payload kept as the dictionary (its tail)
_DICT_BYTES = 128 * 1024


class DictStreams:
    """Payloads compressed one by one against a preset dictionary: the first payload's bytes (what most of a log's
    payloads share: its system prompt and tools), so that each costs roughly what it says that the first did not.
    Zstandard frames against a raw-content dictionary digested once: on the payloads of a ``fix`` run over the
    bench log (stored prompts, renders, memo texts), 1.6 to 5.5 times faster to compress than zlib against the same
    bytes as its preset dictionary (which zlib digests again for every stream) and 1.7 to 2.5 times faster to read
    back, at the same size (docs/benchmarks.md). One compressor and decompressor a thread (neither may be used by
    two at once)."""

    __slots__ = ("_dict", "_local", "_made", "level")

    def __init__(self, level: int = 1):
        self.level = level
        self._dict: Any = None
        self._local = threading.local()
        self._made = threading.Lock()  # (the dictionary is made once, from the first payload of any thread)

    def _codecs(self) -> tuple[Any, Any]:
        got = getattr(self._local, "codecs", None)
        if got is None:
            import zstandard

            assert self._dict is not None
            got = (zstandard.ZstdCompressor(level=self.level, dict_data=self._dict, write_checksum=False,
                                            write_content_size=True, write_dict_id=False),
                   zstandard.ZstdDecompressor(dict_data=self._dict))
            self._local.codecs = got
        return got

    def compress(self, raw: bytes) -> bytes:
        if self._dict is None:
            import zstandard

            with self._made:
                if self._dict is None:
                    made = zstandard.ZstdCompressionDict(raw[-_DICT_BYTES:] or b"\0",
                                                         dict_type=zstandard.DICT_TYPE_RAWCONTENT)
                    made.precompute_compress(level=self.level)
                    self._dict = made
        return self._codecs()[0].compress(raw)

    def decompress(self, blob: bytes) -> bytes:
        return self._codecs()[1].decompress(blob)


def _where(exc: OSError) -> OSError:
    """``exc`` naming where the temporary files are (the spool's own file is already unlinked), so that the
    command's one line says which disk filled or failed, and what to set."""
    where = f"{tempfile.gettempdir()} (cachectl's temporary files; set TMPDIR to another directory)"
    return OSError(exc.errno, exc.strerror or str(exc), where)


class KeyIndex:
    """A map from signed 64-bit int keys (the builtin hash's, the first half of a digest) to non-negative ints, in
    about 16 bytes an entry where a dict of ints takes about a hundred: the entries in two sorted numpy arrays, and
    those added since the last merge in a dict (merged into the arrays when it holds :attr:`MERGE`, or a sixteenth
    of theirs). A request's keys are looked up in one ``numpy.searchsorted`` (:meth:`values`). ``dtype``: the values'
    numpy integer type (a narrower one for small values: ``uint8`` takes 9 bytes an entry); a value it cannot hold
    is refused."""

    #: entries the dict holds before they are merged into the arrays (or a sixteenth of the arrays' entries)
    MERGE = 1 << 12

    __slots__ = ("_keys", "_new", "_top", "_vals")

    def __init__(self, dtype: str = "int64") -> None:
        import numpy as np

        self._keys = np.empty(0, np.int64)
        self._vals = np.empty(0, dtype)
        self._top = int(np.iinfo(self._vals.dtype).max)
        self._new: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._keys) + len(self._new)

    def __iter__(self) -> Iterator[int]:
        """The keys (in no particular order)."""
        yield from self._keys.tolist()
        yield from list(self._new)

    def get(self, key: int) -> int | None:
        got = self._new.get(key)
        if got is not None or not len(self._keys):
            return got
        i = int(self._keys.searchsorted(key))
        return int(self._vals[i]) if i < len(self._keys) and self._keys[i] == key else None

    def __setitem__(self, key: int, value: int) -> None:
        if key not in self._new and len(self._keys):
            i = int(self._keys.searchsorted(key))
            if i < len(self._keys) and self._keys[i] == key:
                self._check(value, value)
                self._vals[i] = value
                return
        self.put([key], [value], absent=True)

    def values(self, keys: Sequence[int], missing: int = -1) -> list[int]:
        """Each key's value, ``missing`` where it has none."""
        import numpy as np

        new = self._new
        if not len(self._keys) or not len(keys):
            return [new.get(k, missing) for k in keys]
        at, found = self._find(np.array(keys, np.int64))
        # (as int64: a missing -1 in an unsigned type would wrap; no copy where the values are int64 already)
        got = np.where(found, self._vals[at].astype(np.int64, copy=False), missing).tolist()
        if new:
            for i in np.flatnonzero(~found).tolist():  # (an entry is in the arrays or in the dict)
                got[i] = new.get(keys[i], missing)
        return got

    def put(self, keys: Sequence[int], values: Sequence[int], absent: bool = False) -> None:
        """Set each key's value (the keys distinct; ``absent``: none of them is in the arrays)."""
        import numpy as np

        if not len(keys):
            return
        self._check(min(values), max(values))
        if len(self._keys) and not absent:
            at, found = self._find(np.array(keys, np.int64))  # (OverflowError past 64 bits)
            if found.any():
                self._vals[at[found]] = np.array(values, self._vals.dtype)[found]
                keep = (~found).tolist()
                keys, values = [k for k, f in zip(keys, keep) if f], [v for v, f in zip(values, keep) if f]
        elif min(keys) < -2**63 or max(keys) >= 2**63:  # (two passes in C: this is every request's insert)
            raise OverflowError("a KeyIndex key is a signed 64-bit int")
        self._new.update(zip(keys, values))
        if len(self._new) >= max(self.MERGE, len(self._keys) >> 4):
            self._merge()

    def arrays(self) -> tuple[Any, Any]:
        """The keys, sorted, and their values: two numpy arrays (what was added since the last merge merged)."""
        if self._new:
            self._merge()
        return self._keys, self._vals

    def _check(self, low: int, high: int) -> None:
        if low < 0 or high > self._top:
            raise ValueError(f"the values of this KeyIndex are integers from 0 to {self._top}")

    def _find(self, arr):
        at = self._keys.searchsorted(arr)
        at[at == len(self._keys)] = 0
        return at, self._keys[at] == arr

    def _merge(self) -> None:
        import numpy as np

        n = len(self._new)
        keys = np.fromiter(self._new.keys(), np.int64, n)
        vals = np.fromiter(self._new.values(), self._vals.dtype, n)
        order = keys.argsort()
        keys, vals = keys[order], vals[order]
        at = self._keys.searchsorted(keys)  # (none of them is in the arrays: put sets those in place)
        self._keys, self._vals = np.insert(self._keys, at, keys), np.insert(self._vals, at, vals)
        self._new.clear()


class KeyDict(dict):
    """:class:`KeyIndex`'s calls over a plain dict: for keys that are not signed 64-bit ints (sha256 digests,
    string ids) or values past 64 bits, where the caller would otherwise keep a second code path."""

    def values(self, keys: Sequence[Any], missing: int = -1) -> list[int]:  # type: ignore[override]
        """Each key's value, ``missing`` where it has none."""
        return [self.get(k, missing) for k in keys]

    def put(self, keys: Sequence[Any], values: Sequence[int], absent: bool = False) -> None:
        """Set each key's value (``absent`` is accepted for :class:`KeyIndex`'s signature; a dict needs no hint)."""
        self.update(zip(keys, values))
