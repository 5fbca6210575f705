"""Hypothesis strategies for malformed and adversarial inputs.

Start from a valid seed (a fixture, a trace line, a config), then mutate it: a value anywhere replaced by a
value of the wrong type, a huge or non-finite number, a key dropped or added; then, on the serialized
bytes, truncation, invalid UTF-8, UTF-16, NUL bytes, gzip garbage, a huge single line or 100,000 levels of
nesting.
"""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

#: levels of nesting of the deep documents (the issue's case: 100,000)
DEEP = 100_000
#: bytes of the huge single lines; the long runner raises it
HUGE_LINE = 1 << 20

# A placeholder string that a serializer turns into deeply nested brackets after json.dumps.
_DEEP_MARK = "\u2063deep\u2063"

NASTY_SCALARS = [None, True, False, 0, -1, 1, 2, 3, 7, 2 ** 31, 2 ** 63, 2 ** 64, -(2 ** 63), 10 ** 30, 10 ** 400,
                 0.5, -0.0, 1e308, -1e308, 1e-320, float("nan"), float("inf"), float("-inf"), "", " ", "0", "1",
                 "-1", "1e999", "NaN", "x", "\x00", "\ud800", "\ufeff", "é" * 3, "5m", "1h", "user", "system",
                 "assistant", "tool", "text", "image", "ephemeral", "2026-11-29T10:00:00Z", "\n" * 3]


def nasty_values() -> st.SearchStrategy:
    """Values of every JSON type, weighted to the ones that break readers."""
    scalars = st.one_of(st.sampled_from(NASTY_SCALARS), st.integers(), st.floats(allow_nan=True),
                        st.text(max_size=20))
    containers = st.one_of(
        st.just([]), st.just({}), st.just([[]]), st.just([{}]), st.just({"": None}), st.just(_DEEP_MARK),
        st.lists(scalars, max_size=4), st.dictionaries(st.text(max_size=8), scalars, max_size=3),
        st.builds(lambda n: [0] * n, st.sampled_from([1, 100, 5000])))
    return st.one_of(scalars, containers)


def _paths(value: Any, prefix: tuple = (), out: list | None = None, limit: int = 400) -> list[tuple]:
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    out.append(prefix)
    if isinstance(value, dict):
        for k, v in value.items():
            _paths(v, prefix + (k,), out, limit)
    elif isinstance(value, list):
        for i, v in enumerate(value[:50]):
            _paths(v, prefix + (i,), out, limit)
    return out


def _set(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    parent = value
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = new
    return value


def _get(value: Any, path: tuple) -> Any:
    for p in path:
        value = value[p]
    return value


@st.composite
def mutated_value(draw, seed: Any, max_mutations: int = 3) -> Any:
    """``seed`` with 1..max_mutations structural mutations."""
    value = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = _paths(value)
        path = draw(st.sampled_from(paths))
        target = _get(value, path)
        action = draw(st.sampled_from(["replace", "replace", "replace", "drop", "add", "wrap", "dup"]))
        if action == "replace":
            value = _set(value, path, draw(nasty_values()))
        elif action == "drop" and path:
            parent = _get(value, path[:-1])
            del parent[path[-1]]
        elif action == "add" and isinstance(target, dict):
            key = draw(st.sampled_from(["type", "role", "content", "text", "cache_control", "ttl", "tokens",
                                        "hash_ids", "salt", "timestamp", "model", "usage", "messages", "system",
                                        "tools", "input_length", "segments", "body", "prompt", "x"]))
            target[key] = draw(nasty_values())
        elif action == "wrap":
            value = _set(value, path, [target] if draw(st.booleans()) else {"body": target})
        elif action == "dup" and isinstance(target, list) and target:
            target.extend(target[:1] * draw(st.sampled_from([1, 10, 1000])))
    return value


def dumps(value: Any, deep: int = DEEP, ascii: bool = False) -> str:
    """JSON text (NaN and Infinity as Python writes them), with the deep mark expanded; lone surrogates stay
    raw (invalid UTF-8 once encoded) unless ``ascii`` escapes them as ``\\ud800``."""
    text = json.dumps(value, allow_nan=True, ensure_ascii=ascii, default=str)
    mark = json.dumps(_DEEP_MARK, ensure_ascii=ascii)
    return text.replace(mark, "[" * deep + "]" * deep) if mark in text else text


# --------------------------------------------------------------------------------------------- bytes

def _insert(data: bytes, pos: int, piece: bytes) -> bytes:
    return data[:pos] + piece + data[pos:]


@st.composite
def mutated_bytes(draw, data: bytes, huge_line: int = HUGE_LINE, deep: int = DEEP) -> bytes:
    """A byte-level mutation of ``data``, or ``data`` unchanged."""
    action = draw(st.sampled_from(["keep", "keep", "keep", "truncate", "insert", "flip", "utf16", "bom",
                                   "gzip", "gzip_garbage", "huge_line", "deep", "empty", "nul", "crlf"]))
    pos = draw(st.integers(0, len(data)))
    if action == "truncate":
        return data[:pos]
    if action == "insert":
        piece = draw(st.sampled_from([b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xef\xbb\xbf", b"\r", b"\n",
                                      b"\n\n", b"{", b"[", b"\"", b"\\", b"}", b",", b"\xe2\x80\xa8", b"\x1b[31m"]))
        return _insert(data, pos, piece)
    if action == "flip" and data:
        pos = min(pos, len(data) - 1)
        return data[:pos] + bytes([data[pos] ^ draw(st.integers(1, 255))]) + data[pos + 1:]
    if action == "utf16":
        return data.decode("utf-8", "replace").encode(draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32"])))
    if action == "bom":
        return b"\xef\xbb\xbf" + data
    if action == "gzip":
        return gzip.compress(data)
    if action == "gzip_garbage":
        return b"\x1f\x8b\x08\x00" + draw(st.binary(max_size=64))
    if action == "huge_line":
        return _insert(data, pos, b"x" * huge_line)
    if action == "deep":
        return _insert(data, pos, b"[" * deep + b"]" * deep)
    if action == "empty":
        return draw(st.sampled_from([b"", b" ", b"\n\n", b"\t \r\n"]))
    if action == "nul":
        return b"\x00" * draw(st.integers(1, 64))
    if action == "crlf":
        return data.replace(b"\n", b"\r\n")
    return data


# ------------------------------------------------------------------------------------------ documents

@st.composite
def json_document(draw, seeds: list, deep: int = DEEP, huge_line: int = HUGE_LINE) -> bytes:
    seed = draw(st.sampled_from(seeds))
    value = draw(mutated_value(seed)) if draw(st.integers(0, 9)) else seed
    data = dumps(value, deep, draw(st.booleans())).encode("utf-8", "surrogatepass")
    return draw(mutated_bytes(data, huge_line, deep))


@st.composite
def jsonl_document(draw, seeds: list, deep: int = DEEP, huge_line: int = HUGE_LINE) -> bytes:
    n = draw(st.integers(1, 6))
    lines = []
    ascii = draw(st.booleans())
    for _ in range(n):
        seed = draw(st.sampled_from(seeds))
        value = draw(mutated_value(seed)) if draw(st.integers(0, 2)) == 0 else seed
        lines.append(dumps(value, deep, ascii))
    data = "\n".join(lines).encode("utf-8", "surrogatepass") + b"\n"
    return draw(mutated_bytes(data, huge_line, deep))


@st.composite
def text_document(draw, seeds: list[str], fragments: list[str], deep: int = DEEP,
                  huge_line: int = HUGE_LINE) -> bytes:
    """Text (templates, TSV, prompts): fragments spliced into a seed, then a byte mutation."""
    text = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(0, 3))):
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.sampled_from(fragments)) + text[pos:]
    return draw(mutated_bytes(text.encode("utf-8", "surrogatepass"), huge_line, deep))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=True) if v != _DEEP_MARK else "[" * DEEP + "]" * DEEP
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v if x is not None) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    return '""'


@st.composite
def toml_document(draw, seeds: list[dict], huge_line: int = HUGE_LINE) -> bytes:
    """A pyproject.toml with a mutated [tool.cachectl.lint] table."""
    table = draw(mutated_value(draw(st.sampled_from(seeds))))
    if not isinstance(table, dict):
        body = f"lint = {_toml_value(table)}\n" if table is not None else ""
        text = "[tool.cachectl]\n" + body
    else:
        text = "[tool.cachectl.lint]\n" + "".join(f"{json.dumps(str(k))} = {_toml_value(v)}\n"
                                                   for k, v in table.items() if v is not None)
    return draw(mutated_bytes(text.encode("utf-8", "surrogatepass"), huge_line))


def yaml_document(seeds: list) -> st.SearchStrategy:
    import yaml

    @st.composite
    def build(draw) -> bytes:
        value = draw(mutated_value(draw(st.sampled_from(seeds))))
        try:
            text = yaml.safe_dump(value, allow_unicode=True)
        except Exception:  # values YAML cannot represent (lone surrogates): write JSON, which is YAML
            text = dumps(value)
        if _DEEP_MARK in text:
            text = text.replace(_DEEP_MARK, "[" * 2000 + "]" * 2000)
        return draw(mutated_bytes(text.encode("utf-8", "surrogatepass")))

    return build()


# ---------------------------------------------------------------------------------------------- GGUF

GGUF_VALUE_TYPES = 13


def gguf_seed(path: str, per_layer_kv: bool = False, arch: str = "llama") -> bytes:
    """A small valid GGUF file written with the ``gguf`` package (header and metadata only)."""
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    if per_layer_kv:
        w.add_head_count_kv([2, 0])
    else:
        w.add_head_count_kv(2)
    w.add_key_length(16)
    w.add_sliding_window(128)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    w.add_array("tokenizer.ggml.scores", [0.5] * 70)
    w.add_array("general.tags", [["x", "y"], ["z"]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    with open(path, "rb") as fh:
        return fh.read()


@st.composite
def gguf_document(draw, seeds: list[bytes]) -> bytes:
    """A GGUF file with a count, a length or a type overwritten, bytes flipped, or a truncation."""
    import struct

    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["u64", "u64", "u32", "flip", "truncate", "append"]))
        pos = draw(st.integers(0, max(0, len(data) - 8)))
        if action == "u64":
            value = draw(st.sampled_from([2 ** 64 - 1, 2 ** 63, 2 ** 40, 2 ** 32, len(data), len(data) * 2, 0, 1]))
            data[pos:pos + 8] = struct.pack("<Q", value)
        elif action == "u32":
            value = draw(st.sampled_from([2 ** 32 - 1, 9, 8, 7, 12, 13, GGUF_VALUE_TYPES, 1, 0, 3]))
            data[pos:pos + 4] = struct.pack("<I", value)
        elif action == "flip" and data:
            data[min(pos, len(data) - 1)] ^= draw(st.integers(1, 255))
        elif action == "truncate":
            del data[pos:]
        else:
            data += draw(st.binary(max_size=64))
    return bytes(data)


def strings(max_size: int = 40) -> st.SearchStrategy:
    """Option values: numbers in every spelling, separators, and text."""
    pieces = st.sampled_from(["0", "1", "-1", "16", "4096", "32k", "1e309", "inf", "-inf", "nan", "1e-400", "1.5",
                              "99999999999999999999999", "k", ",", ",,", " ", "=", "x", "GiB", "GB", "TB", "s", "m",
                              "h", "5m", "1h", "\x00", "é", "{", "[1]", "\"", "CC001", "cc9", "-"])
    return st.lists(pieces, max_size=8).map("".join) | st.text(max_size=max_size)


Strategy = Callable[..., st.SearchStrategy]


@st.composite
def parquet_document(draw, seeds: list) -> bytes:
    """A Parquet file of rows drawn (and mutated) from ``seeds``, as pyarrow infers their columns, then kept,
    truncated, flipped or extended at the byte level."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for _ in range(draw(st.integers(1, 6))):
        seed = draw(st.sampled_from(seeds))
        rows.append(draw(mutated_value(seed)) if draw(st.integers(0, 2)) == 0 else seed)
    group = draw(st.integers(1, 4))

    def write(table) -> Any:
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=group)
        return sink

    try:
        sink = write(pa.Table.from_pylist([r if isinstance(r, dict) else {"tokens": r} for r in rows]))
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        # rows pyarrow cannot type, or Parquet cannot hold (a struct with no fields: a value mutated to {})
        sink = write(pa.Table.from_pylist([s for s in seeds if isinstance(s, dict)]))
    data = bytearray(sink.getvalue().to_pybytes())
    action = draw(st.sampled_from(["keep", "keep", "keep", "truncate", "flip", "append"]))
    pos = draw(st.integers(0, max(0, len(data) - 1)))
    if action == "truncate":
        del data[pos:]
    elif action == "flip" and data:
        data[pos] ^= draw(st.integers(1, 255))
    elif action == "append":
        data += draw(st.binary(max_size=64))
    return bytes(data)
