"""What the provider reads, tested on recorded calls (VCR cassettes from pydantic-ai's public test suite, MIT: see
fixtures/logs/SOURCES.md) with the counters the API billed as the expectation; where no recording could be found,
on the provider's documented statement, quoted.

Token counts come from the test tokenizer (an estimate, not Claude's), so a prediction agrees with a bill when it
has the same outcome (read / write / both / none); the billed counters are asserted exactly as recorded.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from cachectl.engines.provider import PriceTable, simulate_requests
from cachectl.engines.provider.cache import chain_keys, tokenizer_counter
from cachectl.errors import InputError
from cachectl.inputs import parse_request
from cachectl.inputs.formats import log_values

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "logs"


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


@pytest.fixture(scope="module")
def counter(tok):
    return tokenizer_counter(tok)


def _calls(name):
    return [(n, v) for n, v in log_values(str(LOGS / name))]


def _simulate(table, counter, calls):
    reqs = [parse_request({"body": v["body"], "usage": v["usage"], "timestamp": i, "output_tokens": 0},
                          source="c", line=n) for i, (n, v) in enumerate(calls)]
    return simulate_requests(reqs, table=table, source="c", text_counter=counter)


def _billed(row):
    b = row.reconciliation.billed
    return b["cache_read_input_tokens"], b["cache_creation_input_tokens"]


# ------------------------------------------------------------------ item 1: the same prefix, spelled otherwise


def test_a_string_is_a_one_text_block_list_on_a_recorded_pair(table, counter):
    """The Messages API reference: "Each input message `content` may be either a single `string` or an array of
    content blocks [...]. Using a `string` for `content` is shorthand for an array of one content block of type
    `"text"`. The following input messages are equivalent: {"role": "user", "content": "Hello, Claude"} /
    {"role": "user", "content": [{"type": "text", "text": "Hello, Claude"}]}".

    No recorded pair spelling one turn both ways could be found, so the recorded pair of vcr_anthropic_cache.yaml
    (call 2 billed 1,111 read and 418 written: it read what call 1's breakpoint on the first user turn covers) is
    replayed with call 2's first user turn re-spelled as the string the reference calls equivalent: the bill
    stands, and cachectl must still predict a read and a write (before, it said "content changed at
    messages[0]" and predicted no read)."""
    calls = _calls("vcr_anthropic_cache.yaml")
    first_turn = calls[1][1]["body"]["messages"][0]
    assert first_turn["content"] == [{"text": first_turn["content"][0]["text"], "type": "text"}]  # as recorded
    respelled = copy.deepcopy(calls)
    respelled[1][1]["body"]["messages"][0]["content"] = first_turn["content"][0]["text"]
    for log in (calls, respelled):
        r = _simulate(table, counter, log)
        second = r.requests[1]
        assert _billed(second) == (1111, 418)
        assert second.reconciliation.billed_outcome == "read+write"
        assert second.reconciliation.predicted_outcome == "read+write" and second.reconciliation.agree
        assert second.miss is None or second.miss.code != "content_changed"


def test_block_key_order_and_cache_control_are_not_content():
    """The same equivalence, as the cassettes write blocks (keys sorted: ``text`` before ``type``) and with the
    marker moved away (the recorded pair above: the first turn carries cache_control in call 1, not in call 2):
    the string, the block in either key order, with or without cache_control, are one prefix."""
    text = "Hello, Claude"
    spellings = [text, [{"type": "text", "text": text}], [{"text": text, "type": "text"}],
                 [{"text": text, "type": "text", "cache_control": {"type": "ephemeral"}}]]
    keys = {tuple(chain_keys("claude-sonnet-4-5", parse_request(
        {"model": "claude-sonnet-4-5", "system": "s", "messages": [{"role": "user", "content": c}]})))
        for c in spellings}
    assert len(keys) == 1
    # a second block, or another text, is other content
    other = parse_request({"model": "claude-sonnet-4-5", "system": "s", "messages": [
        {"role": "user", "content": [{"type": "text", "text": text}, {"type": "text", "text": "!"}]}]})
    assert tuple(chain_keys("claude-sonnet-4-5", other))[-1] not in {k[-1] for k in keys}


def test_system_as_a_string_is_a_one_text_block_list():
    """``system`` is "One of the following: string | array of TextBlockParam" (the Messages API reference); no
    recording of the same system spelled both ways, and no sentence saying they are one prefix, could be found:
    cachectl already read them as one (a string system is the text block it would be), kept here as the
    shorthand rule of message content above extends to it, key order included."""
    keys = {tuple(chain_keys("claude-sonnet-4-5", parse_request(
        {"model": "claude-sonnet-4-5", "system": s, "messages": [{"role": "user", "content": "q"}]})))
        for s in ("You are a helpful assistant.", [{"type": "text", "text": "You are a helpful assistant."}],
                  [{"text": "You are a helpful assistant.", "type": "text",
                    "cache_control": {"type": "ephemeral"}}])}
    assert len(keys) == 1


# --------------------------------------------------------------- item 2: bodies the API accepted are read


def test_a_system_message_inside_messages_is_cached_in_place(table, counter):
    """A recorded pair (claude-opus-4-8): two identical requests whose last ``messages`` entry is
    ``{"role": "system"}`` with the only cache_control. The API billed 1,590 written, then 1,590 read, 2 input
    tokens after the breakpoint each time: the system entry is part of the prefix at its place in the messages
    (the breakpoint on it covers every turn before it), not moved to the top-level ``system`` (that would put it
    ahead of the turns, and the 2 tokens after it could not be the turns' ~1,500). cachectl reads it so: a
    messages position with role system."""
    calls = _calls("vcr_anthropic_inline_system.yaml")
    req = parse_request(calls[0][1]["body"])
    last = req.positions[-1]
    assert (last.segment, last.role, last.path, last.ttl) == ("messages", "system", "messages[3].content[0]", "5m")
    assert req.chat.messages[-1]["role"] == "system" and req.chat.messages[-1]["content"] == "S"
    r = _simulate(table, counter, calls)
    assert [_billed(q) for q in r.requests] == [(0, 1590), (1590, 0)]
    assert [q.reconciliation.predicted_outcome for q in r.requests] == ["write", "read"]
    assert all(q.reconciliation.agree for q in r.requests)
    assert r.requests[1].miss is None


def test_roles_the_api_does_not_take_are_still_refused():
    with pytest.raises(InputError, match="role must be 'user', 'assistant' or 'system'"):
        parse_request({"model": "claude-sonnet-4-5", "system": "s", "messages": [{"role": "tool", "content": "x"}]})


@pytest.mark.parametrize("name, block, where", [
    # a tool_reference block inside a tool_result (tool search), and a system entry holding a tool_addition
    ("vcr_anthropic_tool_reference.yaml", "tool_reference", "messages[2].content[0]"),
    ("vcr_anthropic_tool_addition.yaml", "tool_addition", "messages[3].content[0]"),
])
def test_unknown_block_types_are_positions_noted_once(table, counter, name, block, where):
    """Recorded calls (claude-sonnet-4-6, claude-opus-4-8) carrying block types cachectl does not know: every call
    is read and answered (none is refused), the block's exact JSON is its content, one note for the run. No
    cache_control in these calls: the API billed nothing read or written, and cachectl predicts the same."""
    calls = _calls(name)
    assert len(calls) == 3
    req = parse_request(calls[1][1]["body"])
    assert req.unknown_blocks == (block,)
    pos = next(p for p in req.positions if p.path == where)
    assert block in pos.content
    r = _simulate(table, counter, calls)
    assert len(r.requests) == 3
    assert [_billed(q) for q in r.requests] == [(0, 0)] * 3
    assert all(q.reconciliation.agree and q.reconciliation.predicted_outcome == "none" for q in r.requests)
    said = [n for n in r.notes if block in n]
    assert len(said) == 1 and "exact JSON" in said[0]


def test_a_block_without_a_type_is_still_refused():
    with pytest.raises(InputError, match="needs a string 'type'"):
        parse_request({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": [{"text": "x"}]}]})


# ------------------------------------------------------------------------ item 6: labels say what happened


@pytest.mark.parametrize("name", ["vcr_openai_gpt56_chat.yaml", "vcr_openai_gpt56_responses.yaml"])
def test_an_identical_gpt56_request_reading_its_breakpoint_prefix_is_no_miss(table, counter, name):
    """Recorded pairs (gpt-5.6-sol, Chat and Responses): two identical requests in explicit mode, one
    ``prompt_cache_breakpoint`` on the first block of the user message, a short block after it. The API billed
    4,012 written, then 4,012 read (8 tokens of 4,020 after the breakpoint uncached both times). The second read
    all its breakpoint covers and nothing changed: no miss (it was labelled content_changed, "the request is a
    prefix of line 2's; its breakpoint was never written")."""
    calls = _calls(name)
    r = _simulate(table, counter, calls)
    assert [_billed(q) for q in r.requests] == [(0, 4012), (4012, 0)]
    assert [q.reconciliation.predicted_outcome for q in r.requests] == ["write", "read"]
    assert all(q.reconciliation.agree for q in r.requests)
    assert r.requests[0].miss.code == "cold"
    assert r.requests[1].miss is None
