"""Every cause a finding can name: why two prompts stop sharing a token prefix. The token diff
(:mod:`cachectl.engines.tokendiff`) tells each one from the rendered tokens, the traffic-wide fork analysis
(:mod:`cachectl.engines.prefix.forks`) adds the causes only the whole log shows, and ``report`` and the docs name
them through this table. The fix codes that remove a cause declare it themselves (``FixCode.causes``).

A new cause is one entry here; a test fails when the token diff or the fork analysis returns an id this table
lacks, or when an entry has no text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CauseInfo:
    """One cause: its stable id (a JSON value of ``cause``), a one-line label, what happened, and the remedy."""

    id: str
    label: str
    what: str
    remedy: str
    #: who tells it: "diff" (two prompts, diff-tokens and every pair of a log), "fork" (across requests only) or
    #: "transcript" (a break in a Claude Code transcript's cache reads)
    found_by: str = "diff"


CAUSES: dict[str, CauseInfo] = {c.id: c for c in (
    CauseInfo("date_time", "a date or time in the prompt",
              "A date or time that changes per request sits inside the cached prefix, so every token after it "
              "differs.",
              "Move the value after the stable content (the end of the prompt), or pin it to a coarser grain "
              "(a day)."),
    CauseInfo("volatile_id", "a per-request id in the prompt",
              "An id that changes per request (a request id, a UUID, a trace id) sits inside the cached prefix.",
              "Move the id out of the prompt (metadata, headers) or after the stable content."),
    CauseInfo("counter", "a counter in the prompt",
              "A number that changes per request (a turn counter, a token budget, a balance) sits inside the "
              "cached prefix.",
              "Move the number after the stable content."),
    CauseInfo("per_user_value", "a per-user value in the prompt",
              "A value that repeats per user and that a log field (user, tenant, prompt_cache_key) predicts sits "
              "inside the prefix, so requests of different users stop sharing there: the cache is shared by all "
              "the traffic, and only requests of the same user read past that value.",
              "Move the per-user value after the text all users share.", found_by="fork"),
    CauseInfo("tool_schema_key_order", "tool schema keys in another order",
              "The tool schemas are equal as values but their keys are serialized in another order.",
              "Serialize tool schemas deterministically (sorted keys) before they reach the template or the API."),
    CauseInfo("tool_order", "tools listed in another order",
              "The same tools are listed in another order.",
              "Keep the tool list in a fixed order."),
    CauseInfo("tools_changed", "the tool list changed",
              "The tool definitions differ: a changed tool list invalidates everything after the tools.",
              "Keep the tool list stable across requests; add tools at the end, or in a separate request family."),
    CauseInfo("json_key_order", "JSON keys in another order",
              "JSON embedded in the prompt holds the same values with its keys in another order.",
              "Serialize embedded JSON with sorted keys."),
    CauseInfo("think_stripped", "reasoning stripped from earlier turns",
              "The chat template drops the reasoning (a <think> block) of earlier assistant turns once a new turn "
              "is added, so the next request's prefix is not the previous one's.",
              "Render history append-only: keep the reasoning, or strip it in every request the same way."),
    CauseInfo("doubled_bos", "a doubled BOS token",
              "The prompt text already starts with the BOS token and the tokenizer adds another.",
              "Encode rendered chat text with add_special_tokens=False, or drop the BOS from the text."),
    CauseInfo("bos_mismatch", "BOS present in one and not the other",
              "One prompt starts with the BOS token and the other does not: they were encoded with different "
              "special-token settings.",
              "Encode every prompt the same way (the same add_special_tokens)."),
    CauseInfo("default_system_prompt", "the template's default system prompt",
              "A request without a system message gets the chat template's default one, where another request "
              "carries its own.",
              "Send the same system message every time."),
    CauseInfo("system_prompt_changed", "the system prompt changed",
              "The system prompt differs between the two requests: everything after it is recomputed.",
              "Keep the system prompt stable; put what changes in a later message."),
    CauseInfo("history_edited", "earlier turns edited",
              "An earlier message differs although newer messages follow it: the history was rewritten "
              "(truncated, summarized, redacted).",
              "Append to the history instead of rewriting it; compact rarely, at a cache boundary."),
    CauseInfo("message_relocated", "a message moved",
              "A message is the same in both prompts but the chat template renders it at another place.",
              "Keep messages in a fixed order, and the template's placement stable."),
    CauseInfo("last_turn_closed_differently", "the last turn closed differently",
              "One prompt ends with an assistant turn that the other closes differently (a generation prompt, an "
              "end-of-turn token).",
              "Close the last turn the same way in every request (the same add_generation_prompt)."),
    CauseInfo("unicode_normalization", "Unicode normalized differently",
              "The texts are the same characters in another Unicode normalization (NFC vs NFD).",
              "Normalize text (NFC) before it reaches the prompt."),
    CauseInfo("whitespace", "whitespace changed",
              "The prompts differ only in whitespace at this point.",
              "Strip or normalize whitespace the same way in every request."),
    CauseInfo("token_boundary", "a token boundary moved",
              "The text still matches for a few more characters, but the tokenizer split it differently because "
              "of what follows.",
              "End the stable part at a boundary that does not merge with what follows (a newline)."),
    CauseInfo("different_prompt", "different prompts",
              "The requests share nothing after the diverging line: different applications or prompt families, "
              "never a cache fault.",
              "Nothing to fix; route such families apart if they compete for the same cache.", found_by="fork"),
    CauseInfo("cold_start", "the first call of a session",
              "The first call of a session (or of a subagent's thread) writes what no earlier call of it could "
              "have cached; it may still read a prefix other sessions cached.",
              "Nothing to fix for one call; keep the shared prefix (system prompt, tools) identical across "
              "sessions so that cold starts read it.", found_by="transcript"),
    CauseInfo("model_switch", "the model changed",
              "The call went to another model than the previous one: each model has its own cache, so nothing "
              "cached for the other is read.",
              "Switch models rarely within a session, or at a point where the prefix would be rewritten anyway.",
              found_by="transcript"),
    CauseInfo("compaction", "the history was compacted",
              "The conversation was compacted (summarized) before the call, so its prefix after the system prompt "
              "is new.",
              "Compact rarely; each compaction rewrites the prefix once.", found_by="transcript"),
    CauseInfo("ttl_expired", "the cache entry expired",
              "The gap since the previous call was longer than the entry's lifetime (5 minutes, or 1 hour for "
              "1-hour writes), so the prefix was written again.",
              "Space calls closer than the TTL, or write with the 1-hour TTL when gaps of 5 to 60 minutes are "
              "common (the report's 1-hour what-if prices it).", found_by="transcript"),
    CauseInfo("unexplained", "no cause identified",
              "The prompts differ and no rule tells why.",
              "Look at the token diff (`cachectl diff-tokens`) of the two requests."),
)}


def cause_label(cause: str | None) -> str:
    """The one-line label of ``cause`` (None: no cause identified)."""
    info = CAUSES.get(cause or "unexplained")
    return info.label if info is not None else (cause or "").replace("_", " ")
