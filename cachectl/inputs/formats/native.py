"""The shapes cachectl read before the foreign ones: its own ``{timestamp, body, usage}`` wrapper, bare request
bodies, token layouts, provider responses with usage, and the prefix-cache traces (token IDs, Mooncake, served
logs). Their lines are read as they stand (:func:`cachectl.inputs.files.iter_jsonl`); this module only tells
them apart and documents them."""

from __future__ import annotations

from ..request import WRAPPER_KEYS, is_request_body
from .base import Head, LogShape, Verdict

SHAPES: tuple[LogShape, ...] = (
    LogShape("wrapper", "cachectl's request log: {timestamp, body, usage}",
             "a JSON object per line whose `body` (or `request`) holds a request body",
             "the request body, its timestamp, the billed `usage` (or `response.usage`), `output_tokens`, and any "
             "other top-level field as a key (`--key session`, `--tenant-field`)",
             ("prompt-cost", "report", "fix", "diff-tokens", "simulate-prefix", "semantic-probe dupes"),
             "fixtures/prompts/openai_requests.jsonl",
             "cachectl's own"),
    LogShape("openai-chat", "OpenAI Chat Completions request bodies",
             "a JSON document (or a log line's body) with `messages` whose model or fields are not Anthropic's",
             "`messages`, `tools`, `response_format`, `prompt_cache_key`, GPT-5.6+ `prompt_cache_breakpoint` and "
             "`prompt_cache_options`",
             ("diff-tokens", "lint"),
             "fixtures/prompts/openai_tools_a.json",
             "https://platform.openai.com/docs/api-reference/chat/create"),
    LogShape("openai-responses", "OpenAI Responses request bodies",
             "a body with `input` and no `messages`",
             "`instructions`, `input` items, `tools`, cache options; in a wrapper, the timestamp and usage",
             ("prompt-cost", "report", "fix", "diff-tokens", "simulate-prefix", "semantic-probe dupes"),
             "fixtures/logs/openai_responses.jsonl",
             "https://platform.openai.com/docs/api-reference/responses/create"),
    LogShape("anthropic-messages", "Anthropic Messages request bodies",
             "a JSON document (or a log line's body) with `messages` and a Claude model, top-level `system`, or "
             "`cache_control` markers",
             "`tools`, `system`, `messages` with their content blocks and `cache_control` breakpoints (TTL)",
             ("diff-tokens", "lint"),
             "fixtures/prompts/anthropic_body.json",
             "https://docs.anthropic.com/en/api/messages"),
    LogShape("token-layout", "token layouts: request blocks as counts",
             "a body with `blocks`, each an `id` and a token count",
             "the cacheable blocks by id and length, `cache_control`, the model, timestamp and output tokens: "
             "a what-if without text or tokenizer",
             ("prompt-cost",),
             "fixtures/logs/token_layout.jsonl",
             "cachectl's own"),
    LogShape("provider-usage", "provider responses with their billed usage",
             "a JSON object with `usage` and no request (`messages`/`input`): an Anthropic message or an OpenAI "
             "response",
             "the billed counters (input, cache read, cache write by TTL, output) and the model: the bill audited "
             "line by line",
             ("prompt-cost",),
             "fixtures/prompts/responses.jsonl",
             "https://docs.anthropic.com/en/api/messages ; https://platform.openai.com/docs/api-reference/responses"),
    LogShape("token-ids", "token-ID traces",
             "a JSON object per line with `tokens`, `prompt_token_ids`, `input_ids` or `token_ids`",
             "the prompt's token IDs, optional timestamp, output tokens, salt, tenant and session fields",
             ("simulate-prefix",),
             "fixtures/traces/rag.jsonl",
             "cachectl's own; vLLM's `prompt_token_ids`"),
    LogShape("mooncake", "Mooncake traces: pre-hashed blocks",
             "a JSON object per line with `hash_ids` (and `input_length`, `output_length`, `timestamp`)",
             "the chained block ids of 512-token blocks, prompt and output lengths, arrival time",
             ("simulate-prefix",),
             "fixtures/traces/mooncake_conv.jsonl",
             "https://github.com/kvcache-ai/Mooncake (FAST'25 traces)"),
    LogShape("served", "served logs: token IDs with the server's cached-token counters",
             "token IDs plus vLLM's `usage.prompt_tokens_details.cached_tokens` or SGLang's `meta_info.cached_tokens`",
             "what the server says it served from its prefix cache, beside the prompt: the simulator checked "
             "against the server",
             ("simulate-prefix",),
             "fixtures/traces/served.jsonl",
             "vLLM's OpenAI-compatible server usage; SGLang's meta_info"),
)

_TRACE_KEYS = ("tokens", "prompt_token_ids", "input_ids", "token_ids", "hash_ids", "prompt", "messages", "text")


def detect(head: Head) -> Verdict:
    """One of cachectl's own shapes: a JSON object whose first line is a body, a wrapper of one, a usage line,
    or a trace line (token IDs, hash ids, a prompt)."""
    first = head.first
    if not isinstance(first, dict):
        return Verdict.no()
    if is_request_body(first) or "blocks" in first:
        return Verdict.yes()
    if any(is_request_body(first.get(k)) for k in WRAPPER_KEYS):
        return Verdict.yes()
    if "usage" in first or any(k in first for k in _TRACE_KEYS):
        return Verdict.yes()
    return Verdict.no()

