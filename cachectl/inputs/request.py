"""The canonical request: one parse of an OpenAI Chat, OpenAI Responses or Anthropic Messages body (bare or
inside a ``{timestamp, body, usage, ...}`` wrapper), or a token layout, into what every command needs.

- ``positions``: the ordered cacheable positions as the provider sees them, tools -> system -> messages
  (OpenAI: tools -> structured-output schema -> messages), each with its exact serialized content (key order
  kept: providers cache on exact bytes), its JSON path, its cache marker, and the text a tokenizer counts.
  On Anthropic each content block is one position, except that a run of ``tool_use`` blocks is one and a run
  of ``tool_result`` blocks is one (the 20-position lookback counts them so).
- ``params``: the request-level parameters that scope a cache (model, tool_choice, thinking, speed,
  response_format, prompt_cache_key, ...), and the two scope strings the Anthropic invalidation hierarchy
  needs (what invalidates system + messages, what invalidates messages).
- ``chat``: the same request as the message list Hugging Face chat templates expect (for diff-tokens and
  kv-inspect), with the JSON path of each message's text.
- ``locate(path)``: line and column of any field in the source file.

This is the only code that walks a request body. Engines take :class:`Request` values; a library user can
build one in memory with :func:`parse_request`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from ..errors import InputError
from .jsonpos import LocateFn
from .timestamps import parse_timestamp
from .usage import MAX_TOKEN_COUNT

PROVIDERS = ("anthropic", "openai", "layout")
APIS = ("messages", "chat", "responses", "layout")

#: Anthropic content block types and whether a tokenizer can render them offline
ANTHROPIC_BLOCKS = {
    "text": True, "thinking": True, "redacted_thinking": True, "tool_use": True, "tool_result": True,
    "image": False, "document": False, "search_result": True, "server_tool_use": True,
    "web_search_tool_result": True, "web_fetch_tool_result": True, "code_execution_tool_result": True,
    "bash_code_execution_tool_result": True, "text_editor_code_execution_tool_result": True,
    "mcp_tool_use": True, "mcp_tool_result": True, "container_upload": False, "tool_search_tool_result": True,
}
_RUNS = ("tool_use", "tool_result")
#: roles an Anthropic ``messages`` entry may have: a ``system`` entry is a mid-conversation system prompt, which the
#: API accepts (behind a user turn, ahead of an assistant turn or the end) and caches in place, as recorded:
#: fixtures/logs/vcr_anthropic_inline_system.yaml (a breakpoint on it writes, then reads, the whole prefix)
ANTHROPIC_ROLES = ("user", "assistant", "system")
OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
OPENAI_PARTS = {"text", "input_text", "output_text", "refusal", "image_url", "input_image", "input_audio",
                "input_file", "file"}
RESPONSES_ITEMS = {"message", "function_call", "function_call_output", "reasoning", "custom_tool_call",
                   "custom_tool_call_output", "item_reference", "web_search_call", "file_search_call",
                   "computer_call", "computer_call_output", "image_generation_call", "code_interpreter_call",
                   "local_shell_call", "local_shell_call_output", "mcp_call", "mcp_list_tools"}
#: keys of a log wrapper that hold the body
WRAPPER_KEYS = ("body", "request")
#: content blocks that may carry OpenAI's ``prompt_cache_breakpoint`` (GPT-5.6+; the guide: a marker elsewhere
#: is a 400 invalid_request_error)
BREAKPOINT_PARTS = {"chat": ("text", "image_url", "input_audio", "file", "refusal"),
                    "responses": ("input_text", "input_image", "input_file")}
#: Responses input items that are messages the implicit breakpoint can sit on besides user/system/developer ones
_ELIGIBLE_ITEMS = ("function_call_output", "custom_tool_call_output", "computer_call_output",
                   "local_shell_call_output")
CACHE_OPTION_MODES = ("implicit", "explicit")


_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
#: what orjson would write and json refuses (dataclasses, datetimes) or writes its own way (subclasses): json's
_PASSTHROUGH = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS
#: a number orjson may write otherwise than json (floats: ``1e-7`` for ``1e-07``, ``0.00001`` for ``1e-05``) or a
#: null that may have been a NaN or an infinity (orjson writes null for them, json ``NaN``): json writes these
#: (digits read as 0, and a float's point or exponent as '.': "0." is a digit then one of them)
_DIGITS = bytes.maketrans(b"123456789eE", b"000000000..")
_NOT_ORJSON = re.compile(rb"(?:^|[:\[,])(?:-?\d+(?:\.\d+|(?:\.\d+)?[eE][-+]?\d+)|null)(?=[,\]}]|$)")


def compact(obj: Any) -> str:
    """Exact serialized content: compact JSON, key order as given (providers cache on exact content).

    The text is ``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))``'s. orjson writes the same for
    strings, integers, booleans, lists and objects, ten times faster (a log's requests are parsed many times by
    ``fix`` and ``report``); whatever it refuses (integers past 64 bits, lone surrogates, keys that are not
    strings, deep nesting) or may write otherwise (floats, null) goes through json."""
    try:
        out = orjson.dumps(obj, option=_PASSTHROUGH)
    except TypeError:  # orjson.JSONEncodeError too
        return _COMPACT.encode(obj)
    digits = out.translate(_DIGITS)  # (a cheap look first: most contents hold neither a float nor a null)
    if (b"0." in digits or b"null" in out) and _NOT_ORJSON.search(out):
        return _COMPACT.encode(obj)
    return out.decode("utf-8")


#: :func:`dumps_alike`'s texts, by the exact content and the options (let go whole when full)
_DUMPED: dict[tuple, str] = {}
_DUMPED_MAX = 4096


def dumps_alike(obj: Any, *, sort_keys: bool = False, ensure_ascii: bool = True, indent: int | None = None) -> str:
    """``json.dumps(obj, sort_keys=..., ensure_ascii=..., indent=...)``, kept for values whose content comes back
    (a log's tools, the same on most of its requests, serialized again for each): found by :func:`compact`'s text,
    which tells apart whatever ``json.dumps`` writes apart (a NaN and a null, 1 and 1.0 and true, key order) in a
    value read from JSON (whose keys are strings: ``{1: 0, "2": 0}``, which ``sort_keys`` refuses, reads as
    ``{"1": 0, "2": 0}`` here)."""
    key = (compact(obj), sort_keys, ensure_ascii, indent)
    got = _DUMPED.get(key)
    if got is None:
        got = json.dumps(obj, sort_keys=sort_keys, ensure_ascii=ensure_ascii, indent=indent)
        if len(_DUMPED) >= _DUMPED_MAX:
            _DUMPED.clear()
        _DUMPED[key] = got
    return got


def _strip_cc(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k != "cache_control"}


def _block(b: dict) -> dict:
    """An Anthropic content block as the provider reads it: without its cache_control and, for a text block,
    ``type`` then ``text`` first. The Messages API: "Using a string for content is shorthand for an array of one
    content block of type "text"": a string, a one-block list and the same block with its keys in another order
    are the same content, so the same prefix."""
    if b.get("type") == "text" and "text" in b:
        return {"type": "text", "text": b["text"], **{k: v for k, v in b.items()
                                                      if k not in ("type", "text", "cache_control")}}
    return _strip_cc(b)


def unknown_block_note(btype: str) -> str:
    """The note said once per run for each content block type cachectl does not know."""
    return (f"content block type {btype!r:.60} is not one cachectl knows: read as a position whose exact JSON "
            "is its content (its tokens estimated from that JSON)")


@dataclass(frozen=True)
class Position:
    """One cacheable position of a request."""

    segment: str                 # tools | system | messages (OpenAI also: schema)
    path: str                    # JSON path in the body of its first block
    kind: str                    # tool | text | image | document | tool_use | tool_result | thinking | schema | message | layout ...
    role: str | None
    content: str                 # exact serialized content of the position, cache_control removed
    text: str                    # what a tokenizer counts for it (an estimate without the provider's renderer)
    ttl: str | None = None       # "5m" | "1h" when this position carries cache_control
    tokens: int | None = None    # known token count (token layouts)
    cache_path: str | None = None  # JSON path of its cache_control
    last_path: str | None = None   # JSON path of its last block (a run of tool_use/tool_result blocks)
    #: cache_control markers in this position (a run of blocks can carry several; each uses one of the 4 slots)
    markers: int = 0
    #: OpenAI's ``prompt_cache_breakpoint`` on the block this position ends with: its ``ttl``, or "" when it takes
    #: the request's (``prompt_cache_options.ttl``); None without one. Its JSON path is ``cache_path``.
    cache_breakpoint: str | None = None

    @property
    def identity(self) -> str:
        return f"{self.segment}:{self.role or ''}:{self.content}"


@dataclass(frozen=True)
class ChatView:
    """The request as Hugging Face chat templates see it."""

    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None
    field_paths: tuple[str, ...]
    #: JSON paths of parts a tokenizer cannot render without the model's processor (images, audio, files)
    unrenderable: tuple[str, ...] = ()


def _no_locate(path: str) -> tuple[int, int]:
    return 1, 1


@dataclass(frozen=True, kw_only=True)
class Request:
    provider: str                         # anthropic | openai | layout
    api: str                              # messages | chat | responses | layout
    model: str | None
    positions: tuple[Position, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    #: what invalidates system and messages (Anthropic: speed, web search, citations)
    scope_system: str = ""
    #: what invalidates messages (Anthropic: tool_choice, images, thinking)
    scope_messages: str = ""
    auto_ttl: str | None = None           # top-level cache_control (automatic caching)
    #: OpenAI GPT-5.6+: ``prompt_cache_options.mode`` ("implicit" | "explicit"; None when not given) and ``.ttl``
    cache_mode: str | None = None
    cache_ttl: str | None = None
    #: OpenAI: the position that ends the newest eligible message (where the implicit breakpoint goes), or None
    implicit_at: int | None = None
    source: str = "<memory>"
    line: int | None = None
    body_path: str = ""                   # "body." when the body sits inside a wrapper
    timestamp: float | None = None
    output_tokens: int | None = None
    usage: Any = None                     # the usage logged next to the request (wrapper), as given
    #: content block types cachectl does not know, read as positions whose exact JSON is their content
    unknown_blocks: tuple[str, ...] = ()
    #: Anthropic: the thinking blocks of earlier assistant turns that the model's context strips (set by the
    #: provider simulation, :func:`cachectl.engines.provider.cache.as_the_model_sees_it`), not in ``positions``
    stripped_thinking: tuple[Position, ...] = ()
    body: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    chat: ChatView | None = field(default=None, compare=False, repr=False)
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    locator: LocateFn = field(default=_no_locate, compare=False, repr=False)

    def locate(self, path: str) -> tuple[int, int]:
        """Line and column of ``path`` (a path in the body) in the source."""
        return self.locator(self.body_path + path if path else self.body_path.rstrip("."))

    def where(self, path: str | None = None) -> dict:
        """``source``/``line``/``field`` keywords for an :class:`InputError` about ``path``."""
        line = self.locate(path)[0] if path is not None and self.line is None else self.line
        return {"source": self.source, "line": line, "field": (self.body_path + path) if path else None}

    def error(self, message: str, path: str | None = None) -> InputError:
        return InputError(message, **self.where(path))

    @property
    def breakpoints(self) -> tuple[int, ...]:
        """Indices of positions with an explicit cache_control marker."""
        return tuple(i for i, p in enumerate(self.positions) if p.ttl is not None)

    @property
    def openai_breakpoints(self) -> tuple[int, ...]:
        """Indices of positions that end with an explicit ``prompt_cache_breakpoint`` (OpenAI)."""
        return tuple(i for i, p in enumerate(self.positions) if p.cache_breakpoint is not None)

    @property
    def marker_count(self) -> int:
        """cache_control markers that use one of the provider's breakpoint slots (top-level automatic caching
        uses one unless the last position already carries a marker)."""
        n = sum(p.markers for p in self.positions)
        if self.auto_ttl is not None and self.positions and self.positions[-1].ttl is None:
            n += 1
        return n


# ------------------------------------------------------------------------------------------------ parse


class _Ctx:
    def __init__(self, source: str, line: int | None, body_path: str, locator: LocateFn) -> None:
        self.source, self.line, self.body_path, self.locator = source, line, body_path, locator

    def err(self, message: str, path: str | None = None) -> InputError:
        line = self.line
        if line is None and path is not None:
            line = self.locator(self.body_path + path)[0]
        return InputError(message, source=self.source, line=line,
                          field=(self.body_path + path) if path else None)


def detect_provider(body: Mapping[str, Any], model: str | None = None) -> str:
    """``anthropic`` or ``openai`` for a body with messages/input; ``layout`` for token layouts."""
    if "blocks" in body:
        return "layout"
    if "input" in body and "messages" not in body:
        return "openai"
    if "system" in body or (model or "").startswith("claude"):
        return "anthropic"
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict) and ("input_schema" in tool or ("name" in tool and "function" not in tool
                                                                  and tool.get("type") != "function")):
            return "anthropic"
    messages = body.get("messages")
    for msg in messages if isinstance(messages, list) else ():
        if isinstance(msg, dict) and isinstance(msg.get("content"), list):
            for block in msg["content"]:
                btype = block.get("type") if isinstance(block, dict) else None
                if isinstance(btype, str) and btype in ANTHROPIC_BLOCKS and btype != "text":
                    return "anthropic"
    return "openai"


def is_request_body(value: Any) -> bool:
    return isinstance(value, dict) and ("messages" in value or "blocks" in value or "input" in value)


#: the fields a prompt's token IDs are read from (:func:`~.prompt.prompt_from_value`)
PROMPT_ID_KEYS = ("tokens", "prompt_token_ids", "input_ids", "token_ids")

#: what a line that holds a response's usage and no request is told (the commands that need its prompt)
USAGE_ONLY = ("this is a response's usage, not a request (it has 'usage' but no request to render): "
              "`cachectl prompt-cost --usage FILE` audits what it billed")


def is_usage_only(value: Any) -> bool:
    """A line that holds a response's ``usage`` and nothing a prompt is read from (a request body, a wrapper's,
    a prompt, its text or token IDs)."""
    return (isinstance(value, dict) and "usage" in value and not any(
        k in value for k in ("messages", "input", "blocks", "prompt", "text", "hash_ids", *PROMPT_ID_KEYS,
                             *WRAPPER_KEYS)))


def unwrap(value: Any) -> tuple[Any, str, dict]:
    """``(body, body_path, wrapper_fields)`` of a log line: the body itself, or the one inside a wrapper."""
    if isinstance(value, dict) and not is_request_body(value):
        for key in WRAPPER_KEYS:
            inner = value.get(key)
            if is_request_body(inner):
                return inner, f"{key}.", {k: v for k, v in value.items() if k != key}
    return value, "", {}


def cache_salt_of(value: Any) -> Any:
    """The vLLM prefix-cache salt a log line carries (None without one): a trace line's own ``salt`` or
    ``cache_salt``, else its request body's ``cache_salt`` (a parameter of vLLM's OpenAI-compatible requests), the
    body being the line itself or the one it wraps."""
    if not isinstance(value, dict):
        return None
    got = value.get("salt", value.get("cache_salt"))
    if got is None:
        body, _, _ = unwrap(value)
        if body is not value and isinstance(body, dict):
            got = body.get("cache_salt")
    return got


#: what a line that holds a JSON array of requests is told (one document saved where JSONL is read)
JSONL_ARRAY_HINT = "expected one request per line (JSONL) (convert with: jq -c '.[]' FILE)"


def parse_request(value: Any, *, source: str = "<memory>", line: int | None = None,
                  locator: LocateFn | None = None, default_model: str | None = None,
                  provider: str | None = None, timestamps: Callable[[Any], float | None] | None = None) -> Request:
    """Parse a request body (or a log line wrapping one) into the canonical :class:`Request`.

    ``locator`` maps a JSON path of ``value`` to (line, column) in its file (documents); log lines pass their
    ``line``. ``provider`` forces ``anthropic`` or ``openai`` where detection would guess. ``timestamps``:
    the reader of the run's timestamps (a :class:`~cachectl.inputs.timestamps.TimestampReader`; by default
    :func:`~cachectl.inputs.timestamps.parse_timestamp`).
    """
    loc = locator or _no_locate
    if not isinstance(value, dict):
        many = isinstance(value, list) and value and isinstance(value[0], dict) and "role" not in value[0]
        got = f"a list of {len(value)} object{'s' * (len(value) != 1)}" if many else type(value).__name__
        raise _Ctx(source, line, "", loc).err(f"expected a JSON object (a request body), got {got}" + (
            f"; {JSONL_ARRAY_HINT}" if many else ""))
    body, body_path, wrapper = unwrap(value)
    ctx = _Ctx(source, line, body_path, loc)
    if not is_request_body(body):
        if is_usage_only(value):
            raise ctx.err(USAGE_ONLY)
        if any(k in value for k in ("prompt_token_ids", "tokens", "prompt")):
            raise ctx.err("a prompt (its text or token IDs) without a request body: what needs the request's "
                          "messages (a provider's prompt cache, its fixes) cannot read it")
        raise ctx.err("not a request body: expected 'messages' (Chat, Anthropic), 'input' (Responses) or "
                      "'blocks' (a token layout)")
    model = body.get("model", wrapper.get("model"))
    if model is not None and not isinstance(model, str):
        raise ctx.err("expected a string", "model")
    model = model or default_model
    ts_raw = wrapper.get("timestamp", body.get("timestamp"))
    try:
        ts = (timestamps or parse_timestamp)(ts_raw)
    except ValueError as exc:
        raise InputError(str(exc), source=source, line=line if line is not None else loc("timestamp")[0],
                         field="timestamp") from None
    out_raw = wrapper.get("output_tokens", body.get("output_tokens"))
    if out_raw is not None and (isinstance(out_raw, bool) or not isinstance(out_raw, int)
                                or not 0 <= out_raw <= MAX_TOKEN_COUNT):
        raise InputError(f"expected a token count from 0 to {MAX_TOKEN_COUNT:,}, got {out_raw!r:.40}", source=source,
                         line=line, field="output_tokens")
    usage = wrapper.get("usage")
    if usage is None and isinstance(wrapper.get("response"), dict):
        usage = wrapper["response"].get("usage")
    if out_raw is None and isinstance(usage, dict):  # (the output as billed, where the line gives no count of it)
        billed = usage.get("output_tokens", usage.get("completion_tokens"))
        out_raw = billed if type(billed) is int and billed >= 0 else None
    kind = provider or detect_provider(body, model)
    if kind == "layout":
        parsed = _layout(body, ctx)
    elif kind == "anthropic":
        parsed = _anthropic(body, ctx)
    elif "input" in body and "messages" not in body:
        parsed = _responses(body, ctx)
    else:
        parsed = _openai_chat(body, ctx)
    meta = {**wrapper, **{k: v for k, v in body.items() if k not in ("messages", "tools", "system", "input")}}
    return Request(model=model, source=source, line=line, body_path=body_path, timestamp=ts,
                   output_tokens=out_raw, usage=usage, body=body, meta=meta, locator=loc, **parsed)


# ------------------------------------------------------------------------------------------- anthropic


def _ttl(cc: Any, ctx: _Ctx, path: str) -> str | None:
    if cc is None:
        return None
    if not isinstance(cc, dict) or cc.get("type", "ephemeral") != "ephemeral":
        raise ctx.err("expected {\"type\": \"ephemeral\", \"ttl\": \"5m\"|\"1h\"}", path)
    ttl = cc.get("ttl", "5m")
    if not isinstance(ttl, str) or ttl not in ("5m", "1h"):
        raise ctx.err(f"cache_control ttl must be '5m' or '1h', got {ttl!r}", f"{path}.ttl")
    return ttl


def _block_ttl(b: dict, ctx: _Ctx, path: str) -> str | None:
    """A content block's ``cache_control`` TTL; on an empty text block, the API's 400 ("cache_control cannot be set
    for empty text blocks", as it answers agents that send one: anthropics/claude-code#50082), at the block's path."""
    ttl = _ttl(b.get("cache_control"), ctx, f"{path}.cache_control")
    if ttl is not None and b.get("type", "text") == "text" and b.get("text") == "":
        raise ctx.err("the API refuses a cache_control on an empty text block (400: cache_control cannot be set for "
                      "empty text blocks)", f"{path}.cache_control")
    return ttl


def _text_of_result(content: Any, ctx: _Ctx, path: str, unknown: list[str] | None = None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ctx.err("expected a string or a list of content blocks", path)
    texts = []
    for i, b in enumerate(content):
        if not isinstance(b, dict):
            raise ctx.err("expected a content block object", f"{path}[{i}]")
        btype = b.get("type")
        if btype == "text":
            if not isinstance(b.get("text"), str):
                raise ctx.err("expected a string", f"{path}[{i}].text")
            texts.append(b["text"])
        elif not isinstance(btype, str):
            raise ctx.err(f"a content block needs a string 'type', got {btype!r:.60}", f"{path}[{i}].type")
        else:
            if btype not in ANTHROPIC_BLOCKS and unknown is not None and btype not in unknown:
                unknown.append(btype)
            texts.append(compact(_strip_cc(b)))
    return "\n".join(texts)


def _anthropic_block_text(b: dict) -> str:
    t = b.get("type")
    if t == "text":
        return str(b.get("text", ""))
    if t == "thinking":
        return str(b.get("thinking", ""))
    if t == "tool_use":
        return compact({"name": b.get("name"), "input": b.get("input", {})})
    return compact(_strip_cc(b))


def _mark_last_tool(positions: list[Position], ttl: str, cache_path: str) -> None:
    """A web search tool's ``cache_control`` (its definition is not part of the tools' cached prefix: toggling web
    search invalidates system and messages only): a breakpoint on the tools before it, one more of the 4 markers.
    With no tool before it, there is no prefix for it to cache (it is left out, as the tool is)."""
    at = next((k for k in range(len(positions) - 1, -1, -1) if positions[k].segment == "tools"), None)
    if at is None:
        return
    p = positions[at]
    positions[at] = replace(p, ttl=p.ttl or ttl, cache_path=p.cache_path or cache_path, markers=p.markers + 1)


def _anthropic(body: dict, ctx: _Ctx) -> dict:
    positions: list[Position] = []
    chat_msgs: list[dict] = []
    chat_paths: list[str] = []
    chat_tools: list[dict] = []
    tools = body.get("tools")
    web_search = False
    if tools is not None:
        if not isinstance(tools, list):
            raise ctx.err("expected a list of tools", "tools")
        for i, tool in enumerate(tools):
            path = f"tools[{i}]"
            if not isinstance(tool, dict):
                raise ctx.err("expected a tool object", path)
            ttl = _ttl(tool.get("cache_control"), ctx, f"{path}.cache_control")
            ttype = str(tool.get("type") or "")
            bare = _strip_cc(tool)
            if "input_schema" in tool:
                fn = {k: v for k, v in bare.items() if k not in ("input_schema", "type")}
                fn["parameters"] = tool["input_schema"]
                chat_tools.append({"type": "function", "function": fn})
            else:
                if not isinstance(tool.get("name"), str) and not ttype:
                    raise ctx.err("a tool needs 'name' and 'input_schema' (or a server tool 'type')", path)
                chat_tools.append(bare)
            if ttype.startswith("web_search"):
                web_search = True  # toggling web search invalidates system and messages, not tools
                if ttl is not None:  # its breakpoint: at the end of the tool definitions before it, where it sits
                    _mark_last_tool(positions, ttl, f"{path}.cache_control")
                continue
            if tool.get("defer_loading") is True:
                continue  # deferred through tool search: not in the prefix
            exact = compact(bare)
            positions.append(Position("tools", path, "tool", None, exact, exact, ttl,
                                      cache_path=f"{path}.cache_control" if ttl else None, markers=int(ttl is not None)))
    system = body.get("system")
    if system is not None:
        if isinstance(system, str):
            if system:
                positions.append(Position("system", "system", "text", "system", compact(
                    {"type": "text", "text": system}), system))
            chat_msgs.append({"role": "system", "content": system})
            chat_paths.append("system")
        elif isinstance(system, list):
            texts = []
            for i, b in enumerate(system):
                path = f"system[{i}]"
                if not isinstance(b, dict):
                    raise ctx.err("expected a text block object", path)
                if b.get("type", "text") != "text" or not isinstance(b.get("text"), str):
                    raise ctx.err("system blocks must be {\"type\": \"text\", \"text\": ...}", path)
                ttl = _block_ttl(b, ctx, path)
                positions.append(Position("system", path, "text", "system", compact(_block(b)), b["text"], ttl,
                                          cache_path=f"{path}.cache_control" if ttl else None,
                                          markers=int(ttl is not None)))
                texts.append(b["text"])
            chat_msgs.append({"role": "system", "content": "\n".join(texts)})
            chat_paths.append("system")
        else:
            raise ctx.err("expected a string or a list of text blocks", "system")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ctx.err("expected a list of messages", "messages")
    if not messages:
        raise ctx.err("expected at least one message", "messages")
    images = 0
    citations = False
    unrenderable: list[str] = []
    unknown: list[str] = []
    for i, msg in enumerate(messages):
        mpath = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ctx.err("expected a message object", mpath)
        role = msg.get("role")
        if not isinstance(role, str) or role not in ANTHROPIC_ROLES:
            raise ctx.err(f"role must be 'user', 'assistant' or 'system', got {role!r:.60}", f"{mpath}.role")
        if "content" not in msg:
            raise ctx.err("missing 'content'", mpath)
        content = msg["content"]
        if isinstance(content, str):
            # the shorthand for one text block: the same content as that block
            positions.append(Position("messages", f"{mpath}.content", "text", role,
                                      compact({"type": "text", "text": content}), content,
                                      last_path=f"{mpath}.content"))
            chat_msgs.append({"role": role, "content": content})
            chat_paths.append(f"{mpath}.content")
            continue
        if not isinstance(content, list):
            raise ctx.err("expected a string or a list of content blocks", f"{mpath}.content")
        runs: list[list[tuple[int, dict]]] = []
        for j, b in enumerate(content):
            bpath = f"{mpath}.content[{j}]"
            if not isinstance(b, dict):
                raise ctx.err("expected a content block object", bpath)
            btype = b.get("type")
            if not isinstance(btype, str):
                raise ctx.err(f"a content block needs a string 'type', got {btype!r:.60}", f"{bpath}.type")
            if btype not in ANTHROPIC_BLOCKS and btype not in unknown:
                unknown.append(btype)  # a type the API took that cachectl does not know: its JSON is its content
            if btype == "text" and not isinstance(b.get("text"), str):
                raise ctx.err("expected a string", f"{bpath}.text")
            if btype == "tool_use" and not isinstance(b.get("name"), str):
                raise ctx.err("a tool_use block needs a string 'name'", f"{bpath}.name")
            if btype == "image":
                images += 1
            if btype == "document" and isinstance(b.get("citations"), dict) and b["citations"].get("enabled"):
                citations = True
            if runs and btype in _RUNS and runs[-1][-1][1].get("type") == btype:
                runs[-1].append((j, b))
            else:
                runs.append([(j, b)])
        for run in runs:
            ttl = None
            cache_path = None
            markers = 0
            for j, b in run:
                t = _block_ttl(b, ctx, f"{mpath}.content[{j}]")
                if t is not None:
                    ttl, cache_path = t, f"{mpath}.content[{j}].cache_control"
                    markers += 1
            first, kind = run[0][0], str(run[0][1].get("type"))
            items = [_block(b) for _, b in run]
            positions.append(Position("messages", f"{mpath}.content[{first}]", kind, role,
                                      compact(items if len(items) > 1 else items[0]),
                                      "\n".join(_anthropic_block_text(b) for b in items), ttl, cache_path=cache_path,
                                      last_path=f"{mpath}.content[{run[-1][0]}]", markers=markers))
        _anthropic_chat(role, mpath, content, ctx, chat_msgs, chat_paths, unrenderable, unknown)
    auto = _ttl(body.get("cache_control"), ctx, "cache_control")
    params = {k: body[k] for k in ("tool_choice", "thinking", "speed", "output_config", "service_tier",
                                   "inference_geo", "metadata", "container", "mcp_servers") if k in body}
    # The invalidation hierarchy (FACTS: Anthropic prompt caching): a change of tool definitions invalidates
    # everything (they lead the chain); speed, web search and citations invalidate system and messages;
    # tool_choice, images and thinking invalidate messages.
    scope_system = compact({"speed": body.get("speed"), "web_search": web_search, "citations": citations})
    scope_messages = compact({"tool_choice": body.get("tool_choice"), "images": images,
                              "thinking": body.get("thinking"),
                              "effort": (body.get("output_config") or {}).get("effort")
                              if isinstance(body.get("output_config"), dict) else None})
    return {"provider": "anthropic", "api": "messages", "positions": tuple(positions), "params": params,
            "scope_system": scope_system, "scope_messages": scope_messages, "auto_ttl": auto,
            "unknown_blocks": tuple(unknown),
            "chat": ChatView(tuple(chat_msgs), tuple(chat_tools) if tools is not None else None, tuple(chat_paths),
                             tuple(unrenderable))}


def _anthropic_chat(role: str, mpath: str, content: list, ctx: _Ctx, msgs: list[dict], paths: list[str],
                    unrenderable: list[str], unknown: list[str] | None = None) -> None:
    """The chat-template view of one Anthropic message (tool_result blocks become tool messages)."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict] = []
    for j, b in enumerate(content):
        bpath = f"{mpath}.content[{j}]"
        btype = b.get("type")
        if btype == "text":
            texts.append(b["text"])
        elif btype == "thinking":
            reasoning.append(str(b.get("thinking", "")))
        elif btype == "redacted_thinking":
            continue
        elif btype == "tool_use":
            calls.append({"id": b.get("id"), "type": "function",
                          "function": {"name": b.get("name"), "arguments": b.get("input", {})}})
        elif btype == "tool_result":
            msgs.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                         "content": _text_of_result(b.get("content"), ctx, f"{bpath}.content", unknown)})
            paths.append(f"{bpath}.content")
        elif not ANTHROPIC_BLOCKS.get(str(btype), False):
            unrenderable.append(bpath)
        else:
            texts.append(_anthropic_block_text(b))
    if texts or calls or reasoning:
        norm: dict = {"role": role, "content": "\n".join(texts)}
        if reasoning:
            norm["reasoning_content"] = "\n".join(reasoning)
        if calls:
            norm["tool_calls"] = calls
        msgs.append(norm)
        paths.append(f"{mpath}.content")


# ---------------------------------------------------------------------------------------------- openai


def _part_text(part: Any, ctx: _Ctx, path: str) -> str | None:
    """Text of one OpenAI content part; ``None`` for a non-text part (image, audio, file)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise ctx.err("expected a content part object", path)
    ptype = part.get("type", "text")
    if not isinstance(ptype, str) or ptype not in OPENAI_PARTS:
        raise ctx.err(f"unknown content part type {ptype!r} (known: {', '.join(sorted(OPENAI_PARTS))})",
                      f"{path}.type")
    if ptype in ("text", "input_text", "output_text"):
        if not isinstance(part.get("text"), str):
            raise ctx.err("expected a string", f"{path}.text")
        return part["text"]
    if ptype == "refusal":
        return str(part.get("refusal", ""))
    return None


def _openai_content(content: Any, ctx: _Ctx, path: str, unrenderable: list[str]) -> str:
    """The text of a message's content; parts are joined by newlines as vLLM does. Paths of non-text
    parts are added to ``unrenderable``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ctx.err("expected a string or a list of content parts", path)
    texts = []
    for i, part in enumerate(content):
        t = _part_text(part, ctx, f"{path}[{i}]")
        if t is None:
            unrenderable.append(f"{path}[{i}]")
        else:
            texts.append(t)
    return "\n".join(texts)


def _tool_call_for_template(call: Any, ctx: _Ctx, path: str) -> dict:
    if not isinstance(call, dict):
        raise ctx.err("expected a tool call object", path)
    fn = call.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        # Chat templates expect arguments as an object (they render it with tojson).
        try:
            args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
        except (ValueError, RecursionError):  # not JSON (or an integer past Python's digits, nested too deeply)
            args = fn["arguments"]
        return {**call, "function": {**fn, "arguments": args}}
    return call


def _openai_tools(tools: Any, ctx: _Ctx, positions: list[Position]) -> tuple[dict, ...] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ctx.err("expected a list of tools", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ctx.err("expected a tool object", f"tools[{i}]")
        if tool.get("type", "function") == "function":  # Chat's {"function": {"name"...}} or the Responses' flat one
            fn = tool.get("function", tool)
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ctx.err("a function tool needs a 'function' object with a string 'name'",
                              f"tools[{i}].function" if "function" in tool else f"tools[{i}].name")
        exact = compact(tool)
        positions.append(Position("tools", f"tools[{i}]", "tool", None, exact, exact))
    return tuple(tools)


def _schema_position(fmt: Any, path: str, positions: list[Position]) -> None:
    """Structured outputs: the schema is part of the cached prefix, ahead of the system message."""
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        exact = compact(fmt)
        positions.append(Position("schema", path, "schema", None, exact, exact))


def _openai_chat(body: dict, ctx: _Ctx) -> dict:
    positions: list[Position] = []
    tools = _openai_tools(body.get("tools"), ctx, positions)
    _schema_position(body.get("response_format"), "response_format", positions)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise ctx.err("expected a list of messages", "messages")
    if not messages:
        raise ctx.err("expected at least one message", "messages")
    msgs: list[dict] = []
    paths: list[str] = []
    unrenderable: list[str] = []
    implicit: int | None = None
    for i, msg in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ctx.err("expected a message object", path)
        role = msg.get("role")
        if not isinstance(role, str):
            raise ctx.err("missing or non-string 'role'", f"{path}.role")
        if role not in OPENAI_ROLES:
            raise ctx.err(f"unknown role {role!r} (known: {', '.join(OPENAI_ROLES)})", f"{path}.role")
        calls = msg.get("tool_calls")
        if "content" not in msg and not calls and not msg.get("function_call"):
            raise ctx.err("missing 'content'", path)
        text = _openai_content(msg.get("content"), ctx, f"{path}.content", unrenderable)
        if calls is not None and not isinstance(calls, list):
            raise ctx.err("expected a list of tool calls", f"{path}.tool_calls")
        norm = {k: v for k, v in msg.items() if k != "content"}
        norm["content"] = text if (msg.get("content") is not None or not calls) else None
        if calls:
            norm["tool_calls"] = [_tool_call_for_template(c, ctx, f"{path}.tool_calls[{j}]")
                                  for j, c in enumerate(calls)]
        msgs.append(norm)
        paths.append(f"{path}.content")
        shown = text + (compact(calls) if calls else "")
        positions.extend(_marked_positions(msg, path, f"{path}.content", "message", role, shown, "chat", ctx))
        if role != "assistant":
            implicit = len(positions) - 1
    params = {k: body[k] for k in ("tool_choice", "response_format", "prompt_cache_key", "reasoning_effort",
                                   "parallel_tool_calls", "prompt_cache_retention", "prompt_cache_options")
              if k in body}
    return {"provider": "openai", "api": "chat", "positions": tuple(positions), "params": params,
            "chat": ChatView(tuple(msgs), tools, tuple(paths), tuple(unrenderable)),
            "implicit_at": implicit, **_cache_options(body, ctx)}


def _responses(body: dict, ctx: _Ctx) -> dict:
    positions: list[Position] = []
    tools_in = body.get("tools")
    chat_tools = None
    if tools_in is not None:
        _openai_tools(tools_in, ctx, positions)
        chat_tools = tuple({"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                           if t.get("type") == "function" and "function" not in t else t for t in tools_in)
    text_cfg = body.get("text")
    if isinstance(text_cfg, dict):
        _schema_position(text_cfg.get("format"), "text.format", positions)
    msgs: list[dict] = []
    paths: list[str] = []
    unrenderable: list[str] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ctx.err("expected a string", "instructions")
        positions.append(Position("system", "instructions", "text", "system", compact(instructions), instructions))
        msgs.append({"role": "system", "content": instructions})
        paths.append("instructions")
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
        single = True
    else:
        single = False
    if not isinstance(items, list):
        raise ctx.err("expected a string or a list of input items", "input")
    implicit: int | None = None
    for i, item in enumerate(items):
        path = "input" if single else f"input[{i}]"
        if not isinstance(item, dict):
            raise ctx.err("expected an input item object", path)
        itype = item.get("type", "message")
        if not isinstance(itype, str) or itype not in RESPONSES_ITEMS:
            raise ctx.err(f"unknown input item type {itype!r}", f"{path}.type")
        if itype == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in ("system", "developer", "user", "assistant"):
                raise ctx.err(f"role must be system, developer, user or assistant, got {role!r}", f"{path}.role")
            if "content" not in item:
                raise ctx.err("missing 'content'", path)
            text = _openai_content(item.get("content"), ctx, path if single else f"{path}.content", unrenderable)
            msgs.append({"role": role, "content": text})
            paths.append(path if single else f"{path}.content")
            shown = text
        elif itype == "function_call":
            if not isinstance(item.get("name"), str):
                raise ctx.err("a function_call needs a string 'name'", f"{path}.name")
            call = _tool_call_for_template({"id": item.get("call_id"), "type": "function",
                                            "function": {"name": item["name"],
                                                         "arguments": item.get("arguments", "")}}, ctx, path)
            if msgs and msgs[-1]["role"] == "assistant" and msgs[-1].get("tool_calls") is not None:
                msgs[-1]["tool_calls"].append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
                paths.append(path)
            shown = compact({"name": item["name"], "arguments": item.get("arguments", "")})
        elif itype == "function_call_output":
            out = item.get("output", "")
            shown = out if isinstance(out, str) else compact(out)
            msgs.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": shown})
            paths.append(f"{path}.output")
        else:
            shown = compact(item)
        if itype == "message" and not single:
            positions.extend(_marked_positions(item, path, f"{path}.content", itype, item.get("role"), shown,
                                               "responses", ctx))
        else:
            positions.append(Position("messages", path, itype, item.get("role"), compact(item), shown,
                                      last_path=path))
        if (itype == "message" and item.get("role") != "assistant") or itype in _ELIGIBLE_ITEMS:
            implicit = len(positions) - 1
    params = {k: body[k] for k in ("tool_choice", "prompt_cache_key", "reasoning", "text", "parallel_tool_calls",
                                   "previous_response_id", "prompt_cache_retention", "prompt_cache_options")
              if k in body}
    return {"provider": "openai", "api": "responses", "positions": tuple(positions), "params": params,
            "chat": ChatView(tuple(msgs), chat_tools, tuple(paths), tuple(unrenderable)),
            "implicit_at": implicit, **_cache_options(body, ctx)}


def _cache_options(body: dict, ctx: _Ctx) -> dict:
    """``prompt_cache_options`` (OpenAI GPT-5.6+): ``{mode: implicit|explicit, ttl}``, checked for shape; whether
    the model accepts it is the engine's question."""
    opts = body.get("prompt_cache_options")
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise ctx.err("expected an object {\"mode\": \"implicit\"|\"explicit\", \"ttl\": ...}", "prompt_cache_options")
    for key in opts:
        if key not in ("mode", "ttl"):
            raise ctx.err(f"unknown prompt_cache_options field {key!r:.60} (known: mode, ttl)",
                          f"prompt_cache_options.{key}")
    mode = opts.get("mode")
    if mode is not None and mode not in CACHE_OPTION_MODES:
        raise ctx.err(f"expected 'implicit' or 'explicit', got {mode!r:.60}", "prompt_cache_options.mode")
    ttl = opts.get("ttl")
    if ttl is not None and not isinstance(ttl, str):
        raise ctx.err(f"expected a TTL string such as '30m', got {ttl!r:.60}", "prompt_cache_options.ttl")
    return {"cache_mode": mode, "cache_ttl": ttl}


def _breakpoint_ttl(part: Any, ctx: _Ctx, path: str, api: str) -> str | None:
    """The ``prompt_cache_breakpoint`` of one content part: its ttl, "" for the request's, None without one."""
    if not isinstance(part, dict) or "prompt_cache_breakpoint" not in part:
        return None
    mark = part["prompt_cache_breakpoint"]
    where = f"{path}.prompt_cache_breakpoint"
    if not isinstance(mark, dict) or mark.get("mode") != "explicit":
        raise ctx.err("expected {\"mode\": \"explicit\"} (the only mode a breakpoint takes)", where)
    ptype = part.get("type", "text")
    if ptype not in BREAKPOINT_PARTS[api]:
        raise ctx.err(f"a prompt_cache_breakpoint on a {ptype!r:.40} block: the API accepts it only on "
                      f"{', '.join(BREAKPOINT_PARTS[api])} blocks (400 invalid_request_error)", where)
    ttl = mark.get("ttl")
    if ttl is not None and not isinstance(ttl, str):
        raise ctx.err(f"expected a TTL string such as '30m', got {ttl!r:.60}", f"{where}.ttl")
    return ttl or ""


def _strip_marks(parts: list) -> list:
    return [{k: v for k, v in p.items() if k != "prompt_cache_breakpoint"} if isinstance(p, dict) else p
            for p in parts]


def _texts(parts: list) -> str:
    """The text a tokenizer counts for some content parts (as :func:`_openai_content` joins them)."""
    out = []
    for p in parts:
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, dict) and p.get("type", "text") in ("text", "input_text", "output_text"):
            out.append(str(p.get("text", "")))
        elif isinstance(p, dict) and p.get("type") == "refusal":
            out.append(str(p.get("refusal", "")))
    return "\n".join(out)


def _marked_positions(msg: dict, path: str, content_path: str, kind: str, role: Any, shown: str, api: str,
                      ctx: _Ctx) -> list[Position]:
    """One OpenAI message (or Responses message item) as positions: one, unless a content part before its last
    carries a ``prompt_cache_breakpoint``: then the message is cut after each marked part, since the cached prefix
    ends exactly there. The markers are not content: a message's identity is the same with or without them (cut
    messages are a different sequence of positions, which the hash chain sees as a different prefix)."""
    content = msg.get("content")
    marks: list[tuple[int, str]] = []
    if isinstance(content, list):
        for j, part in enumerate(content):
            ttl = _breakpoint_ttl(part, ctx, f"{content_path}[{j}]", api)
            if ttl is not None:
                marks.append((j, ttl))
    if not marks:
        return [Position("messages", path, kind, role, compact(msg), shown, last_path=path)]
    assert isinstance(content, list)
    bare = {k: v for k, v in msg.items() if k != "content"}
    cuts = [j for j, _ in marks]
    if cuts[-1] != len(content) - 1:
        cuts.append(len(content) - 1)
    ttl_at = dict(marks)
    out: list[Position] = []
    start = 0
    for n, end in enumerate(cuts):
        parts = _strip_marks(content[start:end + 1])
        if len(cuts) == 1:
            ident = compact({**msg, "content": parts})
        elif n == 0:
            ident = compact({**bare, "content": parts})
        else:
            ident = compact({"content+": parts})
        text = _texts(content[start:end + 1])
        if n > 0 and text:
            text = "\n" + text
        if n == len(cuts) - 1:  # what the message shows after its content (tool calls) goes with its last cut
            whole = _texts(content)
            text += shown[len(whole):] if shown.startswith(whole) else ""
        last = f"{content_path}[{end}]"
        ttl = ttl_at.get(end)
        out.append(Position("messages", path if n == 0 else f"{content_path}[{start}]", kind, role, ident, text,
                            cache_path=f"{last}.prompt_cache_breakpoint" if ttl is not None else None,
                            last_path=last if len(cuts) > 1 else path, cache_breakpoint=ttl))
        start = end + 1
    return out


# ---------------------------------------------------------------------------------------------- layout


def _layout(body: dict, ctx: _Ctx) -> dict:
    blocks_in = body["blocks"]
    if not isinstance(blocks_in, list) or not blocks_in:
        raise ctx.err("expected a non-empty list of blocks", "blocks")
    positions = []
    for i, b in enumerate(blocks_in):
        path = f"blocks[{i}]"
        if not isinstance(b, dict):
            raise ctx.err("expected a block object", path)
        if "id" not in b:
            raise ctx.err("missing 'id' (blocks with equal ids are the same content)", f"{path}.id")
        tokens = b.get("tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise ctx.err(f"expected an integer token count, got {tokens!r}", f"{path}.tokens")
        if tokens < 0:
            raise ctx.err(f"negative token count {tokens}", f"{path}.tokens")
        if tokens > MAX_TOKEN_COUNT:
            raise ctx.err(f"a token count of {tokens:.3g} is past the {MAX_TOKEN_COUNT:,} any request can hold",
                          f"{path}.tokens")
        segment = b.get("segment", "messages")
        if not isinstance(segment, str) or segment not in ("tools", "system", "messages"):
            raise ctx.err(f"segment must be tools, system or messages, got {segment!r}", f"{path}.segment")
        ttl = _ttl(b.get("cache_control"), ctx, f"{path}.cache_control")
        positions.append(Position(segment, path, "layout", None, "id:" + json.dumps(b["id"], sort_keys=True),
                                  "", ttl, tokens=tokens, cache_path=f"{path}.cache_control" if ttl else None,
                                  markers=int(ttl is not None)))
    return {"provider": "layout", "api": "layout", "positions": tuple(positions), "params": {},
            "auto_ttl": _ttl(body.get("cache_control"), ctx, "cache_control")}


# --------------------------------------------------------------------------------------------- helpers


def layout_request(positions: list[tuple[str, int, str | None]], *, model: str, timestamp: float | None = None,
                   output_tokens: int = 0, paths: list[str] | None = None) -> Request:
    """A token layout built in memory: ``(id, tokens, ttl)`` per position (what-if and library use). ``paths``: what
    messages call each position (default ``blocks[i]``, as a layout file spells it)."""
    pos = tuple(Position("messages", paths[i] if paths else f"blocks[{i}]", "layout", None, "id:" + json.dumps(id_),
                         "", ttl, tokens=n, markers=int(ttl is not None))
                for i, (id_, n, ttl) in enumerate(positions))
    return Request(provider="layout", api="layout", model=model, positions=pos, timestamp=timestamp,
                   output_tokens=output_tokens, source="what-if")

