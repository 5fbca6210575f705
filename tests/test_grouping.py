"""Automatic conversation grouping (``group_sessions``) against the naive reference it replaced: every line
compared with the last request of every conversation, the window applied to each. Generated logs mix OpenAI
Chat bodies (shared system prompts, tools, growing histories, a turn sent with extra blocks and then without,
volatile values), raw-text prompts longer and shorter than the index's chunk, token-ID prompts, and timestamps
that are missing, repeated or out of order."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines.repair import groups

from .conftest import TOK_DIR


def _extends(prev: Any, last_turn: int, cur: Any) -> int:
    """The reference's comparison, as it was: all of ``prev`` as ``cur``'s prefix, or (requests) all before its
    last turn and at least that turn's first position."""
    if type(prev) is not type(cur):
        return -1
    if len(prev) <= len(cur) and cur[:len(prev)] == prev:
        return len(prev)
    if isinstance(prev, tuple) and prev and isinstance(prev[0], str):
        n = 0
        for x, y in zip(prev, cur):
            if x != y:
                break
            n += 1
        if n > last_turn:
            return n
    return -1


def naive(lines, window_s, bos=None) -> tuple[tuple[int, ...], int]:
    ids: list[int] = []
    last: list[tuple[Any, int, float | None, int]] = []
    for i, ln in enumerate(lines):
        el, turn = groups._elements(ln, bos)
        best, best_len, best_at = -1, -1, -1
        for g, (pel, pturn, pts, at) in enumerate(last):
            if window_s is not None and pts is not None and ln.timestamp is not None and ln.timestamp - pts > window_s:
                continue
            n = _extends(pel, pturn, el)
            if n <= 0:
                continue
            if n > best_len or (n == best_len and at > best_at):
                best, best_len, best_at = g, n, at
        if best < 0:
            best = len(last)
            last.append((el, turn, ln.timestamp, i))
        else:
            last[best] = (el, turn, ln.timestamp, i)
        ids.append(best)
    return tuple(ids), len(last)


WORDS = ["cache", "block", "prefix", "token", "hit", "miss", "a", "b"]


def make_values(rng: random.Random, n: int, time_mode: str) -> list[Any]:
    systems = ["You are helpful.", "You are a cache expert. " * 5, "Time: 2026-11-30T10:00:00Z. Be brief."]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    convs: list[dict] = []
    out: list[Any] = []
    t = 1000.0
    for _ in range(n):
        roll = rng.random()
        if roll < 0.12:  # raw text, sometimes extending an earlier one
            base = rng.choice([v["prompt"] for v in out if isinstance(v, dict) and "prompt" in v] or [""])
            text = (base if rng.random() < 0.6 else "") + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 40)))
            value: Any = {"prompt": text}
        elif roll < 0.2:  # token IDs
            base = rng.choice([v["tokens"] for v in out if isinstance(v, dict) and "tokens" in v] or [[]])
            value = {"tokens": (base if rng.random() < 0.6 else []) + [rng.randrange(5) for _ in range(rng.randrange(1, 90))]}
        else:
            if not convs or rng.random() < 0.3:
                convs.append({"sys": rng.choice(systems), "msgs": [], "tools": rng.random() < 0.5})
            c = rng.choice(convs)
            if c["msgs"] and rng.random() < 0.8:
                c["msgs"].append({"role": "assistant", "content": rng.choice(WORDS)})
            user = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))
            c["msgs"].append({"role": "user", "content": user})
            msgs = [{"role": "system", "content": c["sys"]}, *[dict(m) for m in c["msgs"]]]
            if rng.random() < 0.15:  # the newest turn with an extra block, the history without it
                msgs[-1] = {"role": "user", "content": [{"type": "text", "text": user},
                                                         {"type": "text", "text": "context " + rng.choice(WORDS)}]}
            if rng.random() < 0.05 and len(msgs) > 2:  # history rewritten: a new conversation, or a partial match
                msgs[1] = {"role": msgs[1]["role"], "content": "edited"}
            body: dict = {"model": "gpt-4.1", "messages": msgs}
            if c["tools"]:
                body["tools"] = tools
            value = {"body": body}
        t += rng.choice([0.0, 1.0, 5.0, 40.0, 400.0])
        if time_mode == "monotone" or (time_mode == "mixed" and rng.random() < 0.7):
            value = {**value, "timestamp": t if rng.random() < 0.9 else t - rng.choice([0.0, 100.0, 3000.0])}
        out.append(value)
    return out


def lines_for(values: list[Any]) -> list[groups.LogLine]:
    return groups.log_lines(enumerate(values, 1), source="gen")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["monotone", "mixed", "none"]),
       st.sampled_from([None, 30.0, 1800.0]))
def test_grouping_equals_the_naive_reference(seed, time_mode, window_s):
    rng = random.Random(seed)
    lines = lines_for(make_values(rng, rng.randrange(1, 120), time_mode))
    got = groups.group_sessions(lines, window_s=window_s)
    assert (got.groups, got.count) == naive(lines, window_s)


def test_grouping_equals_the_naive_reference_on_a_long_log():
    rng = random.Random(3)
    lines = lines_for(make_values(rng, 1500, "mixed"))
    for window_s in (None, 60.0):
        got = groups.group_sessions(lines, window_s=window_s)
        assert (got.groups, got.count) == naive(lines, window_s)


def test_a_bos_prefix_does_not_split_a_raw_text_conversation():
    lines = lines_for([{"prompt": "<s>hello there"}, {"prompt": "hello there and more"}])
    assert groups.group_sessions(lines, tokenizer=type("T", (), {"bos_token": "<s>"})()).groups == (0, 0)
    assert naive(lines, 1800.0, "<s>")[0] == (0, 0)


def test_the_remembered_hashes_give_the_reference_comparison():
    rng = random.Random(8)
    pool = ["s", "u:a", "u:b", "a:x", "c", "t"]
    for _ in range(3000):
        kind = rng.choice(["r", "t", "i"])
        if kind == "r":
            prev: Any = tuple(rng.choice(pool) for _ in range(rng.randrange(1, 7)))
            cur: Any = prev[:rng.randrange(len(prev) + 1)] + tuple(rng.choice(pool) for _ in range(rng.randrange(4)))
            turn = rng.randrange(len(prev) + 1)
        else:
            n = rng.choice([1, 5, 63, 64, 65, 130, 200])
            prev = "".join(rng.choice("ab") for _ in range(n)) if kind == "t" else tuple(rng.randrange(2) for _ in range(n))
            cut = rng.randrange(len(prev) + 1)
            cur = prev[:cut] + (prev[cut:] if rng.random() < 0.5 else prev[cut:][::-1]) + prev[:rng.randrange(70)]
            turn = len(prev)
        index = groups._Index(None)
        index.add(prev, turn, None, 0)
        (last,) = (x for found in index.hot.values() for x in found.values())
        want = _extends(prev, turn, cur)
        if kind == "r":
            n = last.bucket[1]
            pre = groups._positions_hashes(cur)
            filed = n <= len(cur) and pre[n] == last.bucket[2]
        else:
            n = last.bucket[1]
            pre = groups._chunk_hashes(cur)
            filed = n <= len(cur) and (hash(cur[:n]) if n < groups._CHUNK else pre[n // groups._CHUNK]) == last.bucket[2]
        assert filed or want <= 0
        if filed:
            assert index._extends(last, kind, cur, pre) == (want if want > 0 else index._extends(last, kind, cur, pre))
            assert (index._extends(last, kind, cur, pre) > 0) == (want > 0)
        assert index.add(cur, 0, None, 1) == (0 if want > 0 else 1)


def test_a_key_of_true_and_a_key_of_1_are_two_conversations(cli, tmp_path):
    """True == 1 in Python: two requests keyed `true` and `1` were one conversation, and a pair measured."""
    import json as _json

    msgs = [{"role": "user", "content": "hello"}]
    log = tmp_path / "k.jsonl"
    log.write_text(_json.dumps({"session": True, "messages": msgs}) + "\n"
                   + _json.dumps({"session": 1, "messages": msgs + [{"role": "assistant", "content": "hi"}]}) + "\n")
    r = cli("diff-tokens", "--log", log, "--key", "session", "-t", TOK_DIR)
    assert "2 requests, 2 conversations, 0 pairs" in r.stdout, r.stdout
    from cachectl.inputs.prompt import conversation_key

    assert [conversation_key(v) for v in (True, 1, 1.0, "1", {"b": 1, "a": 2})] == [
        "true", 1, "1.0", "1", '{"a": 2, "b": 1}']
