"""Claude Code transcripts: one usage per API response, the cache timeline's breaks and their causes, the 1-hour
TTL what-if, bad input, and `report` on a transcript."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from cachectl.engines.provider.prices import PriceTable
from cachectl.engines.provider.transcript import audit_transcripts
from cachectl.errors import InputError
from cachectl.inputs.formats import log_values, shape_of
from cachectl.inputs.formats.claude_code import NO_BODY, read_path, transcript_files

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "fixtures" / "logs"
SESSION = "4d5611e5-241a-462a-8d15-5122611a9569"
MAIN = LOGS / "claude_code" / f"{SESSION}.jsonl"
SUBAGENT = LOGS / "claude_code" / SESSION / "subagents" / "agent-a2898e3.jsonl"
COMPACT = LOGS / "claude_code_compact.jsonl"
NOTIFIED = LOGS / "claude_code_notification.jsonl"
TRANSCRIPTS = (MAIN, SUBAGENT, COMPACT, NOTIFIED)
# Claude Opus 4.6 in cachectl's price table, USD per million tokens
OPUS = {"input": 5.0, "read": 0.5, "w5": 6.25, "w1": 10.0, "output": 25.0}


@pytest.fixture(scope="module")
def table() -> PriceTable:
    return PriceTable.load()


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _audit(table, *paths):
    return audit_transcripts([r for p in paths for f in transcript_files(str(p)) for r in read_path(f)], table=table)


def _bill(u: dict) -> float:
    cc = u.get("cache_creation") or {}
    return (u["input_tokens"] * OPUS["input"] + u["cache_read_input_tokens"] * OPUS["read"]
            + cc.get("ephemeral_5m_input_tokens", 0) * OPUS["w5"] + cc.get("ephemeral_1h_input_tokens", 0) * OPUS["w1"]
            + u["output_tokens"] * OPUS["output"]) / 1e6


# ------------------------------------------------------------------------------------------------ detection


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.name)
def test_transcripts_are_found_by_themselves(path):
    assert shape_of(str(path)) == "claude-code"


@pytest.mark.parametrize("path", sorted(p for d in ("logs", "prompts") for p in (ROOT / "fixtures" / d).glob("*.jsonl")
                                        if not p.name.startswith("claude_code")), ids=lambda p: p.name)
def test_other_logs_are_not_transcripts(path):
    from cachectl.inputs.formats import claude_code
    from cachectl.inputs.formats.base import Head, HeadLine, json_value

    raw = [x.encode() for x in path.read_text().splitlines() if x.strip()][:5]
    head = Head(str(path), tuple(HeadLine(i + 1, r, json_value(r)) for i, r in enumerate(raw)))
    assert claude_code.detect(head).score == 0


def test_detector_never_raises_and_names_a_typeless_transcript():
    from cachectl.inputs.formats import claude_code
    from cachectl.inputs.formats.base import Head, HeadLine

    assert claude_code.detect(Head("x", (HeadLine(1, b"{", None),))).score == 0
    typeless = {"sessionId": "s", "message": {"id": "m", "usage": {"input_tokens": 1}}}
    v = claude_code.detect(Head("x", (HeadLine(1, b"", typeless),)))
    assert v.score == 1 and "type" in v.lacks


# --------------------------------------------------------------------------------- split responses, once


def test_a_response_written_over_several_lines_is_counted_once(table):
    lines = [v for v in _lines(MAIN) if v.get("type") == "assistant"]
    ids = {v["message"]["id"] for v in lines}
    assert len(lines) > 2 * len(ids) > 0  # the real file: most responses span several lines
    naive = sum(_bill(v["message"]["usage"]) for v in lines)  # each line's usage counted: the silent wrong bill
    final: dict[str, dict] = {}
    for v in lines:  # by hand: the line of each response with the most output tokens (the stream's end)
        u = v["message"]["usage"]
        if v["message"]["id"] not in final or u["output_tokens"] >= final[v["message"]["id"]]["output_tokens"]:
            final[v["message"]["id"]] = u
    honest = sum(_bill(u) for u in final.values())
    a = _audit(table, MAIN)
    assert a.calls == len(ids) == 21
    assert a.cost_usd == pytest.approx(honest, abs=1e-9)
    assert naive / a.cost_usd > 2.3  # this excerpt: the naive bill is 2.6x the real one
    # the final line's usage (iterations: [] and all) is the one kept: output tokens of the stream's end
    assert a.output_tokens == sum(u["output_tokens"] for u in final.values())


def test_records_carry_the_keys_and_no_body():
    rec = next(iter(read_path(str(MAIN))))
    assert rec.body is None and rec.missing == ("request body",)
    assert rec.keys["session"] == SESSION and rec.keys["message_id"] == "msg_01PdWvcjJ6E9BgscDveYt9YV"
    assert rec.keys["request_id"] == "req_011CY4TRHLYkp2wmETF8ujUf" and rec.keys["sidechain"] is False
    assert rec.keys["cwd"].startswith("/home/USER/projects/") and rec.model == "claude-opus-4-6"
    value = dict(log_values(str(MAIN)))[rec.line]
    assert value["usage"]["cache_read_input_tokens"] == 11442 and "body" not in value


def test_subagent_progress_lines_are_not_counted_and_subagents_are_threads_of_their_own(table):
    main = _audit(table, MAIN)
    both = _audit(table, LOGS / "claude_code")
    sub = [v for v in _lines(SUBAGENT) if v.get("type") == "assistant"]
    assert both.calls == main.calls + len({v["message"]["id"] for v in sub}) == 33
    s = both.sessions[0]
    assert s.threads == ("main", "agent-a2898e3")
    assert [b.cause for b in s.breaks if b.thread == "agent-a2898e3"] == ["cold_start"]


def test_a_subagent_replay_of_its_parent_response_is_counted_once(table, tmp_path):
    main = _lines(MAIN)
    first = next(v for v in main if v.get("type") == "assistant")
    replay = {**copy.deepcopy(first), "isSidechain": True, "agentId": "side", "requestId": "req_other"}
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(v) for v in main))
    (tmp_path / "b.jsonl").write_text(json.dumps(replay))
    a = _audit(table, tmp_path)
    assert a.calls == _audit(table, MAIN).calls and a.duplicates_dropped == 1


# --------------------------------------------------------------------------------------- break causes


def _template() -> tuple[dict, dict, dict, dict]:
    """A real user line, assistant line, compact boundary and compact summary of the fixtures."""
    main = _lines(MAIN)
    user = next(v for v in main if v.get("type") == "user" and not v.get("isMeta"))
    assistant = next(v for v in main if v.get("type") == "assistant")
    comp = _lines(COMPACT)
    boundary = next(v for v in comp if v.get("subtype") == "compact_boundary")
    summary = next(v for v in comp if v.get("isCompactSummary"))
    return user, assistant, boundary, summary


def _call(t: str, read: int, write: int, *, model: str = "claude-opus-4-6", ttl: str = "5m", n: int = 0,
          inp: int = 3, out: int = 100) -> dict:
    a = copy.deepcopy(_template()[1])
    a["timestamp"] = t
    a["message"]["id"] = f"msg_{t}_{n}"
    a["requestId"] = f"req_{t}_{n}"
    a["message"]["model"] = model
    a["message"]["usage"] = {
        "input_tokens": inp, "cache_creation_input_tokens": write, "cache_read_input_tokens": read,
        "cache_creation": {"ephemeral_5m_input_tokens": write if ttl == "5m" else 0,
                           "ephemeral_1h_input_tokens": write if ttl == "1h" else 0},
        "output_tokens": out, "service_tier": "standard", "inference_geo": "", "iterations": [], "speed": "standard"}
    return a


def _write(tmp_path, lines: list[dict], name: str = "s.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(v) + "\n" for v in lines))
    return p


def test_each_break_cause_is_told(table, tmp_path):
    user, _, boundary, summary = _template()
    notice = copy.deepcopy(user)
    notice["message"] = {"role": "user", "content": "<task-notification>\n<task-id>b1</task-id>\n</task-notification>"}
    lines = [
        user,
        _call("2026-02-12T10:00:00Z", 0, 20000),            # cold start
        _call("2026-02-12T10:00:10Z", 20000, 1000),         # reads all: no break
        _call("2026-02-12T10:10:10Z", 0, 21100),            # 10 minutes: past the 5-minute TTL
        _call("2026-02-12T10:10:20Z", 21100, 500),
        _call("2026-02-12T10:10:30Z", 0, 21700, model="claude-sonnet-4-5-20250929"),  # model switch
        _call("2026-02-12T10:10:40Z", 21700, 300, model="claude-sonnet-4-5-20250929"),
        boundary, summary,
        _call("2026-02-12T10:10:50Z", 15000, 4000, model="claude-sonnet-4-5-20250929"),  # compaction
        _call("2026-02-12T10:11:00Z", 19000, 200, model="claude-sonnet-4-5-20250929"),
        notice,
        _call("2026-02-12T10:11:05Z", 15000, 4300, model="claude-sonnet-4-5-20250929"),  # unexplained
    ]
    a = _audit(table, _write(tmp_path, lines))
    breaks = a.sessions[0].breaks
    assert [b.cause for b in breaks] == ["cold_start", "ttl_expired", "model_switch", "compaction", "unexplained"]
    ttl, switch, comp, odd = breaks[1:]
    assert ttl.lost_tokens == 21000 and ttl.gap_s == 600 and ttl.saved_by_1h
    assert ttl.cost_usd == pytest.approx(21000 * (OPUS["w5"] - OPUS["read"]) / 1e6)
    assert switch.previous_model == "claude-opus-4-6" and not switch.saved_by_1h
    assert comp.expected_read_tokens == 19003 and comp.lost_tokens == 4003  # the new prompt is shorter
    assert odd.after == "task-notification" and odd.lost_tokens == 4200 and "rewritten" in odd.detail
    assert {c.cause: c.breaks for c in a.by_cause} == {"cold_start": 1, "ttl_expired": 1, "model_switch": 1,
                                                       "compaction": 1, "unexplained": 1}
    assert a.avoidable_break_cost_usd == pytest.approx(sum(b.cost_usd for b in breaks[1:]))


def test_real_compaction_and_notification_breaks(table):
    comp = _audit(table, COMPACT).sessions[0].breaks
    assert [b.cause for b in comp] == ["cold_start", "compaction"]  # the excerpt starts mid-session
    assert comp[1].read_tokens == 21478  # the system prompt and tools still read after the compaction
    odd = _audit(table, NOTIFIED).sessions[0].breaks[1]
    assert (odd.cause, odd.read_tokens, odd.expected_read_tokens, odd.after) == (
        "unexplained", 21478, 98231, "task-notification")
    ttl = _audit(table, MAIN).sessions[0].breaks[1]
    assert ttl.cause == "ttl_expired" and ttl.read_tokens == 0 and ttl.gap_s > 4 * 3600 and not ttl.saved_by_1h


def test_one_hour_writes_have_a_one_hour_ttl(table, tmp_path):
    lines = [_call("2026-02-12T10:00:00Z", 0, 20000, ttl="1h"), _call("2026-02-12T10:30:00Z", 20000, 100, ttl="1h"),
             _call("2026-02-12T11:40:00Z", 0, 20200, ttl="1h")]
    breaks = _audit(table, _write(tmp_path, lines)).sessions[0].breaks
    assert [(b.cause, b.ttl_s) for b in breaks] == [("cold_start", 300.0), ("ttl_expired", 3600.0)]
    assert breaks[1].cost_usd == pytest.approx(20100 * (OPUS["w1"] - OPUS["read"]) / 1e6)


def test_the_one_hour_what_if_by_hand(table, tmp_path):
    # three calls: cold start, a 20-minute gap (a break the 1-hour TTL would have read), a 2-hour gap (a break
    # under either TTL)
    lines = [_call("2026-02-12T10:00:00Z", 0, 10000, inp=3, out=100),
             _call("2026-02-12T10:20:00Z", 0, 10500, inp=3, out=100),
             _call("2026-02-12T12:20:00Z", 0, 11000, inp=3, out=100)]
    a = _audit(table, _write(tmp_path, lines))
    per = lambda i, r, w5, w1, o: (i * OPUS["input"] + r * OPUS["read"] + w5 * OPUS["w5"] + w1 * OPUS["w1"]  # noqa: E731
                                   + o * OPUS["output"]) / 1e6
    actual = per(3, 0, 10000, 0, 100) + per(3, 0, 10500, 0, 100) + per(3, 0, 11000, 0, 100)
    # 1 hour: every write at 10/MTok; the 20-minute break reads the 10,000 tokens the first call cached
    one_hour = per(3, 0, 0, 10000, 100) + per(3, 10000, 0, 500, 100) + per(3, 0, 0, 11000, 100)
    assert a.cost_usd == pytest.approx(actual, abs=1e-9)
    assert a.cost_1h_usd == pytest.approx(one_hour, abs=1e-9)
    assert a.cheaper_with_1h is (one_hour < actual)
    assert [b.saved_by_1h for b in a.sessions[0].breaks] == [False, True, False]


# ----------------------------------------------------------------------------------------------- bad input


def _bad(tmp_path, mutate) -> str:
    user, a, _, _ = _template()
    a = copy.deepcopy(a)
    mutate(a)
    p = _write(tmp_path, [user, a])
    with pytest.raises(InputError) as err:
        list(log_values(str(p)))
    return str(err.value)


def test_empty_unknown_usage_keys_are_not_errors(tmp_path):
    user, a, _, _ = _template()
    a = copy.deepcopy(a)
    a["message"]["usage"].update({"iterations": [], "speed": "standard", "new_counter": 0, "new_map": {}, "x": None})
    vals = list(log_values(str(_write(tmp_path, [user, a]))))
    assert len(vals) == 1 and "iterations" not in vals[0][1]["usage"]


def test_bad_lines_are_one_line_naming_file_line_and_field(tmp_path, table):
    msg = _bad(tmp_path, lambda a: a["message"].pop("usage"))
    assert msg.startswith(f"{tmp_path}/s.jsonl:2: field 'message.usage'")
    msg = _bad(tmp_path, lambda a: a["message"].__setitem__("id", 7))
    assert ":2: field 'message.id'" in msg
    # a usage key that holds something is kept, so that pricing refuses it by name
    user, a, _, _ = _template()
    a = copy.deepcopy(a)
    a["message"]["usage"]["speed"] = "fast"
    with pytest.raises(InputError, match=r"s\.jsonl:2: field 'message\.usage\.speed': unknown usage counter"):
        _audit(table, _write(tmp_path, [user, a]))


def test_lines_of_one_response_that_disagree_are_refused(tmp_path):
    user, a, _, _ = _template()
    b = copy.deepcopy(a)
    b["message"]["usage"]["cache_read_input_tokens"] += 1
    p = _write(tmp_path, [user, a, b])
    with pytest.raises(InputError, match=r":3: field 'message.usage': the lines of response msg_01PdWv"):
        list(log_values(str(p)))


def test_a_transcript_without_responses_and_not_json(tmp_path, table):
    user = _template()[0]
    with pytest.raises(InputError, match="no API responses"):
        _audit(table, _write(tmp_path, [user]))
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(user) + "\n{not json\n")
    with pytest.raises(InputError, match=r"t\.jsonl:2"):
        list(log_values(str(p)))


def test_commands_that_need_bodies_get_one_line(tmp_path):
    with pytest.raises(InputError) as err:
        list(log_values(str(MAIN), need_body=True))
    assert str(err.value) == f"{MAIN}:4: {NO_BODY}" and "`cachectl report`" in NO_BODY


# -------------------------------------------------------------------------------------------------- report


def test_report_on_a_transcript_folder(cli):
    r = cli("report", LOGS / "claude_code")
    assert r.exit_code == 1, r.stderr  # a 4-hour gap broke the cache: it cost money
    assert "33 API responses" in r.stdout and "ttl_expired" in r.stdout
    r = cli("report", NOTIFIED, "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and doc["schema_version"] == 1
    assert doc["by_cause"][-1]["cause"] == "unexplained" and doc["sessions"][0]["breaks"][1]["after"] == "task-notification"


def test_report_on_a_transcript_takes_prices_and_refuses_html(cli, tmp_path):
    """--prices was not read for a transcript (the shipped prices were used, said nowhere), and --html was ignored:
    no page, no error (a CI job publishing the page got nothing)."""
    log = LOGS / "claude_code_compact.jsonl"
    base = json.loads(cli("report", log, "-f", "json").stdout)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {"claude-opus-4-6": {
        "provider": "anthropic", "input": 10, "output": 50, "cache_write_5m": 12.5, "cache_write_1h": 20,
        "cache_read": 1, "min_cacheable_tokens": 4096, "cache_mode": "explicit", "ttls": {"5m": 300, "1h": 3600},
        "max_breakpoints": 4, "lookback_blocks": 20, "usage_style": "anthropic"}}}))
    doubled = json.loads(cli("report", log, "-f", "json", "--prices", prices).stdout)
    assert base["cost_usd"] > 0 and doubled["cost_usd"] == pytest.approx(2 * base["cost_usd"])
    page = tmp_path / "r.html"
    r = cli("report", log, "--html", page)
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        "cachectl: error: --html draws a request log's report; a Claude Code transcript's cache timeline is text or "
        "JSON (-f json)"]
    assert not page.exists()


def test_report_on_a_bad_transcript_is_one_line_exit_2(cli, tmp_path):
    user, a, _, _ = _template()
    a = copy.deepcopy(a)
    a["message"].pop("usage")
    r = cli("report", _write(tmp_path, [user, a]))
    assert r.exit_code == 2 and "message.usage" in r.stderr and "Traceback" not in r.stderr
