"""THE one parser of every input: files and stdin (gzip too), JSON documents and JSONL logs, prompts
(text, chat lists, token IDs), request bodies (OpenAI Chat and Responses, Anthropic Messages, token layouts,
``{timestamp, body, usage}`` wrappers) as one canonical :class:`Request`, and logged usage counters.

Engines take the records made here; no engine opens a file or walks a request body itself.
"""

from __future__ import annotations

from .files import (
    MAX_DEPTH,
    decode_text,
    display_name,
    get_path,
    iter_jsonl,
    iter_raw_lines,
    open_binary,
    parse_json_document,
    parse_jsonl_line,
    read_bytes,
    read_text,
)
from .jsonpos import Locator
from .prompt import (
    KINDS,
    LogRecord,
    PromptInput,
    iter_log,
    parse_ids,
    prompt_from_document,
    prompt_from_request,
    prompt_from_value,
    read_prompt,
)
from .request import (
    ChatView,
    Position,
    Request,
    cache_salt_of,
    compact,
    detect_provider,
    is_request_body,
    layout_request,
    parse_request,
    unwrap,
)
from .timestamps import TIME_UNITS, TimestampError, TimestampReader, parse_timestamp, read_timestamp

__all__ = [
    "KINDS",
    "TIME_UNITS",
    "MAX_DEPTH",
    "ChatView",
    "Locator",
    "LogRecord",
    "Position",
    "PromptInput",
    "Request",
    "TimestampError",
    "TimestampReader",
    "compact",
    "decode_text",
    "detect_provider",
    "display_name",
    "get_path",
    "is_request_body",
    "iter_jsonl",
    "iter_log",
    "iter_raw_lines",
    "layout_request",
    "open_binary",
    "parse_ids",
    "parse_json_document",
    "parse_jsonl_line",
    "parse_request",
    "parse_timestamp",
    "prompt_from_document",
    "prompt_from_request",
    "prompt_from_value",
    "read_bytes",
    "read_json_file",
    "read_prompt",
    "read_request_document",
    "read_requests",
    "read_text",
    "read_timestamp",
    "unwrap",
    "cache_salt_of",
]


def read_json_file(path: str) -> tuple:
    """``(document, source)`` of a JSON file (``-`` for stdin), with located errors."""
    text, source = read_text(path)
    return parse_json_document(text, source), source


def read_requests(path: str, *, default_model: str | None = None, provider: str | None = None,
                  timestamps: TimestampReader | None = None, log_format: str | None = None):
    """Stream canonical requests from a log in any shape (``-`` for stdin, ``.gz`` too), one per record;
    ``timestamps`` reads their timestamps (the run's unit rule); ``log_format`` forces the log's shape."""
    from .formats import log_values

    source = display_name(path)
    for lineno, value in log_values(path, log_format):
        yield parse_request(value, source=source, line=lineno, default_model=default_model, provider=provider,
                            timestamps=timestamps)


def read_request_document(text: str, source: str, *, default_model: str | None = None,
                          provider: str | None = None) -> Request:
    """One request body (or wrapper) from a JSON document, with line:col locations for every field."""
    from ..errors import InputError

    value = parse_json_document(text, source)
    if isinstance(value, list):
        raise InputError("expected a request body (a JSON object), got a JSON list; a bare message list is a "
                         "chat, not a request", source=source)
    return parse_request(value, source=source, locator=Locator(text), default_model=default_model,
                         provider=provider)
