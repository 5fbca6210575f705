"""Logged usage counters, as the providers report them, into one record.

Anthropic's counters are additive (``input_tokens`` excludes cache reads and writes); OpenAI's are inclusive
(``prompt_tokens`` / Responses ``input_tokens`` include ``cached_tokens`` and ``cache_write_tokens``). Every
counter a usage object carries must be one this reader knows: an unknown one (``cache_write``, a provider's
new field) is an error naming it, never dropped, since dropping it would price the request wrongly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import MalformedInput

#: known counters per convention; values: None = a token counter read here, "info" = known, not a token
#: counter that changes the bill of input tokens (listed so that nothing is silently dropped)
ANTHROPIC_KEYS: dict[str, str | None] = {
    "input_tokens": None, "output_tokens": None, "cache_creation_input_tokens": None,
    "cache_read_input_tokens": None, "cache_creation": None, "server_tool_use": "info", "service_tier": "info",
    "inference_geo": "info",
}
ANTHROPIC_SPLIT_KEYS = ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
OPENAI_CHAT_KEYS: dict[str, str | None] = {
    "prompt_tokens": None, "completion_tokens": None, "total_tokens": "info", "prompt_tokens_details": None,
    "completion_tokens_details": "info",
    # DeepSeek's OpenAI-compatible counters: hit + miss = prompt_tokens (mapped: hits are cached tokens)
    "prompt_cache_hit_tokens": None, "prompt_cache_miss_tokens": None,
}
OPENAI_RESPONSES_KEYS: dict[str, str | None] = {
    "input_tokens": None, "output_tokens": None, "total_tokens": "info", "input_tokens_details": None,
    "output_tokens_details": "info",
}
OPENAI_DETAIL_KEYS = ("cached_tokens", "cache_write_tokens", "audio_tokens", "text_tokens", "image_tokens")
_ANY_USAGE = set(ANTHROPIC_KEYS) | set(OPENAI_CHAT_KEYS) | set(OPENAI_RESPONSES_KEYS)
#: the largest token counter a usage may report (a 32-bit int): a billion tokens and more in one request is a logging
#: error, and a counter past 64 bits would reach the JSON output (and a replay that models the difference, memory)
MAX_TOKEN_COUNT = 2**31 - 1


@dataclass(frozen=True)
class LoggedUsage:
    """One response's counters in one convention: ``input_tokens`` are the ordinary (uncached) ones."""

    style: str                    # anthropic | openai-chat | openai-responses
    model: str | None
    input_tokens: int
    cache_write_tokens: int
    cache_read_tokens: int
    output_tokens: int
    write_5m_tokens: int
    write_1h_tokens: int
    #: False when writes were reported without the 5m/1h split (priced as 5m, and said so)
    split_known: bool = True
    #: the counters as the provider reported them
    reported: dict = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_write_tokens + self.cache_read_tokens


def _count(obj: dict, key: str, loc: dict, path: str, *, required: bool = False) -> int:
    value = obj.get(key)
    if value is None:
        if required:
            raise MalformedInput("missing token counter", field=f"{path}{key}", **loc)
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedInput(f"expected an integer token count, got {value!r}", field=f"{path}{key}", **loc)
    if value < 0:
        raise MalformedInput(f"negative token count {value}", field=f"{path}{key}", **loc)
    if value > MAX_TOKEN_COUNT:
        raise MalformedInput(f"a token count of {value:.3g} is past the {MAX_TOKEN_COUNT:,} any request can hold",
                             field=f"{path}{key}", **loc)
    return value


def _check_known(obj: dict, known, loc: dict, path: str, what: str) -> None:
    for key in obj:
        if key not in known:
            raise MalformedInput(f"unknown {what} {key!r}: not priced, so the bill would be wrong (known: "
                             f"{', '.join(known)})", field=f"{path}{key}", **loc)


def find_usage(value: Any) -> tuple[dict | None, str, dict]:
    """``(usage, path_prefix, record)``: the usage object of a response line, a wrapper, or a bare usage."""
    if not isinstance(value, dict):
        return None, "", {}
    rec = value
    prefix = ""
    for key in ("response", "body"):  # log wrappers and OpenAI batch output lines
        inner = rec.get(key)
        if isinstance(inner, dict) and ("usage" in inner or isinstance(inner.get("body"), dict)):
            rec = {**{k: v for k, v in rec.items() if k != key}, **inner}
            prefix += f"{key}."
            inner2 = inner.get("body")
            if isinstance(inner2, dict) and "usage" in inner2:  # batch output: response.body.usage
                rec = {**rec, **inner2}
                prefix += "body."
    usage = rec.get("usage")
    if usage is None and _ANY_USAGE & set(rec):
        return rec, "", rec
    return (usage if isinstance(usage, dict) else None), prefix + "usage.", rec


def record_model(value: Any, rec: dict) -> tuple[Any, str]:
    """``(model, field)`` of a logged response line (``rec`` from :func:`find_usage`): its own model, else the
    request body's in a ``{timestamp, body, usage}`` wrapper; ``(None, "model")`` when it names none."""
    model = rec.get("model")
    body = value.get("body") if isinstance(value, dict) else None
    if not model and isinstance(body, dict) and body.get("model"):
        return body["model"], "body.model"
    return model, "model"


def parse_usage(usage: dict, *, source: str, line: int | None, path: str = "usage.", model: str | None = None,
                style_of: Callable[[str], str] | None = None) -> LoggedUsage:
    """Read one usage object. ``style_of(model)`` settles a bare ``input_tokens``/``output_tokens`` pair
    (Anthropic's additive or OpenAI Responses' inclusive counters) from the model's provider."""
    loc: dict[str, Any] = {"source": source, "line": line}
    if not isinstance(usage, dict):
        raise MalformedInput("expected a usage object", field=path.rstrip(".") or None, **loc)
    keys = set(usage)
    if "prompt_tokens" in keys:
        style = "openai-chat"
    elif keys & {"cache_creation_input_tokens", "cache_read_input_tokens", "cache_creation"}:
        style = "anthropic"
    elif "input_tokens_details" in keys:
        style = "openai-responses"
    elif "input_tokens" in keys:
        hint = style_of(model) if (style_of and model) else None
        style = "openai-responses" if hint == "openai" else "anthropic"
    else:
        unknown = sorted(keys - _ANY_USAGE)
        if unknown:
            raise MalformedInput(f"unknown usage counter {unknown[0]!r} and no input or prompt token counter",
                             field=f"{path}{unknown[0]}", **loc)
        raise MalformedInput("usage has no input or prompt token counter", field=path.rstrip(".") or None, **loc)
    if style == "anthropic":
        _check_known(usage, ANTHROPIC_KEYS, loc, path, "usage counter")
        inp = _count(usage, "input_tokens", loc, path, required=True)
        created = _count(usage, "cache_creation_input_tokens", loc, path)
        read = _count(usage, "cache_read_input_tokens", loc, path)
        out = _count(usage, "output_tokens", loc, path)
        split = usage.get("cache_creation")
        if isinstance(split, dict):
            _check_known(split, ANTHROPIC_SPLIT_KEYS, loc, f"{path}cache_creation.", "cache_creation counter")
            w5 = _count(split, "ephemeral_5m_input_tokens", loc, f"{path}cache_creation.")
            w1 = _count(split, "ephemeral_1h_input_tokens", loc, f"{path}cache_creation.")
            if w5 + w1 != created:
                raise MalformedInput(f"cache_creation splits into {w5} + {w1} tokens but cache_creation_input_tokens "
                                 f"is {created}", field=f"{path}cache_creation", **loc)
            known = True
        elif split is not None:
            raise MalformedInput("expected an object", field=f"{path}cache_creation", **loc)
        else:
            w5, w1, known = created, 0, created == 0
        reported = {"input_tokens": inp, "cache_creation_input_tokens": created, "cache_read_input_tokens": read,
                    "output_tokens": out}
        return LoggedUsage(style, model, inp, created, read, out, w5, w1, known, reported)
    if style == "openai-chat":
        _check_known(usage, OPENAI_CHAT_KEYS, loc, path, "usage counter")
        prompt = _count(usage, "prompt_tokens", loc, path, required=True)
        out = _count(usage, "completion_tokens", loc, path)
        dkey = "prompt_tokens_details"
    else:
        _check_known(usage, OPENAI_RESPONSES_KEYS, loc, path, "usage counter")
        prompt = _count(usage, "input_tokens", loc, path, required=True)
        out = _count(usage, "output_tokens", loc, path)
        dkey = "input_tokens_details"
    details = usage.get(dkey) or {}
    dpath = f"{path}{dkey}."
    if not isinstance(details, dict):
        raise MalformedInput("expected an object", field=dpath.rstrip("."), **loc)
    _check_known(details, OPENAI_DETAIL_KEYS, loc, dpath, "token detail")
    cached = _count(details, "cached_tokens", loc, dpath)
    writes = _count(details, "cache_write_tokens", loc, dpath)
    if "prompt_cache_hit_tokens" in usage:  # DeepSeek
        hit = _count(usage, "prompt_cache_hit_tokens", loc, path)
        miss = _count(usage, "prompt_cache_miss_tokens", loc, path)
        if "prompt_cache_miss_tokens" in usage and hit + miss != prompt:
            raise MalformedInput(f"prompt_cache_hit_tokens ({hit}) + prompt_cache_miss_tokens ({miss}) is not "
                             f"prompt_tokens ({prompt})", field=f"{path}prompt_cache_hit_tokens", **loc)
        if "cached_tokens" in details and cached != hit:
            raise MalformedInput(f"cached_tokens ({cached}) disagrees with prompt_cache_hit_tokens ({hit})",
                             field=f"{dpath}cached_tokens", **loc)
        cached = hit
    if cached + writes > prompt:
        raise MalformedInput(f"cached ({cached}) + written ({writes}) tokens exceed the {prompt} prompt tokens",
                         field=dpath + "cached_tokens", **loc)
    reported = {k: v for k, v in usage.items() if k != "total_tokens"}
    return LoggedUsage(style, model, prompt - cached - writes, writes, cached, out, writes, 0, True, reported)


# ------------------------------------------------------------------------------- served cached tokens

#: the fields of SGLang's ``meta_info`` read here (the rest: ids, latencies, finish reasons, not counters)
SGLANG_META_COUNTERS = ("prompt_tokens", "cached_tokens", "completion_tokens")


@dataclass(frozen=True)
class ServedCache:
    """The prompt tokens a self-hosted server reports it served from its prefix cache for one request.

    vLLM's OpenAI server: ``usage.prompt_tokens_details.cached_tokens`` (with ``--enable-prompt-tokens-details``;
    without it ``prompt_tokens_details`` is null, and nothing is known); SGLang: ``meta_info.cached_tokens``
    (and, with ``--enable-cache-report``, the same OpenAI field).
    """

    cached_tokens: int
    #: the prompt length the server counted (None when the line does not say): another length than the
    #: trace's means the server tokenized another prompt
    prompt_tokens: int | None
    field: str                    # where it was read, e.g. usage.prompt_tokens_details.cached_tokens


def served_cache(value: Any, *, source: str, line: int | None) -> ServedCache | None:
    """The served cached tokens a trace or log line carries beside its request, or None: a ``usage`` object
    (``{tokens, usage}``, the ``{timestamp, body, usage}`` wrapper, or ``response.usage``) in OpenAI's
    inclusive convention, or SGLang's ``meta_info``. A usage object without a cached count (vLLM without
    ``--enable-prompt-tokens-details``) says nothing about the cache: None. The counters are checked as
    :func:`parse_usage` checks them (unknown ones refused)."""
    if not isinstance(value, dict):
        return None
    for prefix, holder in (("", value), ("response.", value.get("response"))):
        if not isinstance(holder, dict):
            continue
        usage = holder.get("usage")
        if usage is not None:
            found = _served_from_usage(usage, source=source, line=line, path=f"{prefix}usage.")
            if found is not None:
                return found
        meta = holder.get("meta_info")
        if meta is not None:
            return _served_from_meta(meta, source=source, line=line, path=f"{prefix}meta_info.")
    return None


def _served_from_usage(usage: Any, *, source: str, line: int | None, path: str) -> ServedCache | None:
    loc: dict[str, Any] = {"source": source, "line": line}
    if not isinstance(usage, dict):
        raise MalformedInput("expected a usage object", field=path.rstrip("."), **loc)
    details_key = "prompt_tokens_details" if "prompt_tokens_details" in usage else "input_tokens_details"
    details = usage.get(details_key)
    if "prompt_tokens" in usage or "input_tokens" in usage:
        counted = parse_usage(usage, source=source, line=line, path=path)
        if not isinstance(details, dict) or "cached_tokens" not in details:
            if counted.style != "anthropic" or "cache_read_input_tokens" not in usage:
                return None
            return ServedCache(counted.cache_read_tokens, counted.prompt_tokens, f"{path}cache_read_input_tokens")
        return ServedCache(counted.cache_read_tokens, counted.prompt_tokens, f"{path}{details_key}.cached_tokens")
    # a token-trace line's bare {"prompt_tokens_details": {"cached_tokens": N}}
    _check_known(usage, OPENAI_CHAT_KEYS, loc, path, "usage counter")
    if details is None:
        return None
    dpath = f"{path}{details_key}."
    if not isinstance(details, dict):
        raise MalformedInput("expected an object", field=dpath.rstrip("."), **loc)
    _check_known(details, OPENAI_DETAIL_KEYS, loc, dpath, "token detail")
    if "cached_tokens" not in details or details["cached_tokens"] is None:
        return None
    return ServedCache(_count(details, "cached_tokens", loc, dpath), None, f"{dpath}cached_tokens")


def _served_from_meta(meta: Any, *, source: str, line: int | None, path: str) -> ServedCache | None:
    loc: dict[str, Any] = {"source": source, "line": line}
    if not isinstance(meta, dict):
        raise MalformedInput("expected an object (SGLang's meta_info)", field=path.rstrip("."), **loc)
    if meta.get("cached_tokens") is None:
        return None
    cached = _count(meta, "cached_tokens", loc, path)
    prompt = _count(meta, "prompt_tokens", loc, path) if meta.get("prompt_tokens") is not None else None
    if prompt is not None and cached > prompt:
        raise MalformedInput(f"cached_tokens ({cached}) exceed the {prompt} prompt tokens", field=f"{path}cached_tokens",
                         **loc)
    return ServedCache(cached, prompt, f"{path}cached_tokens")
