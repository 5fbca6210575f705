"""What the gateway and tracing shapes (LiteLLM, Langfuse) share: they log a call as OpenAI-format chat
messages whatever the provider was, so an Anthropic call is rebuilt here into the Anthropic Messages body the
provider received, and their token counters are put into the provider convention
:func:`cachectl.inputs.usage.parse_usage` reads.

The OpenAI -> Anthropic rebuild follows what LiteLLM's Anthropic adapter sends (read in BerriAI/litellm
``litellm/llms/anthropic/chat/transformation.py`` and ``litellm_core_utils/prompt_templates/factory.py``):
system (and developer) messages become top-level ``system`` text blocks, consecutive messages of one role are
merged, assistant ``tool_calls`` become ``tool_use`` blocks, ``tool`` messages become ``tool_result`` blocks in a
user turn, ``image_url`` parts become ``image`` blocks, OpenAI function tools become ``{name, description,
input_schema}``, ``cache_control`` markers stay where they were. It is the provider's body to the block, not
to the byte: LiteLLM's own additions (a JSON-mode tool, a prefill) are not rebuilt.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import InputError
from ..request import ANTHROPIC_BLOCKS
from ..usage import MAX_TOKEN_COUNT
from .base import text_of


def is_claude(model: Any, provider: Any = None) -> bool:
    """An Anthropic model: the provider says so, or the model name (``anthropic/claude-...``,
    ``bedrock/us.anthropic.claude-...``, ``vertex_ai/claude-...``) is a Claude."""
    if isinstance(provider, str) and provider.lower() == "anthropic":
        return True
    return isinstance(model, str) and "claude" in model.lower()


def _dump(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return str(value)


def _cc(src: dict, block: dict) -> dict:
    if isinstance(src.get("cache_control"), dict):
        block["cache_control"] = src["cache_control"]
    return block


def _image(part: dict) -> dict:
    url = part.get("image_url")
    url = url.get("url") if isinstance(url, dict) else url
    url = url if isinstance(url, str) else ""
    if url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return _cc(part, {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}})
    return _cc(part, {"type": "image", "source": {"type": "url", "url": url}})


def _blocks(content: Any, msg: dict) -> list[dict]:
    """OpenAI message content (a string or a list of parts) as Anthropic content blocks."""
    if content is None:
        return []
    if isinstance(content, str):
        return [_cc(msg, {"type": "text", "text": content})] if content else []
    if not isinstance(content, list):
        return [_cc(msg, {"type": "text", "text": _dump(content)})]
    out: list[dict] = []
    for part in content:
        if isinstance(part, str):
            out.append({"type": "text", "text": part})
        elif not isinstance(part, dict):
            out.append({"type": "text", "text": _dump(part)})
        elif part.get("type") == "text" and isinstance(part.get("text"), str):
            out.append(_cc(part, {"type": "text", "text": part["text"]}))
        elif part.get("type") == "image_url":
            out.append(_image(part))
        elif text_of(part, "type") in ANTHROPIC_BLOCKS:
            out.append(part)  # already an Anthropic block (LiteLLM's /v1/messages route logs them as sent)
        else:  # audio, file, ...: what a tokenizer can count of it
            out.append(_cc(part, {"type": "text", "text": _dump(part)}))
    if out and isinstance(msg.get("cache_control"), dict) and "cache_control" not in out[-1]:
        out[-1] = {**out[-1], "cache_control": msg["cache_control"]}  # message-level marker: on its last block
    return out


def _tool_use(call: Any) -> dict:
    call = call if isinstance(call, dict) else {}
    fn = obj(call, "function")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = orjson.loads(args) if args.strip() else {}
        except orjson.JSONDecodeError:
            args = {"arguments": args}
    return {"type": "tool_use", "id": str(call.get("id") or ""), "name": str(fn.get("name") or ""),
            "input": args if isinstance(args, dict) else {}}


def _tool_result(msg: dict) -> dict:
    content = msg.get("content")
    if isinstance(content, list):
        inner: Any = [b for b in _blocks(content, {}) if b.get("type") in ("text", "image")]
    else:
        inner = content if isinstance(content, str) else _dump(content)
    return _cc(msg, {"type": "tool_result", "tool_use_id": str(msg.get("tool_call_id") or msg.get("name") or ""),
                     "content": inner})


def anthropic_tools(tools: Any) -> list | None:
    """OpenAI function tools as Anthropic tools; Anthropic tools (``input_schema``, server tools) as they are."""
    if not isinstance(tools, list):
        return None
    out = []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("type") == "function" and isinstance(tool.get("function"), dict):
            fn = tool["function"]
            t = {"name": fn.get("name"), "description": fn.get("description"),
                 "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}}
            out.append(_cc(tool, {k: v for k, v in t.items() if v is not None}))
        else:
            out.append(tool)
    return out


def anthropic_tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}.get(choice)
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = obj(choice, "function")
        return {"type": "tool", "name": fn.get("name")}
    return choice


def anthropic_body(model: str | None, messages: list, tools: Any = None, params: dict | None = None, *,
                   path: str = "messages", where: dict | None = None) -> dict:
    """The Anthropic Messages body an OpenAI-format chat was sent as. A message that is no message object, a role
    that is no string, a content that is neither a string nor a list of parts is refused as the OpenAI chat reader
    refuses it (none is a chat the gateway sent): an :class:`~cachectl.errors.InputError` at ``path`` (the
    messages' JSON path in the line) and ``where`` (its ``source`` and ``line``)."""
    system: list[dict] = []
    turns: list[dict] = []
    for i, msg in enumerate(messages):
        at = f"{path}[{i}]"
        if not isinstance(msg, dict):
            raise InputError("expected a message object", field=at, **(where or {}))
        if not isinstance(msg.get("role"), str):
            raise InputError("missing or non-string 'role'", field=f"{at}.role", **(where or {}))
        if not isinstance(msg.get("content"), (str, list, type(None))):
            raise InputError("expected a string or a list of content parts", field=f"{at}.content", **(where or {}))
        role = msg.get("role")
        if role in ("system", "developer"):
            system.extend(_blocks(msg.get("content"), msg))
            continue
        if role in ("tool", "function"):
            role, blocks = "user", [_tool_result(msg)]
        else:
            role = "assistant" if role in ("assistant", "model", "ai") else "user"
            blocks = _blocks(msg.get("content"), msg)
            if role == "assistant":
                calls = msg.get("tool_calls")
                blocks += [_tool_use(c) for c in calls] if isinstance(calls, list) else []
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:  # Anthropic refuses an empty turn; LiteLLM sends a placeholder there
        if not turn["content"]:
            turn["content"] = [{"type": "text", "text": "."}]
    body: dict[str, Any] = {"model": model}
    if system:
        body["system"] = system
    body["messages"] = turns
    tools = anthropic_tools(tools)
    if tools:
        body["tools"] = tools
    params = params or {}
    choice = anthropic_tool_choice(params.get("tool_choice"))
    if choice is not None:
        body["tool_choice"] = choice
    if isinstance(params.get("thinking"), dict):
        body["thinking"] = params["thinking"]
    return body


def anthropic_usage(inp: int, write: int, read: int, out: int, w5: Any = None, w1: Any = None) -> dict:
    """Anthropic's additive counters (``input_tokens`` excludes cache reads and writes)."""
    usage: dict[str, Any] = {"input_tokens": inp, "cache_creation_input_tokens": write,
                             "cache_read_input_tokens": read, "output_tokens": out}
    if isinstance(w5, int) and isinstance(w1, int) and w5 + w1 == write and write:
        usage["cache_creation"] = {"ephemeral_5m_input_tokens": w5, "ephemeral_1h_input_tokens": w1}
    return usage


def openai_usage(prompt: int, out: int, read: int, write: int) -> dict:
    """OpenAI Chat's inclusive counters (``prompt_tokens`` includes cached and written tokens)."""
    details = {"cached_tokens": read}
    if write:
        details["cache_write_tokens"] = write
    return {"prompt_tokens": prompt, "completion_tokens": out, "prompt_tokens_details": details}


def obj(holder: Any, key: str) -> dict:
    """``holder[key]`` when both are objects, else an empty one."""
    value = holder.get(key) if isinstance(holder, dict) else None
    return value if isinstance(value, dict) else {}


def count(value: Any) -> int | None:
    """A token counter as logged: an int (or an integral float/string, as JSON writers leave them) from 0 to
    :data:`~cachectl.inputs.usage.MAX_TOKEN_COUNT`, else None."""
    if isinstance(value, bool):
        return None
    n = None
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and value.is_integer():
        n = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        n = int(value)
    return n if n is not None and 0 <= n <= MAX_TOKEN_COUNT else None


def counter(value: Any, *, source: str, line: int | None, field: str, note: str = "") -> int:
    """:func:`count` of a counter a line gives, refused at ``field`` (``note`` after the message) where it is no
    token count: every reader's one message for it."""
    n = count(value)
    if n is None:
        raise InputError(f"expected a token count (a whole number from 0 to {MAX_TOKEN_COUNT:,}), got {value!r:.40}"
                         f"{note}", source=source, line=line, field=field)
    return n


def response_text(resp: Any) -> str | None:
    """The text a model answered, as a log keeps its response (None where it holds none, such as a call that
    answered with tool calls only, or an empty text): a string; a message ``{role, content}`` (its content a
    string or text parts, joined as they are: the text blocks of one answer); an OpenAI chat completion (its first
    choice's message); a Responses API object (its ``output_text`` parts); an Anthropic message (its text
    blocks); a list of messages (the last one's)."""
    if isinstance(resp, str):
        return resp or None
    if isinstance(resp, list):
        return response_text(resp[-1]) if resp else None
    if not isinstance(resp, dict):
        return None
    choices = resp.get("choices")
    if isinstance(choices, list):
        first = choices[0] if choices and isinstance(choices[0], dict) else {}
        return response_text(first.get("message"))
    if isinstance(resp.get("output"), list):  # (the Responses API: message items holding output_text parts)
        texts = [response_text(item) for item in resp["output"]
                 if isinstance(item, dict) and item.get("type", "message") == "message"]
        got = [t for t in texts if t is not None]
        return "".join(got) if got else None
    content = resp.get("content")
    if isinstance(content, str):
        return content or None
    if isinstance(content, list):
        parts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") in ("text", "output_text")
                 and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None


def streamed_text(kind: str, events: list[dict]) -> str | None:
    """The text of a streamed answer, from its server-sent events (``kind``: anthropic, chat or responses): the
    deltas of its text, in order (None where it streamed none)."""
    parts: list[str] = []
    for e in events:
        if kind == "anthropic":
            delta = e.get("delta") if e.get("type") == "content_block_delta" else None
            if isinstance(delta, dict) and delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                parts.append(delta["text"])
        elif kind == "chat":
            choices = e.get("choices")
            delta = choices[0].get("delta") if isinstance(choices, list) and choices and isinstance(
                choices[0], dict) else None
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                parts.append(delta["content"])
        elif e.get("type") == "response.output_text.delta" and isinstance(e.get("delta"), str):
            parts.append(e["delta"])
    return "".join(parts) if parts else None
