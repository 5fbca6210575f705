"""Bytes in: files, stdin, gzip; JSON documents and JSONL lines parsed with located errors.

Every other reader in :mod:`cachectl.inputs` gets its bytes and its parsed JSON from here, so every
command accepts the same things (``-`` for stdin, ``.gz`` files, a BOM) and refuses bad input with the
same one-line messages.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import os
import re
import stat
import sys
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from typing import IO, Any

import orjson

from ..errors import InputError

_BINARY_SNIFF = 8192
_GZIP_MAGIC = b"\x1f\x8b"
#: a zstd frame (RFC 8878)
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: read buffer of files: lines of long token traces span many of the default 8 KiB buffers
_BUFFER = 1 << 20
#: deepest nesting accepted in a JSON value (orjson's own limit is 1024; json's recursion breaks earlier)
MAX_DEPTH = 512


#: temporary copies of inputs that cannot be read twice (see :func:`spooled`) -> the name their errors give
_SPOOLED: dict[str, str] = {}


def display_name(path: str) -> str:
    """How a file is named in outputs and errors: ``<stdin>`` for ``-``, a spooled copy by its origin's name, and a
    name that is not UTF-8 (its bytes read as Python does, lone surrogates) with those bytes as ``\\xff``: JSON,
    HTML and the terminal take it (it was an internal error in ``-f json`` and ``--html``)."""
    name = "<stdin>" if path == "-" else _SPOOLED.get(path, path)
    return name if name.isascii() else utf8_name(name)


def utf8_name(name: str) -> str:
    """``name`` with each byte that is not UTF-8 (a lone surrogate, as ``os.fsdecode`` reads it) shown as ``\\xff``."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _open_raw(path: str) -> tuple[IO[bytes], str]:
    if path == "-":
        return sys.stdin.buffer, "<stdin>"
    try:
        return open(path, "rb", buffering=_BUFFER), display_name(path)
    except FileNotFoundError:
        raise InputError("no such file", source=path) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a file", source=path) from None
    except PermissionError:
        raise InputError("permission denied", source=path) from None
    except OSError as exc:
        raise InputError(f"cannot open: {exc.strerror or exc}", source=path) from None


def open_binary(path: str) -> tuple[IO[bytes], str]:
    """Open a file (``-`` for stdin) for reading bytes; gzip and zstd are recognized by their magic and undone
    (zstd by pyarrow, the parquet extra)."""
    fh, source = _open_raw(path)
    try:
        head = fh.peek(4)[:4] if hasattr(fh, "peek") else b""
        if hasattr(fh, "peek") and len(head) < 4:  # a pipe gave fewer bytes so far: wait for 4 (or the end)
            head = fh.read(4)
            fh = io.BufferedReader(_Prefixed(head, fh), buffer_size=_BUFFER)
    except OSError:
        head = b""
    if head[:2] == _GZIP_MAGIC:
        return _GzipLines(gzip.GzipFile(fileobj=fh, mode="rb"), source), source  # type: ignore[return-value]
    if head == ZSTD_MAGIC:
        try:
            return _zstd_reader(fh, source), source
        except BaseException:
            _close(fh)
            raise
    return fh, source


class _Prefixed(io.RawIOBase):
    """The bytes ``head`` already read from ``rest``, then the rest of it: a stream read ahead of its use."""

    def __init__(self, head: bytes, rest: Any) -> None:
        self._head, self._rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._rest.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            _close(self._rest)
        super().close()


class _ArrowRaw(io.RawIOBase):
    """A pyarrow input stream as a raw file, its read errors as located input errors."""

    def __init__(self, stream: Any, fh: Any, source: str) -> None:
        self._stream, self._fh, self._source = stream, fh, source

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._stream.read(len(buffer))
        except OSError as exc:
            raise InputError(f"corrupt zstd data ({exc})", source=self._source) from None
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
            _close(self._fh)
        super().close()


def _zstd_reader(fh: Any, source: str) -> IO[bytes]:
    try:
        import pyarrow as pa
    except ImportError:
        raise InputError("zstd-compressed: reading it needs pyarrow (pip install 'llm-cachectl[parquet]'), or "
                         "decompress it first (zstd -d)", source=source) from None
    stream = pa.CompressedInputStream(pa.PythonFile(fh, mode="r"), "zstd")
    return io.BufferedReader(_ArrowRaw(stream, fh, source), buffer_size=_BUFFER)


class _GzipLines:
    """A gzip stream whose read errors become located input errors."""

    def __init__(self, gz: gzip.GzipFile, source: str) -> None:
        self._gz, self._source = gz, source

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"corrupt gzip data ({exc})", source=self._source) from None

    def read(self, n: int = -1) -> bytes:
        return self._guard(self._gz.read, n)

    def readline(self, limit: int = -1) -> bytes:
        return self._guard(self._gz.readline, limit)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def close(self) -> None:
        self._gz.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close(fh: Any) -> None:
    if fh is not sys.stdin.buffer:
        fh.close()


def _read_error(exc: OSError, source: str) -> InputError:
    """An operating-system error while reading (EIO, a permission lost, a device gone) as one located line."""
    return InputError(f"cannot read: {(exc.strerror or str(exc)).lower() if exc.strerror else exc}", source=source)


#: the most bytes a file read whole may hold (a template, a body, a config, a pairs file; gunzipped): a stream
#: (stdin, /dev/zero, a FIFO) has no size to check before it is read, so the read stops here
MAX_WHOLE_FILE_BYTES = 64 * 2**20


def read_bytes(path: str) -> tuple[bytes, str]:
    """Read a whole file (or stdin for ``-``), gunzipped if it is gzip, with its display name; past
    :data:`MAX_WHOLE_FILE_BYTES` it is refused."""
    fh, source = open_binary(path)
    try:
        data = fh.read(MAX_WHOLE_FILE_BYTES + 1)
        if len(data) > MAX_WHOLE_FILE_BYTES:
            raise InputError(f"more than {MAX_WHOLE_FILE_BYTES // 2**20} MiB: past what cachectl reads whole (a "
                             "stream that never ends?)", source=source)
        return data, source
    except OSError as exc:
        raise _read_error(exc, source) from None
    finally:
        _close(fh)


@contextlib.contextmanager
def spooled(path: str) -> Iterator[str]:
    """``path`` itself when it is a regular file; otherwise (``-``, a pipe, a FIFO, ``/dev/stdin``, a process
    substitution), a temporary copy of its bytes, made once, for a reader that reads its input more than once.
    Errors about the copy name the original (:func:`display_name` knows the copy); it is removed at the end."""
    if path != "-":
        try:
            regular = stat.S_ISREG(os.stat(path).st_mode)
        except OSError:  # missing, unreadable: the reader names the problem
            regular = True
        if regular:  # (an OSError of the body's own passes through: not caught here)
            yield path
            return
    fh, source = _open_raw(path)
    try:
        out = tempfile.NamedTemporaryFile(prefix="cachectl-spool-", suffix=".jsonl", delete=False)
    except OSError as exc:
        _close(fh)
        raise InputError(f"cannot make a temporary copy to read it more than once ({tempfile.gettempdir()}: "
                         f"{exc.strerror or exc})", source=source) from None
    try:
        with out:
            run = 0  # bytes since the last line end: the copy stops at a line no reader would take
            while True:
                try:
                    block = fh.read(_BUFFER)
                except OSError as exc:
                    raise _read_error(exc, source) from None
                if not block:
                    break
                first, last = block.find(b"\n"), block.rfind(b"\n")
                if (run + (len(block) if first < 0 else first)) > MAX_LINE_BYTES:
                    raise InputError(f"a line over {MAX_LINE_BYTES // 2**20} MiB: not a log line (a stream that never "
                                     "ends its line?)", source=source)
                run = run + len(block) if last < 0 else len(block) - last - 1
                try:
                    out.write(block)
                except OSError as exc:
                    raise InputError(f"cannot make a temporary copy to read it more than once ("
                                     f"{tempfile.gettempdir()}: {exc.strerror or exc})", source=source) from None
        _SPOOLED[out.name] = source
        yield out.name
    finally:
        _close(fh)
        _SPOOLED.pop(out.name, None)
        with contextlib.suppress(OSError):
            os.unlink(out.name)


def decode_text(data: bytes, source: str) -> str:
    """Decode UTF-8 strictly (a BOM is dropped); refuse empty and binary files with a located message."""
    if not data.strip():
        raise InputError("file is empty", source=source)
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise InputError("looks like UTF-16 text; save it as UTF-8", source=source)
    if b"\x00" in data[:_BINARY_SNIFF]:
        raise InputError("looks like a binary file (NUL bytes), expected text or JSON", source=source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                         source=source, line=line) from None
    return text.removeprefix("\ufeff")


def read_text(path: str) -> tuple[str, str]:
    data, source = read_bytes(path)
    return decode_text(data, source), source


# ---------------------------------------------------------------------------------------------- JSON


def _depth_exceeds(text: str, limit: int) -> bool:
    """Whether brackets nest deeper than ``limit`` outside strings (a cheap pre-check before parsing)."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def yaml_expanded_past(value: Any, text: str) -> bool:
    """Whether a YAML document as loaded (``value``, from ``text``) holds more than twice the text's characters
    (and 65,536 more), each alias counted where it stands: a loader keeps one object for an anchor and all its
    aliases, so a small file can stand for a document a thousand times its size ("billion laughs"), which whatever
    walks, serializes or renders it then pays in full. Characters of strings and items of lists and mappings are
    counted, and the walk stops at the bound: its time is bounded by the text's size."""
    budget = 2 * len(text) + 65_536
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            budget -= len(v) + 1
        elif isinstance(v, dict):
            budget -= len(v) + 1
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            budget -= len(v) + 1
            stack.extend(v)
        else:
            budget -= 1
        if budget < 0:
            return True
    return False


#: the error of a JSONL file read where one JSON document is expected
JSONL_NOT_JSON = "one JSON document per line (JSONL) where a single JSON document is expected"


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list) -> dict:
    """json's ``object_pairs_hook``: an object that names a key twice is refused, not read "last wins"."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey
    return obj


def _duplicate_error(text: str, source: str, line: int | None = None) -> InputError:
    """The located error of a JSON text that names a key twice in one object."""
    from .jsonpos import first_duplicate

    found = first_duplicate(text)
    if found is None:  # pragma: no cover - json and the scanner agree on what a key is
        return InputError("an object names one key twice", source=source, line=line)
    path, key, offset = found
    where = line if line is not None else text.count("\n", 0, offset) + 1
    return InputError(f"duplicate key {key!r}", source=source, line=where, field=path)


def _may_repeat_a_key(raw: bytes, value: Any) -> bool:
    """False when the JSONL line ``raw``, parsed to ``value`` by orjson (which keeps the last of duplicate keys
    without a word), certainly names no key twice: a line with no object, or a flat object (one ``{``) whose
    keys orjson kept are as many as the line's colons (each key has one after it, strings may hold more) or,
    with no white space after a closing quote, as many as its ``":``. Byte counts at C speed; anything else
    is checked by a json parse with a hook."""
    find = raw.find  # one byte: memchr (bytes.count of one byte is a slower loop)
    if type(value) is not dict:
        return find(b"{") >= 0
    if find(b"{", find(b"{") + 1) >= 0:
        return True
    n = len(value)
    i = -1
    for _ in range(n + 1):  # no more colons than keys: a few memchr calls
        i = find(b":", i + 1)
        if i < 0:
            return False
    return raw.count(b'":') != n or b'" ' in raw or b'"\t' in raw or b'"\n' in raw or b'"\r' in raw


def _keys_kept(value: Any) -> int:
    """How many keys the objects of ``value`` hold, all levels (an explicit stack: no recursion limit)."""
    n = 0
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        cur = pop()
        if type(cur) is dict:
            n += len(cur)
            for v in cur.values():
                if type(v) is dict or type(v) is list:
                    push(v)
        else:
            for v in cur:
                if type(v) is dict or type(v) is list:
                    push(v)
    return n


def _keys_certainly_once(raw: bytes, value: Any) -> bool:
    """True when the JSONL line ``raw`` (read by orjson into ``value``, which keeps one of each key) certainly
    names no key twice in one object, told at C speed (else json's check decides):

    - the line is orjson's own compact writing of ``value`` (as JSON.stringify and orjson write JSONL: Claude
      Code's transcripts, cachectl's own lines): its objects are ``value``'s, each key once;
    - no escaped quote and no white space after a quote: its ``":`` count is at least its keys (a string may open
      with a colon), which are at least the keys ``value`` kept: equal, no key was dropped."""
    try:
        if orjson.dumps(value) == raw.rstrip(b"\r\n"):
            return True
    except (orjson.JSONEncodeError, TypeError):  # pragma: no cover - what orjson read, it writes
        return False
    if b'\\"' in raw or b'" ' in raw or b'"\t' in raw or b'"\n' in raw or b'"\r' in raw:
        return False
    return raw.count(b'":') == _keys_kept(value)


def _check_line_keys(raw: bytes, source: str, lineno: int) -> None:
    try:
        json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey:
        raise _duplicate_error(raw.decode("utf-8", "replace"), source, lineno) from None
    except (ValueError, RecursionError):  # orjson read it; json cannot tell (nesting): nothing to add
        pass


def parse_json_document(text: str, source: str) -> Any:
    """Parse a JSON document; errors carry the line (and column) where the parser stopped, and an object that
    names a key twice is an error naming the key and its line."""
    if _depth_exceeds(text, MAX_DEPTH):
        raise InputError(f"JSON nested deeper than {MAX_DEPTH} levels", source=source)
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
        if "\\u" in text:
            _refuse_lone_surrogates(text, value, source)
        return value
    except _DuplicateKey:
        raise _duplicate_error(text, source) from None
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and exc.colno == 1 and _is_jsonl(text):
            raise InputError(JSONL_NOT_JSON, source=source, line=exc.lineno) from None
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", source=source,
                         line=exc.lineno) from None
    except ValueError as exc:  # an integer past Python's limit on digits: 'Exceeds the limit (4300 digits) ...'
        raise too_many_digits(text, source, exc, "invalid JSON") from None
    except RecursionError:
        raise InputError("JSON nested too deeply", source=source) from None


#: a number written with more digits than Python converts (``sys.get_int_max_str_digits``, 4,300 by default)
_LONG_NUMBER = re.compile(r"\d{4301,}")


def too_many_digits(text: str, source: str, exc: ValueError, what: str) -> Exception:
    """The error for a document the parser (json, YAML, TOML) stopped at with ``exc``: an integer of more digits
    than Python converts is one located line (it was an internal error that ended the run); any other ``exc`` is
    returned as it is."""
    if "digits" not in str(exc):
        return exc
    found = _LONG_NUMBER.search(text)
    line = text.count("\n", 0, found.start()) + 1 if found is not None else None
    digits = f"{len(found.group()):,} digits" if found is not None else "too many digits"
    return InputError(f"{what}: an integer of {digits} (at most {sys.get_int_max_str_digits():,}: no token count, "
                      "price or setting has as many)", source=source, line=line)


#: a ``\\uD800``-``\\uDFFF`` escape that is not half of a pair (JSON's parser reads it; no UTF-8 text holds it)
_LONE_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                             r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")


def _refuse_lone_surrogates(text: str, value: Any, source: str) -> None:
    """A string of the document with a lone surrogate (``"\\ud800"``) is refused, as orjson refuses it in JSONL:
    no tokenizer encodes it."""
    found = _LONE_SURROGATE.search(text)
    if found is None:
        return
    try:
        orjson.dumps(value)  # (it refuses a str that is no UTF-8, at any depth; the match may be an escaped '\\')
    except orjson.JSONEncodeError as exc:
        if "surrogates" in str(exc):  # (not an int past 64 bits, a nesting past orjson's depth)
            raise InputError(f"invalid JSON: a lone surrogate {found.group()} in a string (no UTF-8 text holds "
                             "one)", source=source, line=text.count("\n", 0, found.start()) + 1) from None


def _is_jsonl(text: str) -> bool:
    """Whether every non-blank line of ``text`` is a JSON document of its own."""
    try:
        for line in text.split("\n"):  # (not splitlines: a JSON string may hold U+2028 and U+0085 as they are)
            if line.strip():
                json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def parse_jsonl_line(raw: bytes, source: str, lineno: int) -> Any:
    """Parse one JSONL line with orjson; errors name the file and line. A NUL byte is looked for only once
    orjson refused the line: JSON has none outside strings, and none unescaped in one (RFC 8259), so orjson
    refuses every line that holds one; each line it reads is spared the scan."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if b"\x00" in raw:
            if lineno == 1 and raw.startswith(b"PAR1"):
                raise InputError("a Parquet file, expected JSONL (of the commands, simulate-prefix reads Parquet "
                                 "traces)", source=source, line=lineno) from None
            raise InputError("looks like binary data (NUL bytes), expected JSON", source=source,
                             line=lineno) from None
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise InputError(f"not valid UTF-8 (offset {uexc.start} in the line)", source=source,
                             line=lineno) from None
        msg = str(exc.msg)
        if "recursion" in msg.lower():
            raise InputError("JSON nested too deeply", source=source, line=lineno) from None
        if lineno == 1 and (raw.strip() in (b"{", b"[") or raw.rstrip().endswith((b"{", b"["))):
            raise InputError("this is pretty-printed JSON over several lines; expected JSONL, one JSON value per "
                             "line (convert with: jq -c . FILE)", source=source, line=lineno) from None
        if exc.pos >= len(raw.rstrip(b"\r\n")):  # (the parser ran past the line's end: a cut line, or one unclosed)
            first = "; if the file is one JSON document over several lines, expected JSONL, one JSON value per " \
                    "line (convert with: jq -c . FILE)" if lineno == 1 and raw.lstrip()[:1] in (b"{", b"[") else ""
            raise InputError("invalid JSON: the line ends before its value does (cut off, or a string, object or "
                             f"array left open){first}", source=source, line=lineno) from None
        raise InputError(f"invalid JSON: {msg} (column {exc.colno})", source=source, line=lineno) from None
    if _may_repeat_a_key(raw, value) and not _keys_certainly_once(raw, value):
        _check_line_keys(raw, source, lineno)
    return value


#: a UTF-8 byte order mark: dropped from a file's first line as it is read (``fix -o`` writes it back)
BOM = b"\xef\xbb\xbf"


def line_text(lineno: int, raw: bytes) -> bytes | None:
    """What line ``lineno`` holds to read: its bytes, line 1's without a BOM; None for a blank line (no copy of
    the line is made to tell, unlike strip())."""
    if lineno == 1 and raw.startswith(BOM):
        raw = raw[3:]
    return None if not raw or raw.isspace() else raw


class Lines:
    """The numbered non-blank lines of a stream of lines, as every reader takes them: a UTF-8 BOM dropped
    from the file's first line (line 1), blank lines skipped. ``first``: the number of the stream's first
    line. As iteration goes, ``seen`` says whether a non-blank line was given and ``count`` how many lines
    (blank ones too) were read."""

    def __init__(self, lines: Iterable[bytes], first: int = 1) -> None:
        self._lines, self.first = lines, first
        self.seen = False
        self.count = 0

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        lineno = self.first - 1
        for lineno, raw in enumerate(self._lines, start=self.first):
            text = line_text(lineno, raw)
            if text is None:
                continue
            self.seen = True
            yield lineno, text
        self.count = lineno - self.first + 1


#: the longest line any log reader takes (a request body with a long context is a few MiB; past this, a stream
#: that never ends a line, or a file that is no log, is refused after reading this much, not held whole)
MAX_LINE_BYTES = 64 * 2**20


def iter_raw_lines(path: str, *, every: bool = False) -> Iterator[tuple[int, bytes, str]]:
    """Stream ``(line_number, raw_line, source)`` of non-blank lines, as :class:`Lines` gives them (a BOM dropped
    from line 1, blank lines skipped); an empty file is an error, and so is a line over :data:`MAX_LINE_BYTES`,
    raised once that much of it was read (memory stays bounded whatever the stream). One generator over the
    stream's bounded ``readline`` (every line of every log passes here). ``every``: every line as the file holds
    it, blank ones and line 1's BOM too (what ``fix -o`` writes back)."""
    fh, source = open_binary(path)
    seen = False
    try:
        for lineno, raw in enumerate(iter(functools.partial(fh.readline, MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise InputError(f"a line over {MAX_LINE_BYTES // 2**20} MiB: not a log line (a stream that never "
                                 "ends its line?)", source=source, line=lineno)
            text = line_text(lineno, raw)
            if text is None:
                if every:
                    yield lineno, raw, source
                continue
            seen = True
            yield lineno, raw if every else text, source
    except OSError as exc:
        raise _read_error(exc, source) from None
    finally:
        _close(fh)
    if not seen:
        raise InputError("file is empty", source=source)


def _head_of_file(path: str) -> tuple[bytes, int] | None:
    """The first 4 bytes and the size of the regular file ``path``; None for stdin, a pipe, or a file that
    cannot be read (stdin and pipes are not looked at: they are read once, by their reader)."""
    try:
        if path == "-" or not stat.S_ISREG((st := os.stat(path)).st_mode):
            return None
        with open(path, "rb") as fh:
            return fh.read(4), st.st_size
    except OSError:
        return None


def compression(path: str) -> str | None:
    """"gzip" or "zstd" when the file ``path`` is compressed (by its magic bytes, as the readers tell), else
    None."""
    return _compression_of((_head_of_file(path) or (b"", 0))[0])


def _compression_of(head: bytes) -> str | None:
    return "gzip" if head[:2] == _GZIP_MAGIC else "zstd" if head == ZSTD_MAGIC else None


def plain_size(path: str) -> int | None:
    """The size of ``path`` when its bytes are its lines as they stand: a regular file that is not gzip, zstd
    or Parquet (and not stdin). None otherwise, or when it cannot be read (the readers then name the
    problem)."""
    found = _head_of_file(path)
    if found is None or _compression_of(found[0]) or found[0] == b"PAR1":
        return None
    return found[1]


class JsonlChunks:
    """A plain JSONL file (see :func:`plain_size`) cut at line ends into chunks that separate processes read
    on their own. The first chunks are small (``first_bytes``, doubling up to ``chunk_bytes``), so that a
    consumer in file order gets going soon. :meth:`lines` numbers a chunk's lines from :meth:`first_line`:
    1 for the file's first chunk, 2 for the others (never 1, which the readers treat as the file's first
    line: a BOM, the Parquet magic); whoever puts the chunks back in order adds the lines before."""

    def __init__(self, path: str, chunk_bytes: int = 4 << 20, first_bytes: int = 256 << 10) -> None:
        # 4 MiB of trace is about 600k tokens: one frame of keys (~300 kB) in a pipe at a time
        self.path, self.source = path, display_name(path)
        self.bounds: list[tuple[int, int | None]] = []
        start = 0
        step = max(1, min(first_bytes, chunk_bytes))
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            while True:
                fh.seek(start + step - 1)
                step = min(2 * step, max(1, chunk_bytes))
                fh.readline()                       # on to the end of the line that holds the cut
                end = fh.tell()
                if end >= size:                     # the last chunk reads to the end of the file
                    self.bounds.append((start, None))
                    break
                self.bounds.append((start, end))
                start = end

    def __len__(self) -> int:
        return len(self.bounds)

    @staticmethod
    def first_line(index: int) -> int:
        return 1 if index == 0 else 2

    def lines(self, index: int) -> Lines:
        """The non-blank lines of chunk ``index``, read now, numbered from :meth:`first_line`."""
        start, end = self.bounds[index]
        try:
            with open(self.path, "rb") as fh:
                fh.seek(start)
                data = fh.read() if end is None else fh.read(end - start)
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", source=self.source) from None
        return Lines(io.BytesIO(data), self.first_line(index))


def iter_jsonl(path: str) -> Iterator[tuple[int, Any]]:
    """Stream ``(line_number, value)`` from a JSONL file (or ``.jsonl.gz``), skipping blank lines."""
    for lineno, raw, source in iter_raw_lines(path):
        yield lineno, parse_jsonl_line(raw, source, lineno)


#: how :func:`parse_jsonl_line` starts its error for a pretty-printed document
PRETTY_JSON = "this is pretty-printed JSON over several lines"


def iter_log_values(path: str, lines: Iterator[tuple[int, bytes, str]] | None = None
                    ) -> Iterator[tuple[int, bytes, Any]]:
    """``(line_number, raw_line, value)`` of a JSONL log, as :func:`iter_jsonl` reads it; a file that holds one
    pretty-printed JSON document instead (a request body saved from an editor) is a log of one line: line 1,
    the document compacted. Errors in it name the line and column of the document. ``lines``: the file's
    lines when a caller has started reading them (:func:`iter_raw_lines`)."""
    lines = iter_raw_lines(path) if lines is None else lines
    for lineno, raw, source in lines:
        try:
            value = parse_jsonl_line(raw, source, lineno)
        except InputError as exc:
            if lineno != 1 or not exc.message.startswith(("invalid JSON", PRETTY_JSON)):
                raise
            parts, last = [raw.rstrip(b"\r\n").decode("utf-8", "replace")], lineno
            for n, more, _ in lines:  # the rest of the same stream: stdin works too
                parts.append("\n" * (n - last - 1) + more.rstrip(b"\r\n").decode("utf-8", "replace"))
                last = n
            try:
                value = parse_json_document("\n".join(parts), source)
            except InputError:
                if exc.message.startswith(PRETTY_JSON):
                    raise  # the document's own error, located
                raise exc from None  # not one document either: the first bad line of the log
            yield 1, orjson.dumps(value), value
            return
        yield lineno, raw, value


def get_path(value: Any, dotted: str) -> Any:
    """``a.b.c`` lookup in nested dicts; ``None`` when absent."""
    cur = value
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur
