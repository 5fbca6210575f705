"""Compact storage for whole-log analyses that must keep something of every request (the fork analysis replays
the log once per counterfactual): one zlib stream a request, compressed against a preset dictionary (the first
request's own bytes: the system prompt and tools most requests of a log share), so what a request holds beyond
its first copy is roughly what it says that the first one did not.

- :class:`RenderCodec`: a render (token IDs, the character each token starts and ends at, the rendered text) in one
  stream; :meth:`RenderCodec.ids` decompresses only the IDs (they come first).
- :class:`ObjectCodec`: any picklable value (a parsed prompt), the same way.
- what a whole-log analysis keeps of every request but reads only once a pass goes to a
  :class:`cachectl.spool.Spool` (a temporary file).

Both round-trip exactly (``tests/test_forks_packed.py``).
"""

from __future__ import annotations

import pickle
import struct
from array import array
from collections.abc import Sequence
from typing import Any

from ...spool import ZlibStreams

#: flags, ids typecode, ids count, starts count, ends count
_HEAD = struct.Struct("<BcIII")
_STARTS, _ENDS, _TEXT = 1, 2, 4


def _deltas(values: Sequence[int], base: Sequence[int] | None = None) -> bytes:
    """Signed differences (int64 bytes): to the previous value, or to ``base`` element by element. The values are
    character offsets, which :func:`_sums` gives back as 4-byte unsigned ints: one out of that range is refused
    here, once, not at each unpack."""
    import numpy as np

    v = np.asarray(values, dtype=np.int64)
    if len(v) and (int(v.min()) < 0 or int(v.max()) >= 2**32):
        raise OverflowError("a character offset out of range")
    return (v - np.asarray(base, dtype=np.int64) if base is not None else np.diff(v, prepend=0)).tobytes()


def _sums(raw: bytes, at: int, n: int, base: array | None = None) -> array:
    """The values :func:`_deltas` packed (``n`` of them from byte ``at``), as 4-byte unsigned ints (in range:
    :func:`_deltas` refused any other)."""
    import numpy as np

    d = np.frombuffer(raw, np.int64, n, at)
    got = d + np.frombuffer(base, np.uint32) if base is not None else np.cumsum(d)
    return array("I", got.astype(np.uint32).tobytes())


class RenderCodec:
    """Token IDs, their character starts and ends (optional) and the rendered text (optional), packed into one
    zlib stream: IDs as they are (4 or 8 bytes), starts as differences to the previous start and ends as each
    token's length (small numbers that compress well), the text as UTF-8."""

    __slots__ = ("_z",)

    def __init__(self, level: int = 6):
        self._z = ZlibStreams(level)

    def pack(self, ids: array, starts: Sequence[int] | None = None, ends: Sequence[int] | None = None,
             text: str | None = None) -> bytes:
        flags = (_STARTS if starts is not None else 0) | (_ENDS if ends is not None else 0) | (_TEXT if text is not None else 0)
        parts = [_HEAD.pack(flags, ids.typecode.encode(), len(ids), len(starts or ()), len(ends or ())), ids.tobytes()]
        if starts is not None:
            parts.append(_deltas(starts))
        if ends is not None:
            if starts is None or len(starts) != len(ends):
                raise ValueError("ends need starts of the same length")
            parts.append(_deltas(ends, starts))
        if text is not None:
            parts.append(text.encode("utf-8", "surrogatepass"))
        return self._z.compress(b"".join(parts))

    def ids(self, blob: bytes) -> array:
        """Only the IDs (the head of the stream)."""
        head = self._z.decompress(blob, _HEAD.size)
        _, code, n, _, _ = _HEAD.unpack(head)
        ids = array(code.decode())
        raw = self._z.decompress(blob, _HEAD.size + n * ids.itemsize)
        ids.frombytes(raw[_HEAD.size:])
        return ids

    def unpack(self, blob: bytes) -> tuple[array, array | None, array | None, str | None]:
        """(ids, starts, ends, text), each None where it was not packed."""
        raw = self._z.decompress(blob)
        flags, code, n, ns, ne = _HEAD.unpack_from(raw)
        at = _HEAD.size
        ids = array(code.decode())
        ids.frombytes(raw[at:at + n * ids.itemsize])
        at += n * ids.itemsize
        starts = ends = None
        if flags & _STARTS:
            starts = _sums(raw, at, ns)
            at += 8 * ns
        if flags & _ENDS:
            assert starts is not None
            ends = _sums(raw, at, ne, starts)
            at += 8 * ne
        text = raw[at:].decode("utf-8", "surrogatepass") if flags & _TEXT else None
        return ids, starts, ends, text


class ObjectCodec:
    """A picklable value as one zlib stream (against the first value's pickle)."""

    __slots__ = ("_z",)

    def __init__(self, level: int = 6):
        self._z = ZlibStreams(level)

    def dumps(self, value: Any) -> bytes:
        return self._z.compress(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def loads(self, blob: bytes) -> Any:
        return pickle.loads(self._z.decompress(blob))  # noqa: S301 - our own bytes, never a file's


__all__ = ["ObjectCodec", "RenderCodec"]
