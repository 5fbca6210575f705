"""Earlier turns' thinking blocks, as each Claude model keeps them (the price table's ``prior_thinking``, from the
provider's extended-thinking and prompt-caching pages): Opus 4.5+ and Sonnet 4.6+ keep every prior thinking block in
the cached prefix; Opus 4.1 and earlier, Sonnet 4.5 and earlier and Haiku through 4.5 keep only the last turn's, so a
user block that is not a tool result strips the thinking before it, and the cache from there on."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES, TOK_DIR

FIX_LOG = FIXTURES / "prompts" / "fix_log.jsonl"


def _conversation(model: str) -> list[dict]:
    """A tool-use loop then a new user turn: the first request ends with a tool result (the assistant turn's
    thinking is in the current loop), the second adds the answer and a user question (every earlier turn's thinking
    is before it), each with a breakpoint on its last block."""
    system = [{"type": "text", "text": "You answer questions about the account settings of a web product. " * 120,
               "cache_control": {"type": "ephemeral"}}]
    loop = [
        {"role": "user", "content": "Where do I change the password policy for my team?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user asks about team password rules; search the docs. " * 6,
             "signature": "c2lnbmF0dXJlLTE="},
            {"type": "tool_use", "id": "toolu_1", "name": "search_docs", "input": {"query": "team password policy"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "Settings > Security > Password policy (team admins only). " * 8,
                                      "cache_control": {"type": "ephemeral"}}]}]
    answer = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The result names the page and who may open it. " * 5,
         "signature": "c2lnbmF0dXJlLTI="},
        {"type": "text", "text": "Open Settings, then Security, then Password policy; only team admins see it."}]}
    plain = [{**m, "content": [{k: v for k, v in b.items() if k != "cache_control"} for b in m["content"]]}
             if isinstance(m["content"], list) else m for m in loop]
    follow = plain + [answer, {"role": "user", "content": [
        {"type": "text", "text": "And where do admins see who changed it?", "cache_control": {"type": "ephemeral"}}]}]
    return [{"timestamp": 0, "model": model, "max_tokens": 400, "thinking": {"type": "enabled", "budget_tokens": 1024},
             "system": system, "messages": loop},
            {"timestamp": 30, "model": model, "max_tokens": 400,
             "thinking": {"type": "enabled", "budget_tokens": 1024}, "system": system, "messages": follow}]


def _cost(cli, write, model: str) -> list[dict]:
    path = write(f"{model}.jsonl", "".join(json.dumps(r) + "\n" for r in _conversation(model)))
    return json.loads(cli("prompt-cost", str(path), "--tokenizer", str(TOK_DIR), "-f", "json").stdout)["requests"]


def test_a_model_that_keeps_every_turn_s_thinking_reads_the_whole_loop_and_one_that_keeps_the_last_turn_s_does_not(
        cli, write):
    kept = _cost(cli, write, "claude-sonnet-4-6")       # Sonnet 4.6 and later keep all prior thinking blocks
    last = _cost(cli, write, "claude-sonnet-4-5")       # Sonnet 4.5 and earlier keep only the last turn's
    # the first request: the loop's thinking is the current turn's on both, the same prompt, the same writes
    assert [kept[0][k] for k in ("input_tokens", "cache_creation_input_tokens")] == \
        [last[0][k] for k in ("input_tokens", "cache_creation_input_tokens")]
    whole_loop = kept[0]["cache_creation_input_tokens"]
    # Sonnet 4.6: the follow-up reads all of the first request (up to its tool result's breakpoint)
    assert kept[1]["cache_read_input_tokens"] == whole_loop and kept[1]["miss"] is None
    # Sonnet 4.5: the user turn strips the loop's thinking, so the prefix differs from that block on: only the
    # system prompt's entry is read, and the miss names the block that was stripped
    assert 0 < last[1]["cache_read_input_tokens"] < whole_loop
    assert last[1]["miss"]["code"] == "thinking_stripped"
    assert last[1]["miss"]["path"] == "messages[1].content[0]"
    assert "keeps only the last assistant turn's thinking" in last[1]["miss"]["detail"]
    # ... and the two stripped thinking blocks are not in its prompt at all
    total = {name: r[1]["input_tokens"] + r[1]["cache_creation_input_tokens"] + r[1]["cache_read_input_tokens"]
             for name, r in (("kept", kept), ("last", last))}
    assert total["last"] < total["kept"]


def test_the_price_table_says_which_models_keep_only_the_last_turn_s_thinking():
    from cachectl.engines.provider.prices import PriceTable

    table = PriceTable.load()
    last = {m for m, p in table.models.items() if p.prior_thinking == "last_turn"}
    assert last == {"claude-opus-4-1", "claude-opus-4", "claude-sonnet-4-5", "claude-sonnet-4", "claude-3-7-sonnet",
                    "claude-haiku-4-5"}
    for m in ("claude-opus-4-5", "claude-opus-4-6", "claude-sonnet-4-6", "claude-sonnet-5", "gpt-4.1"):
        assert table.lookup(m).prior_thinking == "all"
    assert table.lookup("claude-sonnet-4-5-20250929").prior_thinking == "last_turn"   # a dated id: its alias


def test_list_models_names_the_models_that_keep_only_the_last_turn_s_thinking():
    from typer.testing import CliRunner

    from cachectl.cli import app

    text = CliRunner().invoke(app, ["prompt-cost", "--list-models"])
    assert text.exit_code == 0, text.output
    line = next(x for x in text.output.splitlines() if x.startswith("earlier turns' thinking blocks are stripped"))
    named = set(line.split(" on: ", 1)[1].split(", "))
    data = json.loads(CliRunner().invoke(app, ["prompt-cost", "--list-models", "--format", "json"]).output)
    assert named == {m["model"] for m in data["models"] if m["prior_thinking"] == "last_turn"}
    assert "claude-sonnet-4-5" in named and "claude-sonnet-4-6" not in named


@pytest.mark.parametrize("model, keeps, flag", [("claude-sonnet-4-5", False, False), ("claude-sonnet-4-6", True, False),
                                               ("claude-sonnet-4-5", False, True)])
def test_fx005_drops_a_thinking_block_sent_in_one_request_only_where_the_model_would_have_kept_it(
        cli, write, model, keeps, flag):
    """fix_log.jsonl's ``claude`` conversation sends its first assistant turn's thinking block in the second
    request and not in the third. Sonnet 4.5 sees neither (a later user turn strips it): no inconsistency, no
    FX005, and FX006's breakpoints are where the stripped prompts repeat. Sonnet 4.6 keeps it: FX005 drops it
    from the second request too, and the provider reads more."""
    rows = [json.loads(r) for r in FIX_LOG.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r.get("session") == "claude"]
    for r in rows:
        r["body"]["model"] = model
        if flag:  # (the lines name no model: --model names it)
            del r["body"]["model"]
    path = write("claude.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    d = json.loads(cli("fix", str(path), "--key", "session", "-t", str(TOK_DIR), "--unsafe-fixes", "-f", "json",
                       "-o", str(path.with_name("fixed.jsonl")), *(["-m", model] if flag else [])).stdout)
    fx005 = [f for f in d["fixes"] if f["code"] == "FX005"]
    assert bool(fx005) is keeps
    if keeps:
        assert [(f["line"], f["path"]) for f in fx005] == [(2, "body.messages[1]")]
    # FX006 marks the last position the next request repeats, in each request
    assert [f["line"] for f in d["fixes"] if f["code"] == "FX006"] == [1, 2, 3]
    # and with the fixes, each request reads all of the one before: on Sonnet 4.6 only because FX005 made the
    # thinking block consistent (measured before FX006 adds the breakpoints, FX005's own gain there is nil)
    rows = json.loads(cli("prompt-cost", str(path.with_name("fixed.jsonl")), "--tokenizer", str(TOK_DIR),
                          "-f", "json", *(["-m", model] if flag else [])).stdout)["requests"]
    for a, b in zip(rows, rows[1:]):
        assert b["miss"] is None
        assert b["cache_read_input_tokens"] == a["cache_read_input_tokens"] + a["cache_creation_input_tokens"]
    before, after = d["before"]["provider"], d["after"]["provider"]
    assert after["cache_read_tokens"] == sum(r["cache_read_input_tokens"] for r in rows) > before["cache_read_tokens"]
