"""Shared input readers: raw text, chat message lists, OpenAI and Anthropic request bodies, token-ID
lists and JSONL logs of any of these.

Every reader returns :class:`PromptInput` records that keep their provenance (file and line) so that an
error or a finding can name where it came from. Chat-shaped inputs are normalized to the message form
that Hugging Face chat templates expect (``role``/``content`` strings, OpenAI-style ``tool_calls`` and
function tools); ``field_paths`` maps each normalized message back to where it stood in the original body.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

import orjson

from .errors import InputError

KINDS = ("text", "chat", "openai", "anthropic", "ids")
_ID_KEYS = ("tokens", "prompt_token_ids", "input_ids", "token_ids")
_WRAPPER_KEYS = ("body", "request")
_BINARY_SNIFF = 8192


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

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.line is not None else self.source

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


# --------------------------------------------------------------------------------------------- bytes


def read_bytes(path: str) -> tuple[bytes, str]:
    """Read a file (or stdin for ``-``) and return its bytes and display name."""
    fh, source = _open_binary(path)
    if fh is sys.stdin.buffer:
        return fh.read(), source
    with fh:
        return fh.read(), source


def decode_text(data: bytes, source: str) -> str:
    """Decode UTF-8 strictly; refuse empty and binary files with a located message."""
    if not data.strip():
        raise InputError("file is empty", source=source)
    if b"\x00" in data[:_BINARY_SNIFF]:
        raise InputError("looks like a binary file (NUL bytes), expected text or JSON", source=source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                         source=source, line=line) from None


def read_text(path: str) -> tuple[str, str]:
    data, source = read_bytes(path)
    return decode_text(data, source), source


# ------------------------------------------------------------------------------------------ parsing


def parse_json_document(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", source=source,
                         line=exc.lineno) from None


def read_prompt(path: str, as_kind: str | None = None) -> PromptInput:
    """Read one prompt file of any supported kind (detected unless ``as_kind`` forces it)."""
    if as_kind is not None and as_kind not in KINDS:
        raise InputError(f"unknown input kind {as_kind!r}; expected one of {', '.join(KINDS)}")
    text, source = read_text(path)
    if as_kind == "text":
        return PromptInput(kind="text", source=source, text=text, field_paths=("text",))
    stripped = text.lstrip("\ufeff \t\r\n")
    looks_json = stripped[:1] in ("{", "[") or source.endswith((".json", ".jsonl"))
    if as_kind is None and not looks_json:
        return PromptInput(kind="text", source=source, text=text, field_paths=("text",))
    try:
        value = parse_json_document(stripped, source)
    except InputError as exc:
        if as_kind is None:
            raise InputError(exc.message + "; pass --as text to treat the file as a raw prompt",
                             source=source, line=exc.line) from None
        raise
    return prompt_from_value(value, source=source, line=None, as_kind=as_kind)


def prompt_from_value(value: Any, *, source: str, line: int | None,
                      as_kind: str | None = None) -> PromptInput:
    """Turn a parsed JSON value into a :class:`PromptInput` (detecting its kind)."""
    loc = {"source": source, "line": line}
    if isinstance(value, dict):
        for key in _WRAPPER_KEYS:  # OpenAI batch files and request/response logs wrap the body
            inner = value.get(key)
            if isinstance(inner, dict) and ("messages" in inner or "prompt" in inner):
                meta = {k: v for k, v in value.items() if k != key}
                got = prompt_from_value(inner, source=source, line=line, as_kind=as_kind)
                return _with_meta(got, {**meta, **got.meta}, prefix=f"{key}.")
    if isinstance(value, list):
        if as_kind in (None, "ids") and (as_kind == "ids" or not value or not isinstance(value[0], dict)):
            return PromptInput(kind="ids", source=source, line=line, ids=parse_ids(value, **loc))
        if as_kind in (None, "chat"):
            msgs, paths = _normalize_openai_messages(value, "", loc)
            return PromptInput(kind="chat", source=source, line=line, messages=msgs, field_paths=paths)
        raise InputError(f"a JSON list cannot be read as {as_kind!r}", **loc)
    if not isinstance(value, dict):
        raise InputError(f"expected a JSON object or list, got {type(value).__name__}", **loc)

    meta = {k: v for k, v in value.items() if k not in ("messages", "tools", "system", "prompt")}
    id_key = next((k for k in _ID_KEYS if k in value), None)
    if as_kind == "ids" or (as_kind is None and id_key is not None):
        if id_key is None:
            raise InputError(f"no token-ID field (expected one of {', '.join(_ID_KEYS)})", **loc)
        return PromptInput(kind="ids", source=source, line=line,
                           ids=parse_ids(value[id_key], field=id_key, **loc), meta=meta)
    if "messages" in value:
        kind = as_kind if as_kind in ("openai", "anthropic") else _detect_chat_flavour(value)
        if kind == "anthropic":
            return _anthropic_body(value, loc, meta)
        msgs, paths = _normalize_openai_messages(value["messages"], "messages", loc)
        tools = _openai_tools(value.get("tools"), loc)
        return PromptInput(kind="openai", source=source, line=line, messages=msgs, tools=tools,
                           field_paths=paths, meta=meta)
    if "prompt" in value:
        prompt = value["prompt"]
        if isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
            return PromptInput(kind="ids", source=source, line=line,
                               ids=parse_ids(prompt, field="prompt", **loc), meta=meta)
        if not isinstance(prompt, str):
            raise InputError("expected a string", field="prompt", **loc)
        if as_kind not in (None, "text"):
            raise InputError(f"a completion prompt cannot be read as {as_kind!r}", **loc)
        return PromptInput(kind="text", source=source, line=line, text=prompt,
                           field_paths=("prompt",), meta=meta)
    if "text" in value and isinstance(value["text"], str):
        return PromptInput(kind="text", source=source, line=line, text=value["text"],
                           field_paths=("text",), meta=meta)
    raise InputError("not a prompt: expected 'messages', 'prompt', 'text' or a token-ID field "
                     f"({', '.join(_ID_KEYS)})", **loc)


def _with_meta(p: PromptInput, meta: dict, prefix: str) -> PromptInput:
    paths = tuple(prefix + fp for fp in p.field_paths)
    return PromptInput(kind=p.kind, source=p.source, line=p.line, text=p.text, messages=p.messages,
                       tools=p.tools, ids=p.ids, field_paths=paths, meta=meta)


def parse_ids(value: Any, *, source: str, line: int | None, field: str | None = None) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise InputError("expected a list of token IDs", source=source, line=line, field=field)
    for i, x in enumerate(value):
        if type(x) is not int or x < 0:
            name = f"{field}[{i}]" if field else f"[{i}]"
            raise InputError(f"token ID {x!r} is not a non-negative integer", source=source, line=line,
                             field=name)
    if not value:
        raise InputError("token-ID list is empty", source=source, line=line, field=field)
    return tuple(value)


# ------------------------------------------------------------------------------------- chat bodies

_ANTHROPIC_BLOCKS = {"tool_use", "tool_result", "thinking", "redacted_thinking", "document"}


def _detect_chat_flavour(body: dict) -> str:
    if "system" in body:
        return "anthropic"
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and ("input_schema" in tool or ("name" in tool and "function" not in tool)):
            return "anthropic"
    for msg in body.get("messages") or ():
        if isinstance(msg, dict) and isinstance(msg.get("content"), list):
            for block in msg["content"]:
                if isinstance(block, dict) and block.get("type") in _ANTHROPIC_BLOCKS:
                    return "anthropic"
    return "openai"


def _text_of_parts(parts: Any, path: str, loc: dict) -> str:
    """Flatten OpenAI content parts / Anthropic text blocks; joined by newlines like vLLM does."""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise InputError("expected a string or a list of content parts", field=path, **loc)
    texts = []
    for i, part in enumerate(parts):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise InputError("expected a content part object", field=f"{path}[{i}]", **loc)
        ptype = part.get("type", "text")
        if ptype in ("text", "input_text", "output_text"):
            if not isinstance(part.get("text"), str):
                raise InputError("expected a string", field=f"{path}[{i}].text", **loc)
            texts.append(part["text"])
        else:
            raise InputError(f"content part of type {ptype!r} cannot be rendered to token IDs without "
                             "the model's processor; only text is supported", field=f"{path}[{i}]", **loc)
    return "\n".join(texts)


def _normalize_openai_messages(messages: Any, base: str, loc: dict) -> tuple[tuple[dict, ...], tuple[str, ...]]:
    if not isinstance(messages, list):
        raise InputError("expected a list of messages", field=base or None, **loc)
    out: list[dict] = []
    paths: list[str] = []
    for i, msg in enumerate(messages):
        path = f"{base}[{i}]" if base else f"[{i}]"
        if not isinstance(msg, dict):
            raise InputError("expected a message object", field=path, **loc)
        role = msg.get("role")
        if not isinstance(role, str):
            raise InputError("missing or non-string 'role'", field=f"{path}.role", **loc)
        norm = {k: v for k, v in msg.items() if k not in ("content",)}
        content = msg.get("content")
        if content is None:
            norm["content"] = "" if not msg.get("tool_calls") else None
        else:
            norm["content"] = _text_of_parts(content, f"{path}.content", loc)
        calls = msg.get("tool_calls")
        if calls is not None:
            norm["tool_calls"] = [_normalize_tool_call(c, f"{path}.tool_calls[{j}]", loc)
                                  for j, c in enumerate(calls)]
        out.append(norm)
        paths.append(f"{path}.content")
    return tuple(out), tuple(paths)


def _normalize_tool_call(call: Any, path: str, loc: dict) -> dict:
    if not isinstance(call, dict):
        raise InputError("expected a tool call object", field=path, **loc)
    fn = call.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        # Chat templates expect arguments as an object (they render it with tojson).
        try:
            args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
        except json.JSONDecodeError:
            args = fn["arguments"]
        return {**call, "function": {**fn, "arguments": args}}
    return call


def _openai_tools(tools: Any, loc: dict) -> tuple[dict, ...] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InputError("expected a list of tools", field="tools", **loc)
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InputError("expected a tool object", field=f"tools[{i}]", **loc)
    return tuple(tools)


def _anthropic_body(body: dict, loc: dict, meta: dict) -> PromptInput:
    msgs: list[dict] = []
    paths: list[str] = []
    system = body.get("system")
    if system is not None:
        if isinstance(system, list):
            text = _text_of_parts(system, "system", loc)
        elif isinstance(system, str):
            text = system
        else:
            raise InputError("expected a string or a list of text blocks", field="system", **loc)
        msgs.append({"role": "system", "content": text})
        paths.append("system")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InputError("expected a list of messages", field="messages", **loc)
    for i, msg in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InputError("expected a message object", field=path, **loc)
        role = msg.get("role")
        if role not in ("user", "assistant"):
            raise InputError(f"role must be 'user' or 'assistant', got {role!r}", field=f"{path}.role", **loc)
        content = msg.get("content")
        if isinstance(content, str):
            msgs.append({"role": role, "content": content})
            paths.append(f"{path}.content")
            continue
        if not isinstance(content, list):
            raise InputError("expected a string or a list of content blocks", field=f"{path}.content", **loc)
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[dict] = []
        for j, block in enumerate(content):
            bpath = f"{path}.content[{j}]"
            if not isinstance(block, dict):
                raise InputError("expected a content block object", field=bpath, **loc)
            btype = block.get("type")
            if btype == "text":
                if not isinstance(block.get("text"), str):
                    raise InputError("expected a string", field=f"{bpath}.text", **loc)
                texts.append(block["text"])
            elif btype == "thinking":
                reasoning.append(str(block.get("thinking", "")))
            elif btype == "redacted_thinking":
                continue
            elif btype == "tool_use":
                calls.append({"id": block.get("id"), "type": "function",
                              "function": {"name": block.get("name"), "arguments": block.get("input", {})}})
            elif btype == "tool_result":
                result = block.get("content", "")
                result_text = _text_of_parts(result, f"{bpath}.content", loc) if result != "" else ""
                msgs.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": result_text})
                paths.append(f"{bpath}.content")
            else:
                raise InputError(f"content block of type {btype!r} cannot be rendered to token IDs without "
                                 "the model's processor; only text, thinking, tool_use and tool_result are "
                                 "supported", field=bpath, **loc)
        if texts or calls or reasoning:
            norm: dict = {"role": role, "content": "\n".join(texts)}
            if reasoning:
                norm["reasoning_content"] = "\n".join(reasoning)
            if calls:
                norm["tool_calls"] = calls
            msgs.append(norm)
            paths.append(f"{path}.content")
    tools = body.get("tools")
    norm_tools = None
    if tools is not None:
        if not isinstance(tools, list):
            raise InputError("expected a list of tools", field="tools", **loc)
        norm_tools = []
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise InputError("expected a tool object", field=f"tools[{i}]", **loc)
            if "input_schema" in tool:
                fn = {k: v for k, v in tool.items() if k not in ("input_schema", "cache_control", "type")}
                fn["parameters"] = tool["input_schema"]
                norm_tools.append({"type": "function", "function": fn})
            else:  # server tools (web search, ...) are rendered as they are
                norm_tools.append({k: v for k, v in tool.items() if k != "cache_control"})
        norm_tools = tuple(norm_tools)
    return PromptInput(kind="anthropic", source=loc["source"], line=loc["line"], messages=tuple(msgs),
                       tools=norm_tools, field_paths=tuple(paths), meta=meta)


# -------------------------------------------------------------------------------------------- JSONL


def _open_binary(path: str):
    if path == "-":
        return sys.stdin.buffer, "<stdin>"
    try:
        return open(path, "rb"), path
    except FileNotFoundError:
        raise InputError("no such file", source=path) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a file", source=path) from None
    except PermissionError:
        raise InputError("permission denied", source=path) from None


def parse_jsonl_line(raw: bytes, source: str, lineno: int) -> Any:
    """Parse one JSONL line with orjson; errors name the file and line."""
    if b"\x00" in raw:
        raise InputError("looks like binary data (NUL bytes), expected JSON", source=source, line=lineno)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise InputError(f"not valid UTF-8 (offset {uexc.start} in the line)", source=source,
                             line=lineno) from None
        if lineno == 1 and raw.strip() in (b"{", b"["):  # a pretty-printed document where JSONL is expected
            raise InputError("this is pretty-printed JSON over several lines; expected JSONL, one JSON value per "
                             "line (convert with: jq -c . FILE)", source=source, line=lineno) from None
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})", source=source, line=lineno) from None


def iter_raw_lines(path: str) -> Iterator[tuple[int, bytes, str]]:
    """Stream ``(line_number, raw_line, source)`` of non-blank lines; an empty file is an error."""
    fh, source = _open_binary(path)
    seen = False
    try:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            seen = True
            yield lineno, raw, source
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()
    if not seen:
        raise InputError("file is empty", source=source)


def iter_jsonl(path: str) -> Iterator[tuple[int, Any]]:
    """Stream ``(line_number, value)`` from a JSONL file, skipping blank lines.

    Each line is decoded strictly as UTF-8 and parsed with orjson; an error names the line.
    """
    for lineno, raw, source in iter_raw_lines(path):
        yield lineno, parse_jsonl_line(raw, source, lineno)


def get_path(value: Any, dotted: str) -> Any:
    """``a.b.c`` lookup in nested dicts; ``None`` when absent."""
    cur = value
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


@dataclass(frozen=True)
class LogRecord:
    line: int
    key: Any
    prompt: PromptInput


def iter_log(path: str, key_field: str | None = None, as_kind: str | None = None) -> Iterator[LogRecord]:
    """Stream prompts from a JSONL log, one record per non-blank line."""
    source = "<stdin>" if path == "-" else path
    for lineno, value in iter_jsonl(path):
        if key_field is not None:
            key = get_path(value, key_field)
            if key is None:
                raise InputError("missing conversation key", source=source, line=lineno, field=key_field)
            if isinstance(key, (dict, list)):
                key = json.dumps(key, sort_keys=True)
        else:
            key = None
        prompt = prompt_from_value(value, source=source, line=lineno, as_kind=as_kind)
        yield LogRecord(line=lineno, key=key, prompt=prompt)

