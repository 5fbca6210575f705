"""LiteLLM's ``StandardLoggingPayload``, one JSON object a line, as LiteLLM's custom loggers and its s3 / gcs
bucket loggers write it.

Read in BerriAI/litellm (2025-2026 main): ``litellm/types/utils.py`` (``StandardLoggingPayload``,
``StandardLoggingMetadata`` / ``StandardLoggingUserAPIKeyMetadata``, ``StandardLoggingHiddenParams``),
``litellm/litellm_core_utils/litellm_logging.py`` (``get_standard_logging_object_payload``: ``messages`` are the
call's messages as the caller gave them, in OpenAI format whatever the provider; ``model_parameters`` are the
call's ``optional_params`` filtered to OpenAI's parameter names by ``ModelParamHelper``, so ``tools`` and
``tool_choice`` are there, in the provider's format once LiteLLM mapped them), and
``litellm/llms/anthropic/chat/transformation.py`` (``calculate_usage``), whose counting changed over versions:

- today: ``prompt_tokens`` = Anthropic's input + cache writes + cache reads, with
  ``prompt_tokens_details.cache_creation_tokens`` (and ``text_tokens``, the uncached input) logged;
- LiteLLM 1.5x-1.7x: ``prompt_tokens`` = input + cache reads (writes not added), no ``cache_creation_tokens``
  in the details (earlier 2024 releases added both: such a log cannot be told from these by its fields, and is
  read as the later one).

The record: the request body rebuilt from ``messages``, the model and ``model_parameters``: for an Anthropic
call (``custom_llm_provider`` anthropic, or a Claude model through Bedrock / Vertex) the Anthropic Messages body
LiteLLM sent (system messages to ``system``, tool calls to ``tool_use`` blocks, ...: :mod:`._chat`), so that
cachectl parses it with Anthropic's caching rules; for the others the OpenAI Chat body as logged (Responses calls:
``{model, input}``). The usage in the provider's own convention (Anthropic's additive counters with the cache
reads and writes taken out of ``prompt_tokens``, or OpenAI's ``prompt_tokens`` with ``cached_tokens``), counted
once. ``startTime`` (epoch seconds) is the timestamp; the keys are ``request_id`` (``id``), ``session``
(``trace_id``: LiteLLM's ``litellm_trace_id``, which a client's ``litellm_session_id`` sets), ``user``
(``metadata.user_api_key_user_id``), ``tenant`` (``metadata.user_api_key_team_id``), ``api_key``
(``user_api_key_alias``, else ``user_api_key_hash``), ``end_user``.

Calls LiteLLM answered from its own response cache (``cache_hit``) never reached the provider and are left out,
and so are calls that carry no chat (embeddings, images, ...). The body is assembled, not taken verbatim from the
line, so ``fix`` cannot write an edit back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ...errors import InputError
from ._chat import anthropic_body, anthropic_usage, counter, is_claude, obj, openai_usage, response_text
from .base import Head, LogShape, Record, Verdict, json_value, text_of

SHAPE = LogShape(
    "litellm", "LiteLLM StandardLoggingPayload (custom loggers, s3 / gcs bucket logs)",
    "a JSON object per line with `call_type`, `startTime` and `messages` or `response` (LiteLLM's logging payload)",
    "the request rebuilt from `messages`, the model and `model_parameters` (an Anthropic Messages body for "
    "Anthropic calls), `response.usage` with cache reads and writes in the provider's convention, `startTime`, "
    "and `trace_id`, the key's user, team, alias and the end user as the keys `session`, `user`, `tenant`, "
    "`api_key`, `end_user`; calls served from LiteLLM's own cache are left out",
    ("prompt-cost", "report", "diff-tokens", "simulate-prefix", "semantic-probe dupes"),
    "fixtures/logs/litellm_payloads.jsonl",
    "https://docs.litellm.ai/docs/proxy/logging_spec ; BerriAI/litellm litellm/types/utils.py StandardLoggingPayload",
)

#: the call types that carry a chat (the rest: embeddings, images, audio, files, batches, ...)
CHAT_CALLS = frozenset({"completion", "acompletion", "text_completion", "atext_completion", "anthropic_messages",
                        "aanthropic_messages", "responses", "aresponses", "pass_through_endpoint"})
_RESPONSES = frozenset({"responses", "aresponses"})
_PREFIXES = ("anthropic/", "openai/", "azure/", "text-completion-openai/")


def _is_payload(value: Any) -> bool:
    return isinstance(value, dict) and "call_type" in value and "startTime" in value


def detect(head: Head) -> Verdict:
    first = head.first
    if not _is_payload(first):
        return Verdict.no()
    if "messages" in first or "response" in first:
        return Verdict.yes()
    return Verdict.almost("has neither `messages` nor `response`")


def _model(payload: dict) -> str | None:
    hidden = obj(payload, "hidden_params")
    model = hidden.get("litellm_model_name") or payload.get("model")
    if not isinstance(model, str) or not model:
        return None
    for prefix in _PREFIXES:  # LiteLLM's routing prefix: the provider gets the name after it
        if model.startswith(prefix):
            return model[len(prefix):]
    return model


def _messages(payload: dict) -> list:
    messages = payload.get("messages")
    if isinstance(messages, dict) and isinstance(messages.get("messages"), list):
        messages = messages["messages"]
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    return messages if isinstance(messages, list) else []


def _body(payload: dict, model: str | None, claude: bool, where: dict | None = None) -> dict | None:
    messages = _messages(payload)
    params = obj(payload, "model_parameters")
    params = {k: v for k, v in params.items() if v is not None}
    if not messages:
        return None
    if text_of(payload, "call_type") in _RESPONSES:
        return {"model": model, "input": payload.get("messages"), **params}
    if claude:
        nested = isinstance(payload.get("messages"), dict)   # ({"messages": [...]}: LiteLLM's pass-through routes)
        return anthropic_body(model, messages, params.get("tools"), params,
                              path="messages.messages" if nested else "messages", where=where)
    return {"model": model, "messages": messages, **params}


def _usage_object(payload: dict) -> tuple[Any, str]:
    response = payload.get("response")
    if isinstance(response, dict) and response.get("usage") is not None:
        return response["usage"], "response.usage."
    for where in ("metadata", "hidden_params"):
        holder = payload.get(where)
        if isinstance(holder, dict) and isinstance(holder.get("usage_object"), dict):
            return holder["usage_object"], f"{where}.usage_object."
    return None, ""


def _counter(obj: dict, key: str, path: str, source: str, line: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    return counter(value, source=source, line=line, field=f"{path}{key}")


def usage_of(u: Any, claude: bool, path: str, source: str, line: int) -> dict:
    """LiteLLM's usage object (OpenAI Chat shape, Anthropic's cache counters beside it) in the provider's own
    convention; a Responses or Anthropic-native usage (``input_tokens``) as that API reports it."""
    if not isinstance(u, dict):
        raise InputError("expected a usage object", source=source, line=line, field=path.rstrip("."))
    details = obj(u, "prompt_tokens_details")
    dpath = f"{path}prompt_tokens_details."

    def c(obj: dict, key: str, p: str = path) -> int | None:
        return _counter(obj, key, p, source, line)

    if u.get("prompt_tokens") is None and u.get("input_tokens") is not None:
        inp, out = c(u, "input_tokens") or 0, c(u, "output_tokens") or 0
        if claude:  # LiteLLM's /v1/messages route logs Anthropic's own counters
            split = obj(u, "cache_creation")
            return anthropic_usage(inp, c(u, "cache_creation_input_tokens") or 0,
                                   c(u, "cache_read_input_tokens") or 0, out,
                                   split.get("ephemeral_5m_input_tokens"), split.get("ephemeral_1h_input_tokens"))
        idet = obj(u, "input_tokens_details")
        cached = c(idet, "cached_tokens", f"{path}input_tokens_details.") or 0
        return {"input_tokens": inp, "output_tokens": out, "input_tokens_details": {"cached_tokens": cached}}
    prompt = c(u, "prompt_tokens")
    if prompt is None:
        raise InputError("usage has no prompt_tokens", source=source, line=line, field=f"{path}prompt_tokens")
    out = c(u, "completion_tokens") or 0
    read = c(u, "cache_read_input_tokens")
    read = read if read is not None else (c(details, "cached_tokens", dpath) or 0)
    write = c(u, "cache_creation_input_tokens")
    logged_write = c(details, "cache_creation_tokens", dpath)
    write = write if write is not None else (logged_write or 0)
    if not claude:
        if read + write > prompt:
            raise InputError(f"cached ({read}) + written ({write}) tokens exceed the {prompt} prompt tokens",
                             source=source, line=line, field=f"{dpath}cached_tokens")
        return openai_usage(prompt, out, read, write)
    # today's LiteLLM counts writes in prompt_tokens and says so with cache_creation_tokens; 1.5x-1.7x did not
    uncached = prompt - read - (write if logged_write is not None else 0)
    if uncached < 0:
        raise InputError(f"prompt_tokens ({prompt}) is less than the cache reads ({read}) and writes ({write}) "
                         f"LiteLLM counts in it", source=source, line=line, field=f"{path}prompt_tokens")
    split = obj(details, "cache_creation_token_details")
    return anthropic_usage(uncached, write, read, out, split.get("ephemeral_5m_input_tokens"),
                           split.get("ephemeral_1h_input_tokens"))


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def record_of(payload: dict, line: int, source: str) -> Record | None:
    if payload.get("cache_hit") is True or text_of(payload, "call_type") not in CHAT_CALLS:
        return None
    model = _model(payload)
    claude = is_claude(model, payload.get("custom_llm_provider"))
    body = _body(payload, model, claude, {"source": source, "line": line})
    missing: list[str] = []
    if body is None:
        missing.append("no messages (LiteLLM logged none: turn_off_message_logging?)")
    raw, path = _usage_object(payload)
    usage = usage_of(raw, claude, path, source, line) if raw is not None else None
    if usage is None:
        missing.append("no usage (a failed call, or none logged)")
    meta = obj(payload, "metadata")
    keys = {
        "request_id": _str(payload.get("id")),
        "session": _str(payload.get("trace_id")),
        "user": _str(meta.get("user_api_key_user_id")),
        "tenant": _str(meta.get("user_api_key_team_id")),
        "api_key": _str(meta.get("user_api_key_alias")) or _str(meta.get("user_api_key_hash")),
        "end_user": _str(payload.get("end_user")) or _str(meta.get("user_api_key_end_user_id")),
    }
    out = usage.get("output_tokens", usage.get("completion_tokens")) if usage else None
    return Record(SHAPE.name, source, line, body=body, usage=usage, timestamp=payload.get("startTime"),
                  model=model, keys={k: v for k, v in keys.items() if v is not None},
                  output_tokens=out if isinstance(out, int) else None, missing=tuple(missing),
                  response=response_text(payload.get("response")))


def read(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[Record]:
    for n, raw in lines:
        value = json_value(raw)
        if value is None:
            raise InputError("invalid JSON: expected one LiteLLM StandardLoggingPayload object per line",
                             source=source, line=n)
        if not _is_payload(value):
            raise InputError("not a LiteLLM StandardLoggingPayload (no `call_type` and `startTime`)",
                             source=source, line=n)
        record = record_of(value, n, source)
        if record is not None:
            yield record
