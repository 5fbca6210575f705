"""The provider simulation without its rows (``keep_requests=False``): the same report, the rows handed to
``on_request`` as they are simulated, the misses tallied, and a simulator whose state is its live entries."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachectl.engines.provider import cache as pc
from cachectl.engines.provider.prices import PriceTable
from cachectl.inputs import read_requests

from .conftest import PROMPTS

#: request logs among the fixtures, and the --every each needs (None: its lines carry timestamps)
LOGS = [("agent_log.jsonl", None), ("anthropic_billed.jsonl", None), ("anthropic_requests.jsonl", None),
        ("gpt56_breakpoint.jsonl", None), ("gpt56_implicit.jsonl", None), ("openai_requests.jsonl", None),
        ("shared_prefix_log.jsonl", None), ("shared_prefix_log_fixed.jsonl", None),
        ("shuffled_tools_log.jsonl", 30.0), ("three_apps_log.jsonl", 30.0), ("demo_log.jsonl", 30.0)]


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


@pytest.fixture(scope="module")
def counter(tok):
    return pc.tokenizer_counter(tok)


def simulate(name, every, table, counter, **kw):
    return pc.simulate_requests(read_requests(str(PROMPTS / name), default_model="gpt-4.1"), table=table,
                                source=name, text_counter=counter, every=every, token_source="tokenizer", **kw)


def tallies_from_rows(rows) -> tuple:
    """What ``report``'s cost section counted from the rows: per miss code, requests and their input tokens."""
    t: dict[str, list[int]] = {}
    for q in rows:
        if q.miss is not None:
            c = t.setdefault(q.miss.code, [0, 0])
            c[0] += 1
            c[1] += q.input_tokens
    return tuple((code, n, tok) for code, (n, tok) in sorted(t.items(), key=lambda kv: (-kv[1][0], kv[0])))


@pytest.mark.parametrize("name, every", LOGS)
def test_without_rows_the_report_is_the_same(name, every, table, counter):
    kept = simulate(name, every, table, counter)
    seen: list = []
    bare = simulate(name, every, table, counter, keep_requests=False, on_request=seen.append)
    assert kept.requests and bare.requests == ()
    assert bare == replace(kept, requests=())       # totals, costs, hit rate, findings, notes, models, tallies
    assert tuple(seen) == kept.requests             # each row handed over, in order, as the kept ones


@pytest.mark.parametrize("name, every", LOGS)
def test_streamed_totals_are_the_totals_of_the_rows(name, every, table, counter):
    r = simulate(name, every, table, counter)
    rows = r.requests
    for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"):
        assert r.totals[k] == sum(getattr(q, k) for q in rows)
    assert r.totals["ephemeral_1h_input_tokens"] == sum(q.cache_creation["ephemeral_1h_input_tokens"] for q in rows)
    assert r.total_cost_usd == round(sum(q.cost_usd for q in rows), 10)      # bit for bit: the builtin sum's order
    assert r.uncached_cost_usd == round(sum(q.uncached_cost_usd for q in rows), 10)
    recs = [q.reconciliation for q in rows if q.reconciliation is not None]
    assert (r.reconciled, r.agreed) == (len(recs), sum(x.agree for x in recs))
    assert r.billed_cost_usd == (round(sum(x.billed_cost_usd for x in recs), 10) if recs else None)
    assert r.models == tuple(dict.fromkeys(q.model for q in rows))
    assert r.miss_tallies == tallies_from_rows(rows)


def test_the_fixtures_have_misses_to_tally(table, counter):
    codes = {c for name, every in LOGS for c, _, _ in simulate(name, every, table, counter).miss_tallies}
    assert {"cold", "content_changed", "ttl_expired", "below_minimum"} <= codes


def test_tallies_order_by_requests_then_code(table):
    # cold first in the log, then two below the minimum, then one more cold (another model): 2 each, by code
    from cachectl.inputs import parse_request

    def req(t, model, tokens):
        return {"timestamp": t, "model": model, "blocks": [
            {"id": f"b{tokens}", "tokens": tokens, "cache_control": {"type": "ephemeral"}}, {"id": "q", "tokens": 7}]}

    rows = [req(0, "claude-sonnet-4-5", 2000), req(1, "claude-sonnet-4-5", 10), req(2, "claude-sonnet-4-5", 20),
            req(3, "claude-opus-4-1", 2000)]
    r = pc.simulate_requests([parse_request(x, source="m", line=i + 1) for i, x in enumerate(rows)], table=table,
                             source="m")
    assert r.miss_tallies == (("below_minimum", 2, 10 + 7 + 20 + 7), ("cold", 2, 14))
    assert r.miss_tallies == tallies_from_rows(r.requests)


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), max_size=200))
def test_the_running_sum_is_the_builtin_sum(xs):
    s = pc._FloatSum()
    for x in xs:
        s.add(x)
    assert s.value == sum(xs) or (not xs and s.value == 0)


def test_the_running_sum_of_many_small_costs():
    rng = random.Random(3)
    xs = [round(rng.random() * 1e-3, 10) for _ in range(100_000)]
    s = pc._FloatSum()
    for x in xs:
        s.add(x)
    assert s.value == sum(xs)


def layout_log(n: int, gap: float, rng: random.Random) -> list:
    """``n`` requests, each of a new conversation (its own blocks, a breakpoint), ``gap`` seconds apart."""
    from cachectl.inputs import parse_request

    out = []
    for i in range(n):
        blocks = [{"id": "sys", "tokens": 1500, "cache_control": {"type": "ephemeral"}},
                  {"id": f"q{i}", "tokens": rng.choice([100, 800]), "cache_control": {"type": "ephemeral"}}]
        out.append(parse_request({"timestamp": i * gap, "model": "claude-sonnet-4-5", "blocks": blocks,
                                  "output_tokens": 5}, source="m", line=i + 1))
    return out


def test_the_simulator_keeps_only_live_entries(table, monkeypatch):
    made: list = []

    class Watched(pc.CacheSimulator):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(pc, "CacheSimulator", Watched)
    sizes = []

    def watch(row):
        sim = made[0]
        sizes.append((len(sim.entries), len(sim._deadlines)))

    r = pc.simulate_requests(layout_log(3000, 60.0, random.Random(1)), table=table, source="m",
                             keep_requests=False, on_request=watch)
    # a request every minute, a 5-minute TTL: the shared prefix and the last few conversations' entries
    assert max(e for e, _ in sizes) <= 8 and max(h for _, h in sizes) <= 8
    never = next(f for f in r.findings if f.code == "write_never_read")
    assert never.count == 3000 and never.lines == tuple(range(1, 3001)) and never.tokens > 0  # every q-block
    assert "(5 still alive when it ends)" in never.message


def test_still_alive_counts_entries_alive_when_the_log_ends(table):
    # three one-off writes: the first expired long before the end (never looked up again), the last two alive
    from cachectl.inputs import parse_request

    def req(t, block):
        return parse_request({"timestamp": t, "model": "claude-sonnet-4-5", "blocks": [
            {"id": block, "tokens": 2000, "cache_control": {"type": "ephemeral"}}]}, source="m", line=int(t) + 1)

    r = pc.simulate_requests([req(0, "a"), req(1000, "b"), req(1001, "c")], table=table, source="m")
    never = next(f for f in r.findings if f.code == "write_never_read")
    assert never.count == 3 and never.lines == (1, 1001, 1002) and never.tokens == 6000
    assert "(2 still alive when it ends)" in never.message


def test_an_entry_replaced_by_a_shorter_ttl_still_expires_on_time(table):
    # a 1h write, then the same prefix written again with 5m (read misses: the first is not yet readable)
    from cachectl.inputs import parse_request

    def req(t, ttl, extra):
        cc = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
        return parse_request({"timestamp": t, "model": "claude-sonnet-4-5",
                              "blocks": [{"id": "p", "tokens": 2000, "cache_control": cc}, *extra]},
                             source="m", line=int(t) + 1)

    sim = pc.CacheSimulator(table)
    price = table.lookup("claude-sonnet-4-5")
    for t, ttl in ((0.0, "1h"), (0.0, None)):
        q = req(t, ttl, [])
        keys = pc.chain_keys(price.model, q)
        sim.advance(t)
        sim.explicit(q, price, keys, [2000], t)
    assert len(sim.entries) == 1
    sim.advance(301.0)
    assert not sim.entries and len(sim.expired) == 1   # gone at its 5-minute deadline, not the 1h one


def test_the_token_memo_is_bounded(tok):
    counter = pc.TextTokens(tok, memo_bytes=20_000)
    texts = [f"conversation {i} asks about the cache" for i in range(2000)]
    want = [len(tok.backend.encode(t, add_special_tokens=False).ids) for t in texts]
    assert [counter.count(t) for t in texts] == want
    assert counter._held <= 20_000 and len(counter._cache) < 100
    assert [counter.count(t) for t in reversed(texts)] == want[::-1]   # evicted texts are counted again
    assert list(counter.ids(texts[0])) == tok.backend.encode(texts[0], add_special_tokens=False).ids


def test_the_token_memo_keeps_ids_by_a_digest_of_the_text(tok):
    """A text is kept by its 16-byte digest, not itself: texts that differ in one character or in key order are
    different entries, and a text seen again is not encoded again."""
    counter = pc.TextTokens(tok)
    texts = ["a" * 5000, "a" * 4999 + "b", '{"a":1,"b":2}', '{"b":2,"a":1}', "é", "e\u0301", ""]
    for t in texts + texts:
        assert list(counter.ids(t)) == tok.backend.encode(t, add_special_tokens=False).ids
    assert counter.encoded == len(texts) and len(counter._cache) == len(texts)
    assert all(isinstance(k, bytes) and len(k) == 16 for k in counter._cache)
    assert counter._held == sum(4 * len(v) + 200 for v in counter._cache.values())


def test_texts_primed_in_a_batch_are_the_ids_one_text_at_a_time_gives(tok):
    """``prime`` encodes the texts the memo lacks in one batch (each distinct text once), and ``ids`` then reads
    them there without encoding: the same IDs the tokenizer gives one text at a time, multi-byte and empty texts
    included; a text too large to keep is left to ``ids``."""
    texts = ["a" * 300, "héllo wörld 👋", "", "e\u0301", '{"b":2,"a":1}', "same", "same"]
    counter = pc.TextTokens(tok, memo_bytes=200_000)
    counter.ids("e\u0301")  # held already: not encoded again
    counter.prime(texts)
    assert counter.encoded == 1 + 5
    for t in texts:
        assert list(counter.ids(t)) == tok.backend.encode(t, add_special_tokens=False).ids
    assert counter.encoded == 6  # every text read from the memo
    assert counter._held == sum(4 * len(v) + 200 for v in counter._cache.values())
    small = pc.TextTokens(tok, memo_bytes=8 * 400)
    small.prime(["word " * 200])  # 4 bytes a char is past an eighth of the memo: not encoded ahead
    assert small.encoded == 0 and not small._cache
    assert small.count("word " * 200) == len(tok.backend.encode("word " * 200, add_special_tokens=False).ids)


def test_rows_handed_over_before_the_log_ends(table):
    """``on_request`` sees a row before the next request is read (the CLI writes it out then)."""
    reqs = layout_log(5, 1.0, random.Random(0))
    got: list = []

    def feed():
        for i, q in enumerate(reqs):
            assert len(got) == i
            yield q

    r = pc.simulate_requests(feed(), table=table, source="m", keep_requests=False, on_request=got.append)
    assert len(got) == 5 and r.requests == () and json.dumps(r.totals)
