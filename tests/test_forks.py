"""The shared-prefix tree of a whole log (cachectl.engines.prefix.forks), on the fixtures that
fixtures/make_shared_prefix_log.py builds. Fork costs are checked against an independent computation: the
hand-fixed copy of the log (and variants of it fixed by hand in this file) replayed by a naive reference (keys
are whole token prefixes, a plain set for no eviction, tests/reference_prefix.py's NaiveVllm at capacity)."""

from __future__ import annotations

import json
import random
from array import array
from pathlib import Path

import pytest

import cachectl
from cachectl.engines.prefix import analyze_forks, fork_requests, simulate
from cachectl.engines.prefix.forks import ForkRequest, PrefixTree
from cachectl.engines.prefix.trace import TraceRequest, block_keys
from cachectl.inputs import iter_jsonl, prompt_from_value

from .reference_prefix import NaiveVllm

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "fixtures" / "prompts"
SHARED = PROMPTS / "shared_prefix_log.jsonl"
FIXED = PROMPTS / "shared_prefix_log_fixed.jsonl"
APPS = PROMPTS / "three_apps_log.jsonl"
TOOLS = PROMPTS / "shuffled_tools_log.jsonl"
CONTRACT = {"path", "char", "cause", "distinct_values", "requests", "tokens_lost", "fixable"}


@pytest.fixture(scope="module")
def tok():
    return cachectl.load_tokenizer(str(ROOT / "fixtures" / "tok"))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _served(tok, rows: list[dict]) -> list[list[int]]:
    prompts = [prompt_from_value(r, source="<test>", line=i + 1) for i, r in enumerate(rows)]
    return [list(t.ids) for t in tok.tokenize_many(prompts, add_generation_prompt=True)]


def _naive_hits(seqs: list[list[int]], bs: int = 16, capacity: int | None = None) -> int:
    """No eviction: a set of whole-prefix tuples, lookup capped at L - 1 tokens; at capacity: NaiveVllm."""
    if capacity is not None:
        pool = NaiveVllm(capacity, bs)
        return sum(pool.run(s) for s in seqs)
    seen: set = set()
    hits = 0
    for s in seqs:
        keys = [tuple(s[:(i + 1) * bs]) for i in range(len(s) // bs)]
        h = 0
        while h < min(len(keys), (len(s) - 1) // bs) and keys[h] in seen:
            h += 1
        hits += h * bs
        seen.update(keys)
    return hits


def _move_to_context(rows: list[dict], prefixes: tuple[str, ...]) -> list[dict]:
    """Fix by hand: the system prompt's lines that start with one of ``prefixes`` moved to a trailing
    ``Context:`` section of the user turn (what shared_prefix_log_fixed.jsonl does with all three)."""
    out = []
    for r in rows:
        system, user = r["messages"][0]["content"], r["messages"][1]["content"]
        lines = system.split("\n")
        moved = [x for x in lines if x.startswith(prefixes)]
        kept = [x for x in lines if not x.startswith(prefixes)]
        out.append({**r, "messages": [{"role": "system", "content": "\n".join(kept)},
                                      {"role": "user", "content": user + "\n\nContext:\n" + "\n".join(moved)}]})
    return out


@pytest.fixture(scope="module")
def shared(tok):
    reqs = list(fork_requests(iter_jsonl(str(SHARED)), source=str(SHARED), tokenizer=tok))
    return reqs, analyze_forks(reqs, tokenizer=tok, block_size=16, capacity_blocks=400)


def test_hand_fixed_copy_is_the_fixture_fixed_by_hand():
    assert _move_to_context(_rows(SHARED), ("Current time:", "Request id:", "user:")) == _rows(FIXED)


def test_shared_prefix_forks_and_their_causes(shared):
    _, rep = shared
    fixable = {f.cause: f for f in rep.forks if f.fixable}
    assert set(fixable) == {"date_time", "volatile_id", "per_user_value"}
    assert {f.fixable for f in fixable.values()} == {"FX001", "FX007"}
    assert fixable["date_time"].fixable == fixable["volatile_id"].fixable == "FX001"
    user = fixable["per_user_value"]
    assert user.fixable == "FX007"
    assert (user.distinct_values, user.requests) == (12, 60)    # 12 users over 60 requests
    assert user.predicted_by == "user"                          # the OpenAI `user` field (opaque ids) decides it
    assert all(e.startswith("user: ") and e.endswith(".example") for e in user.examples)
    for cause, char in (("date_time", "Current time: "), ("volatile_id", "Request id: req_"), ("per_user_value", "user: ")):
        f = fixable[cause]
        assert f.path == "messages[0].content"
        line_start = _rows(SHARED)[0]["messages"][0]["content"].index(char)
        assert line_start <= f.char <= line_start + 40, (cause, f.char)
    assert fixable["date_time"].distinct_values == fixable["volatile_id"].distinct_values == 60
    assert [f.tokens_lost for f in rep.forks] == sorted((f.tokens_lost for f in rep.forks), reverse=True)
    assert all(CONTRACT <= set(f.to_dict()) for f in rep.forks)
    d = rep.to_dict()
    json.dumps(d)
    assert CONTRACT <= set(d["forks"][0])


def test_fork_costs_against_a_naive_replay_of_the_hand_fixed_log(tok, shared):
    _, rep = shared
    before, after = _served(tok, _rows(SHARED)), _served(tok, _rows(FIXED))
    assert rep.hit_tokens == _naive_hits(before)
    naive_fixed = _naive_hits(after)
    assert naive_fixed > 30 * rep.hit_tokens                  # the three lines cost nearly everything
    assert abs(rep.fixed_hit_tokens - naive_fixed) <= 0.01 * naive_fixed
    assert rep.hit_tokens_at_capacity == _naive_hits(before, capacity=400)
    naive_cap = _naive_hits(after, capacity=400)
    assert rep.fixed_hit_tokens_at_capacity is not None
    assert abs(rep.fixed_hit_tokens_at_capacity - naive_cap) <= 0.01 * naive_cap
    # each fork's cost: all three moved, against all but that one moved (fixed by hand, replayed naively)
    by_cause = {f.cause: f for f in rep.forks if f.fixable}
    for cause, kept in (("per_user_value", ("Current time:", "Request id:")),
                        ("date_time", ("Request id:", "user:")), ("volatile_id", ("Current time:", "user:"))):
        variant = _served(tok, _move_to_context(_rows(SHARED), kept))
        lost = naive_fixed - _naive_hits(variant)
        assert abs(by_cause[cause].tokens_lost - lost) <= 0.03 * naive_fixed, (cause, by_cause[cause].tokens_lost, lost)
        lost_cap = naive_cap - _naive_hits(variant, capacity=400)
        assert abs(by_cause[cause].tokens_lost_at_capacity - lost_cap) <= 0.03 * naive_cap, cause


def test_spans_to_move_name_the_lines_in_the_request(shared):
    reqs, rep = shared
    rows = _rows(SHARED)
    for k in (0, 7, 59):
        spans = rep.spans_to_move(reqs[k])
        content = rows[k]["messages"][0]["content"]
        assert [s.code for s in spans] == ["FX001", "FX001", "FX007"]
        assert {s.cause for s in spans} == {"date_time", "volatile_id", "per_user_value"}
        for s in spans:
            assert s.path == "messages[0].content"
            assert content[s.start:s.end] == s.text
            assert s.text.startswith(("Current time: ", "Request id: req_", "user: ")) and s.text.endswith("\n")
    user = next(f for f in rep.forks if f.cause == "per_user_value")
    span = cachectl.engines.prefix.fork_span(rep, user, reqs[3])
    assert span is not None and span.text == f"user: {rows[3]['messages'][0]['content'].split('user: ')[1].split(chr(10))[0]}\n"


def test_three_unrelated_apps_have_no_fixable_fork(tok):
    rep = analyze_forks(iter_jsonl(str(APPS)), tokenizer=tok, source=str(APPS))
    assert rep.forks and not any(f.fixable for f in rep.forks)
    root = rep.forks[0]
    assert (root.cause, root.distinct_values, root.requests, root.tokens_lost) == ("different_prompt", 3, 30, 0)
    assert root.path == "messages[0].content"
    assert rep.fixed_hit_tokens == rep.hit_tokens == _naive_hits(_served(tok, _rows(APPS)))


def test_shuffled_tools_are_a_tool_order_fork(tok):
    rep = analyze_forks(iter_jsonl(str(TOOLS)), tokenizer=tok, source=str(TOOLS))
    fork = next(f for f in rep.forks if f.fixable)
    assert (fork.cause, fork.fixable, fork.path, fork.requests) == ("tool_order", "FX003", "tools", 24)
    rows = _rows(TOOLS)
    assert fork.distinct_values == len({tuple(t["function"]["name"] for t in r["tools"]) for r in rows})
    # independent: every request's tools sorted by name (any one order shares the same prefix), replayed naively
    ordered = [{**r, "tools": sorted(r["tools"], key=lambda t: t["function"]["name"])} for r in rows]
    naive = _naive_hits(_served(tok, ordered))
    assert rep.fixed_hit_tokens == naive
    assert fork.tokens_lost == naive - _naive_hits(_served(tok, rows)) > 0


def test_without_a_tokenizer_canonical_positions_show_the_same_forks():
    reqs = list(fork_requests(iter_jsonl(str(SHARED)), source=str(SHARED)))
    rep = analyze_forks(reqs)
    causes = {f.cause: f for f in rep.forks if f.fixable}
    assert set(causes) == {"date_time", "volatile_id", "per_user_value"}
    assert causes["per_user_value"].distinct_values == 12 and causes["per_user_value"].predicted_by == "user"
    apps = analyze_forks(list(fork_requests(iter_jsonl(str(APPS)), source=str(APPS))))
    assert not any(f.fixable for f in apps.forks)


def test_a_tenant_field_that_predicts_a_value_is_named():
    rows = [{"model": "m", "metadata": {"tenant_id": t}, "user": f"u{k}", "messages": [
        {"role": "system", "content": f"Assistant.\nCompany: {t.title()} Incorporated\n" + "Stable rules apply. " * 40},
        {"role": "user", "content": f"question number {k}"}]} for k, t in enumerate(["acme", "globex"] * 6)]
    rep = analyze_forks(list(enumerate(rows, 1)), source="<test>")
    fork = next(f for f in rep.forks if f.fixable)
    assert (fork.cause, fork.predicted_by, fork.distinct_values, fork.requests) == (
        "per_user_value", "metadata.tenant_id", 2, 12)


# ------------------------------------------------------------------------------------------ the tree


def _naive_forks(seqs: list[list[int]]) -> dict[tuple, tuple[int, int]]:
    """Prefix (whole blocks) -> (requests that continue past it, distinct next blocks), where >= 2 branches."""
    nxt: dict[tuple, dict[tuple, int]] = {}
    for s in seqs:
        for i in range(len(s)):
            nxt.setdefault(tuple(s[:i]), {}).setdefault(tuple(s[:i + 1]), 0)
            nxt[tuple(s[:i])][tuple(s[:i + 1])] += 1
    return {p: (sum(c.values()), len(c)) for p, c in nxt.items() if len(c) >= 2}


@pytest.mark.parametrize("chained", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_prefix_tree_forks_agree_with_a_naive_trie(seed, chained):
    """Chained keys (a block's key names its whole prefix) find a child by its first key alone; raw token values
    as keys (not chained: one key starts edges under many nodes) take the tree's fallback by node and key."""
    rng = random.Random(seed)
    stems = [[rng.randrange(4) for _ in range(rng.randrange(1, 6))] for _ in range(4)]
    seqs = []
    for _ in range(rng.randrange(2, 30)):
        s = list(rng.choice(stems)) if rng.random() < 0.8 else []
        s += [rng.randrange(3) for _ in range(rng.randrange(0, 5))]
        seqs.append(s)
    tree = PrefixTree()
    for k, s in enumerate(seqs):
        tree.insert(array("q", block_keys(s, 1) if chained else s), k)
    naive = _naive_forks(seqs)
    forks = tree.forks()
    took = tree.branches(forks)
    got = {}
    for f in forks:
        rep = seqs[next(iter(took[f.key]))]
        prefix = tuple(rep[:f.end])
        got[prefix] = (len(took[f.key]), len(f.children))
        nexts = {seqs[c.rep][f.end] for c in f.children}
        assert list(took[f.key]) == sorted(took[f.key])  # in log order
        for r in took[f.key]:   # a request under the fork goes on into one of its children
            assert tuple(seqs[r][:f.end]) == prefix and len(seqs[r]) > f.end and seqs[r][f.end] in nexts
    assert got == naive


def test_token_id_requests_replay_like_simulate():
    rng = random.Random(3)
    system = [rng.randrange(100) for _ in range(64)]
    seqs = [system + [rng.randrange(100) for _ in range(rng.randrange(1, 40))] for _ in range(30)]
    reqs = [ForkRequest(index=k, line=k + 1, ids=s) for k, s in enumerate(seqs)]
    rep = analyze_forks(reqs, block_size=16)
    ref = simulate([TraceRequest(index=k, line=k + 1, prompt_tokens=len(s), tokens=s) for k, s in enumerate(seqs)],
                   policy="infinite", block_size=16)
    assert rep.hit_tokens == rep.fixed_hit_tokens == ref.hit_tokens == _naive_hits(seqs)
    assert not any(f.fixable for f in rep.forks)


@pytest.mark.parametrize("seed", range(10))
def test_tree_pass_hits_are_simulate_infinite(seed):
    """The tree's own count of no-eviction hits (the baseline) against simulate's infinite policy: prefixes of
    one another, partial blocks, block-aligned requests (the L - 1 cap), salts, duplicates."""
    rng = random.Random(seed)
    stems = [[rng.randrange(5) for _ in range(rng.randrange(0, 40))] for _ in range(3)]
    seqs, salts = [], []
    for _ in range(rng.randrange(1, 40)):
        s = list(rng.choice(stems))[:rng.randrange(0, 41)] + [rng.randrange(5) for _ in range(rng.randrange(0, 20))]
        seqs.append(s or [1])
        salts.append(rng.choice([None, None, "a", "b"]))
    bs = rng.choice([1, 4, 16])
    reqs = [ForkRequest(index=k, line=k + 1, ids=s, salt=salt) for k, (s, salt) in enumerate(zip(seqs, salts))]
    rep = analyze_forks(reqs, block_size=bs)
    ref = simulate([TraceRequest(index=k, line=k + 1, prompt_tokens=len(s), tokens=s, salt=salt)
                    for k, (s, salt) in enumerate(zip(seqs, salts))], policy="infinite", block_size=bs)
    assert rep.hit_tokens == ref.hit_tokens


def _clock_on_some(n: int = 42, every: int = 7) -> list[dict]:
    """A support log whose system prompt opens with a clock line in one request of ``every``: the rest start
    with the stable text itself (the bench's log does this)."""
    rng = random.Random(3)
    words = (ROOT / "fixtures" / "corpus.txt").read_text(encoding="utf-8").split()
    stable = "You are a support agent for a cache diagnostics product.\n" + " ".join(rng.choice(words) for _ in range(120))
    rows = []
    for i in range(n):
        top = f"Current time: 2026-11-30T10:{i:02d}:{(i * 7) % 60:02d}Z\n\n" if i % every == 3 else ""
        rows.append({"timestamp": 1796032800 + 60 * i, "session": f"s{i}", "body": {"model": "gpt-4.1", "messages": [
            {"role": "system", "content": top + stable},
            {"role": "user", "content": " ".join(rng.choice(words) for _ in range(12))}]}})
    return rows


def test_a_line_on_top_of_some_requests_only_is_the_value_not_the_stable_text_below_it(tok):
    """The requests without the clock line hold the stable text at the fork: that text is not a value (it is what
    the clock requests have one line later), so they are not moved and the fork is the clock's (date_time,
    FX001), not a per-user value over every request (what the fork analysis said of the bench's log)."""
    from cachectl.engines.repair import fix, groups

    rows = _clock_on_some()
    clocked = [i + 1 for i, r in enumerate(rows) if r["body"]["messages"][0]["content"].startswith("Current time:")]
    rep = analyze_forks(list(enumerate(rows, 1)), tokenizer=tok, source="<test>")
    fork = next(f for f in rep.forks if f.fixable)
    assert (fork.cause, fork.fixable, fork.requests, fork.distinct_values) == ("date_time", "FX001", len(clocked),
                                                                               len(clocked))
    assert all(e.startswith("Current time: ") for e in fork.examples)
    # fix moves the clock lines only, and reaches the hits the analysis promised
    lines = groups.log_lines(list(enumerate(rows, 1)), source="<test>", key="session")
    report = fix.fix_log(lines, fix.FixOptions(unsafe=True, key="session"), tokenizer=tok)
    assert sorted(f.line for f in report.fixes if f.applied) == clocked
    assert {f.code for f in report.fixes} == {"FX001"}
    assert report.after.vllm.hit_tokens == rep.fixed_hit_tokens > rep.hit_tokens
    out = list(report.output)
    for i in clocked:  # the stable text starts the system prompt as in the requests that never had the clock
        system = out[i - 1]["body"]["messages"][0]["content"]
        assert system == rows[0]["body"]["messages"][0]["content"]
    # independent: the hand-fixed log (clock lines and the blank line after them cut) replayed naively
    fixed = [{**r["body"], "messages": [{"role": "system", "content": o["body"]["messages"][0]["content"]},
                                         r["body"]["messages"][1] | {"content": o["body"]["messages"][1]["content"]}]}
             for r, o in zip(rows, out)]
    assert rep.fixed_hit_tokens == _naive_hits(_served(tok, fixed))


def _random_tree(seed: int) -> PrefixTree:
    rng = random.Random(seed)
    stems = [array("q", [rng.randrange(1 << 40) for _ in range(rng.randint(1, 6))]) for _ in range(20)]
    tree = PrefixTree()
    for k in range(500):  # shared heads, split edges, then tails of their own
        head = array("q")
        for s in rng.sample(stems, rng.randint(1, 3)):
            head.extend(s)
        tree.insert(head + array("q", [rng.randrange(1 << 40) for _ in range(rng.randint(0, 4))]), k)
    return tree


def test_a_tree_is_freed_without_the_garbage_collector():
    """The tree is flat arrays (an edge is an index, its parent another): nothing in it makes a cycle, so a tree
    let go (the fork analysis builds one a pass) is freed at once, read or not."""
    import gc

    gc.collect()
    gc.disable()
    try:
        tree = _random_tree(1)
        assert len(tree) > 500
        del tree
        assert gc.collect() == 0
        tree = _random_tree(1)
        tree.outline(16), tree.branches(tree.forks())
        del tree
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_the_fork_analysis_leaves_no_cyclic_garbage(tok):
    """Its trees (each pass's, the first and the last one summarized) and the analyzer itself are
    freed by reference counting when the analysis returns: nothing of it waits for the collector."""
    import gc

    reqs = list(fork_requests(iter_jsonl(str(SHARED)), source=str(SHARED), tokenizer=tok))
    gc.collect()
    gc.disable()
    try:
        rep = analyze_forks(reqs, tokenizer=tok, block_size=16, capacity_blocks=400)
        assert rep.passes >= 2 and rep.tree and rep.fixed_tree  # several trees were built, two summarized
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_line_move_ends_with_its_field_even_where_a_message_quotes_what_follows(tok):
    """A system prompt's last line ends where the system prompt does, before the template's end-of-turn text,
    even when a later message quotes that line with the template's text after it (a pasted transcript): the move
    takes the value, not the template's tokens (it once ran on to the newline when some message held the rest of
    the line)."""
    from array import array

    from cachectl.engines.prefix.forks.views import _LineMove, _View

    system = "Answer in one line.\nTicket 4c1f9a"
    pasted = "Earlier I saw this: Ticket 4c1f9a<|im_end|>\nwhat does it mean?"
    value = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": pasted}]}
    r = next(iter(fork_requests([(1, value)], source="<test>", tokenizer=tok)))
    assert r.text is not None and r.starts is not None
    at = r.text.index("Ticket 4c1f9a")
    end = at + len("Ticket 4c1f9a")
    assert r.text[end:].startswith("<|im_end|>\n") and "Ticket 4c1f9a<|im_end|>\n" in r.text[end:]
    d = max(i for i, s in enumerate(r.starts) if s <= at + len("Ticket "))   # a token of the value
    a = max(i for i, s in enumerate(r.starts) if s <= at)                     # the line's first token
    v = _View(r, r.ids, r.text, r.starts, r.tokenized)
    got = _LineMove(d, a, array("I", r.ids[:d]), "FX001", "volatile_id").span(v)
    assert got is not None
    assert got[2] == r.starts[a] and got[3] == end, r.text[got[2]:got[3]]
    assert "<|im_end|>" not in r.text[got[2]:got[3]]
