"""One timestamp reader for every command: ISO 8601 with a zone, epoch seconds, milliseconds or microseconds by
magnitude (said in a note), refused with the unit to state where the magnitude fits none (--time-unit)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from cachectl.inputs import TimestampError, TimestampReader, read_timestamp

from .conftest import FIXTURES

ISO = "2026-11-30T10:00:00Z"
EPOCH = datetime.fromisoformat("2026-11-30T10:00:00+00:00").timestamp()


@pytest.mark.parametrize("value,seconds,how", [
    (ISO, EPOCH, "iso"),
    ("2026-11-30T11:00:00+01:00", EPOCH, "iso"),
    (EPOCH, EPOCH, "s"),
    (int(EPOCH * 1000), EPOCH, "ms"),
    (int(EPOCH * 1_000_000), EPOCH, "us"),
    (0, 0.0, "s"),            # seconds from the start of a trace
    (12.5, 12.5, "s"),
])
def test_units_are_recognized_by_magnitude(value, seconds, how):
    assert read_timestamp(value) == (pytest.approx(seconds), how)


@pytest.mark.parametrize("value", [5e10, 5e13, 1e17])
def test_a_magnitude_that_fits_no_unit_is_refused_naming_the_option(value):
    with pytest.raises(TimestampError, match=r"--time-unit s\|ms\|us"):
        read_timestamp(value)
    assert read_timestamp(value, "s") == (value, "s")  # stated: read as told


def test_iso_without_a_zone_and_junk_are_refused():
    with pytest.raises(TimestampError, match="no time zone"):
        read_timestamp("2026-11-30T10:00:00")
    for bad in ("yesterday", True, float("nan"), [1]):
        with pytest.raises(TimestampError):
            read_timestamp(bad)


def test_a_stated_unit_applies_to_every_number_and_the_reader_notes_what_it_recognized():
    assert TimestampReader("ms")(1500) == 1.5
    reader = TimestampReader()
    assert reader(EPOCH * 1000) == pytest.approx(EPOCH) and reader(ISO) == pytest.approx(EPOCH)
    assert reader.note() == ("timestamps read as epoch milliseconds, by their magnitude (--time-unit states "
                             "the unit)")
    assert TimestampReader().note() is None


def _in_ms(src: str, dst) -> str:
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as out:
        for line in f:
            value = json.loads(line)
            value["timestamp"] = round(datetime.fromisoformat(value["timestamp"].replace("Z", "+00:00"))
                                       .timestamp() * 1000)
            out.write(json.dumps(value) + "\n")
    return str(dst)


def test_simulate_prefix_reads_iso_timestamps(cli):
    # it used to refuse them: "expected a number of seconds..., got '2026-11-30T10:00:00Z'"
    r = cli("simulate-prefix", "fixtures/prompts/openai_requests.jsonl", "-t", "fixtures/tok",
            "--capacity-blocks", "200")
    assert r.exit_code == 0, r.stderr
    assert "hit rate 56.2%" in r.stdout and "timestamp" not in r.stderr


def test_epoch_milliseconds_are_milliseconds_in_prompt_cost(cli, tmp_path):
    iso = cli("prompt-cost", "fixtures/prompts/agent_log.jsonl", "-t", "fixtures/tok", "-f", "json")
    log = _in_ms("fixtures/prompts/agent_log.jsonl", tmp_path / "ms.jsonl")
    ms = cli("prompt-cost", log, "-t", "fixtures/tok", "-f", "json")
    assert iso.exit_code == ms.exit_code == 0, ms.stderr
    rate = json.loads(iso.stdout)["hit_rate"]
    assert rate > 0.5 and json.loads(ms.stdout)["hit_rate"] == rate  # not "TTL expired" on every request
    assert "cachectl: note: timestamps read as epoch milliseconds" in ms.stderr and iso.stderr == ""
    # stated as seconds, they are 1,000 times as far apart: every entry expires
    assert json.loads(cli("prompt-cost", log, "-t", "fixtures/tok", "-f", "json", "--time-unit", "s")
                      .stdout)["hit_rate"] == 0


@pytest.mark.parametrize("command", [
    ["simulate-prefix", "{log}", "--capacity-blocks", "10"],
    ["prompt-cost", "{log}", "-t", "fixtures/tok"],
    ["fix", "{log}"],
])
def test_an_ambiguous_timestamp_is_one_line_naming_the_unit_to_state(cli, tmp_path, command):
    log = tmp_path / "odd.jsonl"
    log.write_text(json.dumps({"timestamp": 5e10, "model": "gpt-4.1", "tokens": [1, 2, 3],
                               "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    r = cli(*[str(log) if a == "{log}" else a for a in command])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "odd.jsonl:1" in r.stderr and "--time-unit s|ms|us" in r.stderr
    ok = cli(*[str(log) if a == "{log}" else a for a in command], "--time-unit", "ms")
    assert ok.exit_code in (0, 1) and "timestamp" not in ok.stderr, ok.stderr


def test_a_time_zone_is_an_iana_name_utc_or_an_offset_and_anything_else_is_refused():
    from datetime import timedelta, timezone

    from cachectl.inputs.timestamps import time_zone

    assert time_zone("UTC") is time_zone("Z") is time_zone(" utc ")
    assert time_zone("+01:00").utcoffset(None) == timedelta(hours=1)
    assert time_zone("-0530").utcoffset(None) == timedelta(hours=-5, minutes=-30)
    assert time_zone("+09") == timezone(timedelta(hours=9))
    assert str(time_zone("Europe/Berlin")) == "Europe/Berlin"
    for bad in ("Mars/Base", "+24:00", "+01:60", "../../etc/passwd", "/etc/localtime", "", "x" * 300):
        with pytest.raises(TimestampError, match="time zone"):
            time_zone(bad)


def test_a_time_without_a_zone_is_read_in_the_zone_named_and_a_time_with_one_keeps_it():
    # 29 March 2026: Berlin moves from +01:00 to +02:00 at 02:00 local time
    before, after = "2026-03-29 00:30:00", "2026-03-29T03:10:00"
    berlin = TimestampReader(zone="Europe/Berlin")
    assert berlin(before) == datetime.fromisoformat(before + "+01:00").timestamp()
    assert berlin(after) == datetime.fromisoformat(after + "+02:00").timestamp()
    assert berlin(after) - berlin(before) == 100 * 60  # 1 h 40 min apart, not the 2 h 40 min the clock shows
    fixed = TimestampReader(zone="+01:00")
    assert fixed(after) - fixed(before) == 160 * 60
    assert berlin(ISO) == fixed(ISO) == EPOCH and berlin(EPOCH) == EPOCH  # a zone given, or a number: as it was
    with pytest.raises(TimestampError, match="--time-zone"):  # the refusal names the option that reads them
        TimestampReader()(before)
    import pickle

    assert pickle.loads(pickle.dumps(berlin))(after) == berlin(after)  # a forked or Ray worker reads alike


NAIVE = [{"timestamp": t, "body": {"model": "gpt-4.1", "messages": [
    {"role": "system", "content": "You are a careful assistant for a cache diagnostics product. " * 8},
    {"role": "user", "content": q}]}} for t, q in (("2026-03-29 00:30:00", "hi"), ("2026-03-29 03:10:00", "again"))]


@pytest.mark.parametrize("command", [
    ["prompt-cost", "{log}", "-t", "fixtures/tok"],
    ["report", "{log}", "-t", "fixtures/tok"],
    ["fix", "{log}", "-t", "fixtures/tok"],
    ["diff-tokens", "--log", "{log}", "-t", "fixtures/tok"],
    ["simulate-prefix", "replay", "{log}", "-t", "fixtures/tok", "--policy", "infinite"],
    ["simulate-prefix", "curve", "{log}", "-t", "fixtures/tok"],
])
def test_every_command_that_reads_log_times_takes_the_zone_of_times_logged_without_one(cli, tmp_path, command):
    log = tmp_path / "local.jsonl"
    log.write_text("".join(json.dumps(v) + "\n" for v in NAIVE))
    args = [str(log) if a == "{log}" else a for a in command]
    r = cli(*args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "local.jsonl:1" in r.stderr and "no time zone" in r.stderr and "--time-zone" in r.stderr
    ok = cli(*args, "--time-zone", "Europe/Berlin")
    assert ok.exit_code in (0, 1) and "time zone" not in ok.stderr, ok.stderr
    bad = cli(*args, "--time-zone", "Europe/Nowhere")
    assert bad.exit_code == 2 and "--time-zone: unknown time zone 'Europe/Nowhere'" in bad.stderr, bad.stderr


def test_prompt_cost_places_times_logged_without_a_zone_in_the_zone_named(cli, tmp_path):
    log = tmp_path / "local.jsonl"
    log.write_text("".join(json.dumps(v) + "\n" for v in NAIVE))
    for zone, offsets in (("Europe/Berlin", ("+01:00", "+02:00")), ("+01:00", ("+01:00", "+01:00"))):
        r = cli("prompt-cost", str(log), "-t", "fixtures/tok", "-f", "json", "--time-zone", zone)
        assert r.exit_code == 0, r.stderr
        got = [q["timestamp"] for q in json.loads(r.stdout)["requests"]]
        assert got == [datetime.fromisoformat(v["timestamp"] + off).timestamp() for v, off in zip(NAIVE, offsets)]


def test_the_audit_dates_its_prices_by_times_logged_without_a_zone_in_the_zone_named(cli, tmp_path):
    # Sonnet 5.5's cache reads were cut from 0.1x to 0.05x input on 2026-10-07 (the shipped table's history): a
    # call logged at 23:30 local time on 6 October was billed at the old rates in UTC, at the new ones in New York
    log = tmp_path / "usage.jsonl"
    log.write_text(json.dumps({"timestamp": "2026-10-06 23:30:00", "model": "claude-sonnet-5-5", "usage": {
        "input_tokens": 100, "cache_read_input_tokens": 1_000_000, "cache_creation_input_tokens": 0,
        "output_tokens": 10}}) + "\n")

    def audit(*zone):
        r = cli("prompt-cost", "--usage", str(log), "-f", "json", *zone)
        assert r.exit_code == 0, r.stderr
        data = json.loads(r.stdout)
        return data["total_cost_usd"], " ".join(data["notes"])

    undated, utc, new_york = audit(), audit("--time-zone", "UTC"), audit("--time-zone", "America/New_York")
    assert "calls without a date" in undated[1] and "--time-zone" in undated[1]
    assert "priced at the rates in force then" in utc[1] and "calls without a date" not in new_york[1]
    assert new_york[0] == undated[0] and utc[0] - new_york[0] == pytest.approx(0.10)  # a million reads at $0.10 more


@pytest.mark.parametrize("stamp", ["2026-03-29 03:10:00", "yesterday", 1e30])
def test_lint_reads_no_times_so_a_body_is_not_refused_for_its_wrapper_s(cli, tmp_path, stamp):
    """lint has no time flags and uses no times: a request body whose wrapper logs a time without a zone (or one no
    command could read) is linted, not refused with an error naming a flag lint does not have; a body with a
    finding in it (a breakpoint below the model's minimum) still has it found."""
    body = {"model": "gpt-4.1", "messages": [{"role": "system", "content": "You are helpful."},
                                             {"role": "user", "content": "hi"}]}
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps({"timestamp": stamp, "body": body}))
    r = cli("lint", str(clean))
    assert r.exit_code == 0 and "clean" in r.stdout and r.stderr == ""
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"timestamp": stamp,
                                 "body": json.loads((FIXTURES / "lint" / "bad" / "body_short.json").read_text())}))
    r = cli("lint", str(short), "--format", "json")
    assert r.exit_code == 1 and r.stderr == ""
    assert "CC005" in {f["rule"] for f in json.loads(r.stdout)["findings"]}
