"""VCR cassettes: the HTTP interactions vcrpy (and pytest-recording, which uses vcrpy's serializers) recorded in
a test suite, read for their LLM API calls.

Read from vcrpy's own code (github.com/kevin1024/vcrpy at b1fb62b, 2026-06: ``vcr/serialize.py``,
``vcr/serializers/yamlserializer.py``, ``jsonserializer.py``, ``compat.py``, ``vcr/request.py``,
``vcr/stubs/httpx_stubs.py``) and from the cassettes of pydantic-ai's test suite (github.com/pydantic/pydantic-ai
at 4fda389, ``tests/json_body_serializer.py``, ``tests/cassette_utils.py``). One cassette is ONE document
(YAML, or JSON with vcrpy's JSON serializer), ``{"version": 1, "interactions": [{"request": ..., "response":
...}]}``:

- ``request``: ``method``, ``uri``, ``headers`` (name -> list of values), ``body``: a string, ``!!binary`` bytes
  (base64 in the YAML), or null. pydantic-ai's serializer writes the parsed JSON as ``parsed_body`` instead; a
  later one ("cassetter") writes ``body: {type: json | text | binary | none, content: ...}`` and ``recorded_at``.
- ``response``: ``status: {code, message}``, ``headers``, ``body: {string: ...}`` (a string or ``!!binary``
  bytes: gzip when the server's ``Content-Encoding`` was gzip and vcrpy's ``decode_compressed_response`` was
  off); vcrpy's httpx stubs of 2022 wrote ``status_code``, ``http_version`` and ``content`` (already decoded,
  though the ``Content-Encoding: gzip`` header stays), hence a body is gunzipped only when its bytes ARE gzip.
- streamed responses are kept as the SSE text: Anthropic's usage is ``message_start``'s ``message.usage``
  updated by ``message_delta``'s ``usage`` (cumulative: its counters replace the start's); OpenAI Chat's is the
  final chunk's ``usage`` (``stream_options.include_usage``); OpenAI Responses' is ``response.completed``'s.

Only the LLM calls become records: POST to ``/v1/chat/completions``, ``/v1/responses`` (OpenAI-compatible
hosts too) and ``/v1/messages`` (Anthropic); the others (token counting, files, auth) are counted in the
record's ``missing`` note. A cassette has no time per interaction (vcrpy records none): the records have no
timestamp unless the cassette carries ``recorded_at``, so timing commands need ``--every``.

YAML is read with PyYAML's safe loader only: ``!!binary`` is standard YAML; a ``!!python/...`` tag (old vcrpy
cassettes of file-like bodies) is refused in one line, never constructed.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import re
import zlib
from collections.abc import Iterable, Iterator
from typing import Any
from urllib.parse import urlsplit

import orjson
import yaml

from ...errors import InputError
from ..files import yaml_expanded_past
from ..usage import ANTHROPIC_KEYS, OPENAI_CHAT_KEYS, OPENAI_RESPONSES_KEYS
from ._chat import counter, response_text, streamed_text
from .base import Head, LogShape, Record, Verdict

try:
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _Loader = yaml.SafeLoader

SHAPE = LogShape(
    "vcr", "VCR cassettes (vcrpy, pytest-recording)",
    "a YAML or JSON document with `interactions`, each a `request` (`method`, `uri`) and its `response`",
    "each LLM call's request body (OpenAI Chat or Responses, Anthropic Messages) and the billed usage of its "
    "response, streamed (SSE) or not, gzip or base64 bodies decoded; the response id and the interaction's "
    "`recorded_at` where the cassette has one (vcrpy records no time: use `--every`)",
    ("prompt-cost", "report", "diff-tokens", "simulate-prefix", "semantic-probe dupes"),
    "fixtures/logs/vcr_anthropic_cache.yaml",
    "https://github.com/kevin1024/vcrpy (vcr/serialize.py, vcr/serializers/); "
    "https://github.com/kiwicom/pytest-recording",
)

#: the most bytes of one cassette (it is read whole: YAML is one document)
MAX_BYTES = 64 << 20
#: the endpoints whose calls become records, by the path's end
_ENDPOINTS = ("/chat/completions", "/responses", "/messages")


def detect(head: Head) -> Verdict:
    """A cassette: its first lines hold ``interactions`` (YAML's ``interactions:`` or JSON's
    ``"interactions"``) and a ``request``/``uri``."""
    try:
        text = head.text
        if b"interactions" not in text:
            return Verdict.no()
        starts = tuple(h.raw.lstrip() for h in head.lines)
        yaml_like = any(s.startswith((b"interactions:", b"version:")) for s in starts)
        json_like = bool(starts) and starts[0].startswith(b"{") and b'"interactions"' in text
        if not (yaml_like or json_like):
            return Verdict.no()
        if b"request" in text or b"uri" in text or b"response" in text:
            return Verdict.yes()
        if head.source.endswith((".yaml", ".yml")) or json_like:
            return Verdict.almost("its first interaction has no `request` in the first lines")
        return Verdict.no()
    except Exception:  # a detector never raises
        return Verdict.no()


def _document(lines: Iterable[tuple[int, bytes]], source: str) -> tuple[str, int]:
    """The whole cassette as text (blank lines put back: YAML's literal blocks and quoted scalars keep them),
    and its first line."""
    parts: list[bytes] = []
    size = 0
    first = last = 0
    for n, raw in lines:
        if not first:
            first = n
        elif n > last + 1:
            parts.append(b"\n" * (n - last - 1))
        last = n
        size += len(raw)
        if size > MAX_BYTES:
            raise InputError(f"a cassette over {MAX_BYTES >> 20} MiB is not read (it is one document)",
                             source=source, line=n)
        parts.append(raw if raw.endswith(b"\n") else raw + b"\n")
    try:
        return b"".join(parts).decode("utf-8"), first
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", source=source,
                         line=first) from None


def _load(text: str, first: int, source: str) -> Any:
    if text.lstrip().startswith("{"):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise InputError(f"invalid JSON cassette: {exc}", source=source, line=first) from None
    try:
        return _plain_yaml(text)
    except Exception:  # outside the plain subset, or a bad document: the safe loader says which
        pass
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - the safe loader (C or pure Python)
    except yaml.constructor.ConstructorError as exc:
        line = first + _lines_before(text, exc.problem_mark)
        tag = (exc.problem or "").split("tag ")[-1].split(" ")[0] or "a tag"
        raise InputError(f"unsafe YAML tag {tag} (a Python object): not loaded; re-record the cassette or "
                         "serialize bodies as text", source=source, line=line) from None
    except yaml.YAMLError as exc:
        line = first + _lines_before(text, getattr(exc, "problem_mark", None))
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"invalid YAML cassette: {problem}", source=source, line=line) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        from ..files import too_many_digits

        err = too_many_digits(text, source, exc, "invalid YAML cassette")
        if isinstance(err, InputError) and err.line is not None:
            err = InputError(err.message, source=source, line=first + err.line - 1)
        raise err from None
    if yaml_expanded_past(data, text):  # (only the loader's path has aliases: the plain one refuses them)
        raise InputError("a cassette whose YAML aliases (*name) expand it past twice its size: not read", source=source,
                         line=first)
    return data


def _lines_before(text: str, mark: Any) -> int:
    """The file's line breaks before a YAML parser's mark: counted from its character index, since YAML counts
    U+0085, U+2028 and U+2029 as line breaks too (its ``mark.line`` would name a line past the file's). A mark
    at the end of the stream is on the last line."""
    return text.count("\n", 0, min(mark.index, len(text) - 1)) if mark is not None else 0


class _NotPlain(Exception):
    """The document has what :func:`_plain_yaml` leaves to the safe loader."""


_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"
#: the safe loader's constructors of scalars (plain functions of one node); any other tag is left to the loader
_SCALARS = {tag: fn for tag, fn in _Loader.yaml_constructors.items()
            if tag in ("tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                       "tag:yaml.org,2002:float", "tag:yaml.org,2002:binary", "tag:yaml.org,2002:timestamp")}
_NO_KEY = object()


def _plain_yaml(text: str) -> Any:
    """The one document of ``text`` as the safe loader builds it, from the same parser's events: each scalar's
    tag resolved by the loader's own resolver (memoized for short plain scalars) and built by its own
    constructor, mappings and sequences filled in place. The safe loader builds its node graph first (a Python
    node, a resolver call and its marks per scalar) and then its objects; a cassette of JSON bodies holds
    hundreds of thousands of scalars. What this leaves to the loader raises :class:`_NotPlain` (anchors and
    aliases, merge keys, any other tag, a key that is a collection, not one document); so does any error, which
    the loader then names as it always does."""
    ScalarEvent, MappingStartEvent, SequenceStartEvent = yaml.ScalarEvent, yaml.MappingStartEvent, \
        yaml.SequenceStartEvent
    ScalarNode = yaml.ScalarNode
    loader = _Loader(text)
    try:
        if loader.yaml_path_resolvers:  # tags that depend on a node's path: only the loader's composer knows
            raise _NotPlain
        get, resolve = loader.get_event, loader.resolve
        tags: dict[str, str] = {}
        get()  # the stream's start
        if type(get()) is not yaml.DocumentStartEvent:
            raise _NotPlain
        #: the mappings and sequences being filled, each with the key waiting for its value (mappings)
        stack: list[list[Any]] = []
        value: Any
        while True:
            event = get()
            kind = type(event)
            if kind is ScalarEvent:
                if event.anchor is not None:
                    raise _NotPlain
                tag, value = event.tag, event.value
                if tag is None or tag == "!":
                    if event.implicit[0]:  # plain: the loader's implicit resolvers (null, bool, int, ...)
                        tag = tags.get(value)
                        if tag is None:
                            tag = resolve(ScalarNode, value, event.implicit)
                            if len(value) <= 64:
                                tags[value] = tag
                    else:
                        tag = _STR
                if tag != _STR:
                    build = _SCALARS.get(tag)
                    if build is None:
                        raise _NotPlain
                    value = build(loader, ScalarNode(tag, value, event.start_mark, event.end_mark, event.style))
            elif kind is MappingStartEvent:
                if event.anchor is not None or event.tag not in (None, "!", _MAP):
                    raise _NotPlain
                stack.append([{}, _NO_KEY])
                continue
            elif kind is SequenceStartEvent:
                if event.anchor is not None or event.tag not in (None, "!", _SEQ):
                    raise _NotPlain
                stack.append([[], _NO_KEY])
                continue
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                value = stack.pop()[0]
            else:
                raise _NotPlain
            if not stack:
                break
            top = stack[-1]
            if type(top[0]) is list:
                top[0].append(value)
            elif top[1] is _NO_KEY:
                if type(value) is dict or type(value) is list:
                    raise _NotPlain
                top[1] = value
            else:
                top[0][top[1]] = value
                top[1] = _NO_KEY
        if type(get()) is not yaml.DocumentEndEvent or type(get()) is not yaml.StreamEndEvent:
            raise _NotPlain
        return value
    finally:
        loader.dispose()


def _header(headers: Any, name: str) -> str | None:
    if not isinstance(headers, dict):
        return None
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == name:
            if isinstance(value, list):
                value = value[0] if value else None
            return value if isinstance(value, str) else None
    return None


def _raw_body(part: dict[str, Any], *, response: bool) -> Any:
    """The body of a request or response as recorded: a parsed JSON value, str or bytes (None: none)."""
    if part.get("parsed_body") is not None:
        return part["parsed_body"]
    body = part.get("body")
    if response and body is None and "content" in part:  # vcrpy's httpx stubs of 2022
        body = part["content"]
    if isinstance(body, dict):
        if "type" in body and "content" in body and "string" not in body:  # typed body
            kind, content = body.get("type"), body.get("content")
            if kind == "binary" and isinstance(content, str):
                try:
                    return base64.b64decode(content, validate=True)
                except (binascii.Error, ValueError):
                    return content
            return content if kind in ("json", "text") else None
        body = body.get("string")
    return body


def _decoded(body: Any, headers: Any, field: str, source: str, line: int) -> Any:
    """A str/bytes body as JSON (a dict) or SSE text; gzip/deflate bytes inflated (by their own bytes: the
    header stays on cassettes that hold the decoded body)."""
    if isinstance(body, (dict, list)) or body is None:
        return body
    if isinstance(body, str):
        data = body.encode("utf-8", "surrogatepass")
    elif isinstance(body, (bytes, bytearray)):
        data = bytes(body)
    else:
        return None
    encoding = (_header(headers, "content-encoding") or "").lower()
    try:
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        elif "deflate" in encoding and data[:1] == b"\x78":
            data = zlib.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"a gzip body that does not inflate ({exc})", source=source, line=line,
                         field=field) from None
    if "br" in encoding.split(",") and data[:1] not in (b"{", b"[", b"e", b"d", b":") and not data.isascii():
        raise InputError("a brotli (`Content-Encoding: br`) body: not read; record with "
                         "decode_compressed_response=True", source=source, line=line, field=field)
    text = data.decode("utf-8", "replace")
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            return orjson.loads(stripped)
        except orjson.JSONDecodeError:
            return text
    return text


def _sse(text: str) -> list[dict[str, Any]]:
    events = []
    for line in re.split(r"\r\n|\r|\n", text):  # (SSE's line breaks: not splitlines, which breaks inside JSON data)
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload.startswith("{"):
                try:
                    value = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(value, dict):
                    events.append(value)
    return events


def _known(usage: Any, keys: dict[str, str | None]) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    return {k: v for k, v in usage.items() if k in keys and v is not None}


def _usage(kind: str, response: Any) -> tuple[dict[str, Any] | None, str | None, str | None]:
    """``(usage, response id, response model)`` of a decoded response: a JSON object or SSE text."""
    if isinstance(response, dict):
        if "error" in response and "usage" not in response:
            return None, None, None
        keys = ANTHROPIC_KEYS if kind == "anthropic" else (
            OPENAI_CHAT_KEYS if kind == "chat" else OPENAI_RESPONSES_KEYS)
        return _known(response.get("usage"), keys), response.get("id"), response.get("model")
    if not isinstance(response, str):
        return None, None, None
    events = _sse(response)
    if kind == "anthropic":
        usage: dict[str, Any] = {}
        rid = model = None
        for e in events:
            if e.get("type") == "message_start" and isinstance(e.get("message"), dict):
                msg = e["message"]
                rid, model = msg.get("id"), msg.get("model")
                usage.update(_known(msg.get("usage"), ANTHROPIC_KEYS) or {})
            elif e.get("type") == "message_delta":
                # cumulative counters: they replace message_start's (server tools add input tokens)
                usage.update(_known(e.get("usage"), ANTHROPIC_KEYS) or {})
        return usage or None, rid, model
    if kind == "chat":
        found: dict[str, Any] | None = None
        rid = model = None
        for e in events:
            rid, model = e.get("id", rid), e.get("model", model)
            if isinstance(e.get("usage"), dict):
                found = _known(e["usage"], OPENAI_CHAT_KEYS)  # the last chunk's (include_usage)
        return found, rid, model
    for e in events:
        if e.get("type") == "response.completed" and isinstance(e.get("response"), dict):
            r = e["response"]
            return _known(r.get("usage"), OPENAI_RESPONSES_KEYS), r.get("id"), r.get("model")
    return None, None, None


def _check_counters(usage: dict[str, Any] | None, kind: str, json_body: bool, source: str, line: int,
                    path: str) -> None:
    """Refuse a counter of the response's usage that is no token count, at the response's path."""
    keys = ANTHROPIC_KEYS if kind == "anthropic" else OPENAI_CHAT_KEYS if kind == "chat" else OPENAI_RESPONSES_KEYS
    for key, value in (usage or {}).items():
        if keys[key] is None and not isinstance(value, dict):
            counter(value, source=source, line=line, field=f"{path}.usage.{key}" if json_body else path,
                    note="" if json_body else f" (usage.{key} in its event stream)")


def _kind(method: Any, uri: Any) -> str | None:
    if not isinstance(method, str) or method.upper() != "POST" or not isinstance(uri, str):
        return None
    path = urlsplit(uri).path.rstrip("/")
    if path.endswith("/v1/messages") or (path.endswith("/messages") and "anthropic" in uri):
        return "anthropic"
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/responses"):
        return "responses"
    return None


def _interaction_lines(text: str, first: int, count: int) -> list[int]:
    """The line each interaction starts on (YAML's ``- request:`` at the list's indent, JSON's ``"request"``);
    the document's first line for each where they cannot be told apart."""
    end = text.find("\n")
    starts = [first] if _ITEM_START.match(text, 0, len(text) if end < 0 else end) else []
    line, pos = first, 0
    for m in _NEXT_ITEM_START.finditer(text):  # found by the regex engine from each newline; lines counted at C speed
        line += text.count("\n", pos, m.start() + 1)
        pos = m.start() + 1
        starts.append(line)
    return starts if len(starts) == count else [first] * count


#: an interaction's first line (``[^\S\n]``: white space that stays on the line); and the same after a newline
_ITEM_START = re.compile(r'(?:(?:  )?- (?:recorded_at|request|response):|[^\S\n]*"request": *\{)')
_NEXT_ITEM_START = re.compile(r'\n(?:(?:  )?- (?:recorded_at|request|response):|[^\S\n]*"request": *\{)')


def read(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[Record]:
    text, first = _document(lines, source)
    data = _load(text, first, source)
    if isinstance(data, list):
        raise InputError("a cassette from before vcrpy 1.0 (a list of interactions): re-record it or run "
                         "vcrpy's migration script", source=source, line=first)
    if not isinstance(data, dict) or not isinstance(data.get("interactions"), list):
        raise InputError("not a cassette: no `interactions` list", source=source, line=first,
                         field="interactions")
    interactions = data["interactions"]
    where = _interaction_lines(text, first, len(interactions))
    skipped = 0
    for i, (item, line) in enumerate(zip(interactions, where, strict=True)):
        field = f"interactions[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("request"), dict):
            raise InputError("an interaction without a `request` mapping", source=source, line=line,
                             field=field)
        request, response = item["request"], item.get("response")
        if request.get("method") is None or request.get("uri") is None:  # (vcrpy records both: a cassette cut there)
            raise InputError("a request without its `method` and `uri` (vcrpy records both: is the cassette cut?)",
                             source=source, line=line, field=f"{field}.request")
        try:
            kind = _kind(request.get("method"), request.get("uri"))
        except ValueError:  # (urlsplit: a bracketed host that is no IP address, a bad port)
            uri = str(request.get("uri"))
            raise InputError(f"not a URL: {uri if len(uri) <= 80 else uri[:77] + '...'!r}", source=source,
                             line=line, field=f"{field}.request.uri") from None
        if kind is None:
            skipped += 1
            continue
        body = _decoded(_raw_body(request, response=False), request.get("headers"),
                        f"{field}.request.body", source, line)
        if not isinstance(body, dict):
            raise InputError("the request body of an LLM call is not a JSON object", source=source,
                             line=line, field=f"{field}.request.body")
        usage = rid = model = answer = None
        missing: list[str] = []
        if isinstance(response, dict):
            status = response.get("status")
            code = status.get("code") if isinstance(status, dict) else response.get("status_code", status)
            decoded = _decoded(_raw_body(response, response=True), response.get("headers"),
                               f"{field}.response.body", source, line)
            if code is None or (isinstance(code, int) and 200 <= code < 300):
                usage, rid, model = _usage(kind, decoded)
                answer = response_text(decoded) if isinstance(decoded, dict) else (
                    streamed_text(kind, _sse(decoded)) if isinstance(decoded, str) else None)
                _check_counters(usage, kind, isinstance(decoded, dict), source, line, f"{field}.response.body")
            if usage is None:
                missing.append(f"no usage (HTTP {code})" if isinstance(code, int) and code >= 300
                               else "no usage in the response")
        else:
            missing.append("no response")
        if skipped and not missing:
            missing.append(f"{skipped} non-LLM interaction(s) skipped before it")
        skipped = 0
        keys: dict[str, Any] = {"request_id": rid} if rid else {}
        yield Record(
            shape=SHAPE.name, source=source, line=line, body=body, usage=usage or None,
            timestamp=_timestamp(item.get("recorded_at")), model=body.get("model") or model, keys=keys,
            body_path=f"interactions.{i}.request.body" if isinstance(_raw_body(request, response=False), dict)
            else None,
            missing=tuple(missing) + (() if item.get("recorded_at") else ("no timestamp (use --every)",)),
            response=answer,
        )


def _timestamp(value: Any) -> Any:
    if value is None:
        return None
    if hasattr(value, "isoformat"):  # YAML reads an unquoted ISO time as a datetime
        return value.isoformat()
    return value if isinstance(value, (str, int, float)) else None
