"""The fix codes' rewrites of a log kept as edits: each line's original value stays where it is (the line store's
file, or the line itself), and a rewrite of line ``i`` is kept as the (JSON path, new value) pairs that turn the
value before it into the value after it.

:class:`Edits` is what a fix code sees as ``rw.values``: ``values[i]`` is a fresh copy of line ``i``'s original
value with its edits applied, ``values[i] = new`` a rewrite, turned into edits at once by comparing ``new`` with
the value as it was:

- two dicts whose keys stay in order (keys dropped, keys added at the end) differ by their keys: an edit per key
  set, added or dropped, the values of the keys kept compared in turn;
- two lists of one length differ by the items that changed (compared in turn), unless each of them is replaced whole
  (a list sorted, every tool's keys sorted): then the list is;
- anything else (a list sorted or reordered, a dict's keys reordered, a string changed) is one edit: the new value
  at that path.

A new value is kept as its JSON bytes (orjson), one copy per distinct JSON text: the 2,000 requests of a log whose
tools FX002 sorts into one of a few hundred lists cost one bytes object per list. Each rewrite is stamped with the
number of snapshots taken before it (its version, a small int: no object a rewrite): :meth:`Edits.snapshot` is the
log as the rewrites made so far left it (what ``fix`` measures for the tokens reused per fix code), later rewrites
unseen.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import orjson

__all__ = ["Edits"]

#: a line's edits, flat: (version, path, data, version, path, data, ...), one triple an edit: the rewrite's version,
#: the JSON path, and the new value's bytes (None where the key is dropped). One tuple a rewritten line, in a list
#: with a slot a line. (20,000 lines of three edits each, from two rewrites: 267 bytes a line, the new values
#: included, where a dict of lists of tuples took 513; tracemalloc.)
LineEdits = tuple


def _encoded(value: Any) -> bytes:
    """``value``'s JSON bytes; a value JSON cannot hold exactly (a key that is no string, a lone surrogate) is
    pickled instead (pickle's first byte, 0x80, starts no JSON text)."""
    try:
        return orjson.dumps(value)
    except (orjson.JSONEncodeError, TypeError):
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _decoded(data: bytes) -> Any:
    if data[:1] == b"\x80":
        return pickle.loads(data)  # noqa: S301 (pickled by this process: _encoded)
    return orjson.loads(data)


def _diff(old: Any, new: Any, new_bytes: bytes, path: tuple, out: list[tuple[tuple, bytes | None]]) -> None:
    """The edits that turn ``old`` into ``new`` (their JSON differs; ``new_bytes`` is ``new``'s), appended to
    ``out``."""
    if type(old) is dict and type(new) is dict:
        kept = [k for k in old if k in new]
        if list(new) == kept + [k for k in new if k not in old]:
            out.extend((path + (k,), None) for k in old if k not in new)
            for k, v in new.items():
                b = _encoded(v)
                if k not in old:
                    out.append((path + (k,), b))
                elif _encoded(old[k]) != b:
                    _diff(old[k], v, b, path + (k,), out)
            return
    elif type(old) is list and type(new) is list and len(old) == len(new):
        news = [_encoded(v) for v in new]
        sub: list[tuple[tuple, bytes | None]] = []
        for k, (v, b) in enumerate(zip(old, news)):
            if _encoded(v) != b:
                _diff(v, new[k], b, path + (k,), sub)
        if len(sub) == 1 or any(len(p) > len(path) + 1 for p, _ in sub):  # (else items replaced whole: the list)
            out.extend(sub)
            return
    out.append((path, new_bytes))


def _kept(same: dict[Any, Any], data: bytes) -> bytes:
    """The one copy of ``data`` kept: a new value's bytes are copied once, to their size. (orjson gives a bytes
    object of 4 KB or more, whatever the text's length: 100,000 values of 200 characters, kept as orjson gave
    them, took 412 MB of RSS here; their copies, 25 MB.)"""
    got = bytes(memoryview(data))
    same[got] = got  # (the copy is the key too: the dict would keep the object it was given)
    return got


def _applied(value: Any, edits: LineEdits, version: int) -> Any:
    triples = iter(edits)
    for seq, path, data in zip(triples, triples, triples):
        if seq >= version:
            break
        if not path:
            value = _decoded(data)
            continue
        parent = value
        for k in path[:-1]:
            parent = parent[k]
        if data is None:
            del parent[path[-1]]
        else:
            parent[path[-1]] = _decoded(data)
    return value


class Edits(Sequence[Any]):
    """The values of a log as the fix codes rewrite them, kept as edits to the original values (see the module
    docstring). ``base(i)``: a fresh copy of line ``i``'s original value (nobody else holds it)."""

    def __init__(self, n: int, base: Callable[[int], Any]):
        self._n = n
        self._base = base
        self._edits: list[LineEdits | None] = [None] * n   # a line's edits (None: not rewritten), flat
        self._version = 0                          # snapshots taken so far: the version of a rewrite now
        self._same: dict[Any, Any] = {}            # one copy of each new value's bytes, of each path
        self._lines: dict[LineEdits, LineEdits] = {}  # one copy of each line's edits made of values seen before
        #: rewrites made (a value set that changed nothing is none)
        self.writes = 0

    def __len__(self) -> int:
        return self._n

    def _index(self, i: int) -> int:
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return i

    def value(self, i: int, version: int | None = None) -> Any:
        """A fresh copy of line ``i``'s value as the rewrites before ``version`` (None: all) left it."""
        i = self._index(i)
        edits = self._edits[i]
        value = self._base(i)
        return value if edits is None else _applied(value, edits, self._version + 1 if version is None else version)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self.value(k) for k in range(*i.indices(self._n))]
        return self.value(i)

    def __iter__(self) -> Iterator[Any]:
        for i in range(self._n):
            yield self.value(i)

    def __setitem__(self, i: int, value: Any) -> None:
        i = self._index(i)
        now = self.value(i)
        new_bytes = _encoded(value)
        if _encoded(now) == new_bytes:
            return
        found: list[tuple[tuple, bytes | None]] = []
        _diff(now, value, new_bytes, (), found)
        same, v = self._same, self._version
        parts: list[Any] = []
        seen = True  # every new value is one kept already
        for path, data in found:
            got = None if data is None else same.get(data)
            if got is None and data is not None:
                got, seen = _kept(same, data), False
            parts += (v, same.setdefault(path, path), got)
        self.writes += 1
        line = tuple(parts) if (old := self._edits[i]) is None else old + tuple(parts)
        # edits made of values seen before are likely the edits of other lines too (FX002's one sorted list, a
        # line moved alike): one tuple for them all (on 5,000 requests, 743 tuples for 10,000 edited lines)
        self._edits[i] = self._lines.setdefault(line, line) if seen else line

    def edits(self, i: int) -> list[tuple[tuple, Any]]:
        """Line ``i``'s edits in the order they apply: (JSON path, new value; the path's key dropped: None)."""
        edits = self._edits[self._index(i)] or ()
        return [(path, None if data is None else _decoded(data)) for path, data in zip(edits[1::3], edits[2::3])]

    def changed(self, i: int) -> bool:
        """Whether line ``i`` was rewritten (its JSON changed at some point)."""
        return self._edits[self._index(i)] is not None

    def signature(self, i: int, version: int | None = None) -> tuple | None:
        """Line ``i``'s edits before ``version`` (None: all) as (paths, new values' bytes), without the versions
        that stamp them (None: not rewritten then). Two equal signatures, of this log or of another rewrite of the
        same lines, are the same value."""
        edits = self._edits[self._index(i)]
        if edits is None:
            return None
        n = len(edits)
        if version is not None:
            n = next((k for k in range(0, n, 3) if edits[k] >= version), n)
            if n == 0:
                return None
        return edits[1:n:3], edits[2:n:3]

    def snapshot(self) -> _Version:
        """The values as the rewrites made so far left them, read-only, unaffected by later rewrites (a fix code
        applied after it): nothing is copied."""
        self._version += 1  # (the rewrites from now on are of a later version)
        return _Version(self, self._version)

    def branch(self, at: _Version) -> Edits:
        """The values as the snapshot ``at`` (of these edits) holds them, to be rewritten apart from these: another
        rewrite of the same lines that went as this one did until then goes on from there. A slot a line is copied,
        no edit."""
        assert at._of is self
        v = at._v
        out = Edits(self._n, self._base)
        out._version = v  # (its own rewrites come after those it holds)
        out._same, out._lines = self._same, self._lines
        out._edits = [e if e is None or e[-3] < v else _before(e, v) for e in self._edits]
        return out


def _before(edits: LineEdits, version: int) -> LineEdits | None:
    """A line's edits stamped before ``version`` (None: none)."""
    n = next(k for k in range(0, len(edits), 3) if edits[k] >= version)
    return edits[:n] or None


class _Version(Sequence[Any]):
    """An :class:`Edits`' values as the rewrites before ``version`` left them (:meth:`Edits.snapshot`)."""

    def __init__(self, edits: Edits, version: int):
        self._of, self._v = edits, version

    def __len__(self) -> int:
        return len(self._of)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._of.value(k, self._v) for k in range(*i.indices(len(self)))]
        return self._of.value(i, self._v)

    def changed(self, i: int) -> bool:
        edits = self._of._edits[self._of._index(i)]
        return edits is not None and edits[0] < self._v

    def signature(self, i: int) -> tuple | None:
        return self._of.signature(i, self._v)
