"""The exact-match duplicate rate of a log, streaming: the cache that needs no embeddings.

Two keys, as the caches users run key their entries:

- **a prompt field** (``field_name``; by default ``prompt`` where a line has one): the text alone, as a
  prompt-keyed cache (GPTCache's exact-match mode) keys it;
- **the request** (any other line, of a log in any shape cachectl reads): the whole request body, as a response cache in
  front of the API keys it (Helicone's cache key hashes the complete request body; LiteLLM's is made of the
  call's parameters). Two requests are duplicates when their bodies are the same JSON, key order included, and
  name the same model. ``ignore`` leaves dotted body paths out of the key, as a cache told to ignore them does.

For the request key, each top-level field that is not the request's content (its messages, input, system prompt,
tools, model) is also left out of the key in turn: a field whose leaving out makes more requests duplicates is a
per-request value (a request id in ``metadata``, an end user, ``stream``) that keeps an exact-match cache from
ever hitting. Each such key is kept as one 8-byte digest a request (numpy counts the distinct ones at the end).
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import InputError, UsageError
from .pairs import SCHEMA_VERSION

#: the fields of a request body that are its content: never left out of the key in turn (a cache that ignored
#: them would answer another question)
CONTENT_FIELDS = frozenset({"messages", "input", "system", "instructions", "prompt", "tools", "model", "contents",
                            "functions"})
#: the top-level fields left out in turn, at most (a log whose bodies have more: those after are not)
MAX_FIELDS = 64


@dataclass(frozen=True, kw_only=True)
class DupesReport:
    schema_version: int = SCHEMA_VERSION
    lines: int
    distinct: int
    duplicates: int
    duplicate_rate: float | None
    normalize: str
    #: the most repeated keys: {"prompt": the text shown, "count", "line": where the key was first seen,
    #: "prompt_line": the line the shown text is from (the second with the key: with --normalize the first one's
    #: text may differ, and is not kept)}
    top: tuple[dict, ...]
    #: what the key is: ``prompt`` (a prompt field: ``field``) or ``request`` (the request body and model)
    key: str = "prompt"
    field: str | None = None
    #: the body paths left out of the request key (``ignore``)
    ignored: tuple[str, ...] = ()
    #: the request key only: each top-level field whose leaving out makes more duplicates, with the duplicates
    #: there would then be (most first): {"field", "duplicates", "gained"}
    would_duplicate: tuple[dict, ...] = ()
    notes: tuple[str, ...] = ()


_WS_RUN = re.compile(rb"\s+")


def exact_dupes(path: str, field_name: str | None = None, normalize: str = "none", top: int = 10, *,
                ignore: Sequence[str] = (), log_format: str | None = None) -> DupesReport:
    """Exact-match duplicates of a log, streaming (see the module docstring). ``field_name``: the prompt field
    (dotted) every record is keyed on; None keys a record on its ``prompt`` where it has a string there, else on
    its request.
    ``normalize``: none, whitespace (runs of whitespace as one space, trimmed) or case (that and lower case), on
    the prompt or on the request's JSON text. Memory follows the distinct keys (16-byte digests, and the line
    each was first seen at), with a text kept only for keys seen twice, and 8 bytes a request
    for each top-level field left out in turn."""
    from ...inputs import get_path
    from ...inputs.files import display_name
    from ...inputs.formats import log_values

    if normalize not in ("none", "whitespace", "case"):
        raise UsageError("--normalize must be none, whitespace or case")
    ignored = tuple(dict.fromkeys(p.strip() for p in ignore))
    if any(not p or any(not part for part in p.split(".")) for p in ignored):
        raise UsageError("--ignore-field takes a dotted path into the request body, such as metadata.request_id")
    source = display_name(path)
    counts: Counter = Counter()
    first_text: dict[bytes, Any] = {}  # the text of a key seen twice
    first_line: dict[bytes, int] = {}  # the line each key was first seen at
    field = field_name or "prompt"
    loo = _LeftOut()
    total = 0
    keyed: Counter[str] = Counter()  # lines keyed on a prompt field, on a request body
    found: Counter[str] = Counter()  # the bodies each --ignore-field path was in
    # (a shape whose records carry no request body says so at its first record, unless a prompt field is named)
    for line, value in log_values(path, log_format, need_body=field_name is None):
        prompt = get_path(value, field) if isinstance(value, dict) else None
        if isinstance(prompt, str) or field_name is not None:
            if not isinstance(prompt, str):
                raise InputError("no prompt text", source=source, line=line, field=field)
            data, shown, parts = prompt.encode("utf-8"), prompt, None
        else:
            parts, shown = _request_parts(value, ignored, source, line, field, found)
            data = b"{" + b",".join(p for _, p in parts) + b"}"
        keyed["prompt" if parts is None else "request"] += 1
        data = _normalized(data, normalize)
        digest = hashlib.blake2b(data, digest_size=16).digest()
        loo.add(digest, parts or (), normalize)
        counts[digest] += 1
        first_line.setdefault(digest, line)
        if counts[digest] == 2:  # (the second line's text: the first one's is not kept; they differ by --normalize)
            first_text[digest] = (shown, line)
        total += 1
    mode = "mixed" if len(keyed) > 1 else next(iter(keyed), "prompt")
    notes: tuple[str, ...] = ()
    if ignored and not keyed["request"]:
        notes = ("no line was keyed on its request body: --ignore-field left nothing out",)
    elif ignored:  # (a typo, or a path through a list, was reported as applied)
        notes = tuple(f"--ignore-field {p}: no request body has it (a path goes through objects only), so it left "
                      "nothing out" for p in ignored if not found[p])
    distinct = len(counts)
    common = [{"prompt": first_text[d][0], "count": c, "line": first_line[d], "prompt_line": first_text[d][1]}
              for d, c in counts.most_common(top) if c > 1]
    would, more = loo.gains(total - distinct)
    return DupesReport(lines=total, distinct=distinct, duplicates=total - distinct,
                       duplicate_rate=(total - distinct) / total if total else None, normalize=normalize,
                       top=tuple(common), key=mode, field=field if keyed["prompt"] else None,
                       ignored=ignored, would_duplicate=would, notes=notes + more)


def _normalized(data: bytes, normalize: str) -> bytes:
    if normalize in ("whitespace", "case"):
        data = _WS_RUN.sub(b" ", data.strip())
    if normalize == "case":
        data = data.lower()
    return data


def _request_parts(value: Any, ignored: Sequence[str], source: str, line: int, field: str,
                   found: Counter | None = None) -> tuple[list[tuple[str, bytes]], Any]:
    """The request key of a record: its body's top-level fields as ``"name":value`` JSON texts, in the body's
    order (their join is the body's compact JSON), the model first where the body names none; and what a report
    shows of it (its last user message, else its first 100 characters)."""
    from ...inputs.request import compact
    from .replay import check_body, last_user, request_of

    if not isinstance(value, dict):
        raise InputError("expected a JSON object", source=source, line=line)
    body, at = request_of(value)
    if body is None:
        raise InputError(f"neither a request body nor a '{field}' text to key on", source=source, line=line)
    check_body(value, source, line)
    for p in ignored:
        left = _without(body, p.split("."))
        if found is not None and left is not body:
            found[p] += 1
        body = left
    parts = [(k, f"{compact(k)}:{compact(v)}".encode()) for k, v in body.items()]
    if "model" not in body and isinstance(value.get("model"), str) and at:
        parts.insert(0, ("model", f'"model":{compact(value["model"])}'.encode()))
    text = last_user(body)[0]
    shown = text if isinstance(text, str) else compact(body)[:100]
    return parts, shown


def _without(obj: dict, path: list[str]) -> dict:
    """``obj`` without the value at ``path`` (a copy of the dicts on the way; ``obj`` as it is where the path is
    absent)."""
    head = path[0]
    if head not in obj:
        return obj
    if len(path) == 1:
        return {k: v for k, v in obj.items() if k != head}
    inner = obj[head]
    if not isinstance(inner, dict):
        return obj
    left = _without(inner, path[1:])
    if left is inner:  # (absent further down: ``obj`` itself, so that the caller sees nothing was left out)
        return obj
    out = dict(obj)
    out[head] = left
    return out


class _LeftOut:
    """The request key with each top-level field but the content left out in turn: one 8-byte digest a request
    per field (a request without the field keeps its whole key there)."""

    def __init__(self) -> None:
        self.whole = array("Q")
        self.keys: dict[str, array] = {}
        self.past_max = False

    def add(self, digest: bytes, parts: Sequence[tuple[str, bytes]], normalize: str) -> None:
        whole = int.from_bytes(digest[:8], "little")
        names = [k for k, _ in parts if k not in CONTENT_FIELDS]
        for name in names:
            if name not in self.keys:
                if len(self.keys) >= MAX_FIELDS:
                    self.past_max = True
                    continue
                self.keys[name] = array("Q", self.whole)
        mine = set(names)
        for name, arr in self.keys.items():
            if name not in mine:
                arr.append(whole)
                continue
            data = _normalized(b"{" + b",".join(p for k, p in parts if k != name) + b"}", normalize)
            # (the whole key's digest, cut as ``whole`` is: a request without the field matches one left without it)
            arr.append(int.from_bytes(hashlib.blake2b(data, digest_size=16).digest()[:8], "little"))
        self.whole.append(whole)

    def gains(self, duplicates: int) -> tuple[tuple[dict, ...], tuple[str, ...]]:
        import numpy as np

        found: list[tuple[int, str, int]] = []  # (-gained, field, duplicates)
        for name, arr in self.keys.items():
            n = len(arr)
            dup = n - len(np.unique(np.frombuffer(arr, dtype=np.uint64))) if n else 0
            if dup > duplicates:
                found.append((duplicates - dup, name, dup))
        out = [{"field": name, "duplicates": dup, "gained": -minus} for minus, name, dup in sorted(found)]
        notes = (f"only the first {MAX_FIELDS} top-level fields were left out in turn",) if self.past_max else ()
        return tuple(out), notes
