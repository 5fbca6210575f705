"""Where each value of a JSON text stands: JSON path -> (line, column).

The standard parsers give values, not positions. This scanner walks the text once with one regular
expression over its tokens and records the offset of every value under its path (``messages[2].content``),
so that findings and errors point at the field itself, whatever order the keys come in.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


def child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _walk(text: str) -> Iterator[tuple[str, str | None, str | None, int | None, int]]:
    """``(path, parent, key, key_offset, value_offset)`` for every value of the text's first JSON value, in
    order; ``key`` and ``key_offset`` are None for the root and for array elements."""
    # stack entries: [path, is_array, next_index, pending_key, pending_key_offset]
    stack: list[list] = []
    root_done = False
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        if tok in ",:":
            continue
        if tok in "}]":
            if stack:
                stack.pop()
            continue
        top = stack[-1] if stack else None
        if top is not None and not top[1] and top[3] is None:
            # inside an object, waiting for a key
            if tok.startswith('"'):
                try:
                    top[3] = json.loads(tok)
                except ValueError:
                    top[3] = tok[1:-1]
                top[4] = m.start()
            continue
        key: str | None = None
        key_offset: int | None = None
        if top is None:
            if root_done:
                return
            path = ""
            root_done = True
        elif top[1]:
            path = child(top[0], top[2])
            top[2] += 1
        else:
            key, key_offset = top[3], top[4]
            path = child(top[0], top[3])
            top[3] = None
        yield path, top[0] if top is not None else None, key, key_offset, m.start()
        if tok == "{":
            stack.append([path, False, 0, None, 0])
        elif tok == "[":
            stack.append([path, True, 0, None, 0])


def scan_offsets(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """``(values, keys)``: the offset of the first character of every value, keyed by its path (the root is
    ``""``), and, for object members, the offset of the member's key."""
    values: dict[str, int] = {}
    keys: dict[str, int] = {}
    for path, _, _key, key_offset, value_offset in _walk(text):
        if key_offset is not None:
            keys.setdefault(path, key_offset)
        values.setdefault(path, value_offset)
    return values, keys


def first_duplicate(text: str) -> tuple[str, str, int] | None:
    """``(path, key, offset)`` of the first object member whose key its object already has (``path`` is the
    member's, ``offset`` its key's), or None. A slow scan, for texts a parser found a duplicate in."""
    seen: set[tuple[str | None, str]] = set()
    for path, parent, key, key_offset, _ in _walk(text):
        if key is None or key_offset is None:
            continue
        if (parent, key) in seen:
            return path, key, key_offset
        seen.add((parent, key))
    return None


def value_offsets(text: str) -> dict[str, int]:
    """Offset of the first character of every value, keyed by its path (the root is ``""``)."""
    return scan_offsets(text)[0]


class Locator:
    """``locate(path) -> (line, column)``, 1-based, for a JSON text that starts at ``line``/``column``.

    An object member is located at its key (``"cache_control": ...`` points at ``"cache_control"``), an
    array element at its value. Paths that are not found fall back to their nearest located ancestor; the
    scan runs on first use.
    """

    def __init__(self, text: str, line: int = 1, column: int = 1) -> None:
        self._text = text
        self._line = line
        self._column = column

    @functools.cached_property
    def _offsets(self) -> dict[str, int]:
        values, keys = scan_offsets(self._text)
        values.update(keys)
        return values

    @functools.cached_property
    def _line_starts(self) -> list[int]:
        starts = [0]
        for m in re.finditer("\n", self._text):
            starts.append(m.end())
        return starts

    def offset(self, path: str) -> int | None:
        offsets = self._offsets
        p = path
        while True:
            if p in offsets:
                return offsets[p]
            if not p:
                return None
            p = _parent(p)

    def __call__(self, path: str) -> tuple[int, int]:
        off = self.offset(path)
        if off is None:
            return self._line, self._column
        import bisect

        i = bisect.bisect_right(self._line_starts, off) - 1
        col = off - self._line_starts[i] + 1
        return self._line + i, (col + self._column - 1) if i == 0 else col


def _parent(path: str) -> str:
    if path.endswith("]"):
        return path[:path.rindex("[")]
    i = path.rfind(".")
    return path[:i] if i >= 0 else ""


LocateFn = Callable[[str], tuple[int, int]]


class YamlLocator(Locator):
    """:class:`Locator` of a YAML document (a lint body): each path's offset from the mark of the node PyYAML
    composed for it (a mapping member at its key, a list item at its value), as the JSON scan gives them."""

    def __init__(self, text: str, node: Any) -> None:
        super().__init__(text)
        self._node = node

    @functools.cached_property
    def _offsets(self) -> dict[str, int]:
        import yaml

        out: dict[str, int] = {}
        stack: list[tuple[str, Any]] = [("", self._node)]
        while stack:  # (aliases: a document that expands past twice its size was refused as it was loaded)
            path, node = stack.pop()
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode):
                        at = f"{path}.{key.value}" if path else str(key.value)
                        out.setdefault(at, key.start_mark.index)
                        stack.append((at, value))
            elif isinstance(node, yaml.SequenceNode):
                for i, value in enumerate(node.value):
                    out[f"{path}[{i}]"] = value.start_mark.index
                    stack.append((f"{path}[{i}]", value))
        return out


def yaml_duplicate_key(node: Any) -> tuple[str, int] | None:
    """The first key a mapping of a composed YAML document names twice, and its character offset (PyYAML keeps
    the last value without a word, where a JSON document's duplicate is an error)."""
    import yaml

    stack, seen_nodes = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen_nodes:
            continue
        seen_nodes.add(id(n))
        if isinstance(n, yaml.MappingNode):
            keys: set[Any] = set()
            for key, value in n.value:
                if isinstance(key, yaml.ScalarNode):
                    if (key.tag, key.value) in keys:
                        return str(key.value), key.start_mark.index
                    keys.add((key.tag, key.value))
                stack.append(value)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
    return None
