"""Issue 23 items 3-5: ``fix``, ``report`` and ``diff-tokens --log`` across requests, on the fixtures of
fixtures/make_shared_prefix_log.py. What ``fix --unsafe-fixes`` reaches is checked against a naive replay of the
hand-fixed copy (tests/test_forks.py's reference: whole-prefix tuples in a set, NaiveVllm at capacity)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cachectl.engines.provider.prices import PriceTable
from cachectl.engines.repair import fix, groups
from cachectl.engines.repair.shared_prefix import cross_request_loss, log_forks
from cachectl.engines.tokendiff import MISMATCH, PairResult, diff_log
from cachectl.inputs import LogRecord, iter_jsonl

from .conftest import TOK_DIR
from .test_forks import APPS, FIXED, SHARED, TOOLS, _naive_hits, _rows, _served

LOG_AGENT = SHARED.parent / "agent_log.jsonl"


def _lines(path, key=None):
    return groups.log_lines(iter_jsonl(str(path)), source=str(path), key=key)


@pytest.fixture(scope="module")
def fixed_shared(tok):
    opts = fix.FixOptions(unsafe=True, capacity_blocks=400)
    return fix.fix_log(_lines(SHARED), opts, tokenizer=tok, table=PriceTable.load(), source=str(SHARED))


def test_fix_recovers_what_the_hand_fixed_copy_gets(tok, fixed_shared):
    r = fixed_shared
    out = _served(tok, list(r.output))
    hand = _served(tok, _rows(FIXED))
    assert r.before.vllm_no_eviction.hit_tokens == _naive_hits(_served(tok, _rows(SHARED)))
    # the same replay of both: at least 95% of what the hand-fixed copy gets, with no eviction and at capacity
    assert r.after.vllm_no_eviction.hit_tokens == _naive_hits(out) >= 0.95 * _naive_hits(hand)
    assert r.after.vllm.hit_tokens == _naive_hits(out, capacity=400) >= 0.95 * _naive_hits(hand, capacity=400)
    assert r.after.vllm_no_eviction.hit_tokens > 30 * r.before.vllm_no_eviction.hit_tokens
    # every request rewritten by FX001 (clock and request id) and FX007 (the user's e-mail), nothing else
    assert {f.code for f in r.fixes} == {"FX001", "FX007"}
    assert sum(f.code == "FX001" for f in r.fixes) == sum(f.code == "FX007" for f in r.fixes) == 60
    user = next(f for f in r.fixes if f.code == "FX007")
    assert "per-user value" in user.message and "12 values over 60 requests" in user.message
    assert user.before.startswith("user: ") and user.after == "the end of the last user turn"
    for row, value in zip(_rows(SHARED), r.output):
        system = value["messages"][0]["content"]
        assert not any(x in system for x in ("Current time:", "Request id:", "user: "))
        moved = value["messages"][1]["content"]
        for x in row["messages"][0]["content"].split("\n")[1:4]:
            assert x in moved
    # the cross-request gain, measured, priced; the per-code gains add up to it
    c = r.cross_request
    assert c is not None and c.hit_tokens_after == r.after.vllm_no_eviction.hit_tokens
    assert c.hit_tokens_after_at_capacity == r.after.vllm.hit_tokens and c.capacity_blocks == 400
    price = PriceTable.load().lookup("gpt-4.1")
    gained = c.hit_tokens_after_at_capacity - c.hit_tokens_before_at_capacity
    assert c.price_model == "gpt-4.1" and c.usd_saved == pytest.approx(gained * (price.input - price.cache_read) / 1e6)
    assert sum(g.vllm_hit_tokens for g in r.per_cause) == c.hit_tokens_after - c.hit_tokens_before


def test_fix_json_keeps_its_fields_and_lists_the_forks(cli):
    r = cli("fix", str(SHARED), "-t", str(TOK_DIR), "--unsafe-fixes", "-f", "json")
    assert r.exit_code == 1, r.stderr
    d = json.loads(r.stdout)
    for k in ("schema_version", "grouping", "fixes", "before", "after", "per_cause", "notes", "applied",
              "unsafe_skipped", "out", "changed_lines"):
        assert k in d
    assert {f["code"] for f in d["fixes"]} == {"FX001", "FX007"} and d["applied"] == 120
    assert [f["tokens_lost"] for f in d["forks"]] == sorted((f["tokens_lost"] for f in d["forks"]), reverse=True)
    assert {f["fixable"] for f in d["forks"]} == {"FX001", "FX007", None}
    assert d["cross_request"]["hit_tokens_after"] > 30 * d["cross_request"]["hit_tokens_before"]
    safe = json.loads(cli("fix", str(SHARED), "-t", str(TOK_DIR), "-f", "json").stdout)
    assert safe["applied"] == 0 and safe["unsafe_skipped"] == 120      # unsafe: found, not applied by default


def test_three_unrelated_apps_get_no_fix(tok, cli):
    r = fix.fix_log(_lines(APPS), fix.FixOptions(unsafe=True), tokenizer=tok, table=PriceTable.load())
    assert r.fixes == () and r.cross_request is None
    assert not any(f.fixable for f in r.forks.report.forks)
    d = json.loads(cli("report", str(APPS), "-t", str(TOK_DIR), "-f", "json").stdout)
    assert d["forks"] and not any(f["fixable"] for f in d["forks"])
    assert d["forks"][0]["cause"] == "different_prompt" and d["total_tokens_lost"] == d["tokens_lost"]


def test_tools_shuffled_per_request_are_fixed_across_requests(tok):
    r = fix.fix_log(_lines(TOOLS), fix.FixOptions(unsafe=True), tokenizer=tok, table=PriceTable.load())
    assert {f.code for f in r.fixes} == {"FX003"} and r.grouping.count == 24     # 24 independent requests
    names = {tuple(t["function"]["name"] for t in v["tools"]) for v in r.output}
    assert len(names) == 1
    ordered = [{**row, "tools": sorted(row["tools"], key=lambda t: t["function"]["name"])} for row in _rows(TOOLS)]
    assert r.after.vllm.hit_tokens == _naive_hits(_served(tok, ordered)) == r.forks.report.fixed_hit_tokens
    assert r.cross_request is not None and r.cross_request.forks[0].fixable == "FX003"


def test_history_stays_append_only_across_requests(tok):
    """Conversations of several turns sharing the system prompt (clock, request id, e-mail on top): the lines
    leave every request's system prompt, and each request still repeats the previous one of its conversation."""
    rows = _rows(SHARED)[:24]
    convs = []
    for k, row in enumerate(rows):
        msgs = list(row["messages"])
        for turn in range(k % 3):
            msgs += [{"role": "assistant", "content": f"Answer {turn} of conversation {k}."},
                     {"role": "user", "content": f"Follow-up {turn}: and then?"}]
        convs.append((k, msgs))
    log = []
    for k, msgs in convs:  # each conversation sent turn by turn
        for n in range(2, len(msgs) + 1, 2):
            log.append({**rows[k], "session": f"c{k}", "messages": msgs[:n]})
    lines = groups.log_lines(enumerate(log, 1), source="<test>", key="session")
    r = fix.fix_log(lines, fix.FixOptions(unsafe=True, key="session"), tokenizer=tok)
    assert {f.code for f in r.fixes} >= {"FX001", "FX007"}
    last: dict[str, list] = {}
    for row, value in zip(log, r.output):
        assert "user: " not in value["messages"][0]["content"]
        prev = last.get(row["session"])
        if prev is not None:
            assert value["messages"][:len(prev)] == prev, row["session"]
        last[row["session"]] = value["messages"]


def test_report_headline_counts_each_request_once(tok, cli):
    d = json.loads(cli("report", str(SHARED), "-t", str(TOK_DIR), "-f", "json").stdout)
    sp = d["shared_prefix"]
    # independent requests: nothing within conversations, everything across requests
    assert d["tokens_lost"] == 0 and d["total_tokens_lost"] == sp["tokens_lost"]
    naive = _naive_hits(_served(tok, _rows(FIXED))) - _naive_hits(_served(tok, _rows(SHARED)))
    assert abs(sp["tokens_lost"] - naive) <= 0.01 * naive
    price = PriceTable.load().lookup("gpt-4.1")
    assert d["total_usd_lost"] == pytest.approx(d["total_tokens_lost"] * (price.input - price.cache_read) / 1e6)
    assert {"path", "char", "cause", "distinct_values", "requests", "tokens_lost", "fixable"} <= set(d["forks"][0])
    assert [f["tokens_lost"] for f in d["forks"]] == sorted((f["tokens_lost"] for f in d["forks"]), reverse=True)
    user = next(f for f in d["forks"] if f["cause"] == "per_user_value")
    assert (user["distinct_values"], user["requests"], user["fixable"]) == (12, 60, "FX007")


def test_report_never_counts_a_token_twice(tok, cli):
    """agent_log: the clock and the request id break prefixes within their conversations and across them; a
    request counts the larger of its within-conversation loss and its fork gain, so the headline stays far below
    the sum of the two, and equals the per-request rule computed here from diff_log's own pairs (rendered with the
    generation prompt, as the report and a server render them)."""
    d = json.loads(cli("report", str(LOG_AGENT), "--key", "session", "-t", str(TOK_DIR), "-f", "json").stdout)
    forks, _ = log_forks(_lines(LOG_AGENT, "session"), tokenizer=tok)
    assert forks is not None
    gain_total = forks.report.fixed_hit_tokens - forks.report.hit_tokens
    assert sum(forks.report.request_gains) == gain_total > 0
    pair_lost = {}
    records = [LogRecord(line=ln.line, key=ln.key, prompt=ln.prompt) for ln in _lines(LOG_AGENT, "session")]
    for item in diff_log(records, tok, add_generation_prompt=True):
        if isinstance(item, PairResult) and item.diff.kind == MISMATCH:
            pair_lost[item.line_b] = min(item.diff.tokens_a, item.diff.tokens_b) - item.diff.common_prefix_tokens
    per_request = sum(max(g - pair_lost.get(ln, 0), 0) for ln, g in zip(forks.lines, forks.report.request_gains))
    assert per_request == cross_request_loss(forks.gains_by_line(), pair_lost) == d["shared_prefix"]["tokens_lost"]
    assert d["total_tokens_lost"] == d["tokens_lost"] + per_request < d["tokens_lost"] + gain_total
    assert d["tokens_lost"] == sum(c["tokens_lost"] for c in d["causes"])   # the within-conversation figure as it was


def test_report_text_and_exit_code(cli):
    r = cli("report", str(SHARED), "-t", str(TOK_DIR))
    assert r.exit_code == 1
    assert "more across requests" in r.stdout and "per_user_value (user)" in r.stdout and "FX007" in r.stdout
    clean = cli("report", str(FIXED), "-t", str(TOK_DIR))
    assert clean.exit_code == 0, clean.stdout      # the hand-fixed copy: no fork with a fix, nothing lost


def test_report_html_escapes_fork_values(cli, tmp_path):
    evil = "<script>alert(1)</script>"
    rows = [{"model": "gpt-4.1", "user": f"u{k % 3}", "messages": [
        {"role": "system", "content": f"Assistant.\nuser: {evil}{k % 3}@x.example\n" + "Stable rules apply. " * 60},
        {"role": "user", "content": f"question {k}"}]} for k in range(9)]
    log = tmp_path / "evil.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    page = tmp_path / "r.html"
    r = cli("report", str(log), "-t", str(TOK_DIR), "--html", str(page), "-f", "json")
    assert r.exit_code == 1, r.stderr
    assert any(f["cause"] == "per_user_value" for f in json.loads(r.stdout)["forks"])
    html = page.read_text(encoding="utf-8")
    assert "<script" not in html.lower() and "&lt;script&gt;" in html
    assert 'aria-label="the shared-prefix tree as logged"' in html


def test_diff_tokens_log_groups_as_fix_and_summarizes_forks(cli, tok):
    r = cli("diff-tokens", "--log", str(SHARED), "-t", str(TOK_DIR))
    assert r.exit_code == 1                                     # forks with a fix
    assert "60 requests, 60 conversations found automatically" in r.stdout
    assert "system_prompt_changed" not in r.stdout and "0 pairs" in r.stdout
    assert "per_user_value (user)" in r.stdout and "3 with a fix" in r.stdout
    out = [json.loads(x) for x in cli("diff-tokens", "--log", str(SHARED), "-t", str(TOK_DIR), "-f", "json")
           .stdout.splitlines()]
    assert out[0]["record"] == "grouping" and out[0]["conversations"] == 60
    assert out[-2]["record"] == "forks" and out[-1]["record"] == "summary"
    # the same grouping as fix and report: one function
    lines = _lines(LOG_AGENT)
    g = groups.group_sessions(lines, tokenizer=tok)
    first = json.loads(cli("diff-tokens", "--log", str(LOG_AGENT), "-t", str(TOK_DIR), "-f", "json")
                       .stdout.splitlines()[0])
    assert first["conversations"] == g.count == 6
    rep = fix.fix_log(lines, replace(fix.FixOptions(), per_cause=False), tokenizer=tok)
    assert rep.grouping == g


def test_the_fork_analysis_reports_its_progress(tok):
    """Each line as it is packed, then each request as a pass or a replay views it (a batch of 256 at a time): on a long log
    the fork analysis is minutes of work, and the progress of `fix` and `report` moves through it."""
    lines = _lines(SHARED)
    ticks: list[int] = []
    forks, _ = log_forks(lines, tokenizer=tok, progress=ticks.append)
    quiet, _ = log_forks(lines, tokenizer=tok)
    assert forks is not None and quiet is not None and forks.report == quiet.report
    assert ticks[:len(lines)] == [1] * len(lines)              # packed, line by line
    assert set(ticks[len(lines):]) == {256}                     # viewed by the passes and replays
    viewed = sum(ticks[len(lines):])
    assert viewed >= 256 and viewed >= forks.report.replays * len(lines) // 256 * 256


def test_a_cache_salt_keys_every_replay_of_the_report_apart(cli, tmp_path):
    """vLLM's ``cache_salt`` (a request parameter: in the body) keeps one tenant's blocks from another's. The
    report's parts that replay the log (the curve's ceiling, the before/after measures, the fork analysis) all
    key blocks with it, so they agree with each other and with simulate-prefix, and are below the unsalted log's.
    Before, the measures and the fork analysis dropped the salt and the curve read only a top-level one."""
    rows = [json.loads(x) for x in LOG_AGENT.read_text().splitlines()]
    salted = tmp_path / "salted.jsonl"
    salted.write_text("".join(json.dumps({**r, "body": {**r["body"], "cache_salt": f"tenant-{i % 3}"}}) + "\n"
                              for i, r in enumerate(rows)))

    def rates(path):
        d = json.loads(cli("report", str(path), "--key", "session", "-t", str(TOK_DIR), "-f", "json").stdout)
        sp = d["shared_prefix"]
        return (d["curve"]["ceiling_hit_rate"], d["fixes"]["columns"][0]["vllm_hit_rate"],
                sp["hit_tokens"] / d["curve"]["query_tokens"])

    curve, before, forks = rates(salted)
    assert curve == before == pytest.approx(forks)
    sim = json.loads(cli("simulate-prefix", str(salted), "--policy", "infinite", "-t", str(TOK_DIR), "-f", "json").stdout)
    assert sim["hit_rate"] == pytest.approx(curve)
    plain = rates(LOG_AGENT)
    assert plain[0] == plain[1] == pytest.approx(plain[2]) and curve < plain[0]
