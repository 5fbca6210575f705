"""What provider prompt caching costs and saves.

Three entry points, one result type (:class:`CostReport`):

- :func:`audit_usage` prices logged responses exactly, from the usage counters the API reported
  (Anthropic's additive counters, OpenAI's inclusive ones).
- :func:`simulate_requests` replays a timed request log through a model of the provider's cache and
  predicts the counters each request would report: breakpoints, minimum cacheable length, TTL expiry and
  refresh, the 20-position lookback, the tools -> system -> messages hierarchy (a prefix hash chain),
  per-model caches; OpenAI-style automatic caching for models that have it.
- :func:`what_if` builds a synthetic log (a fixed prefix, a varying suffix, N calls every D seconds).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..errors import InputError, UsageError
from .pricing import ModelPrice, PriceTable, Usage, cost_usd, uncached_cost_usd

SCHEMA_VERSION = 1


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True, kw_only=True)
class RequestCost:
    index: int
    line: int | None
    model: str
    input_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens: int
    cache_creation: dict
    cost_usd: float
    uncached_cost_usd: float
    timestamp: float | None = None
    #: the counters in the provider's own convention (OpenAI: prompt_tokens includes cached_tokens)
    usage_reported: dict = field(default_factory=dict)
    note: str | None = None


@dataclass(frozen=True, kw_only=True)
class CostReport:
    schema_version: int = SCHEMA_VERSION
    mode: str                      # audit | simulate | what-if
    estimate: bool                 # token counts came from a tokenizer or count_tokens, not a bill
    token_source: str
    requests: tuple[RequestCost, ...]
    total_cost_usd: float
    uncached_cost_usd: float
    savings_usd: float
    hit_rate: float | None         # cache-read share of all prompt tokens
    totals: dict
    models: tuple[str, ...]
    notes: tuple[str, ...] = ()
    break_even_reads: int | None = None


def _report(mode: str, rows: list[RequestCost], *, estimate: bool, token_source: str,
            notes: Iterable[str] = (), break_even: int | None = None) -> CostReport:
    totals = {k: sum(getattr(r, k) for r in rows) for k in
              ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")}
    totals["ephemeral_5m_input_tokens"] = sum(r.cache_creation.get("ephemeral_5m_input_tokens", 0) for r in rows)
    totals["ephemeral_1h_input_tokens"] = sum(r.cache_creation.get("ephemeral_1h_input_tokens", 0) for r in rows)
    prompt = totals["input_tokens"] + totals["cache_creation_input_tokens"] + totals["cache_read_input_tokens"]
    total = sum(r.cost_usd for r in rows)
    uncached = sum(r.uncached_cost_usd for r in rows)
    return CostReport(mode=mode, estimate=estimate, token_source=token_source, requests=tuple(rows),
                      total_cost_usd=round(total, 10), uncached_cost_usd=round(uncached, 10),
                      savings_usd=round(uncached - total, 10),
                      hit_rate=(totals["cache_read_input_tokens"] / prompt) if prompt else None, totals=totals,
                      models=tuple(dict.fromkeys(r.model for r in rows)), notes=tuple(dict.fromkeys(notes)),
                      break_even_reads=break_even)


def _row(index: int, line: int | None, price: ModelPrice, usage: Usage, *, timestamp: float | None = None,
         reported: dict | None = None, note: str | None = None) -> RequestCost:
    return RequestCost(
        index=index, line=line, model=price.model, input_tokens=usage.input_tokens,
        cache_creation_input_tokens=usage.cache_creation_input_tokens,
        cache_read_input_tokens=usage.cache_read_input_tokens, output_tokens=usage.output_tokens,
        cache_creation={"ephemeral_5m_input_tokens": usage.cache_write_5m_tokens,
                        "ephemeral_1h_input_tokens": usage.cache_write_1h_tokens},
        cost_usd=round(cost_usd(price, usage), 10), uncached_cost_usd=round(uncached_cost_usd(price, usage), 10),
        timestamp=timestamp, usage_reported=reported or {}, note=note)


def _openai_reported(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cache_read_input_tokens,
                                      "cache_write_tokens": usage.cache_creation_input_tokens}}


# ----------------------------------------------------------------------------------------------- audit


def _count(obj: dict, key: str, where: dict, path: str, *, default: int | None = 0) -> int:
    value = obj.get(key)
    if value is None:
        if default is None:
            raise InputError("missing token counter", field=f"{path}{key}", **where)
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"expected an integer token count, got {value!r}", field=f"{path}{key}", **where)
    if value < 0:
        raise InputError(f"negative token count {value}", field=f"{path}{key}", **where)
    return value


_USAGE_KEYS = {"input_tokens", "output_tokens", "prompt_tokens", "completion_tokens", "cache_read_input_tokens",
               "cache_creation_input_tokens"}


def usage_from_record(value: Any, *, default_model: str | None, table: PriceTable, source: str,
                      line: int | None) -> tuple[ModelPrice, Usage, dict]:
    """Read one logged response (Anthropic, OpenAI chat or Responses, or a bare usage object)."""
    where = {"source": source, "line": line}
    if not isinstance(value, dict):
        raise InputError("expected a JSON object (a response or its usage)", **where)
    rec = value
    for key in ("response", "body"):  # log wrappers and OpenAI batch output lines
        inner = rec.get(key)
        if isinstance(inner, dict) and ("usage" in inner or "body" in inner):
            rec = {**{k: v for k, v in rec.items() if k != key}, **inner}
    usage = rec.get("usage")
    path = "usage."
    if usage is None and _USAGE_KEYS & set(rec):
        usage, path = rec, ""
    if not isinstance(usage, dict):
        if "messages" in rec or "blocks" in rec:
            raise InputError("this is a request, not a response: --usage audits logged responses; pass "
                             "request logs as REQUESTS.jsonl to simulate them", **where)
        raise InputError("neither a response nor a usage object (no 'usage' field)", **where)
    model_name = rec.get("model") or default_model
    if not model_name:
        raise InputError("no model on this line; pass --model", **where)
    price = table.lookup(str(model_name))
    anthropic_keys = {"cache_creation_input_tokens", "cache_read_input_tokens", "cache_creation"} & set(usage)
    if anthropic_keys or ("input_tokens" in usage and "input_tokens_details" not in usage
                          and price.usage_style == "anthropic"):
        inp = _count(usage, "input_tokens", where, path, default=None)
        created = _count(usage, "cache_creation_input_tokens", where, path)
        read = _count(usage, "cache_read_input_tokens", where, path)
        out = _count(usage, "output_tokens", where, path)
        split = usage.get("cache_creation")
        if isinstance(split, dict):
            w5 = _count(split, "ephemeral_5m_input_tokens", where, f"{path}cache_creation.")
            w1 = _count(split, "ephemeral_1h_input_tokens", where, f"{path}cache_creation.")
            if w5 + w1 != created:
                raise InputError(f"cache_creation splits into {w5} + {w1} tokens but cache_creation_input_tokens "
                                 f"is {created}", field=f"{path}cache_creation", **where)
            assumed = False
        else:
            w5, w1, assumed = created, 0, created > 0
        u = Usage(inp, created, read, out, w5, w1)
        reported = {"input_tokens": inp, "cache_creation_input_tokens": created, "cache_read_input_tokens": read,
                    "output_tokens": out}
        return price, u, {"reported": reported, "assumed_5m": assumed}
    if "prompt_tokens" in usage:  # chat completions: prompt_tokens INCLUDES cached and written tokens
        prompt = _count(usage, "prompt_tokens", where, path, default=None)
        details = usage.get("prompt_tokens_details") or {}
        dpath = f"{path}prompt_tokens_details."
        out = _count(usage, "completion_tokens", where, path)
    elif "input_tokens" in usage:  # Responses API: input_tokens includes cached_tokens
        prompt = _count(usage, "input_tokens", where, path, default=None)
        details = usage.get("input_tokens_details") or {}
        dpath = f"{path}input_tokens_details."
        out = _count(usage, "output_tokens", where, path)
    else:
        raise InputError("usage has no input or prompt token counter", field=path.rstrip(".") or None, **where)
    if not isinstance(details, dict):
        raise InputError("expected an object", field=dpath.rstrip("."), **where)
    cached = _count(details, "cached_tokens", where, dpath)
    writes = _count(details, "cache_write_tokens", where, dpath)
    if cached + writes > prompt:
        raise InputError(f"cached ({cached}) + written ({writes}) tokens exceed the {prompt} prompt tokens",
                         field=dpath + "cached_tokens", **where)
    u = Usage(prompt - cached - writes, writes, cached, out, writes, 0)
    return price, u, {"reported": {k: v for k, v in usage.items() if k != "total_tokens"}, "assumed_5m": False}


def audit_usage(records: Iterable[tuple[int, Any]], *, source: str, table: PriceTable,
                default_model: str | None = None) -> CostReport:
    """Price logged responses exactly from their usage counters."""
    rows: list[RequestCost] = []
    notes: list[str] = []
    for index, (line, value) in enumerate(records):
        price, usage, info = usage_from_record(value, default_model=default_model, table=table, source=source,
                                               line=line)
        if info["assumed_5m"]:
            notes.append("some lines report cache writes without the cache_creation split: priced as 5-minute "
                         "writes (1-hour writes cost 2x base input, not 1.25x)")
        rows.append(_row(index, line, price, usage, reported=info["reported"]))
    return _report("audit", rows, estimate=False, token_source="usage counters", notes=notes)


# --------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Block:
    """One lookback position: content identity, token count, and its cache_control TTL if it has one."""

    identity: str
    tokens: int | None
    ttl: str | None = None
    segment: str = "messages"
    text: str = ""
    path: str = ""


@dataclass(frozen=True)
class Request:
    line: int | None
    model: str
    timestamp: float | None
    blocks: tuple[Block, ...]
    output_tokens: int
    auto_ttl: str | None = None   # top-level cache_control (automatic caching)
    body: dict | None = None      # the Anthropic body, for count_tokens
    kind: str = "layout"          # layout | anthropic | openai
    output_known: bool = True


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")


def parse_duration(text: str) -> float:
    """``90``, ``30s``, ``2m``, ``1h`` -> seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise UsageError(f"cannot read duration {text!r} (examples: 30s, 2m, 1h)")
    n = float(m.group(1))
    return n * {"ms": 0.001, "s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]


def _timestamp(value: Any, where: dict) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise InputError("expected seconds or an ISO 8601 time", field="timestamp", **where)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    raise InputError(f"cannot read timestamp {value!r} (seconds, or ISO 8601)", field="timestamp", **where)


def _ttl_of(cache_control: Any, where: dict, path: str) -> str | None:
    if cache_control is None:
        return None
    if not isinstance(cache_control, dict) or cache_control.get("type", "ephemeral") != "ephemeral":
        raise InputError("expected {\"type\": \"ephemeral\", \"ttl\": \"5m\"|\"1h\"}", field=path, **where)
    ttl = cache_control.get("ttl", "5m")
    if ttl not in ("5m", "1h"):
        raise InputError(f"cache_control ttl must be '5m' or '1h', got {ttl!r}", field=f"{path}.ttl", **where)
    return ttl


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _strip_cc(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k != "cache_control"}


def _block_text(block: dict) -> str:
    btype = block.get("type")
    if btype == "text":
        return str(block.get("text", ""))
    if btype == "thinking":
        return str(block.get("thinking", ""))
    if btype == "tool_use":
        return json.dumps({"name": block.get("name"), "input": block.get("input", {})}, ensure_ascii=False)
    if btype == "tool_result":
        content = block.get("content", "")
        if isinstance(content, list):
            return "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        return str(content)
    return json.dumps(_strip_cc(block), ensure_ascii=False)


def request_from_value(value: Any, *, line: int | None, source: str, default_model: str | None) -> Request:
    where = {"source": source, "line": line}
    if not isinstance(value, dict):
        raise InputError("expected a JSON object: a token layout or a request body", **where)
    body = value.get("body") if isinstance(value.get("body"), dict) else value
    model = body.get("model") or value.get("model") or default_model
    if not model:
        raise InputError("no model on this line; pass --model", **where)
    ts = _timestamp(value.get("timestamp", body.get("timestamp")), where)
    output = value.get("output_tokens", body.get("output_tokens"))
    output_known = output is not None
    if output is None:
        output = 0  # a request does not say how long its answer was: noted in the report
    if isinstance(output, bool) or not isinstance(output, int) or output < 0:
        raise InputError(f"expected a non-negative integer, got {output!r}", field="output_tokens", **where)
    if "blocks" in body:
        req = _layout(body, str(model), ts, output, where)
    elif "messages" in body:
        from ..inputs import _detect_chat_flavour

        if _detect_chat_flavour(body) == "anthropic" or str(model).startswith("claude"):
            req = _anthropic_request(body, str(model), ts, output, where)
        else:
            req = _openai_request(body, str(model), ts, output, where)
    else:
        req = None
    if req is not None:
        return req if output_known else replace(req, output_known=False)
    if "usage" in value:
        raise InputError("this is a response, not a request: pass response logs with --usage", **where)
    raise InputError("neither a request body (messages) nor a token layout (blocks)", **where)


def _layout(body: dict, model: str, ts: float | None, output: int, where: dict) -> Request:
    blocks_in = body["blocks"]
    if not isinstance(blocks_in, list) or not blocks_in:
        raise InputError("expected a non-empty list of blocks", field="blocks", **where)
    blocks = []
    for i, b in enumerate(blocks_in):
        path = f"blocks[{i}]"
        if not isinstance(b, dict):
            raise InputError("expected a block object", field=path, **where)
        if "id" not in b:
            raise InputError("missing 'id' (blocks with equal ids are the same content)", field=f"{path}.id", **where)
        tokens = b.get("tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise InputError(f"expected an integer token count, got {tokens!r}", field=f"{path}.tokens", **where)
        if tokens < 0:
            raise InputError(f"negative token count {tokens}", field=f"{path}.tokens", **where)
        blocks.append(Block(identity="id:" + _canon(b["id"]), tokens=tokens,
                            ttl=_ttl_of(b.get("cache_control"), where, f"{path}.cache_control"),
                            segment=str(b.get("segment", "messages")), path=path))
    return Request(line=where["line"], model=model, timestamp=ts, blocks=tuple(blocks), output_tokens=output,
                   auto_ttl=_ttl_of(body.get("cache_control"), where, "cache_control"), kind="layout")


def _anthropic_request(body: dict, model: str, ts: float | None, output: int, where: dict) -> Request:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise InputError("expected a list of tools", field="tools", **where)
    system = body.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}] if system else []
    if system is not None and not isinstance(system, list):
        raise InputError("expected a string or a list of text blocks", field="system", **where)
    blocks: list[Block] = []
    for segment, items, text_of in (("tools", tools, lambda t: json.dumps(t, ensure_ascii=False)),
                                    ("system", system or [], _block_text)):
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InputError(f"expected a {'tool' if segment == 'tools' else 'text block'} object",
                                 field=f"{segment}[{i}]", **where)
            bare = _strip_cc(item)
            blocks.append(Block(identity=f"{segment}:" + _canon(bare), tokens=None,
                                ttl=_ttl_of(item.get("cache_control"), where, f"{segment}[{i}].cache_control"),
                                segment=segment, text=text_of(bare), path=f"{segment}[{i}]"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InputError("expected a non-empty list of messages", field="messages", **where)
    # tool_choice changes invalidate the messages part of the cache: fold it into the first message block
    head = "choice:" + _canon(body.get("tool_choice")) + "|" if body.get("tool_choice") is not None else ""
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("user", "assistant"):
            raise InputError("expected a message with role 'user' or 'assistant'", field=f"messages[{i}]", **where)
        content = msg.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        if not isinstance(content, list):
            raise InputError("expected a string or a list of content blocks", field=f"messages[{i}].content", **where)
        # a run of tool_use blocks is one lookback position, and so is a run of tool_result blocks
        runs: list[list[tuple[int, dict]]] = []
        for j, b in enumerate(content):
            if not isinstance(b, dict):
                raise InputError("expected a content block", field=f"messages[{i}].content[{j}]", **where)
            if b.get("type") in ("image", "document"):
                raise InputError(f"{b.get('type')} blocks cannot be token-counted offline; use --count-with-api",
                                 field=f"messages[{i}].content[{j}]", **where)
            kind = b.get("type")
            if runs and kind in ("tool_use", "tool_result") and runs[-1][-1][1].get("type") == kind:
                runs[-1].append((j, b))
            else:
                runs.append([(j, b)])
        for run in runs:
            ttl = None
            for j, b in run:
                ttl = _ttl_of(b.get("cache_control"), where, f"messages[{i}].content[{j}].cache_control") or ttl
            blocks.append(Block(identity=msg["role"] + ":" + _canon([_strip_cc(b) for _, b in run]), tokens=None,
                                ttl=ttl, segment="messages", text="\n".join(_block_text(b) for _, b in run),
                                path=f"messages[{i}].content[{run[0][0]}]"))
    if head:
        first = next(k for k, b in enumerate(blocks) if b.segment == "messages")
        b = blocks[first]
        blocks[first] = Block(head + b.identity, b.tokens, b.ttl, b.segment, b.text, b.path)
    return Request(line=where["line"], model=model, timestamp=ts, blocks=tuple(blocks), output_tokens=output,
                   auto_ttl=_ttl_of(body.get("cache_control"), where, "cache_control"), body=body, kind="anthropic")


def _openai_request(body: dict, model: str, ts: float | None, output: int, where: dict) -> Request:
    from ..inputs import prompt_from_value

    prompt = prompt_from_value({k: v for k, v in body.items() if k in ("messages", "tools")},
                               source=where["source"], line=where["line"])
    blocks = [Block(identity="tool:" + _canon(t), tokens=None, segment="tools",
                    text=json.dumps(t, ensure_ascii=False), path=f"tools[{i}]") for i, t in enumerate(prompt.tools or ())]
    for i, m in enumerate(prompt.messages or ()):
        text = (m.get("content") or "") + (json.dumps(m["tool_calls"]) if m.get("tool_calls") else "")
        blocks.append(Block(identity=m["role"] + ":" + _canon(m), tokens=None, segment="messages", text=text,
                            path=f"messages[{i}]"))
    return Request(line=where["line"], model=model, timestamp=ts, blocks=tuple(blocks), output_tokens=output,
                   body=body, kind="openai")


# ------------------------------------------------------------------------------------------ token counts

TokenCounter = Callable[[Request, int], int]  # cumulative tokens of blocks[:k+1]


def tokenizer_counter(tokenizer: Any) -> Callable[[str], int]:
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        if text not in cache:
            cache[text] = len(tokenizer.backend.encode(text, add_special_tokens=False).ids)
        return cache[text]

    return count


def api_counter(client: Any) -> Callable[[Request, int], int]:
    """Cumulative token counts from ``client.messages.count_tokens`` on the request cut after a block.

    A cut inside tools or system has no messages; the API needs one, so a one-character user message is
    added and its own count (measured once per model) subtracted. Counts are memoized per prefix.
    """
    memo: dict[tuple[str, int, str], int] = {}
    baseline: dict[str, int] = {}
    filler = [{"role": "user", "content": "."}]

    def call(model: str, **kwargs) -> int:
        return int(client.messages.count_tokens(model=model, **kwargs).input_tokens)

    def count(req: Request, k: int, key: str) -> int:
        memo_key = (req.model, k, key)
        if memo_key in memo:
            return memo[memo_key]
        body = req.body or {}
        n_tools = sum(1 for b in req.blocks if b.segment == "tools")
        n_system = sum(1 for b in req.blocks if b.segment == "system")
        kwargs: dict[str, Any] = {}
        tools = body.get("tools") or []
        system = body.get("system")
        if isinstance(system, str):
            system = [{"type": "text", "text": system}] if system else []
        if k < n_tools:
            kwargs["tools"] = tools[:k + 1]
        else:
            if tools:
                kwargs["tools"] = tools
            if system:
                kwargs["system"] = system[:max(0, k + 1 - n_tools)]
        if k < n_tools + n_system:
            if req.model not in baseline:
                baseline[req.model] = call(req.model, messages=filler)
            n = call(req.model, messages=filler, **kwargs) - baseline[req.model]
        else:
            kwargs["messages"] = _messages_upto(body["messages"], req, k - n_tools - n_system)
            if body.get("tool_choice") is not None:
                kwargs["tool_choice"] = body["tool_choice"]
            n = call(req.model, **kwargs)
        memo[memo_key] = n
        return n

    return count


def _messages_upto(messages: list, req: Request, position: int) -> list:
    """The messages holding the first ``position + 1`` message positions of ``req``."""
    paths = [b.path for b in req.blocks if b.segment == "messages"][:position + 1]
    last = paths[-1]
    m = re.match(r"messages\[(\d+)\](?:\.content\[(\d+)\])?", last)
    i = int(m.group(1))
    out = [dict(x) for x in messages[:i + 1]]
    if m.group(2) is not None and isinstance(out[i].get("content"), list):
        # keep the whole run that starts at this block (a run of tool_use/tool_result counts as one)
        start = int(m.group(2))
        content = out[i]["content"]
        end = start + 1
        while end < len(content) and content[end].get("type") == content[start].get("type") and \
                content[start].get("type") in ("tool_use", "tool_result"):
            end += 1
        out[i]["content"] = content[:end]
    return out


# ------------------------------------------------------------------------------------------ simulation


@dataclass
class _Entry:
    expires: float
    ttl: float
    available_from: float


def _chain(model: str, blocks: Sequence[Block]) -> list[str]:
    keys = []
    h = hashlib.blake2b(("model:" + model).encode(), digest_size=16).hexdigest()
    for b in blocks:
        h = hashlib.blake2b((h + "\x00" + b.identity).encode(), digest_size=16).hexdigest()
        keys.append(h)
    return keys


class CacheSimulator:
    """A provider's prompt cache: entries keyed by the hash chain of the prefix, one namespace per model."""

    def __init__(self, table: PriceTable, source: str | None = None):
        self.table = table
        self.source = source
        self.entries: dict[str, _Entry] = {}

    def _alive(self, key: str, t: float) -> _Entry | None:
        e = self.entries.get(key)
        if e is None:
            return None
        if e.expires <= t:
            del self.entries[key]
            return None
        # readable only once the writing request has started (parallel twins both miss)
        return e if e.available_from < t else None

    def run(self, req: Request, cum: Sequence[int], t: float) -> tuple[ModelPrice, Usage, str | None]:
        price = self.table.lookup(req.model)
        keys = _chain(price.model, req.blocks)
        if price.cache_mode == "automatic":
            return price, *self._automatic(req, price, keys, cum, t)
        return price, *self._explicit(req, price, keys, cum, t)

    def _explicit(self, req: Request, price: ModelPrice, keys: list[str], cum: Sequence[int],
                  t: float) -> tuple[Usage, str | None]:
        where = {"source": self.source, "line": req.line}
        bps = [(i, b.ttl) for i, b in enumerate(req.blocks) if b.ttl is not None]
        if req.auto_ttl is not None and (not bps or bps[-1][0] != len(req.blocks) - 1):
            bps.append((len(req.blocks) - 1, req.auto_ttl))  # automatic caching: the last block, one slot
        if len(bps) > price.max_breakpoints:
            raise InputError(f"{len(bps)} cache breakpoints; {price.model} allows at most {price.max_breakpoints}",
                             **where)
        seen_5m = False
        for _, ttl in bps:
            if ttl == "5m":
                seen_5m = True
            elif seen_5m:
                raise InputError("a 1h cache_control breakpoint comes after a 5m one; 1h entries must come first",
                                 **where)
        total = cum[-1] if cum else 0
        cacheable = [(i, ttl) for i, ttl in bps if cum[i] >= price.min_cacheable_tokens]
        note = None
        if bps and not cacheable:
            note = (f"prefix at the breakpoint below {price.model}'s minimum of {price.min_cacheable_tokens} "
                    "tokens: nothing cached")
        hit = -1
        for i, _ in cacheable:  # each breakpoint looks back over at most `lookback` positions
            for j in range(i, max(-1, i - price.lookback_blocks), -1):
                e = self._alive(keys[j], t)
                if e is not None:
                    e.expires = t + e.ttl  # a hit refreshes the TTL for free
                    hit = max(hit, j)
                    break
        a = cum[hit] if hit >= 0 else 0
        after = [(i, ttl) for i, ttl in cacheable if cum[i] > a]
        b = max((cum[i] for i, ttl in after if ttl == "1h"), default=a)
        c = max((cum[i] for i, _ in after), default=a)
        for i, ttl in after:
            secs = price.ttl_seconds(ttl)
            self.entries[keys[i]] = _Entry(expires=t + secs, ttl=secs, available_from=t)
        usage = Usage(input_tokens=total - max(a, c), cache_creation_input_tokens=c - a, cache_read_input_tokens=a,
                      output_tokens=req.output_tokens, cache_write_5m_tokens=c - b, cache_write_1h_tokens=b - a)
        return usage, note

    def _automatic(self, req: Request, price: ModelPrice, keys: list[str], cum: Sequence[int],
                   t: float) -> tuple[Usage, str | None]:
        total = cum[-1] if cum else 0
        hit = -1
        for j in range(len(keys) - 1, -1, -1):
            e = self._alive(keys[j], t)
            if e is not None:
                hit = j
                break
        cached = 0
        if hit >= 0 and cum[hit] >= price.min_cacheable_tokens:
            g = max(1, price.cache_granularity)
            cached = min(cum[hit], total) // g * g
            for j in range(hit + 1):
                e = self.entries.get(keys[j])
                if e is not None:
                    e.expires = t + e.ttl
        if total >= price.min_cacheable_tokens:
            ttl = float(next(iter(price.ttls.values())))
            for j, k in enumerate(keys):
                if cum[j] >= price.min_cacheable_tokens and (k not in self.entries or self.entries[k].expires <= t):
                    self.entries[k] = _Entry(expires=t + ttl, ttl=ttl, available_from=t)
        note = None if total >= price.min_cacheable_tokens else \
            f"prompt below {price.model}'s minimum of {price.min_cacheable_tokens} tokens: not cached"
        return Usage(total - cached, 0, cached, req.output_tokens, 0, 0), note


def simulate_requests(requests: Iterable[Request], *, table: PriceTable, source: str,
                      text_counter: Callable[[str], int] | None = None, api: Any = None,
                      every: float | None = None, token_source: str = "layout") -> CostReport:
    """Replay requests in order through the cache model and price what each would report."""
    sim = CacheSimulator(table, source)
    rows: list[RequestCost] = []
    notes: list[str] = []
    counter = api_counter(api) if api is not None else None
    last_t: float | None = None
    estimate = False
    unknown_output = 0
    for index, req in enumerate(requests):
        where = {"source": source, "line": req.line}
        t = req.timestamp
        if t is None:
            if every is None:
                if index == 0:
                    t = 0.0
                else:
                    raise InputError("no timestamp: cache entries expire (5 minutes or 1 hour), so TTL matters; "
                                     "add 'timestamp' (seconds or ISO 8601) or pass --every DURATION", **where)
            else:
                t = index * every
        if last_t is not None and t < last_t:
            raise InputError(f"timestamp {t} is earlier than the previous request's ({last_t}); sort the log by time",
                             field="timestamp", **where)
        last_t = t
        cum = _cumulative(req, text_counter, counter, where)
        unknown_output += not req.output_known
        if any(b.tokens is None for b in req.blocks):
            estimate = True
        price, usage, note = sim.run(req, cum, t)
        if note:
            notes.append(note)
        reported = _openai_reported(usage) if price.usage_style == "openai" else {}
        rows.append(_row(index, req.line, price, usage, timestamp=t, reported=reported, note=note))
    if not rows:
        raise InputError("no requests", source=source)
    if unknown_output:
        notes.append(f"{unknown_output} request(s) give no output_tokens: their output is not priced "
                     "(add output_tokens to those lines)")
    if estimate:
        token_source = "count_tokens API (an estimate)" if api is not None else f"{token_source} (an estimate)"
    return _report("simulate", rows, estimate=estimate, token_source=token_source, notes=notes)


def _cumulative(req: Request, text_counter, api_count, where: dict) -> list[int]:
    cum: list[int] = []
    total = 0
    keys = None
    for k, b in enumerate(req.blocks):
        if b.tokens is not None:
            total += b.tokens
        elif api_count is not None and req.kind == "anthropic":
            if keys is None:
                keys = _chain(req.model, req.blocks)
            total = api_count(req, k, keys[k])
        elif text_counter is not None:
            total += text_counter(b.text)
        else:
            raise InputError("request bodies need token counts: pass --tokenizer (an estimate) or, for Claude "
                             "models, --count-with-api", **where)
        cum.append(total)
    return cum


# -------------------------------------------------------------------------------------------- what-if


def what_if(*, table: PriceTable, model: str, prefix_tokens: int, suffix_tokens: int, output_tokens: int,
            calls: int, every: float, ttl: str = "5m") -> CostReport:
    """N calls sharing a cached prefix, ``every`` seconds apart: cost with and without caching."""
    for name, v in (("--prefix-tokens", prefix_tokens), ("--suffix-tokens", suffix_tokens),
                    ("--output-tokens", output_tokens)):
        if v < 0:
            raise UsageError(f"{name} must not be negative")
    if calls < 1:
        raise UsageError("--calls must be at least 1")
    price = table.lookup(model)
    explicit = price.cache_mode == "explicit"
    reqs = []
    for i in range(calls):
        blocks = (Block("id:prefix", prefix_tokens, ttl if explicit else None),
                  Block(f"id:suffix-{i}", suffix_tokens))
        reqs.append(Request(line=None, model=price.model, timestamp=i * every, blocks=blocks,
                            output_tokens=output_tokens))
    report = simulate_requests(reqs, table=table, source="what-if", token_source="what-if")
    notes = list(report.notes)
    if explicit:
        ttl_s = price.ttl_seconds(ttl)
        if every >= ttl_s and calls > 1:
            notes.append(f"calls every {every:g}s outlive the {ttl} TTL ({ttl_s}s): every call writes again")
    r = price.rates(prefix_tokens + suffix_tokens)
    write = (r.cache_write_1h if ttl == "1h" else r.cache_write_5m) if explicit else r.input
    read = r.cache_read if r.cache_read is not None else r.input
    premium = (write or r.input) - r.input
    saving = r.input - read
    break_even = None
    if prefix_tokens >= price.min_cacheable_tokens and saving > 0:
        break_even = max(0, math.ceil(premium / saving - 1e-12))
    return replace(report, mode="what-if", notes=tuple(notes), break_even_reads=break_even)


def iter_requests(records: Iterable[tuple[int, Any]], *, source: str, default_model: str | None) -> Iterator[Request]:
    for line, value in records:
        yield request_from_value(value, line=line, source=source, default_model=default_model)
