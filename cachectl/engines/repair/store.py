"""A whole log kept out of memory: each line's JSON value written to a temporary file, a few bytes per line in
memory, lines parsed again when they are read (a small cache keeps the ones in use).

``fix`` and ``report`` read a log several times over (grouping, the fork analysis, each fix code's pass, the
before/after measures). Held as Python objects a line costs about fifty times its JSON; here it costs its
offset, its line number and its timestamp (about 24 bytes), its conversation key where there is one, and its
bytes on disk. The temporary files are deleted when the store is garbage-collected or the process ends.

- :class:`Spool` (from :mod:`cachectl.spool`): an append-only temporary file of values, read back by offset (a
  line's value as its JSON bytes, pickled where JSON cannot hold it exactly).
- :class:`LineStore`: the log's :class:`~.groups.LogLine` records as a read-only sequence.
- :class:`Mapped`: a sequence computed from another one item by item (the lines reparsed after a rewrite).
"""

from __future__ import annotations

import math
import os
import pickle
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, overload

import orjson

from ...spool import Spool

__all__ = ["CACHE", "LineStore", "Mapped", "Spool", "store_of"]

T = TypeVar("T")

#: objects a store keeps parsed (the lines a fix code is working on: a conversation, a batch to tokenize); the
#: environment variable CACHECTL_STORE_CACHE overrides it (the tests run with 2, so that a change lost through
#: an object held too long shows). 256, not 2,048: on 20,000 requests `report`'s peak, summed over its two
#: processes, was 216 MB against 270, for 0.4 more parses a request (5,000 requests) and no time that stood out
#: from the noise
def _cache_size(default: int = 256) -> int:
    got = os.environ.get("CACHECTL_STORE_CACHE", "")
    return max(2, int(got)) if got.isdigit() else default


CACHE = _cache_size()


class _Cached(Sequence[T]):
    """A read-only sequence whose items are built on demand by ``_build`` and kept in a small LRU cache."""

    def __init__(self) -> None:
        self._cache: OrderedDict[int, T] = OrderedDict()

    def __len__(self) -> int:  # pragma: no cover (abstract)
        raise NotImplementedError

    def _build(self, i: int) -> T:  # pragma: no cover (abstract)
        raise NotImplementedError

    def _item(self, i: int) -> T:
        got = self._cache.get(i)
        if got is not None:
            self._cache.move_to_end(i)
            return got
        got = self._build(i)
        self._cache[i] = got
        if len(self._cache) > CACHE:
            self._cache.popitem(last=False)
        return got

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> list[T]: ...

    def __getitem__(self, i: int | slice) -> T | list[T]:
        n = len(self)
        if isinstance(i, slice):
            return [self._item(k) for k in range(*i.indices(n))]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self._item(i)

    def __iter__(self) -> Iterator[T]:
        for k in range(len(self)):
            yield self._item(k)


class LineStore(_Cached[Any]):
    """A log's lines (:class:`~.groups.LogLine`), their values on disk. ``build(value, line, key, timestamp)``
    makes a line from its value again; ``append`` takes a line already built (its value read and checked)."""

    def __init__(self, build: Callable[[Any, int, Any, float | None], Any]):
        super().__init__()
        self._build_line = build
        self._spool = Spool()
        self._lines = array("q")
        self._ts = array("d")
        self._keys: list[Any] | None = None   # only when a line has one
        self._interned: dict[Any, Any] = {}
        self._facts: list[tuple] = []         # per line: (prompt kind, provider, model), interned
        #: the errors of the lines left out (:func:`.groups.log_lines`' ``leave_out``), in the log's order
        self.left_out: list[Any] = []

    def append(self, ln: Any) -> None:
        self._spool.put_bytes(_packed(ln.value))
        self._lines.append(ln.line)
        self._ts.append(math.nan if ln.timestamp is None else ln.timestamp)
        if ln.key is not None and self._keys is None:
            self._keys = [None] * (len(self._lines) - 1)
        if self._keys is not None:
            self._keys.append(self._interned.setdefault(ln.key, ln.key) if ln.key is not None else None)
        req = ln.request
        facts = (ln.prompt.kind, req.provider, req.model) if req is not None else (ln.prompt.kind, None, None)
        self._facts.append(self._interned.setdefault(("facts", facts), facts))
        if len(self._cache) < CACHE:  # the first lines stay parsed: a short log is never read back
            self._cache[len(self._lines) - 1] = ln

    def __len__(self) -> int:
        return len(self._lines)

    def value(self, i: int) -> Any:
        """A fresh copy of line ``i``'s value (nobody else holds it)."""
        return _unpacked(self._spool.get_bytes(i))

    def line_number(self, i: int) -> int:
        return self._lines[i]

    def differs(self, i: int, value: Any) -> bool:
        """Whether ``value``'s JSON text differs from line ``i``'s value's (:func:`cachectl.inputs.request.compact`'s
        exact text: what a rewrite must change to be written), compared with the line's bytes as kept where they are
        orjson's: the line is not read back. Two values that orjson encodes alike have one JSON text, unless one
        holds a NaN or an infinity (orjson writes ``null``; a line kept as orjson's holds neither): encodings with a
        ``null`` in them, and values orjson refuses, are compared by their texts."""
        kept = self._spool.get_bytes(i)
        if kept[:1] != b"\x80":
            try:
                data = orjson.dumps(value)
            except (orjson.JSONEncodeError, TypeError):
                data = None
            if data is not None and (data != kept or b"null" not in data):
                return data != kept
        from ...inputs.request import compact

        return compact(value) != compact(_unpacked(kept))

    def index_of(self, line: int) -> int:
        """The index of the line numbered ``line`` (line numbers only grow along a log)."""
        from bisect import bisect_left

        i = bisect_left(self._lines, line)
        if i == len(self._lines) or self._lines[i] != line:
            raise KeyError(line)
        return i

    def meta(self, i: int) -> tuple[int, Any, float | None]:
        """Line ``i``'s number, conversation key and time, without parsing it."""
        ts = self._ts[i]
        return self._lines[i], self._keys[i] if self._keys is not None else None, None if math.isnan(ts) else ts

    def facts(self, i: int) -> tuple[str, str | None, str | None]:
        """Line ``i``'s prompt kind (chat, text, ids), its request's provider and model (None, None: no request
        body), without parsing it: a fix code's rewrites keep them."""
        return self._facts[i]

    def models(self) -> list[str]:
        """The models the lines' requests name, in the order they first appear (from the kept facts)."""
        return list(dict.fromkeys(k[1][2] for k in self._interned if type(k) is tuple and k[0] == "facts" and k[1][2]))

    def line_again(self, i: int, value: Any) -> Any:
        """Line ``i`` as ``value`` parses (a rewrite of its value), with its number, key and time."""
        return self._build_line(value, *self.meta(i))

    def _build(self, i: int) -> Any:
        return self._build_line(_unpacked(self._spool.get_bytes(i)), *self.meta(i))


def _packed(value: Any) -> bytes:
    """``value`` as its JSON bytes (orjson), where they read back equal to it; else pickled (a number JSON cannot
    hold exactly, a NaN, a lone surrogate, a tuple: pickle's first byte, 0x80, starts no JSON text). A line is read
    back many times: orjson reads a request body in about half the time pickle takes (7.5 against 15.3 us, on the
    bench log's lines)."""
    try:
        data = orjson.dumps(value)
        if orjson.loads(data) == value:
            return data
    except (orjson.JSONEncodeError, orjson.JSONDecodeError, TypeError):
        pass
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _unpacked(data: bytes) -> Any:
    if data[:1] == b"\x80":
        return pickle.loads(data)  # noqa: S301 (pickled by this process: _packed)
    return orjson.loads(data)


def store_of(lines: Any) -> LineStore | None:
    """The line store behind ``lines`` (itself, or the one a :class:`Mapped` view of it reads its values from),
    or None for lines held in memory."""
    if isinstance(lines, Mapped):
        lines = lines.values_of
    return lines if isinstance(lines, LineStore) else None


class Mapped(_Cached[T]):
    """``fn(i)`` for ``i`` in ``range(n)``, as a sequence (built on demand, a few kept)."""

    def __init__(self, n: int, fn: Callable[[int], T], values_of: Sequence[Any] | None = None):
        super().__init__()
        self._n = n
        self._fn = fn
        #: the line store whose values these items have, unchanged (a rewriter reads them there)
        self.values_of: Sequence[Any] | None = values_of.values_of if isinstance(values_of, Mapped) else values_of

    def __len__(self) -> int:
        return self._n

    def _build(self, i: int) -> T:
        return self._fn(i)
