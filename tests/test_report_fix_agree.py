"""``report`` and ``fix`` agree across requests (issue 38, item 5): every fork ``report`` offers a fix for
(``fixable`` FX001/FX007) is rewritten by ``fix --unsafe-fixes`` at that fork's path, in every request shape whose
head can hold a per-request line (Anthropic ``system`` as a string and as a list of text blocks, OpenAI Chat
system and developer messages, their content as parts, Responses ``instructions`` and a developer input item),
the rewritten log is still valid for its API, its fork is gone, and the vLLM hits rise as the report predicted.

Each log is a few dozen single-turn requests of different users whose system prompt (hundreds of tokens, many
16-token blocks) opens with a request id or a clock line; both commands run through the real CLI with the
project's test tokenizer (fixtures/tok)."""

from __future__ import annotations

import json
import random
import uuid

import pytest

from .conftest import TOK_DIR

STABLE = ("You are a support assistant for the Acme cache service. A prefix cache keeps the attention keys and "
          "values of a prompt after the request ends, so that the next request that starts with the same tokens can "
          "skip their prefill. The cache is keyed by token IDs in blocks of sixteen tokens, and each block's key is a "
          "hash of its parent block's key and its own tokens. Lookup walks the blocks from the first one and stops at "
          "the first miss. Only full blocks are stored; the partial block at the end of a prompt never hits.\n"
          "When memory runs out, the least recently used free block is evicted first. A provider prompt cache is the "
          "billed version of the same lookup. Most cache misses come from the prompt itself.\n")
QUESTIONS = ["How do I clear the cache?", "Why is my hit rate low?", "What is a block?", "How long do entries live?",
             "Can I pin a prefix?", "What does eviction mean?", "Does the order of tools matter?", "What is prefill?"]
N = 20


def _body(shape: str, rid: str, k: int) -> dict:
    head = f"request_id: {rid}"
    q = f"{QUESTIONS[k % len(QUESTIONS)]} (asked by user {k})"
    claude = {"model": "claude-sonnet-4-5", "max_tokens": 100}
    if shape == "anthropic_system_string":
        return {**claude, "system": f"{head}\n{STABLE}", "messages": [{"role": "user", "content": q}]}
    if shape == "anthropic_system_blocks":
        # the first block holds only the request id (the shape of issue 38 item 5)
        return {**claude, "system": [{"type": "text", "text": head}, {"type": "text", "text": STABLE}],
                "messages": [{"role": "user", "content": q}]}
    if shape == "anthropic_system_blocks_marked":
        # the id block, in the middle, carries a breakpoint; the user turn is a list of blocks
        return {**claude, "system": [{"type": "text", "text": "You are Acme's assistant."},
                                     {"type": "text", "text": head, "cache_control": {"type": "ephemeral"}},
                                     {"type": "text", "text": STABLE, "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": q}]}]}
    if shape == "anthropic_system_id_and_user_blocks":
        # two blocks to move, one per fix code: FX007 finds its block after FX001 removed the one above it
        return {**claude, "metadata": {"user_id": f"u{k % 4}"},
                "system": [{"type": "text", "text": head}, {"type": "text", "text": f"user: customer{k % 4}@example.com"},
                           {"type": "text", "text": STABLE}],
                "messages": [{"role": "user", "content": q}]}
    if shape == "anthropic_prefill":
        # the request ends with an assistant prefill: the line goes to the user turn before it
        return {**claude, "system": [{"type": "text", "text": head}, {"type": "text", "text": STABLE}],
                "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "{"}]}
    if shape == "openai_prefill":
        return {"model": "gpt-4.1", "messages": [{"role": "system", "content": f"{head}\n{STABLE}"},
                                                 {"role": "user", "content": q}, {"role": "assistant", "content": "{"}]}
    if shape == "openai_system":
        return {"model": "gpt-4.1", "messages": [{"role": "system", "content": f"{head}\n{STABLE}"},
                                                 {"role": "user", "content": q}]}
    if shape == "openai_developer":
        return {"model": "gpt-4.1", "messages": [{"role": "developer", "content": f"{head}\n{STABLE}"},
                                                 {"role": "user", "content": q}]}
    if shape == "openai_system_parts":
        return {"model": "gpt-4.1", "messages": [
            {"role": "system", "content": [{"type": "text", "text": head}, {"type": "text", "text": STABLE}]},
            {"role": "user", "content": q}]}
    if shape == "responses_instructions":
        return {"model": "gpt-4.1", "instructions": f"{head}\n{STABLE}", "input": [{"role": "user", "content": q}]}
    if shape == "responses_instructions_string_input":
        return {"model": "gpt-4.1", "instructions": f"{head}\n{STABLE}", "input": q}
    if shape == "responses_developer_parts":
        return {"model": "gpt-4.1", "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": head},
                                              {"type": "input_text", "text": STABLE}]},
            {"role": "user", "content": q}]}
    raise AssertionError(shape)


SHAPES = ["anthropic_system_string", "anthropic_system_blocks", "anthropic_system_blocks_marked",
          "anthropic_system_id_and_user_blocks", "anthropic_prefill", "openai_prefill", "openai_system",
          "openai_developer", "openai_system_parts", "responses_instructions", "responses_instructions_string_input",
          "responses_developer_parts"]


def _log(path, shape: str) -> None:
    rng = random.Random(shape)
    with open(path, "w") as f:
        for k in range(N):
            rid = "req_" + uuid.UUID(int=rng.getrandbits(128)).hex
            f.write(json.dumps({"timestamp": f"2026-11-30T10:{k:02d}:00Z", "session": f"s{k}",
                                "body": _body(shape, rid, k)}) + "\n")


def _report(cli, path) -> dict:
    r = cli("report", path, "-t", TOK_DIR, "--format", "json")
    assert r.exit_code in (0, 1), r.output  # 1: it found something to fix
    return json.loads(r.stdout)


def _fix(cli, path, out) -> dict:
    r = cli("fix", path, "-t", TOK_DIR, "--unsafe-fixes", "-o", out, "--format", "json")
    assert r.exit_code in (0, 1), r.output  # 1: it rewrote something
    return json.loads(r.stdout)


def _at(fix_path: str, fork_path: str) -> bool:
    return fix_path == fork_path or fix_path.startswith((fork_path + ".", fork_path + "["))


def _offered(report: dict) -> list[dict]:
    return [f for f in report["forks"] if f["fixable"] in ("FX001", "FX007")]


def _check_valid(body: dict) -> None:
    """No empty text block or part is left (Anthropic refuses one), and a system list is never empty."""
    blocks = []
    if isinstance(body.get("system"), list):
        assert body["system"], body
        blocks += body["system"]
    for m in (body.get("messages") or []) + (body.get("input") if isinstance(body.get("input"), list) else []):
        if isinstance(m.get("content"), list):
            assert m["content"], m
            blocks += m["content"]
    for b in blocks:
        assert b.get("text", "x").strip(), body


@pytest.mark.parametrize("shape", SHAPES)
def test_a_fork_report_offers_a_fix_for_is_fixed_by_fix(cli, tmp_path, shape):
    log, out = tmp_path / "log.jsonl", tmp_path / "fixed.jsonl"
    _log(log, shape)
    offered = _offered(_report(cli, log))
    assert offered, f"{shape}: report finds the request id at the top of the shared prefix"
    fixed = _fix(cli, log, out)
    for fork in offered:
        done = [x for x in fixed["fixes"] if x["code"] == fork["fixable"] and x["applied"] and _at(x["path"], fork["path"])]
        assert len({x["line"] for x in done}) == N, (shape, fork["path"], fixed["fixes"][:3])
    cross = fixed["cross_request"]
    assert cross["hit_tokens_before"] < cross["hit_tokens_after"]
    assert cross["hit_tokens_after"] >= 0.9 * cross["predicted_hit_tokens"], cross
    # the rewritten log: valid for its API, every line rewritten keeps its other fields, no fork left to fix
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == N
    for row in rows:
        _check_valid(row["body"])
        body = row["body"]
        head = {k: v for k, v in body.items() if k not in ("messages", "input")}
        turns = body.get("messages", body.get("input"))
        if isinstance(turns, list):  # the turns before the last user turn, and an assistant prefill after it
            last_user = max(k for k, m in enumerate(turns) if m.get("role") == "user")
            head["earlier turns"] = turns[:last_user] + turns[last_user + 1:]
            assert turns[-1].get("role") == "user" or turns[-1] == {"role": "assistant", "content": "{"}, turns
        assert "request_id" not in json.dumps(head) and "request_id: req_" in json.dumps(body), body
    again = _report(cli, out)
    assert not _offered(again), again["forks"]
    assert not [f for f in again["forks"] if f["cause"] in ("volatile_id", "date_time", "counter")], again["forks"]


@pytest.mark.parametrize("shape", ["anthropic_system_blocks", "openai_system_parts", "responses_instructions"])
def test_a_per_user_fork_report_offers_fx007_for_is_fixed_by_fix(cli, tmp_path, shape):
    """The same with a per-user line (five users, four requests each, the log's ``user`` field predicting it):
    FX007 moves it."""
    log, out = tmp_path / "log.jsonl", tmp_path / "fixed.jsonl"
    with open(log, "w") as f:
        for k in range(N):
            body = json.loads(json.dumps(_body(shape, "x", k)).replace("request_id: x", f"user: customer{k % 5}@example.com"))
            f.write(json.dumps({"timestamp": f"2026-11-30T10:{k:02d}:00Z", "session": f"s{k}",
                                "user": f"u{k % 5}", "body": body}) + "\n")
    offered = _offered(_report(cli, log))
    assert [f["fixable"] for f in offered] == ["FX007"], offered
    fixed = _fix(cli, log, out)
    done = [x for x in fixed["fixes"] if x["code"] == "FX007" and x["applied"] and _at(x["path"], offered[0]["path"])]
    assert len({x["line"] for x in done}) == N, fixed["fixes"][:3]
    for x in out.read_text().splitlines():
        _check_valid(json.loads(x)["body"])
    assert not _offered(_report(cli, out))


def test_a_breakpoint_on_the_removed_block_goes_to_the_block_before(cli, tmp_path):
    log, out = tmp_path / "log.jsonl", tmp_path / "fixed.jsonl"
    _log(log, "anthropic_system_blocks_marked")
    _fix(cli, log, out)
    for x in out.read_text().splitlines():
        body = json.loads(x)["body"]
        system = body["system"]
        assert [b["text"] for b in system] == ["You are Acme's assistant.", STABLE]
        assert [("cache_control" in b) for b in system] == [True, True]
        last = body["messages"][-1]["content"]
        assert last[-1]["type"] == "text" and last[-1]["text"].startswith("request_id: req_")


def test_a_value_in_a_conversation_turn_is_not_offered_a_fix(cli, tmp_path):
    """A value that differs between conversations in their first user turn: that turn is history in the later
    requests of each conversation, which FX001/FX007 keep append-only, so ``report`` must not offer a fix there
    (``fix`` never rewrites it)."""
    log, out = tmp_path / "log.jsonl", tmp_path / "fixed.jsonl"
    with open(log, "w") as f:
        for k in range(N):
            body = {"model": "claude-sonnet-4-5", "max_tokens": 100,
                    "system": [{"type": "text", "text": f"Current time: 2026-11-30T10:{k:02d}:{k:02d}Z"},
                               {"type": "text", "text": STABLE}],
                    "messages": [{"role": "user", "content": f"ticket {1000 + k}: my cache is cold\n{STABLE}"},
                                 {"role": "assistant", "content": "Sure."},
                                 {"role": "user", "content": "and more?"}]}
            f.write(json.dumps({"timestamp": f"2026-11-30T10:{k:02d}:00Z", "session": f"s{k}", "body": body}) + "\n")
    report = _report(cli, log)
    offered = _offered(report)
    assert offered and all(f["path"] == "body.system" for f in offered), report["forks"]
    fixed = _fix(cli, log, out)
    for fork in offered:
        assert any(x["applied"] and _at(x["path"], fork["path"]) for x in fixed["fixes"])
    assert not any(_at(x["path"], "body.messages") for x in fixed["fixes"] if x["code"] in ("FX001", "FX007"))
