"""Prompts as tokenizers see them: raw text, chat message lists, request bodies (through the canonical
request of :mod:`cachectl.inputs.request`), token-ID lists, and JSONL logs of any of these.

Every reader returns :class:`PromptInput` records that keep their provenance (file and line) so that an
error or a finding can name where it came from. Chat-shaped inputs are normalized to the message form that
Hugging Face chat templates expect (``role``/``content`` strings, OpenAI-style ``tool_calls`` and function
tools); ``field_paths`` maps each normalized message back to where it stood in the original body.
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, UnrenderablePart
from .files import JSONL_NOT_JSON, display_name, parse_json_document, read_text
from .jsonpos import Locator
from .request import JSONL_ARRAY_HINT, PROMPT_ID_KEYS, USAGE_ONLY, Request, is_request_body, is_usage_only, parse_request, unwrap

KINDS = ("text", "chat", "openai", "anthropic", "ids")


@dataclass(frozen=True)
class PromptInput:
    """One prompt as read from a file, before tokenization."""

    kind: str
    source: str
    line: int | None = None
    text: str | None = None
    messages: tuple[dict, ...] | None = None
    tools: tuple[dict, ...] | None = None
    ids: tuple[int, ...] | None = None
    #: for each normalized message, the JSON path of its text in the original input
    field_paths: tuple[str, ...] = ()
    #: top-level fields of the original record (a log line's session id, model, ...), not rendered
    meta: dict = field(default_factory=dict, compare=False)
    #: the canonical request, when the prompt came from a request body
    request: Request | None = field(default=None, compare=False, repr=False)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line is not None else self.source

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


#: the largest prompt file read whole (a request body, a prompt, token IDs), in bytes: parsing one takes some ten
#: times its size, and no text past the tokenizer's bound (``cachectl.tokenization.MAX_TOKENIZE_CHARS``, 2 MiB
#: characters) fits in it anyway unless most of the file is not text
MAX_PROMPT_FILE_BYTES = 32 * 2**20


def read_prompt(path: str, as_kind: str | None = None) -> PromptInput:
    """Read one prompt file of any supported kind (detected unless ``as_kind`` forces it)."""
    if as_kind is not None and as_kind not in KINDS:
        raise InputError(f"unknown input kind {as_kind!r}; expected one of {', '.join(KINDS)}")
    try:
        size = os.stat(path).st_size if path != "-" and os.path.isfile(path) else 0
    except OSError:
        size = 0
    if size > MAX_PROMPT_FILE_BYTES:
        raise InputError(f"a prompt file of {size:,} bytes: past the {MAX_PROMPT_FILE_BYTES:,} cachectl reads whole "
                         "(a request log is read line by line: diff-tokens --log)", source=path)
    text, source = read_text(path)
    return prompt_from_document(text, source, as_kind)


def prompt_from_document(text: str, source: str, as_kind: str | None = None) -> PromptInput:
    """One prompt from the text of a document (a file's, or one given on the command line): raw text, or JSON
    of any supported kind (detected unless ``as_kind`` forces it). ``source`` names it in messages."""
    if as_kind is not None and as_kind not in KINDS:
        raise InputError(f"unknown input kind {as_kind!r}; expected one of {', '.join(KINDS)}")
    if as_kind == "text":
        return PromptInput(kind="text", source=source, text=text, field_paths=("text",))
    stripped = text.lstrip(" \t\r\n")
    looks_json = stripped[:1] in ("{", "[") or source.endswith((".json", ".jsonl", ".json.gz"))
    if as_kind is None and not looks_json:
        return PromptInput(kind="text", source=source, text=text, field_paths=("text",))
    try:
        value = parse_json_document(text, source)
    except InputError as exc:
        if as_kind is None:
            hint = ("; a log of prompts is compared line by line with diff-tokens --log FILE"
                    if exc.message == JSONL_NOT_JSON else "; pass --as text to treat the file as a raw prompt")
            raise InputError(exc.message + hint, source=source, line=exc.line) from None
        raise
    return prompt_from_value(value, source=source, line=None, as_kind=as_kind, locator=Locator(text))


def prompt_from_value(value: Any, *, source: str, line: int | None, as_kind: str | None = None,
                      locator: Locator | None = None, timestamps: Any = None) -> PromptInput:
    """Turn a parsed JSON value into a :class:`PromptInput` (detecting its kind). ``timestamps``: the run's
    reader of a request's timestamp (see :func:`~cachectl.inputs.parse_request`)."""
    loc: dict[str, Any] = {"source": source, "line": line}
    if isinstance(value, list):
        if as_kind in (None, "ids") and (as_kind == "ids" or not value or not isinstance(value[0], dict)):
            return PromptInput(kind="ids", source=source, line=line, ids=parse_ids(value, **loc))
        if as_kind in (None, "chat"):
            if "role" not in value[0] and not value[0].keys().isdisjoint(("body", "messages", "request")):
                raise InputError(f"a JSON list of {len(value)} objects that are requests, not messages; "
                                 f"{JSONL_ARRAY_HINT}", **loc)
            try:
                req = parse_request({"messages": value}, source=source, line=line, locator=_shift(locator),
                                    provider="openai")
            except InputError as exc:  # the list is the line's own value: its fields are named from it
                if exc.field and exc.field.startswith("messages"):
                    exc.rename_field(exc.field[len("messages"):])
                raise
            assert req.chat is not None
            _refuse_unrenderable(req, source, line, strip="messages")
            paths = tuple(p[len("messages"):] for p in req.chat.field_paths)
            return PromptInput(kind="chat", source=source, line=line, messages=req.chat.messages,
                               field_paths=paths)
        raise InputError(f"a JSON list cannot be read as {as_kind!r}", **loc)
    if not isinstance(value, dict):
        raise InputError(f"expected a JSON object or list, got {type(value).__name__}", **loc)

    body, body_path, wrapper = unwrap(value)
    if not body_path:  # a wrapper around a completion prompt or token IDs
        for key in ("body", "request"):
            inner = value.get(key)
            if isinstance(inner, dict) and any(k in inner for k in ("prompt", "text", *PROMPT_ID_KEYS)):
                body, body_path, wrapper = inner, f"{key}.", {k: v for k, v in value.items() if k != key}
                break
    if is_request_body(body) and "blocks" not in body:
        if as_kind in ("ids", "text"):  # (--as ids was passed over: the body was rendered as a chat)
            raise InputError(f"a request body (messages) cannot be read as {as_kind!r}: without --as it is rendered "
                             "through the chat template", **loc)
        provider = as_kind if as_kind in ("openai", "anthropic") else None
        req = parse_request(value, source=source, line=line, locator=locator, provider=provider,
                            timestamps=timestamps)
        return prompt_from_request(req)
    meta = {k: v for k, v in body.items() if k not in ("messages", "tools", "system", "prompt")}
    meta.update(wrapper)
    id_key = next((k for k in PROMPT_ID_KEYS if k in body), None)
    if as_kind == "ids" or (as_kind is None and id_key is not None):
        if id_key is None:
            raise InputError(f"no token-ID field (expected one of {', '.join(PROMPT_ID_KEYS)})", **loc)
        return PromptInput(kind="ids", source=source, line=line,
                           ids=parse_ids(body[id_key], field=body_path + id_key, **loc), meta=meta)
    if "prompt" in body:
        prompt = body["prompt"]
        if isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
            return PromptInput(kind="ids", source=source, line=line,
                               ids=parse_ids(prompt, field=body_path + "prompt", **loc), meta=meta)
        if not isinstance(prompt, str):
            raise InputError("expected a string", field=body_path + "prompt", **loc)
        if as_kind not in (None, "text"):
            raise InputError(f"a completion prompt cannot be read as {as_kind!r}", **loc)
        return PromptInput(kind="text", source=source, line=line, text=prompt,
                           field_paths=(body_path + "prompt",), meta=meta)
    if "text" in body and isinstance(body["text"], str):
        return PromptInput(kind="text", source=source, line=line, text=body["text"],
                           field_paths=(body_path + "text",), meta=meta)
    if is_usage_only(value):
        raise InputError(USAGE_ONLY, **loc)
    raise InputError("not a prompt: expected 'messages', 'input', 'prompt', 'text' or a token-ID field "
                     f"({', '.join(PROMPT_ID_KEYS)})", **loc)


def prompt_from_request(req: Request) -> PromptInput:
    """The prompt a tokenizer renders for a canonical request (its chat-template view)."""
    if req.chat is None:
        raise req.error("a token layout has no text to render")
    _refuse_unrenderable(req, req.source, req.line)
    kind = "anthropic" if req.provider == "anthropic" else "openai"
    paths = tuple(req.body_path + p for p in req.chat.field_paths)
    return PromptInput(kind=kind, source=req.source, line=req.line, messages=req.chat.messages,
                       tools=req.chat.tools, field_paths=paths, meta=dict(req.meta), request=req)


def _refuse_unrenderable(req: Request, source: str, line: int | None, strip: str = "") -> None:
    if req.chat is not None and req.chat.unrenderable:
        path = req.body_path + req.chat.unrenderable[0]
        raise UnrenderablePart("this content part (image, audio, document or file) cannot be rendered to token "
                               "IDs without the model's processor; only text parts are supported", source=source,
                               line=line if line is not None else req.locate(req.chat.unrenderable[0])[0],
                               field=path[len(strip):] if strip and path.startswith(strip) else path)


def _shift(locator: Locator | None):
    """A locator for a bare message list parsed as the body ``{"messages": [...]}``."""
    if locator is None:
        return None
    return lambda path: locator(path.removeprefix("messages"))


#: the largest token ID taken (32 bits: every tokenizer's vocabulary fits, and token IDs are kept so)
MAX_TOKEN_ID = 2**32 - 1


def check_ids(value: Any, *, source: str, line: int | None, field: str | None = None,
              maybe_bool: bool = True) -> None:
    """Validate a non-empty list of non-negative integer token IDs below 2**64 without copying it (the one
    validator of token-ID lists).

    ``maybe_bool=False`` (the caller saw no ``true``/``false`` in the raw line) checks at C speed: a bool
    would otherwise pass as 0 or 1.
    """
    if not isinstance(value, list):
        raise InputError("expected a list of token IDs", source=source, line=line, field=field)
    if value and not maybe_bool:
        try:
            array("I", value)
            return
        except (TypeError, OverflowError):
            pass
    for i, x in enumerate(value):
        if type(x) is not int or x < 0 or x > MAX_TOKEN_ID:
            name = f"{field}[{i}]" if field else f"[{i}]"
            why = (f"is past {MAX_TOKEN_ID:,} (no vocabulary is that large)" if type(x) is int and x > 0
                   else "is not a non-negative integer")
            raise InputError(f"token ID {x!r:.60} {why}", source=source, line=line, field=name)
    if not value:
        raise InputError("token-ID list is empty", source=source, line=line, field=field)


def parse_ids(value: Any, *, source: str, line: int | None, field: str | None = None,
              maybe_bool: bool = True) -> tuple[int, ...]:
    """:func:`check_ids`, then the IDs as a tuple."""
    check_ids(value, source=source, line=line, field=field, maybe_bool=maybe_bool)
    return tuple(value)


# -------------------------------------------------------------------------------------------- logs


@dataclass(frozen=True)
class LogRecord:
    line: int
    key: Any
    prompt: PromptInput


def conversation_key(value: Any) -> Any:
    """A conversation key as grouping compares it: a string or an int as it is; an object or a list as its JSON text
    (sorted keys); a boolean or a float as its JSON text too (``True == 1`` in Python: two conversations, one keyed
    ``true`` and one ``1``, were one)."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, (bool, float)):
        return json.dumps(value)
    return value


def iter_log(path: str, key_field: str | None = None, as_kind: str | None = None,
             log_format: str | None = None, timestamps: Any = None) -> Iterator[LogRecord]:
    """Stream prompts from a log in any shape (``log_format``, or found from its first lines), one per record.
    ``timestamps``: the run's reader of them (:class:`~.timestamps.TimestampReader`)."""
    from .files import get_path
    from .formats import log_values

    source = display_name(path)
    for lineno, value in log_values(path, log_format, need_body=True):
        if key_field is not None:
            key = get_path(value, key_field)
            if key is None:
                raise InputError("missing conversation key", source=source, line=lineno, field=key_field)
            key = conversation_key(key)
        else:
            key = None
        prompt = prompt_from_value(value, source=source, line=lineno, as_kind=as_kind, timestamps=timestamps)
        yield LogRecord(line=lineno, key=key, prompt=prompt)
