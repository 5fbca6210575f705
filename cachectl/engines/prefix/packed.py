"""Compact storage for whole-log analyses that must keep something of every request (the fork analysis replays
the log once per counterfactual): one compressed stream a request, against a preset dictionary (the first request's
own bytes: the system prompt and tools most requests of a log share; :class:`cachectl.spool.DictStreams`), so what a
request holds beyond its first copy is roughly what it says that the first one did not.

- :class:`RenderCodec`: a render (token IDs, the character each token starts and ends at, the rendered text) in one
  stream; :meth:`RenderCodec.ids` reads only the IDs (they come first).
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

from ...spool import DictStreams

#: flags, ids typecode, ids count, starts count, ends count
_HEAD = struct.Struct("<BcIII")
_STARTS, _ENDS, _TEXT = 1, 2, 4
#: the bytes each packed difference takes, by its code in the flags (two bits each: starts' at bit 3, ends' at bit 5)
_WIDTHS = {0: "<i8", 1: "<i2", 2: "<i4"}
_STARTS_AT, _ENDS_AT = 3, 5


def _deltas(values: Sequence[int], base: Sequence[int] | None = None) -> tuple[bytes, int]:
    """Signed differences: to the previous value, or to ``base`` element by element, in the narrowest of 2, 4 or 8
    bytes that holds them all (most are a token's few characters: 2); and that width's code. The values are
    character offsets, which :func:`_sums` gives back as 4-byte unsigned ints: one out of that range is refused
    here, once, not at each unpack."""
    import numpy as np

    v = np.asarray(values, dtype=np.int64)
    # (an array of 4-byte unsigned ints, as the offsets are kept, is in range by its type)
    if len(v) and not (isinstance(values, array) and values.typecode == "I") and (
            int(v.min()) < 0 or int(v.max()) >= 2**32):
        raise OverflowError("a character offset out of range")
    if base is not None:
        d = v - np.asarray(base, dtype=np.int64)
    else:  # (each value less the one before it, the first less 0: numpy.diff's prepend costs 6 times this)
        d = v.copy()
        np.subtract(v[1:], v[:-1], out=d[1:])
    lo, hi = (int(d.min()), int(d.max())) if len(d) else (0, 0)
    code = 1 if -2**15 <= lo and hi < 2**15 else 2 if -2**31 <= lo and hi < 2**31 else 0
    return d.astype(_WIDTHS[code]).tobytes(), code


def _sums(raw: bytes, at: int, n: int, code: int, base: array | None = None) -> array:
    """The values :func:`_deltas` packed (``n`` of them from byte ``at``, of width ``code``), as 4-byte unsigned ints
    (in range: :func:`_deltas` refused any other). Summed in 4-byte unsigned ints, which wrap as the values' own
    differences do: each sum is the value itself (one ufunc call, without a copy in 8 bytes first: a render's few
    hundred starts cost the calls, not the adding)."""
    import numpy as np

    d = np.frombuffer(raw, _WIDTHS[code], n, at)
    if base is not None:
        got = np.add(np.frombuffer(base, np.uint32), d, dtype=np.uint32, casting="unsafe")
    else:
        got = np.add.accumulate(d, dtype=np.uint32)
    return array("I", got.tobytes())


def _width(code: int) -> int:
    return int(_WIDTHS[code][2:])


class RenderCodec:
    """Token IDs, their character starts and ends (optional) and the rendered text (optional), packed into one
    stream: IDs as they are (4 or 8 bytes), starts as differences to the previous start and ends as each
    token's length (small numbers, in 2 bytes where they fit, that compress well), the text as UTF-8."""

    __slots__ = ("_z",)

    def __init__(self, level: int = 1):
        self._z = DictStreams(level)

    def pack(self, ids: array, starts: Sequence[int] | None = None, ends: Sequence[int] | None = None,
             text: str | None = None) -> bytes:
        flags = (_STARTS if starts is not None else 0) | (_ENDS if ends is not None else 0) | (_TEXT if text is not None else 0)
        parts = [b"", ids.tobytes()]
        if starts is not None:
            got, code = _deltas(starts)
            parts.append(got)
            flags |= code << _STARTS_AT
        if ends is not None:
            if starts is None or len(starts) != len(ends):
                raise ValueError("ends need starts of the same length")
            got, code = _deltas(ends, starts)
            parts.append(got)
            flags |= code << _ENDS_AT
        if text is not None:
            parts.append(text.encode("utf-8", "surrogatepass"))
        parts[0] = _HEAD.pack(flags, ids.typecode.encode(), len(ids), len(starts or ()), len(ends or ()))
        return self._z.compress(b"".join(parts))

    def ids(self, blob: bytes) -> array:
        """Only the IDs (the head of the stream)."""
        raw = self._z.decompress(blob)
        _, code, n, _, _ = _HEAD.unpack_from(raw)
        ids = array(code.decode())
        ids.frombytes(raw[_HEAD.size:_HEAD.size + n * ids.itemsize])
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
            w = flags >> _STARTS_AT & 3
            starts = _sums(raw, at, ns, w)
            at += _width(w) * ns
        if flags & _ENDS:
            assert starts is not None
            w = flags >> _ENDS_AT & 3
            ends = _sums(raw, at, ne, w, starts)
            at += _width(w) * ne
        text = raw[at:].decode("utf-8", "surrogatepass") if flags & _TEXT else None
        return ids, starts, ends, text


class ObjectCodec:
    """A picklable value as one compressed stream (against the first value's pickle)."""

    __slots__ = ("_z",)

    def __init__(self, level: int = 1):
        self._z = DictStreams(level)

    def dumps(self, value: Any) -> bytes:
        return self._z.compress(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def loads(self, blob: bytes) -> Any:
        return pickle.loads(self._z.decompress(blob))  # noqa: S301 - our own bytes, never a file's


__all__ = ["ObjectCodec", "RenderCodec"]
