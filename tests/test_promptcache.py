"""prompt-cost engine: hand-computed cases for each cache rule, audits of both counter conventions."""

from __future__ import annotations

import json

import pytest

from cachectl.engines.provider.prices import PriceTable, Usage, UnknownModelError, cost_usd
from cachectl.engines.provider.cache import audit_usage, parse_duration, simulate_requests, what_if
from cachectl.inputs import parse_request, read_json_file
from cachectl.errors import InputError

SONNET = "claude-sonnet-4-5"   # $3 in, 3.75 5m write, 6 1h write, 0.30 read, 15 out; minimum 1,024 tokens


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


def layout(t, blocks, model=SONNET, out=0, **extra):
    return {"timestamp": t, "model": model, "blocks": blocks, "output_tokens": out, **extra}


def blk(id_, tokens, ttl=None):
    b = {"id": id_, "tokens": tokens}
    if ttl:
        b["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    return b


def sim(table, lines, **kw):
    reqs = [parse_request(v, line=i + 1, source="t.jsonl") for i, v in enumerate(lines)]
    return simulate_requests(reqs, table=table, source="t.jsonl", **kw)


def counters(report):
    return [(r.input_tokens, r.cache_creation_input_tokens, r.cache_read_input_tokens) for r in report.requests]


def test_price_lookup_prefix_alias_and_close_names(table):
    assert table.lookup("claude-sonnet-4-5-20250929").model == "claude-sonnet-4-5"
    assert table.lookup("claude-3-5-sonnet-20241022").input == 3 and table.lookup("claude-3-5-sonnet-20241022").output == 15
    assert table.lookup("claude-opus-4-20250514").model == "claude-opus-4"
    with pytest.raises(UnknownModelError, match="close names: claude-sonnet-4-5"):
        table.lookup("claude-sonet-4-5")


def test_every_shipped_entry_is_dated_and_sourced(table):
    for p in table.models.values():
        assert p.source and p.as_of != "unknown"
        assert p.input > 0 and p.output > 0 and p.min_cacheable_tokens > 0
        if p.cache_mode == "explicit":  # published prices are rounded (Haiku 3 writes at $0.30, not 0.3125)
            assert p.cache_write_5m == pytest.approx(p.input * 1.25, abs=0.015)
            assert p.cache_write_1h == pytest.approx(p.input * 2, abs=0.015)
            assert p.cache_read <= p.input * 0.1 + 0.005


def test_first_call_writes_second_reads(table):
    r = sim(table, [layout(0, [blk("sys", 2000, "5m"), blk("q1", 50)], out=100),
                    layout(60, [blk("sys", 2000, "5m"), blk("q2", 70)], out=100)])
    assert counters(r) == [(50, 2000, 0), (70, 0, 2000)]
    # $: 2000*3.75 + 50*3 + 100*15 = 9150 micro-dollars; 2000*0.30 + 70*3 + 1500 = 2310
    assert [q.cost_usd for q in r.requests] == [pytest.approx(0.00915), pytest.approx(0.00231)]
    assert r.uncached_cost_usd == pytest.approx((2050 * 3 + 1500 + 2070 * 3 + 1500) / 1e6)


def test_prefix_below_minimum_caches_nothing(table):
    r = sim(table, [layout(0, [blk("sys", 1000, "5m"), blk("q", 10)]),
                    layout(10, [blk("sys", 1000, "5m"), blk("q", 10)])])
    assert counters(r) == [(1010, 0, 0), (1010, 0, 0)]
    assert any("minimum of 1024" in n for n in r.notes)


def test_gap_longer_than_ttl_writes_again(table):
    r = sim(table, [layout(0, [blk("sys", 2000, "5m")]), layout(301, [blk("sys", 2000, "5m")])])
    assert counters(r) == [(0, 2000, 0), (0, 2000, 0)]


def test_hit_refreshes_the_ttl(table):
    # 0 writes (expires 300); 240 reads and refreshes (expires 540); 480 still hits although 480 > 300
    lines = [layout(t, [blk("sys", 2000, "5m"), blk(f"q{t}", 5)]) for t in (0, 240, 480)]
    assert counters(sim(table, lines)) == [(5, 2000, 0), (5, 0, 2000), (5, 0, 2000)]
    # without the middle call the entry is gone at 480
    assert counters(sim(table, [lines[0], lines[2]])) == [(5, 2000, 0), (5, 2000, 0)]


def test_one_hour_ttl(table):
    r = sim(table, [layout(0, [blk("sys", 2000, "1h")]), layout(3000, [blk("sys", 2000, "1h")])])
    assert counters(r) == [(0, 2000, 0), (0, 0, 2000)]
    assert r.requests[0].cache_creation == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 2000}
    assert r.requests[0].cost_usd == pytest.approx(2000 * 6 / 1e6)


def test_lookback_reaches_20_positions_and_no_further(table):
    base = [blk("sys", 2000, "5m")]
    # the next requests move their only breakpoint to the end: just the lookback can find the old entry
    near = [blk("sys", 2000)] + [blk(f"m{i}", 10) for i in range(19)]
    far = [blk("sys", 2000)] + [blk(f"m{i}", 10) for i in range(20)]
    near[-1] = {**near[-1], "cache_control": {"type": "ephemeral"}}
    far[-1] = {**far[-1], "cache_control": {"type": "ephemeral"}}
    # the breakpoint is position #1 of the walk: 19 new blocks after the entry -> the entry is #20, found
    r = sim(table, [layout(0, base), layout(10, near)])
    assert counters(r)[1] == (0, 190, 2000)
    # 20 new blocks -> the entry would be #21: a miss, and the whole prefix is written again
    r = sim(table, [layout(0, base), layout(10, far)])
    assert counters(r)[1] == (0, 2200, 0)


def test_one_hour_then_five_minute_breakpoints_mixed_billing(table):
    first = layout(0, [blk("tools", 3000, "1h"), blk("sys", 1000, "5m"), blk("q", 20)])
    r = sim(table, [first])
    q = r.requests[0]
    # A = 0 (no hit), B = 3000 (highest 1h breakpoint), C = 4000 (last breakpoint)
    assert (q.cache_creation_input_tokens, q.input_tokens) == (4000, 20)
    assert q.cache_creation == {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 3000}
    assert q.cost_usd == pytest.approx((3000 * 6 + 1000 * 3.75 + 20 * 3) / 1e6)
    # 10 minutes later the 5m entry is gone, the 1h entry is read: A = 3000 read, C - A = 1000 written at 5m
    r = sim(table, [first, layout(600, [blk("tools", 3000, "1h"), blk("sys", 1000, "5m"), blk("q2", 20)])])
    q = r.requests[1]
    assert (q.input_tokens, q.cache_creation_input_tokens, q.cache_read_input_tokens) == (20, 1000, 3000)
    assert q.cache_creation == {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 0}


def test_five_minute_before_one_hour_is_an_error(table):
    with pytest.raises(InputError, match=r"t.jsonl:1: field .blocks\[1\].cache_control.: a 1h cache_control breakpoint comes after a 5m one"):
        sim(table, [layout(0, [blk("a", 2000, "5m"), blk("b", 10, "1h")])])


def test_more_than_four_breakpoints_is_an_error(table):
    with pytest.raises(InputError, match="5 cache_control breakpoints"):
        sim(table, [layout(0, [blk(f"b{i}", 500, "5m") for i in range(5)])])


def test_automatic_caching_marks_the_last_block(table):
    lines = [layout(0, [blk("sys", 2000), blk("q", 30)], cache_control={"type": "ephemeral"}),
             layout(5, [blk("sys", 2000), blk("q", 30), blk("a", 40), blk("q2", 30)],
                    cache_control={"type": "ephemeral"})]
    assert counters(sim(table, lines)) == [(0, 2030, 0), (0, 70, 2030)]


def test_parallel_twins_both_miss(table):
    lines = [layout(0, [blk("sys", 2000, "5m")]), layout(0, [blk("sys", 2000, "5m")])]
    assert counters(sim(table, lines)) == [(0, 2000, 0), (0, 2000, 0)]


def test_changed_tool_definition_invalidates_everything_after(table):
    tool = {"name": "search", "description": "Search the docs", "input_schema": {"type": "object"}}
    system = [{"type": "text", "text": "x" * 10, "cache_control": {"type": "ephemeral"}}]
    body = {"model": SONNET, "tools": [tool], "system": system, "messages": [{"role": "user", "content": "hi"}]}
    changed = json.loads(json.dumps(body))
    changed["tools"][0]["description"] = "Search the documentation"
    reqs = [parse_request({**b, "timestamp": t}, line=i + 1, source="t")
            for i, (t, b) in enumerate([(0, body), (10, body), (20, changed)])]
    words = lambda text: 2000 if text.startswith("x") else 5  # noqa: E731 - a fixed counter for the test
    r = simulate_requests(reqs, table=table, source="t", text_counter=words)
    assert counters(r) == [(5, 2005, 0), (5, 0, 2005), (5, 2005, 0)]
    assert r.estimate


def test_tool_choice_change_invalidates_messages_only(table):
    sys_cc = [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]
    msg = [{"role": "user", "content": [{"type": "text", "text": "y", "cache_control": {"type": "ephemeral"}}]}]
    a = {"model": SONNET, "system": sys_cc, "messages": msg, "tool_choice": {"type": "auto"}}
    b = {**a, "tool_choice": {"type": "any"}}
    reqs = [parse_request({**x, "timestamp": t}, line=i + 1, source="t")
            for i, (t, x) in enumerate([(0, a), (10, b)])]
    r = simulate_requests(reqs, table=table, source="t", text_counter=lambda text: 1500)
    # the system breakpoint (1500 tokens) is still read, the message breakpoint is written again
    assert counters(r) == [(0, 3000, 0), (0, 1500, 1500)]


def test_model_switch_misses(table):
    lines = [layout(0, [blk("sys", 5000, "5m")]), layout(10, [blk("sys", 5000, "5m")], model="claude-opus-4-5")]
    r = sim(table, lines)
    assert counters(r) == [(0, 5000, 0), (0, 5000, 0)]
    assert r.models == ("claude-sonnet-4-5", "claude-opus-4-5")


def test_tool_use_run_is_one_position(table):
    body = {"model": SONNET, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}},
                                          {"type": "tool_use", "id": "b", "name": "g", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"},
                                     {"type": "tool_result", "tool_use_id": "b", "content": "2"}]}]}
    req = parse_request(body, line=1, source="t")
    assert [(p.segment, p.kind) for p in req.positions] == [("messages", "text"), ("messages", "tool_use"),
                                                             ("messages", "tool_result")]
    assert req.positions[1].last_path == "messages[1].content[1]"


def test_openai_automatic_caching_in_128_token_steps(table):
    lines = [layout(0, [blk("sys", 2000), blk("q1", 100)], model="gpt-4o"),
             layout(30, [blk("sys", 2000), blk("q2", 100)], model="gpt-4o")]
    r = sim(table, lines)
    # 2000 shared tokens -> 1,920 cached (15 x 128); prompt_tokens includes them
    assert counters(r)[1] == (180, 0, 1920)
    assert r.requests[1].usage_reported["prompt_tokens"] == 2100
    assert r.requests[1].usage_reported["prompt_tokens_details"]["cached_tokens"] == 1920
    assert r.requests[1].cost_usd == pytest.approx((180 * 2.5 + 1920 * 1.25) / 1e6)


def test_missing_timestamp_where_ttl_matters(table):
    lines = [{"model": SONNET, "blocks": [blk("sys", 2000, "5m")]}, {"model": SONNET, "blocks": [blk("sys", 2000, "5m")]}]
    with pytest.raises(InputError, match="t.jsonl:2: no timestamp"):
        sim(table, lines)
    assert counters(sim(table, lines, every=60.0)) == [(0, 2000, 0), (0, 0, 2000)]


def test_every_places_a_line_without_a_time_after_the_request_before_it(table):
    """In a log that gives some times, `every` fills a missing one in after the request before it (not at i x every
    from zero, earlier than the logged times around it): the 5-minute entry written at t is read 60 s later, expired
    4,000 s later. A logged time earlier than a time filled in before it is taken as that time; a logged time
    earlier than a logged one is still an error."""
    epoch = 1_796_032_800.0

    def line(t, q):
        v = {"model": SONNET, "blocks": [blk("sys", 2000, "5m"), blk(q, 10)]}
        return v if t is None else dict(v, timestamp=t)

    r = sim(table, [line(epoch, "a"), line(None, "b"), line(epoch + 4000, "c"), line(None, "d")], every=60.0)
    assert counters(r) == [(10, 2000, 0), (10, 0, 2000), (10, 2000, 0), (10, 0, 2000)]
    r = sim(table, [line(epoch, "a"), line(None, "b"), line(epoch + 30, "c")], every=60.0)
    assert counters(r)[2] == (10, 0, 2000)
    with pytest.raises(InputError, match=r"t.jsonl:2: field 'timestamp': timestamp 2026-11-30T09:59:59.000Z is "
                       r"earlier than the previous request's \(2026-11-30T10:00:00.000Z\)"):  # (instants, as read)
        sim(table, [line(epoch, "a"), line(epoch - 1, "b")], every=60.0)
    with pytest.raises(InputError, match=r"timestamp 29.5 s is earlier than the previous request's \(30 s\)"):
        sim(table, [line(30, "a"), line(29.5, "b")])  # (small times: seconds from the log's start)


def test_a_ttl_gap_advises_the_1h_ttl_only_for_a_model_that_has_one(table):
    def gap(model):
        r = sim(table, [layout(0, [blk("sys", 2000, "5m" if model == SONNET else None), blk("q1", 10)], model=model),
                        layout(1000, [blk("sys", 2000, "5m" if model == SONNET else None), blk("q2", 10)],
                               model=model)])
        return next(f.message for f in r.findings if f.code == "ttl_gap")

    assert gap(SONNET).endswith("space them closer than the TTL, or use the 1h TTL")
    assert gap("gpt-4o").endswith("space them closer than the TTL")  # (OpenAI's automatic cache: one TTL)


def test_layout_bad_input(table):
    with pytest.raises(InputError, match=r"field 'blocks\[0\].tokens': negative token count"):
        parse_request(layout(0, [blk("a", -5)]), line=3, source="t")
    with pytest.raises(InputError, match="not a request body"):
        parse_request({"model": SONNET, "foo": 1}, line=3, source="t")
    with pytest.raises(InputError, match="this is a response"):
        parse_request({"model": SONNET, "usage": {"input_tokens": 3}}, line=3, source="t")


# ----------------------------------------------------------------------------------------------- audit


def test_audit_anthropic_counters_are_additive(table):
    line = {"model": "claude-sonnet-4-5-20250929", "usage": {
        "input_tokens": 50, "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 10000,
        "output_tokens": 200, "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 2000}}}
    r = audit_usage([(1, line)], source="r.jsonl", table=table)
    q = r.requests[0]
    expected = (50 * 3 + 1000 * 3.75 + 2000 * 6 + 10000 * 0.30 + 200 * 15) / 1e6
    assert q.cost_usd == pytest.approx(expected)
    assert q.uncached_cost_usd == pytest.approx((13050 * 3 + 200 * 15) / 1e6)
    assert r.hit_rate == pytest.approx(10000 / 13050)


def test_audit_openai_counters_are_inclusive(table):
    chat = {"object": "chat.completion", "model": "gpt-4.1-2025-04-14",
            "usage": {"prompt_tokens": 5000, "completion_tokens": 100, "total_tokens": 5100,
                      "prompt_tokens_details": {"cached_tokens": 4096}}}
    responses = {"object": "response", "model": "gpt-4.1",
                 "usage": {"input_tokens": 5000, "input_tokens_details": {"cached_tokens": 4096}, "output_tokens": 100}}
    r = audit_usage([(1, chat), (2, responses)], source="r.jsonl", table=table)
    for q in r.requests:  # 904 uncached at $2, 4096 cached at $0.50, 100 out at $8 - never 5000 + 4096
        assert (q.input_tokens, q.cache_read_input_tokens) == (904, 4096)
        assert q.cost_usd == pytest.approx((904 * 2 + 4096 * 0.5 + 100 * 8) / 1e6)


def test_audit_null_counters_and_bare_usage(table):
    r = audit_usage([(1, {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": None,
                          "cache_creation_input_tokens": None})], source="r", table=table, default_model=SONNET)
    assert r.requests[0].cost_usd == pytest.approx((10 * 3 + 5 * 15) / 1e6)


def test_audit_without_split_assumes_5m_and_says_so(table):
    r = audit_usage([(1, {"model": SONNET, "usage": {"input_tokens": 1, "output_tokens": 0,
                                                     "cache_creation_input_tokens": 1000}})], source="r", table=table)
    assert r.requests[0].cost_usd == pytest.approx((3 + 1000 * 3.75) / 1e6)
    assert any("5-minute" in n for n in r.notes)


@pytest.mark.parametrize("line, message", [
    ({"model": SONNET, "usage": {"input_tokens": -1, "output_tokens": 0}}, "field 'usage.input_tokens': negative"),
    ({"model": SONNET, "messages": []}, "this is a request, not a response"),
    ({"hello": "world"}, "neither a response nor a usage object"),
    ({"usage": {"input_tokens": 1, "output_tokens": 1}}, "no model on this line; pass `default_model`"),
    ({"model": SONNET, "usage": {"input_tokens": 1, "cache_creation_input_tokens": 10,
                                 "cache_creation": {"ephemeral_5m_input_tokens": 3, "ephemeral_1h_input_tokens": 3}}},
     "does not|splits into 3 \\+ 3"),
    ({"model": "gpt-4o", "usage": {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 20}}}, "exceed"),
])
def test_audit_bad_lines(table, line, message):
    with pytest.raises(InputError, match=message) as exc:
        audit_usage([(7, line)], source="r.jsonl", table=table)
    assert str(exc.value).startswith("r.jsonl:7: ")


# ----------------------------------------------------------------------------------------------- what-if


def test_what_if_break_even_and_totals(table):
    r = what_if(table=table, model=SONNET, prefix_tokens=180_000, suffix_tokens=2_000, output_tokens=500,
                calls=20, every=120.0)
    assert r.total_cost_usd == pytest.approx(0.6885 + 19 * 0.0675)
    assert r.uncached_cost_usd == pytest.approx(20 * 0.5535)
    assert r.break_even_reads == 1  # write premium 0.75/MTok, each read saves 2.70/MTok


def test_what_if_outliving_the_ttl_costs_more(table):
    r = what_if(table=table, model=SONNET, prefix_tokens=50_000, suffix_tokens=0, output_tokens=0, calls=3, every=600.0)
    assert r.savings_usd < 0 and any("outlive the 5m TTL" in n for n in r.notes)
    r1h = what_if(table=table, model=SONNET, prefix_tokens=50_000, suffix_tokens=0, output_tokens=0, calls=3,
                  every=600.0, ttl="1h")
    assert r1h.savings_usd > 0
    assert r1h.break_even_reads == 2  # 1h premium 3/MTok, each read saves 2.70/MTok


def test_what_if_refuses_what_it_cannot_lay_out_in_seconds(table):
    from cachectl.engines.provider import cache as promptcache
    from cachectl.errors import UsageError

    base = {"table": table, "model": SONNET, "prefix_tokens": 1000, "suffix_tokens": 0, "output_tokens": 0,
            "calls": 1, "every": 1.0}
    big = promptcache.MAX_WHAT_IF_TOKENS
    cases = [({"calls": 0}, "`calls`"), ({"calls": promptcache.MAX_WHAT_IF_CALLS + 1}, "`calls`"),
             ({"prefix_tokens": 10**20}, "`prefix_tokens`"), ({"prefix_tokens": big, "suffix_tokens": 1}, "`suffix_tokens`"),
             ({"output_tokens": big + 1}, "`output_tokens`"), ({"prefix_tokens": -1}, "`prefix_tokens`"),
             ({"prefix_tokens": big, "calls": promptcache.MAX_WHAT_IF_TOTAL // big + 1}, "in all")]
    for change, word in cases:
        with pytest.raises(UsageError, match=word.replace("`", "\\`")):
            what_if(**{**base, **change})
    # the limits themselves are priced
    r = what_if(**{**base, "prefix_tokens": big, "output_tokens": big})
    assert r.totals["output_tokens"] == big and len(r.requests) == 1


def test_parse_duration():
    assert parse_duration("2m") == 120 and parse_duration("1h") == 3600 and parse_duration("45") == 45


# ----------------------------------------------------------------------------------------------- prices


def test_litellm_price_file_import(tmp_path):
    f = tmp_path / "litellm.json"
    f.write_text(json.dumps({
        "sample_spec": {"input_cost_per_token": 0},
        "my-claude": {"litellm_provider": "anthropic", "input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05,
                      "cache_creation_input_token_cost": 3.75e-06, "cache_creation_input_token_cost_above_1hr": 6e-06,
                      "cache_read_input_token_cost": 3e-07,
                      "input_cost_per_token_above_200k_tokens": 6e-06, "output_cost_per_token_above_200k_tokens": 2.25e-05,
                      "cache_read_input_token_cost_above_200k_tokens": 6e-07},
    }))
    t = PriceTable.load(read_json_file(str(f)))
    p = t.lookup("my-claude")
    assert (p.input, p.cache_write_5m, p.cache_write_1h, p.cache_read, p.output) == (3, 3.75, 6, 0.3, 15)
    assert p.usage_style == "anthropic" and p.max_breakpoints == 4
    small = Usage(100_000, 0, 0, 1000)
    big = Usage(250_000, 0, 0, 1000)
    assert cost_usd(p, small) == pytest.approx((100_000 * 3 + 1000 * 15) / 1e6)
    assert cost_usd(p, big) == pytest.approx((250_000 * 6 + 1000 * 22.5) / 1e6)


def test_native_price_file_overrides(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"models": {"claude-sonnet-4-5": {"provider": "anthropic", "input": 1, "output": 2,
                                                              "cache_write_5m": 1.25, "cache_write_1h": 2,
                                                              "cache_read": 0.1, "min_cacheable_tokens": 100}}}))
    assert PriceTable.load(read_json_file(str(f))).lookup(SONNET).input == 1


def test_bad_price_file(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"models": {"x": {"input": "cheap", "output": 1}}}))
    with pytest.raises(InputError, match=r"field 'models.x.input'"):
        PriceTable.load(read_json_file(str(f)))
