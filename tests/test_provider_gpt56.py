"""OpenAI GPT-5.6+ prompt caching, with expectations computed by hand from the documented rules
(developers.openai.com/api/docs/guides/prompt-caching): an implicit breakpoint at the end of the newest eligible
message, explicit ``prompt_cache_breakpoint`` markers, at most four writes a request, exact reads at written
breakpoints, the 30-minute TTL, writes at 1.25x the input rate and reads at 0.1x.

Token counts are words here (the counter below), so that every number can be checked by hand. gpt-5.6-sol
costs $4 input, $5 write, $0.40 read, $20 output per million tokens (the shipped table).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cachectl.cli import app
from cachectl.engines.lint.body import lint_body
from cachectl.engines.lint.rules import RULES, LintConfig
from cachectl.engines.provider import PriceTable, audit_usage, simulate_requests
from cachectl.engines.provider.prices import UnknownModelError
from cachectl.errors import InputError
from cachectl.inputs.request import parse_request

MODEL = "gpt-5.6-sol"
IN, WRITE, READ = 4e-6, 5e-6, 0.4e-6


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def count(text: str) -> int:
    return len(text.split())


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


def chat(messages, ts, model=MODEL, **extra):
    return parse_request({"timestamp": ts, "output_tokens": 0, "model": model, "messages": messages, **extra})


def developer(n=9000, marked=False):
    block = {"type": "text", "text": words(n, "d")}
    if marked:
        block["prompt_cache_breakpoint"] = {"mode": "explicit"}
    return {"role": "developer", "content": [block]}


def user(i, n=10):
    return {"role": "user", "content": words(n, f"q{i}x")}


def run(reqs, table):
    return simulate_requests(reqs, table=table, source="t", text_counter=count)


def test_stable_prefix_and_changing_question_never_reads_under_implicit_mode(table):
    # 10 requests, 2 minutes apart (18 minutes: within the 30-minute TTL). The implicit breakpoint sits at the
    # end of the changing user message, so nothing is ever read; each request writes all 9,010 tokens at 1.25x.
    r = run([chat([developer(), user(i)], 120 * i) for i in range(10)], table)
    for q in r.requests:
        assert (q.cache_read_input_tokens, q.cache_creation_input_tokens, q.input_tokens) == (0, 9010, 0)
        assert q.cost_usd == pytest.approx(9010 * WRITE)          # 1.25 x $4 = $5 per million
        assert q.uncached_cost_usd == pytest.approx(9010 * IN)
    assert [q.miss.code for q in r.requests] == ["cold"] + ["implicit_breakpoint_after_change"] * 9
    assert r.requests[1].miss.path == "messages[0]"
    assert r.total_cost_usd == pytest.approx(10 * 9010 * WRITE)
    assert r.savings_usd < 0  # caching costs more than not caching
    assert r.requests[0].usage_reported["prompt_tokens_details"] == {"cached_tokens": 0, "cache_write_tokens": 9010}


def test_one_explicit_breakpoint_at_the_stable_boundary_reads_it_exactly(table):
    r = run([chat([developer(marked=True), user(i)], 120 * i) for i in range(10)], table)
    first, *later = r.requests
    # the first writes both breakpoints: the explicit one (9,000) and the implicit one (9,010)
    assert (first.cache_read_input_tokens, first.cache_creation_input_tokens) == (0, 9010)
    for q in later:  # exactly the 9,000-token prefix: no 128-token rounding (8,960 would be the old rule)
        assert (q.cache_read_input_tokens, q.cache_creation_input_tokens, q.input_tokens) == (9000, 10, 0)
        assert q.cost_usd == pytest.approx(9000 * READ + 10 * WRITE)
        assert q.miss is None


def test_earlier_openai_models_keep_automatic_caching_in_128_token_steps(table):
    r = run([chat([developer(), user(i)], 120 * i, model="gpt-5") for i in range(3)], table)
    assert [q.cache_read_input_tokens for q in r.requests] == [0, 8960, 8960]  # 1,024 + 62 x 128
    assert all(q.cache_creation_input_tokens == 0 for q in r.requests)


def test_growing_conversation_under_implicit_mode_reads_its_previous_turn(table):
    history = [developer(2000)]
    reqs = []
    for i in range(4):
        history = history + [user(i, 100)]
        reqs.append(chat(list(history), 60 * i))
        history = history + [{"role": "assistant", "content": words(50, f"a{i}x")}]
    r = run(reqs, table)
    assert [(q.cache_read_input_tokens, q.cache_creation_input_tokens) for q in r.requests] == \
        [(0, 2100), (2100, 150), (2250, 150), (2400, 150)]
    assert [q.miss for q in r.requests[1:]] == [None, None, None]


def test_explicit_mode_without_a_breakpoint_caches_nothing(table):
    opts = {"prompt_cache_options": {"mode": "explicit"}}
    r = run([chat([developer(), user(i)], 60 * i, **opts) for i in range(3)], table)
    for q in r.requests:
        assert (q.cache_read_input_tokens, q.cache_creation_input_tokens, q.input_tokens) == (0, 0, 9010)
        assert q.miss.code == "no_breakpoint"
        assert q.cost_usd == pytest.approx(9010 * IN)


def test_explicit_mode_writes_only_the_marked_breakpoint(table):
    opts = {"prompt_cache_options": {"mode": "explicit", "ttl": "30m"}}
    r = run([chat([developer(marked=True), user(i)], 60 * i, **opts) for i in range(2)], table)
    assert [(q.cache_read_input_tokens, q.cache_creation_input_tokens, q.input_tokens) for q in r.requests] == \
        [(0, 9000, 10), (9000, 0, 10)]


def test_an_entry_older_than_the_ttl_is_gone(table):
    r = run([chat([developer(marked=True), user(0)], 0), chat([developer(marked=True), user(1)], 31 * 60)], table)
    assert r.requests[1].cache_read_input_tokens == 0
    assert r.requests[1].miss.code == "ttl_expired"
    assert [f.code for f in r.findings if f.code == "ttl_gap"] == ["ttl_gap"]


def test_a_read_renews_the_entry(table):
    # written at 0, read at 20 min (renewed to 50 min), read again at 40 min
    r = run([chat([developer(marked=True), user(i)], t) for i, t in enumerate((0, 1200, 2400))], table)
    assert [q.cache_read_input_tokens for q in r.requests] == [0, 9000, 9000]


def marked_blocks(n: int, tag: str) -> dict:
    return {"role": "developer", "content": [{"type": "text", "text": words(1100, f"{tag}{k}x"),
                                               "prompt_cache_breakpoint": {"mode": "explicit"}}
                                              for k in range(n)]}


def test_the_four_write_limit_leaves_the_earliest_explicit_breakpoint_unwritten(table):
    # five marked blocks of 1,100 tokens + the implicit breakpoint: the implicit one and the latest three explicit
    # ones are written, the first two are not. The next request changes the third block: it could have read the
    # second block's prefix (2,200 tokens), but that breakpoint was never written.
    first = chat([marked_blocks(5, "b"), user(0)], 0)
    body = marked_blocks(5, "b")
    body["content"][2]["text"] = words(1100, "changed")
    second = chat([body, user(1)], 60)
    r = run([first, second], table)
    assert r.requests[0].cache_creation_input_tokens == 5 * 1100 + 10
    assert r.requests[1].cache_read_input_tokens == 0
    assert r.requests[1].miss.code == "breakpoint_limit"
    assert r.requests[1].miss.path == "messages[0].content[1]"


def test_a_breakpoint_cuts_a_message_and_is_not_content():
    body = {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "stable", "prompt_cache_breakpoint": {"mode": "explicit"}},
        {"type": "text", "text": "question"}]}]}
    req = parse_request(body)
    assert [p.text for p in req.positions] == ["stable", "\nquestion"]
    assert req.openai_breakpoints == (0,)
    assert req.positions[0].cache_path == "messages[0].content[0].prompt_cache_breakpoint"
    assert req.implicit_at == 1
    assert "prompt_cache_breakpoint" not in req.positions[0].content
    on_last = parse_request({"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "q", "prompt_cache_breakpoint": {"mode": "explicit"}}]}]})
    plain = parse_request({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]})
    assert on_last.positions[0].identity == plain.positions[0].identity


def test_responses_items_and_the_eligible_message():
    req = parse_request({"model": MODEL, "instructions": "be brief", "input": [
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "doc", "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"}},
            {"type": "input_text", "text": "q"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]}]})
    assert req.openai_breakpoints == (1,)
    assert req.positions[1].cache_breakpoint == "30m"
    assert req.implicit_at == 2  # the user message's last cut: the assistant message is not eligible


@pytest.mark.parametrize("body,message", [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x",
                                                "prompt_cache_breakpoint": {"mode": "implicit"}}]}]},
     "the only mode a breakpoint takes"),
    ({"input": [{"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "x", "prompt_cache_breakpoint": {"mode": "explicit"}}]}]},
     "accepts it only on input_text"),
    ({"prompt_cache_options": {"mode": "sometimes"}, "messages": [{"role": "user", "content": "x"}]},
     "expected 'implicit' or 'explicit'"),
])
def test_malformed_cache_controls_are_located_errors(body, message):
    with pytest.raises(InputError, match=message):
        parse_request({"model": MODEL, **body})


def test_ttl_and_retention_together_are_refused_as_the_api_refuses_them(table):
    req = chat([developer(), user(0)], 0, prompt_cache_options={"ttl": "30m"}, prompt_cache_retention="24h")
    with pytest.raises(InputError, match="rejects a request that sets both"):
        run([req], table)


def test_an_unknown_ttl_and_cache_controls_on_an_earlier_model_are_refused(table):
    with pytest.raises(InputError, match="accepts 30m"):
        run([chat([developer(), user(0)], 0, prompt_cache_options={"ttl": "1h"})], table)
    with pytest.raises(InputError, match="gpt-4.1 rejects it"):
        run([chat([developer(marked=True), user(0)], 0, model="gpt-4.1")], table)


def test_retention_alone_is_a_note_on_these_models(table):
    r = run([chat([developer(), user(0)], 0, prompt_cache_retention="24h")], table)
    assert any("prompt_cache_retention is deprecated" in n for n in r.notes)


def test_reconciliation_reads_cache_write_tokens_and_compares_them(table):
    usage = {"prompt_tokens": 9010, "completion_tokens": 0,
             "prompt_tokens_details": {"cached_tokens": 9000, "cache_write_tokens": 10}}
    lines = [{"timestamp": 60 * i, "output_tokens": 0, "usage": usage,
              "body": {"model": MODEL, "messages": [developer(marked=True), user(i)]}} for i in range(2)]
    r = simulate_requests([parse_request(x, line=i + 1) for i, x in enumerate(lines)], table=table, source="t",
                          text_counter=count)
    first, second = (q.reconciliation for q in r.requests)
    assert not first.agree and first.billed["cache_creation_input_tokens"] == 10
    assert second.agree and second.billed["cache_creation_input_tokens"] == 10


def test_audit_prices_cache_write_tokens_at_the_write_rate(table):
    rec = {"model": MODEL, "usage": {"prompt_tokens": 10_000, "completion_tokens": 100,
                                     "prompt_tokens_details": {"cached_tokens": 6000, "cache_write_tokens": 3000}}}
    q = audit_usage([(1, rec)], source="t", table=table).requests[0]
    assert (q.input_tokens, q.cache_creation_input_tokens, q.cache_read_input_tokens) == (1000, 3000, 6000)
    assert q.cost_usd == pytest.approx(1000 * IN + 3000 * WRITE + 6000 * READ + 100 * 20e-6)


def test_long_context_band_prices_the_whole_request(table):
    rec = {"model": MODEL, "usage": {"prompt_tokens": 300_000, "completion_tokens": 0}}
    q = audit_usage([(1, rec)], source="t", table=table).requests[0]
    assert q.cost_usd == pytest.approx(300_000 * 8e-6)  # above 272K: $8 input


def test_what_if_marks_the_prefix_on_these_models(table):
    from cachectl.engines.provider import what_if

    r = what_if(table=table, model=MODEL, prefix_tokens=9000, suffix_tokens=10, output_tokens=0, calls=3, every=60)
    assert [(q.cache_read_input_tokens, q.cache_creation_input_tokens) for q in r.requests] == \
        [(0, 9010), (9000, 10), (9000, 10)]


# ------------------------------------------------------------------------------------------------ lint


def lint(body):
    return [f.rule for f in lint_body("b.json", parse_request(body), LintConfig(), None, count)]


def test_lint_rules_continue_the_series_with_a_fix_safety():
    for rule in ("CC011", "CC012", "CC013", "CC014", "CC015"):
        assert RULES[rule].fix_safety == "safe"


def test_lint_stable_prefix_left_to_the_implicit_breakpoint():
    assert lint({"model": MODEL, "messages": [developer(), user(0)]}) == ["CC015"]
    assert lint({"model": MODEL, "messages": [developer(marked=True), user(0)]}) == []
    assert lint({"model": "gpt-5", "messages": [developer(), user(0)]}) == []  # the old rule: no breakpoints


def test_lint_ttl_retention_explicit_mode_and_too_many_breakpoints():
    body = {"model": MODEL, "prompt_cache_options": {"mode": "explicit", "ttl": "30m"},
            "prompt_cache_retention": "24h", "messages": [developer(), user(0)]}
    assert lint(body) == ["CC013", "CC014"]
    assert lint({"model": MODEL, "messages": [marked_blocks(4, "b"), user(0)]}) == ["CC012"]


def test_lint_breakpoint_after_a_per_request_value():
    dev = developer(marked=True)
    dev["content"][0]["text"] = "Current time: 2026-11-30T10:00:00Z. " + dev["content"][0]["text"]
    assert lint({"model": MODEL, "messages": [dev, user(0)]}) == ["CC011"]


# -------------------------------------------------------------------------------------------- the CLI


def test_list_models_names_the_caching_rule_and_the_source_date():
    result = CliRunner().invoke(app, ["prompt-cost", "--list-models"])
    assert result.exit_code == 0
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.strip()}
    assert "openai 5.6+ breakpoints" in rows["gpt-5.6-sol"] and "2026-12-01" in rows["gpt-5.6-sol"]
    assert "openai automatic (pre-5.6)" in rows["gpt-4.1"]
    assert "anthropic breakpoints" in rows["claude-sonnet-4-5"]
    assert "no prompt caching" in rows["gpt-4o-2024-05-13"]
    data = json.loads(CliRunner().invoke(app, ["prompt-cost", "--list-models", "--format", "json"]).output)
    sol = next(m for m in data["models"] if m["model"] == MODEL)
    assert sol["rule"] == "openai 5.6+ breakpoints" and sol["cache_write"] == 5 and sol["as_of"] == "2026-12-01"


def test_unknown_model_is_one_line_with_close_names_or_priced_with_model_as(tmp_path):
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps({"model": "gpt-5.6-solar", "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
                   + "\n")
    result = CliRunner().invoke(app, ["prompt-cost", "--usage", str(log)])
    assert result.exit_code == 2
    assert "unknown model 'gpt-5.6-solar'; close names: gpt-5.6-sol" in result.output
    ok = CliRunner().invoke(app, ["prompt-cost", "--usage", str(log), "--model-as", MODEL])
    assert ok.exit_code == 0, ok.output
    assert "'gpt-5.6-solar' is not in the price table: priced as gpt-5.6-sol" in ok.output
    bad = CliRunner().invoke(app, ["prompt-cost", "--usage", str(log), "--model-as", "gpt-nope"])
    assert bad.exit_code == 2 and "--model" in bad.output


# ------------------------------------------------------------------------------------------------ names


@pytest.mark.parametrize("name", ["gpt-5-pro", "o1-pro", "gpt-4o-2024-05-13"])
def test_names_that_start_like_another_model_are_their_own_entries(table, name):
    assert table.lookup(name).model == name


@pytest.mark.parametrize("name", ["claude-opus-4-9", "gpt-5-turbo", "gpt-4.1-" + "x" * 100_000, "o1-pro-max"])
def test_no_prefix_guess(table, name):
    with pytest.raises(UnknownModelError) as exc:
        table.lookup(name)
    assert len(str(exc.value)) < 500 and "\n" not in str(exc.value)


def test_the_dated_snapshot_with_its_own_price(table):
    p = table.lookup("gpt-4o-2024-05-13")
    assert (p.input, p.output, p.cache_read, p.cache_mode) == (5, 15, None, "none")
    assert table.lookup("gpt-4o-2024-08-06").model == "gpt-4o"


CURRENT = [
    "gpt-6.2-sol", "gpt-6.1-sol", "gpt-6.1-terra", "gpt-6-sol", "gpt-6-luna", "gpt-6-astra", "gpt-5.6", "gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna", "gpt-5.5", "gpt-5.5-pro", "gpt-5.4",
    "gpt-5.4-mini", "gpt-5.4-nano", "gpt-5.4-pro", "gpt-5.3-codex", "gpt-5.2", "gpt-5.2-pro", "gpt-5.2-codex",
    "gpt-5.1", "gpt-5.1-codex", "gpt-5.1-codex-max", "gpt-5.1-codex-mini", "gpt-5", "gpt-5-mini", "gpt-5-nano",
    "gpt-5-pro", "gpt-5-codex", "codex-mini-latest", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "gpt-4o",
    "gpt-4o-mini", "o1", "o1-pro", "o3", "o3-pro", "o3-mini", "o4-mini",
    "claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5", "claude-fable-5-1", "claude-fable-5",
    "claude-mythos-5", "claude-mythos-5-1",
    "claude-opus-5", "claude-sonnet-5", "claude-opus-4-8", "claude-opus-4-7", "claude-opus-4-6", "claude-opus-4-5",
    "claude-opus-4-1", "claude-sonnet-4-6", "claude-sonnet-4-5", "claude-haiku-4-5",
    "claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001", "claude-opus-4-1-20250805", "o3-2025-04-16",
    "o4-mini-2025-04-16", "gpt-5-2025-08-07", "openai/gpt-5.4", "claude-sonnet-4-5@20250929",
]


@pytest.mark.parametrize("name", CURRENT)
def test_no_model_of_the_current_families_is_unknown(table, name):
    assert table.lookup(name).source


# --------------------------------------------------------------------- the table against its sources

#: The numbers as read from the pages each entry cites (USD per million tokens: input, cached read, write
#: (Anthropic 5m / OpenAI 5.6+), 1h write, output; a band above N tokens), typed in again here, apart from
#: prices.json, and written out below in LiteLLM's format: a typo on either side shows as a difference.
SOURCES = {
    "gpt-6.2-sol": (2, 0.1, 2.5, None, 10, (272_000, 4, 0.2, 5, 15)),
    "gpt-6.1-sol": (2, 0.1, 2.5, None, 10, (272_000, 4, 0.2, 5, 15)),
    "gpt-6.1-terra": (1, 0.05, 1.25, None, 5, (272_000, 2, 0.1, 2.5, 7.5)),
    "gpt-6-sol": (2, 0.2, 2.5, None, 10, (272_000, 4, 0.4, 5, 15)),
    "gpt-6-luna": (0.1, 0.01, 0.125, None, 0.5, (272_000, 0.2, 0.02, 0.25, 0.75)),
    "gpt-6-astra": (10, 1, 12.5, None, 50, (272_000, 20, 2, 25, 75)),
    "gpt-5.6-sol": (4, 0.4, 5, None, 20, (272_000, 8, 0.8, 10, 30)),
    "gpt-5.6-terra": (2, 0.2, 2.5, None, 12, (272_000, 4, 0.4, 5, 18)),
    "gpt-5.6-luna": (0.2, 0.02, 0.25, None, 1.2, (272_000, 0.4, 0.04, 0.5, 1.8)),
    "gpt-5.5": (5, 0.5, None, None, 30, (272_000, 10, 1, None, 45)),
    "gpt-5.5-pro": (30, None, None, None, 180, (272_000, 60, None, None, 270)),
    "gpt-5.4": (2.5, 0.25, None, None, 15, (272_000, 5, 0.5, None, 22.5)),
    "gpt-5.4-mini": (0.75, 0.075, None, None, 4.5, None),
    "gpt-5.4-nano": (0.2, 0.02, None, None, 1.25, None),
    "gpt-5.4-pro": (30, None, None, None, 180, (272_000, 60, None, None, 270)),
    "gpt-5.3-codex": (1.75, 0.175, None, None, 14, None),
    "gpt-5.2": (1.75, 0.175, None, None, 14, None),
    "gpt-5.2-pro": (21, None, None, None, 168, None),
    "gpt-5.1": (1.25, 0.125, None, None, 10, None),
    "gpt-5.1-codex-mini": (0.25, 0.025, None, None, 2, None),
    "gpt-5": (1.25, 0.125, None, None, 10, None),
    "gpt-5-mini": (0.25, 0.025, None, None, 2, None),
    "gpt-5-nano": (0.05, 0.005, None, None, 0.4, None),
    "gpt-5-pro": (15, None, None, None, 120, None),
    "codex-mini-latest": (1.5, 0.375, None, None, 6, None),
    "gpt-4.1": (2, 0.5, None, None, 8, None),
    "gpt-4.1-mini": (0.4, 0.1, None, None, 1.6, None),
    "gpt-4.1-nano": (0.1, 0.025, None, None, 0.4, None),
    "gpt-4o": (2.5, 1.25, None, None, 10, None),
    "gpt-4o-2024-05-13": (5, None, None, None, 15, None),
    "gpt-4o-mini": (0.15, 0.075, None, None, 0.6, None),
    "o1": (15, 7.5, None, None, 60, None),
    "o1-pro": (150, None, None, None, 600, None),
    "o1-mini": (1.1, 0.55, None, None, 4.4, None),
    "o3": (2, 0.5, None, None, 8, None),
    "o3-pro": (20, None, None, None, 80, None),
    "o3-mini": (1.1, 0.55, None, None, 4.4, None),
    "o4-mini": (1.1, 0.275, None, None, 4.4, None),
    "claude-haiku-5-5": (0.1, 0.01, 0.125, 0.2, 0.5, (100_000, 0.5, 0.05, 0.625, 2.5)),
    "claude-sonnet-5": (2, 0.2, 2.5, 4, 10, None),
    "claude-fable-5": (10, 1, 12.5, 20, 50, None),
    "claude-mythos-5": (10, 1, 12.5, 20, 50, None),
    "claude-sonnet-4-5": (3, 0.3, 3.75, 6, 15, (200_000, 6, 0.6, 7.5, 22.5)),
    "claude-sonnet-4-6": (3, 0.3, 3.75, 6, 15, None),
    "claude-opus-4-6": (5, 0.5, 6.25, 10, 25, None),
    "claude-haiku-4-5": (1, 0.1, 1.25, 2, 5, None),
    "claude-opus-4-1": (15, 1.5, 18.75, 30, 75, None),
    "claude-3-5-haiku": (0.8, 0.08, 1, 1.6, 4, None),
    "claude-3-haiku": (0.25, 0.03, 0.3, 0.5, 1.25, None),
}


def litellm_file(sources: dict) -> dict:
    """The sources in LiteLLM's model_prices_and_context_window.json format (USD per token)."""
    def per_token(x):
        return None if x is None else x / 1e6

    out: dict = {"sample_spec": {"input_cost_per_token": 0}}
    for name, (inp, read, write, write_1h, output, band) in sources.items():
        e = {"litellm_provider": "anthropic" if name.startswith("claude") else "openai", "mode": "chat",
             "input_cost_per_token": per_token(inp), "output_cost_per_token": per_token(output)}
        for key, value in (("cache_read_input_token_cost", read), ("cache_creation_input_token_cost", write),
                           ("cache_creation_input_token_cost_above_1hr", write_1h)):
            if value is not None:
                e[key] = per_token(value)
        if band is not None:
            above, b_in, b_read, b_write, b_out = band
            k = f"_above_{above // 1000}k_tokens"
            e["input_cost_per_token" + k] = per_token(b_in)
            e["output_cost_per_token" + k] = per_token(b_out)
            if b_read is not None:
                e["cache_read_input_token_cost" + k] = per_token(b_read)
            if b_write is not None:
                e["cache_creation_input_token_cost" + k] = per_token(b_write)
        out[name] = e
    return out


def test_the_shipped_table_matches_a_litellm_file_built_from_its_sources(table, tmp_path):
    path = tmp_path / "model_prices_and_context_window.json"
    path.write_text(json.dumps(litellm_file(SOURCES)))
    from cachectl.inputs import read_json_file

    built = PriceTable.load(read_json_file(str(path)))  # --prices keeps reading LiteLLM's format
    for name in SOURCES:
        ours, theirs = table.lookup(name), built.lookup(name)
        assert theirs.source.endswith("(LiteLLM format)")
        assert theirs.cache_mode == ours.cache_mode and theirs.ttls == ours.ttls  # a known model keeps its rules
        for f in ("input", "output", "cache_read", "cache_write_5m", "cache_write_1h", "cache_write"):
            assert getattr(theirs, f) == pytest.approx(getattr(ours, f)) if getattr(ours, f) is not None \
                else getattr(theirs, f) is None, (name, f)
        assert len(theirs.bands) == len(ours.bands), name
        for t, o in zip(theirs.bands, ours.bands):  # field by field: approx() takes no nested structures
            for f in ("above_tokens", "input", "output", "cache_read"):
                want = getattr(o, f)
                assert (getattr(t, f) is None) if want is None else getattr(t, f) == pytest.approx(want), (name, f)


@pytest.mark.parametrize("opts, messages", [
    ({"prompt_cache_options": {"mode": "explicit"}}, [developer(marked=True), user(0)]),
    ({}, [developer(marked=True), user(0), {"role": "assistant", "content": words(5, "p")}]),
    ({}, [developer(), user(0), {"role": "assistant", "content": words(5, "p")}]),
])
def test_an_identical_request_that_reads_its_whole_breakpoint_prefix_has_no_miss(table, opts, messages):
    # content after the last breakpoint (a user message in explicit mode, an assistant prefill after the implicit
    # breakpoint) is never cached; an identical second request reads everything its breakpoints cover: no miss,
    # not content_changed (the recorded pair: tests/test_provider_recorded.py)
    r = run([chat(messages, 60 * i, **opts) for i in range(2)], table)
    first, second = r.requests
    assert second.cache_read_input_tokens == first.cache_creation_input_tokens > 0
    assert second.cache_creation_input_tokens == 0
    assert second.miss is None
