"""``cachectl fix`` FX006 on OpenAI GPT-5.6+ requests, with expectations computed by hand from the documented rules
(developers.openai.com/api/docs/guides/prompt-caching): an explicit ``prompt_cache_breakpoint`` at the last
position the next request repeats, never on an assistant message, not below the minimum, at most four writes a
request; writes at 1.25x the input rate, reads at 0.1x, exact reads at a written breakpoint.

Token counts are words (the counter below), as in tests/test_provider_gpt56.py, so that every number can be
checked by hand. gpt-5.6-sol costs $4 input, $5 write, $0.40 read per million tokens (the shipped table).
"""

from __future__ import annotations

import json

import pytest

from cachectl.engines.provider import PriceTable, simulate_requests
from cachectl.engines.repair import fixes, groups

from .conftest import PROMPTS

MODEL = "gpt-5.6-sol"
IN, WRITE, READ = 4e-6, 5e-6, 0.4e-6
MARK = {"mode": "explicit"}


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def count(text: str) -> int:
    return len(text.split())


class Words:
    """The token counter FX006 checks the minimum with: words."""

    def count(self, text: str) -> int:
        return count(text)


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


def body(messages, ts, model=MODEL, **extra):
    return {"timestamp": ts, "output_tokens": 0, "model": model, "prompt_cache_key": "ops", "messages": messages,
            **extra}


def developer(n=9000, marked=False, tag="d"):
    block = {"type": "text", "text": words(n, tag)}
    if marked:
        block["prompt_cache_breakpoint"] = dict(MARK)
    return {"role": "developer", "content": [block]}


def user(i, n=10):
    return {"role": "user", "content": words(n, f"q{i}x")}


def fixed(rows, table, key=None):
    """FX006 alone on the rows: the lines, the rewriter, and the rewritten lines parsed again."""
    lines = groups.log_lines(enumerate(rows, start=1), source="t.jsonl", key=key)
    grouping = groups.group_sessions(lines, key=key)
    rw = fixes.rewrite(lines, grouping, ["FX006"], False, None, table, None, counter=Words())
    return lines, rw, [groups.reparse(ln, v) for ln, v in zip(lines, rw.values)]


def simulate(lines, table):
    return simulate_requests([ln.request for ln in lines], table=table, source="t", text_counter=count)


def split(report):
    return [(q.cache_read_input_tokens, q.cache_creation_input_tokens) for q in report.requests]


@pytest.mark.parametrize("key", [None, "prompt_cache_key"])
def test_the_stable_developer_message_gets_the_breakpoint_and_every_later_request_reads_it(table, key):
    # the case: 10 requests two minutes apart (within the 30-minute TTL), a 9,000-token stable developer
    # message and a changing 10-token question. Without a key each request is its own conversation (grouping
    # finds nothing to extend), so FX006 pairs each with the next request that starts the same.
    rows = [body([developer(), user(i)], 120 * i) for i in range(10)]
    lines, rw, after_lines = fixed(rows, table, key)
    assert len(rw.fixes) == 10 and all(f.code == "FX006" and f.safe and f.applied for f in rw.fixes)
    assert {f.path for f in rw.fixes} == {"messages[0].content[0]"}
    assert "9,000 tokens, minimum 1,024" in rw.fixes[0].message
    for v in rw.values:  # the developer's block is marked, the question is not
        assert v["messages"][0]["content"][0]["prompt_cache_breakpoint"] == MARK
        assert v["messages"][1] == rows[0]["messages"][1] or isinstance(v["messages"][1]["content"], str)
    before, after = simulate(lines, table), simulate(after_lines, table)
    # before: the implicit breakpoint sits after the change, nothing is read, 9,010 tokens written each time
    assert split(before) == [(0, 9010)] * 10
    assert before.total_cost_usd == pytest.approx(10 * 9010 * WRITE)              # $0.4505
    # after: one write of the whole prompt, then 9,000 read exactly (0 -> 9,000) and the 10-token question written
    assert split(after) == [(0, 9010)] + [(9000, 10)] * 9
    assert after.total_cost_usd == pytest.approx(9010 * WRITE + 9 * (9000 * READ + 10 * WRITE))   # $0.0779
    assert after.total_cost_usd == pytest.approx(0.0779)
    assert all(q.miss is None for q in after.requests[1:])


def test_a_growing_conversation_gets_its_breakpoint_on_the_last_repeated_message(table):
    # the client sends a per-request context message after the newest question, and not in the history: the
    # implicit breakpoint sits on it, after the part that changes, so nothing is ever read.
    history = [developer(2000)]
    rows = []
    for i in range(4):
        history = history + [user(i, 100)]
        rows.append(body(history + [{"role": "system", "content": words(20, f"c{i}x")}], 60 * i))
        history = history + [{"role": "assistant", "content": [{"type": "text", "text": words(50, f"a{i}x")}]}]
    lines, rw, after_lines = fixed(rows, table)
    # each request's breakpoint: its newest question, the last message the next request repeats (a string content
    # becomes one text block, in every request that sends it)
    marked = [[(j, b) for j, m in enumerate(v["messages"]) if isinstance(m["content"], list)
               for b in m["content"] if "prompt_cache_breakpoint" in b] for v in rw.values]
    assert [[j for j, _ in m] for m in marked] == [[1], [3], [5], [5]]
    for v in rw.values:
        for m in v["messages"][1:6:2]:  # the marked questions: the same block wherever they are sent
            assert m["content"][0]["type"] == "text" and m["content"][0]["text"].startswith("q")
        assert not any("prompt_cache_breakpoint" in b for m in v["messages"] if m["role"] == "assistant"
                       for b in m["content"])
    before, after = simulate(lines, table), simulate(after_lines, table)
    # positions: developer 2,000, each question 100, each answer 50, the context 20
    assert split(before) == [(0, 2120), (0, 2270), (0, 2420), (0, 2570)]
    assert split(after) == [(0, 2120), (2100, 170), (2250, 170), (2400, 170)]
    assert after.total_cost_usd == pytest.approx((2120 + 3 * 170) * WRITE + (2100 + 2250 + 2400) * READ)
    assert before.total_cost_usd == pytest.approx((2120 + 2270 + 2420 + 2570) * WRITE)


def test_explicit_mode_without_a_marker_gets_one_and_a_keyed_conversation_likewise(table):
    opts = {"prompt_cache_options": {"mode": "explicit"}}
    history = [developer(2000)]
    rows = []
    for i in range(3):
        history = history + [user(i, 100)]
        rows.append(body(list(history), 60 * i, **opts))
        history = history + [{"role": "assistant", "content": words(50, f"a{i}x")}]
    lines, rw, after_lines = fixed(rows, table, key="prompt_cache_key")
    # the last request of an append-only conversation: its last position, as for Anthropic
    assert [f.path for f in rw.fixes] == ["messages[1].content[0]", "messages[3].content[0]", "messages[5].content[0]"]
    before, after = simulate(lines, table), simulate(after_lines, table)
    assert split(before) == [(0, 0)] * 3                                 # explicit mode, no marker: nothing cached
    assert split(after) == [(0, 2100), (2100, 150), (2250, 150)]


def test_nothing_is_placed_on_an_assistant_message(table):
    # a regenerated last question: the next request repeats up to the assistant's answer, which takes no marker;
    # the breakpoint goes on the question before it
    answer = {"role": "assistant", "content": [{"type": "text", "text": words(50, "a")}]}
    rows = [body([developer(2000), user(0, 100), answer, user(i + 1, 100)], 60 * i) for i in range(3)]
    lines, rw, after_lines = fixed(rows, table)
    assert {f.path for f in rw.fixes} == {"messages[1].content[0]"}
    for v in rw.values:
        assert "prompt_cache_breakpoint" not in v["messages"][2]["content"][0]
    assert split(simulate(after_lines, table)) == [(0, 2250), (2100, 150), (2100, 150)]


def test_responses_input_gets_the_marker_on_an_input_text_block(table):
    rows = [{"timestamp": 120 * i, "output_tokens": 0, "model": MODEL,
             "input": [{"role": "developer", "content": words(3000, "d")},
                       {"role": "user", "content": [{"type": "input_text", "text": words(10, f"q{i}x")}]}]}
            for i in range(3)]
    lines, rw, after_lines = fixed(rows, table)
    for v in rw.values:
        assert v["input"][0]["content"] == [{"type": "input_text", "text": words(3000, "d"),
                                             "prompt_cache_breakpoint": MARK}]
    assert split(simulate(after_lines, table)) == [(0, 3010), (3000, 10), (3000, 10)]


def test_a_marker_on_the_changing_message_is_removed_and_the_stable_one_marked(table):
    def question(i):
        return {"role": "user", "content": [{"type": "text", "text": words(10, f"q{i}x"),
                                             "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"}}]}

    rows = [body([developer(), question(i)], 120 * i) for i in range(3)]
    lines, rw, after_lines = fixed(rows, table)
    assert all("1 marker(s) on positions the next request changes removed" in f.message for f in rw.fixes[:2])
    for v in rw.values[:2]:
        assert "prompt_cache_breakpoint" not in v["messages"][1]["content"][0]
        # the removed marker's TTL goes with the new one
        assert v["messages"][0]["content"][0]["prompt_cache_breakpoint"] == {"mode": "explicit", "ttl": "30m"}
    assert split(simulate(lines, table)) == [(0, 9010)] * 3
    assert split(simulate(after_lines, table)) == [(0, 9010), (9000, 10), (9000, 10)]


@pytest.mark.parametrize("mode, kept", [("implicit", [2, 3, 4]), ("explicit", [1, 2, 3, 4])])
def test_the_four_write_limit_holds(table, mode, kept):
    # four marked instruction messages and an unmarked stable fifth before a changing question: the new marker
    # on the fifth would make five explicit ones; a request writes at most four (the implicit one and the latest
    # three explicit ones in implicit mode), so the earliest go
    stable = [developer(1200, marked=True, tag=f"s{k}x") for k in range(4)] + [developer(100, tag="s4x")]
    rows = [body(stable + [user(i)], 60 * i, prompt_cache_options={"mode": mode}) for i in range(3)]
    lines, rw, after_lines = fixed(rows, table)
    for v in rw.values:
        marked = [j for j, m in enumerate(v["messages"]) if "prompt_cache_breakpoint" in m["content"][0]]
        assert marked == kept
        assert len(marked) + (mode == "implicit") <= 4
    assert "earlier marker(s) removed: a request writes at most 4" in rw.fixes[0].message
    before, after = simulate(lines, table), simulate(after_lines, table)
    assert all(q.miss is None or q.miss.code != "breakpoint_limit" for q in after.requests)
    assert [q.cache_read_input_tokens for q in before.requests] == [0, 4800, 4800]   # the fourth marker, 4 x 1,200
    assert [q.cache_read_input_tokens for q in after.requests] == [0, 4900, 4900]    # the stable prefix, exactly


def test_below_the_minimum_and_earlier_models_get_nothing(table):
    short = [body([developer(500), user(i)], 60 * i) for i in range(3)]
    assert fixed(short, table)[1].fixes == []
    gpt5 = [body([developer(), user(i)], 60 * i, model="gpt-5") for i in range(3)]
    assert fixed(gpt5, table)[1].fixes == []


def test_fix_turns_the_implicit_fixture_into_the_breakpoint_fixture(cli, tmp_path):
    out = tmp_path / "fixed.jsonl"
    r = cli("fix", PROMPTS / "gpt56_implicit.jsonl", "-t", PROMPTS.parent / "tok", "--out", out, "--format", "json")
    assert r.exit_code == 1, r.output   # fixes were found
    assert out.read_bytes() == (PROMPTS / "gpt56_breakpoint.jsonl").read_bytes()
    d = json.loads(r.stdout)
    b, a = d["before"]["provider"], d["after"]["provider"]
    assert (b["cache_read_tokens"], a["cache_read_tokens"]) == (0, 4 * 9047)
    assert a["cost_usd"] < b["cost_usd"] and b["cost_usd"] > b["uncached_cost_usd"]


def test_model_as_is_named_by_its_flag(cli, tmp_path):
    # the engine's note names its parameter (`model_as`); the CLI shows the flag, and refuses an unknown NAME there
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps({"model": "gpt-5.6-solar", "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
                   + "\n")
    ok = cli("prompt-cost", "--usage", log, "--model-as", MODEL)
    assert ok.exit_code == 0 and "with its cache rules (--model-as)" in ok.stdout and "`model_as`" not in ok.stdout
    bad = cli("prompt-cost", "--usage", log, "--model-as", "gpt-nope")
    assert bad.exit_code == 2 and "--model-as: unknown model 'gpt-nope'" in bad.stderr
