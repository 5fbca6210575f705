"""Each known pitfall, reproduced on real renders of the fixture tokenizer, gets its cause hint."""

from __future__ import annotations

import copy
import json

import pytest

from cachectl.engines.tokendiff import check_stability, diff_tokens
from cachectl.inputs import read_prompt

from .conftest import PROMPTS, chat_prompt, text_prompt


def diff(tok, a, b, **kw):
    return diff_tokens(tok.tokenize(a, **kw), tok.tokenize(b, **kw), tokenizer=tok)


def test_default_system_prompt(tok):
    d = diff(tok, read_prompt(str(PROMPTS / "chat_no_system.json")), read_prompt(str(PROMPTS / "chat_with_system.json")))
    assert d.kind == "mismatch"
    assert d.cause.id == "default_system_prompt"
    assert d.a.location.in_template
    assert d.b.location.message_index == 0 and d.b.location.role == "system"


def test_tool_schema_key_order(tok):
    d = diff(tok, read_prompt(str(PROMPTS / "openai_tools_a.json")), read_prompt(str(PROMPTS / "openai_tools_b.json")))
    assert d.cause.id == "tool_schema_key_order"
    assert d.a.location.field == "tools[0]"


def test_tool_order_and_changed_tools(tok):
    body = json.loads((PROMPTS / "openai_tools_a.json").read_text())
    second = {"type": "function", "function": {"name": "search_docs", "description": "Search the documentation",
                                                "parameters": {"type": "object", "properties": {}}}}
    a = dict(body, tools=body["tools"] + [second])
    b = dict(body, tools=[second] + body["tools"])
    from cachectl.inputs import prompt_from_value

    pa, pb = (prompt_from_value(x, source="<t>", line=None) for x in (a, b))
    assert diff(tok, pa, pb).cause.id == "tool_order"
    c = copy.deepcopy(a)
    c["tools"][1]["function"]["description"] = "Search the docs"
    pc = prompt_from_value(c, source="<t>", line=None)
    d = diff(tok, pa, pc)
    assert d.cause.id == "tools_changed" and "tools[1]" in d.cause.message


def test_date_in_system_prompt(tok):
    d = diff(tok, read_prompt(str(PROMPTS / "system_time_a.txt")), read_prompt(str(PROMPTS / "system_time_b.txt")))
    assert d.cause.id == "date_time"
    assert "2026-11-28T09:15:00Z" in d.cause.message and "2026-11-29T10:02:41Z" in d.cause.message


def test_injected_date_line_from_template_var(tok):
    p = chat_prompt([{"role": "user", "content": "What is the weather in Paris today?"}])
    ta = tok.tokenize(p, template_vars={"date_string": "28 Nov 2026"})
    tb = tok.tokenize(p, template_vars={"date_string": "29 Nov 2026"})
    assert "Today Date: 28 Nov 2026" in ta.text
    d = diff_tokens(ta, tb, tokenizer=tok)
    assert d.cause.id == "date_time"
    assert d.a.location.in_template


def test_doubled_bos_on_ids_without_tokenizer():
    from cachectl.inputs import PromptInput
    from cachectl.tokenization import Tokenized

    a = Tokenized(PromptInput(kind="ids", source="a", ids=(1, 5, 6)), [1, 5, 6])
    b = Tokenized(PromptInput(kind="ids", source="b", ids=(1, 1, 5, 6)), [1, 1, 5, 6])
    d = diff_tokens(a, b)
    assert d.cause.id == "doubled_bos" and "likely BOS" in d.cause.message


def test_bos_mismatch(tok):
    text = "How do I reset my password?"
    d = diff_tokens(tok.tokenize(text_prompt(text)), tok.tokenize(text_prompt(text), add_special_tokens=False),
                    tokenizer=tok)
    assert d.first_diff_index == 0 and d.cause.id == "bos_mismatch"


def test_whitespace(tok):
    d = diff(tok, text_prompt("Hello  world and more"), text_prompt("Hello world and more"))
    assert d.cause.id == "whitespace"


def test_token_boundary(tok):
    # "Hello " then "world": the trailing space is its own token in A, merged into "Ġw" in B.
    d = diff(tok, text_prompt("Hello "), text_prompt("Hello world"))
    assert d.kind == "mismatch" and d.cause.id == "token_boundary"


def test_volatile_request_id(tok):
    d = diff(tok, text_prompt("request req_01HZX8K2Q9 follows. Answer"),
             text_prompt("request req_01HZX8K2Q7 follows. Answer"))
    assert d.cause.id == "volatile_id"


def test_think_block_stripped_in_history(tok):
    conv = json.loads((PROMPTS / "think_conversation.json").read_text())
    # The earlier request (the assistant turn is the newest) keeps the think block; the next one,
    # after a new user message, has it stripped by the template.
    a = chat_prompt(conv[:3])
    b = chat_prompt(conv[:4])
    d = diff(tok, a, b)
    assert d.kind == "mismatch" and d.cause.id == "think_stripped"


def test_history_edited(tok):
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris today?"},
            {"role": "assistant", "content": "It is sunny and 18 degrees in Paris."},
            {"role": "user", "content": "What about Berlin tomorrow?"}]
    edited = copy.deepcopy(msgs)
    edited[2]["content"] = "The conversation discussed cache hit rates."
    d = diff(tok, chat_prompt(msgs), chat_prompt(edited))
    assert d.cause.id == "history_edited" and d.a.location.message_index == 2


def test_system_prompt_changed(tok):
    a = chat_prompt([{"role": "system", "content": "You are a helpful assistant."},
                     {"role": "user", "content": "hi"}])
    b = chat_prompt([{"role": "system", "content": "You are a cache expert."},
                     {"role": "user", "content": "hi"}])
    assert diff(tok, a, b).cause.id == "system_prompt_changed"


def test_no_cause_for_a_plain_new_question(tok):
    a = chat_prompt([{"role": "user", "content": "How do I reset my password?"}])
    b = chat_prompt([{"role": "user", "content": "Is the API rate limited?"}])
    d = diff(tok, a, b)
    assert d.kind == "mismatch" and d.cause is None


def test_no_cause_when_b_extends_a(tok):
    conv = json.loads((PROMPTS / "stable_conversation.json").read_text())
    d = diff(tok, chat_prompt(conv[:2]), chat_prompt(conv[:4]))
    assert d.kind == "a_prefix_of_b" and d.cause is None


# ---------------------------------------------------------------------------------------- stability


def test_stability_flags_think_stripping(tok):
    r = check_stability(read_prompt(str(PROMPTS / "think_conversation.json")), tok)
    assert not r.stable and r.first_unstable_k == 3
    bad = next(s for s in r.steps if not s.stable)
    assert bad.diff.cause.id == "think_stripped"
    # the steps before it are real prefixes
    assert all(s.stable for s in r.steps if s.k < 3)


def test_stability_of_an_append_only_conversation(tok):
    r = check_stability(read_prompt(str(PROMPTS / "stable_conversation.json")), tok)
    assert r.stable and r.first_unstable_k is None
    assert [s.k for s in r.steps] == [2, 3, 4]
    assert all(s.tokens_next > s.tokens_prev for s in r.steps)


def test_stability_needs_chat(tok):
    from cachectl.errors import UsageError

    with pytest.raises(UsageError):
        check_stability(text_prompt("hi"), tok)
