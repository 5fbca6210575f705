"""Codex CLI rollouts: one record per model call, repeats counted once, Responses usage, the rebuilt request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachectl.errors import InputError
from cachectl.inputs.formats import codex, log_values, shape_of
from cachectl.inputs.usage import parse_usage

ROOT = Path(__file__).resolve().parents[1]
REAL = str(ROOT / "fixtures" / "logs" / "codex_rollout.jsonl")
TOTALS = str(ROOT / "fixtures" / "logs" / "codex_rollout_totals.jsonl")


def _records(path: str):
    lines = [(i + 1, raw.rstrip(b"\n")) for i, raw in enumerate(Path(path).read_bytes().splitlines(True)) if raw.strip()]
    return list(codex.read(lines, path))


def test_detected_on_its_fixtures_and_not_on_the_others():
    assert shape_of(REAL) == "codex" and shape_of(TOTALS) == "codex"
    for other in [*(ROOT / "fixtures" / "logs").iterdir(), *(ROOT / "fixtures" / "prompts").glob("*.jsonl")]:
        if other.name.startswith("codex_") or other.suffix not in (".jsonl", ".log"):
            continue
        try:
            assert shape_of(str(other)) != "codex", other
        except InputError:
            pass


def test_each_call_once_with_its_last_token_usage():
    records = _records(REAL)
    # 12 token_count events with info, each written twice: 6 calls
    assert [r.line for r in records] == [18, 27, 36, 45, 54, 62]
    final = {"input_tokens": 298373, "cached_input_tokens": 238848, "output_tokens": 1123}
    assert sum(r.usage["input_tokens"] for r in records) == final["input_tokens"]
    assert sum(r.usage["input_tokens_details"]["cached_tokens"] for r in records) == final["cached_input_tokens"]
    assert sum(r.output_tokens for r in records) == final["output_tokens"]
    first = parse_usage(records[0].usage, source=REAL, line=18)
    # Codex's input_tokens include the cached ones (Responses' inclusive convention)
    assert (first.input_tokens, first.cache_read_tokens, first.output_tokens) == (42772 - 3456, 3456, 204)
    r = records[1]
    assert r.model == "gpt-5.3-codex" and r.keys["session"] == "019c8bfe-ec25-79e0-97d7-bda6a9c575ff"
    assert r.timestamp == "2026-02-23T19:34:39.532Z"  # the turn_context before the call, not the count
    assert r.body is not None and r.body["model"] == "gpt-5.3-codex"
    assert r.body["instructions"].startswith("[REDACTED_TEXT len=13131")
    # the input ends with the previous call's tool output; the call's own outputs are not in it
    assert r.body["input"][-1]["type"] == "function_call_output"
    assert len(records[2].body["input"]) > len(r.body["input"])
    assert r.body_path is None and any("tools" in m for m in r.missing)


def test_totals_only_are_differenced():
    records = _records(TOTALS)
    assert [r.usage["input_tokens"] for r in records] == [1000, 600]
    assert [r.usage["input_tokens_details"]["cached_tokens"] for r in records] == [100, 200]
    assert [r.output_tokens for r in records] == [200, 250]


def test_log_values_gives_wrapper_lines():
    values = list(log_values(REAL))
    assert len(values) == 6
    line, v = values[0]
    assert line == 18 and v["session"] and v["usage"]["input_tokens"] == 42772 and v["body"]["input"]


def _write(tmp_path, lines):
    p = tmp_path / "rollout.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(p)


def test_bad_counter_names_line_and_field(tmp_path):
    path = _write(tmp_path, [
        {"timestamp": "t", "type": "turn_context", "payload": {"model": "gpt-5"}},
        {"timestamp": "t", "type": "event_msg", "payload": {"type": "token_count", "info": {
            "total_token_usage": {"input_tokens": "12"}}}}])
    with pytest.raises(InputError) as e:
        list(log_values(path))
    assert e.value.line == 2 and e.value.field == "payload.info.total_token_usage.input_tokens"


def test_empty_last_usage_is_not_an_error_and_old_rollouts_are_named(tmp_path):
    path = _write(tmp_path, [
        {"timestamp": "t", "type": "event_msg", "payload": {"type": "token_count", "info": {
            "total_token_usage": {"input_tokens": 5, "output_tokens": 1}, "last_token_usage": {}}}}])
    assert [v["usage"]["input_tokens"] for _, v in log_values(path)] == [5]
    old = _write(tmp_path, [{"id": "x", "timestamp": "2025-05-01T00:00:00Z", "instructions": None},
                            {"type": "message", "role": "user", "content": []}, {"record_type": "state"}])
    with pytest.raises(InputError, match="old rollout"):
        list(log_values(old))


def test_prompt_cost_audits_a_rollout(cli):
    r = cli("prompt-cost", "--usage", REAL)
    assert r.exit_code == 0, r.stderr
    assert "gpt-5.3-codex" in r.stdout and "80.1%" in r.stdout


def test_concatenated_rollouts_start_each_session_afresh(tmp_path):
    """`cat rollout-a.jsonl rollout-b.jsonl`: the second session's calls carry only its own history and its own
    usage (totals restart), as two files read apart give."""
    data = Path(REAL).read_bytes()
    other = data.replace(b'"session_meta","payload":{"id":"', b'"session_meta","payload":{"id":"other-', 1)
    assert other != data
    both = tmp_path / "both.jsonl"
    both.write_bytes(data + other)
    alone = [v for _, v in log_values(str(REAL), "codex")]
    together = [v for _, v in log_values(str(both), "codex")]
    assert len(together) == 2 * len(alone)
    for a, b in zip(alone, together[len(alone):]):
        assert b["usage"] == a["usage"] and len(b["body"]["input"]) == len(a["body"]["input"])
        assert b["session"] != a["session"]


def test_a_forced_log_format_that_the_file_is_not_is_said_on_its_first_line(cli):
    """``--log-format codex`` on cachectl's own log: its reader would skip every line (report said 'no requests');
    a forced shape whose detector does not see the file is one line naming the shape and what it expects. Each
    shape's own example still reads under its name forced."""
    from cachectl.inputs.formats import MODULES, open_log

    r = cli("report", "fixtures/prompts/fix_log.jsonl", "-t", "fixtures/tok", "--log-format", "codex")
    assert r.exit_code == 2 and r.stderr.startswith("cachectl: error: fixtures/prompts/fix_log.jsonl:1: not Codex CLI")
    assert "--log-format codex" in r.stderr and "no requests" not in r.stderr
    for module in MODULES:
        name, reader, lines = open_log(module.SHAPE.example, module.SHAPE.name)
        assert (name, reader) == (module.SHAPE.name, module) and next(lines)


@pytest.mark.parametrize("command", [
    ["report", TOTALS, "-t", "fixtures/tok"],
    ["prompt-cost", TOTALS, "-t", "fixtures/tok"],
    ["diff-tokens", "--log", TOTALS, "-t", "fixtures/tok"],
    ["simulate-prefix", "replay", TOTALS, "-t", "fixtures/tok", "--policy", "infinite"],
])
def test_a_rollout_of_counts_without_items_is_said_to_hold_usage_and_sent_to_the_audit(cli, command):
    # its calls log their token counts and none of the items sent: there is no prompt to render (it said "no
    # messages to render"; prompt-cost priced an empty prompt and then disagreed with the bill)
    r = cli(*command)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "codex_rollout_totals.jsonl:2: this is a response's usage, not a request" in r.stderr
    assert "`cachectl prompt-cost --usage FILE` audits what it billed" in r.stderr
    audit = cli("prompt-cost", "--usage", TOTALS, "-f", "json")
    assert audit.exit_code == 0 and len(json.loads(audit.stdout)["requests"]) == 2, audit.stderr


@pytest.mark.parametrize("key", [[], ["--key", "session"]])
def test_a_log_of_its_shape_with_no_request_is_an_error_in_diff_tokens_too(cli, tmp_path, key):
    """A file read as a Codex rollout (its first line is one) whose lines hold no model call: `diff-tokens --log`
    printed 0 requests and exited 0, where fix, report and simulate-prefix say "no requests" (exit 2)."""
    meta = (Path(__file__).parent.parent / "fixtures" / "logs" / "codex_rollout.jsonl").read_text().splitlines()[0]
    native = json.dumps({"timestamp": 0, "body": {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}})
    p = tmp_path / "mixed.jsonl"
    p.write_text(f"{meta}\n{native}\n")
    r = cli("diff-tokens", "--log", str(p), "-t", str(Path(__file__).parent.parent / "fixtures" / "tok"), *key)
    assert r.exit_code == 2 and r.stderr.strip().endswith("mixed.jsonl: no requests"), r.stderr
