"""Prices as of a call's date (issue #38, item 3) and the shipped table's sources and aliases (item 4).

Rates in USD per million tokens, from the shipped table (input | write | read | output):
- gpt-5.6-sol: 5 | 6.25 | 0.50 | 30 from 2026-07-09 (launch) to 2026-08-20, then 4 | 5 | 0.40 | 20 from 2026-08-21;
- gpt-5.6-luna: 1 | 1.25 | 0.10 | 6 to 2026-07-29, then 0.20 | 0.25 | 0.02 | 1.20 from 2026-07-30;
- claude-sonnet-5-5: reads 0.20 to 2026-10-06, 0.10 from 2026-10-07 (input 2, 5m write 2.50, output 10 throughout).
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from typer.testing import CliRunner

from cachectl.cli import app
from cachectl.datafiles import load_data
from cachectl.engines.provider import PriceTable, simulate_requests
from cachectl.engines.provider.prices import Usage, cost_usd, priced_at
from cachectl.inputs.request import parse_request


def at(day: str, hour: int = 12) -> float:
    return datetime.fromisoformat(f"{day}T{hour:02d}:00:00+00:00").timestamp()


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


def openai_usage(inp=0, write=0, read=0, out=0) -> Usage:
    return Usage(input_tokens=inp, cache_creation_input_tokens=write, cache_read_input_tokens=read,
                 output_tokens=out, cache_write_5m_tokens=write)


# ------------------------------------------------------------------------------------------ the lookup


def test_a_call_before_and_after_the_cut_is_priced_at_each_rate(table):
    sol = table.lookup("gpt-5.6-sol")
    u = openai_usage(inp=4000, write=2000, read=4000, out=1000)
    before, note = priced_at(sol, at("2026-08-20", 23))
    # 4,000 x 5 + 2,000 x 6.25 + 4,000 x 0.50 + 1,000 x 30 = 20,000 + 12,500 + 2,000 + 30,000
    assert cost_usd(before, u) == pytest.approx(0.0645)
    assert note is not None and "2026-07-09 to 2026-08-20" in note and "not today's" in note
    after, note = priced_at(sol, at("2026-08-21", 0))
    # 4,000 x 4 + 2,000 x 5 + 4,000 x 0.40 + 1,000 x 20 = 16,000 + 10,000 + 1,600 + 20,000
    assert cost_usd(after, u) == pytest.approx(0.0476) and note is None and after is sol


def test_the_launch_long_context_band_keeps_its_multiples(table):
    before, _ = priced_at(table.lookup("gpt-5.6-sol"), at("2026-07-15"))
    band = before.rates(300_000)
    # the set gives no band: the current band's multiples (2x input and cache rates, 1.5x output) of the set's rates
    assert (band.input, band.cache_read, band.cache_write, band.output) == (10, 1.0, 12.5, 45)


def test_no_date_is_todays_rate(table):
    sol = table.lookup("gpt-5.6-sol")
    assert priced_at(sol, None) == (sol, None)
    assert priced_at(sol, 120.0) == (sol, None)          # seconds from the start of a log: no date


def test_a_date_before_the_first_known_rates_gets_them_with_a_note(table):
    early, note = priced_at(table.lookup("gpt-5.6-luna"), at("2026-06-30"))
    assert (early.input, early.output, early.cache_write) == (1, 6, 1.25)
    assert note is not None and "before 2026-07-09" in note


def test_sonnet_5_5_reads_before_and_after_the_cut(table):
    p = table.lookup("claude-sonnet-5-5")
    assert priced_at(p, at("2026-10-06"))[0].cache_read == 0.2
    assert priced_at(p, at("2026-10-07"))[0].cache_read == 0.1


# ------------------------------------------------------------------------------------------ the CLI


def _run(*args: str):
    return CliRunner().invoke(app, ["prompt-cost", *args])


def test_audit_prices_each_response_at_its_dates_rate(tmp_path):
    def line(ts):
        usage = {"prompt_tokens": 10_000, "completion_tokens": 1000,
                 "prompt_tokens_details": {"cached_tokens": 4000, "cache_write_tokens": 2000}}
        return {**({"timestamp": ts} if ts is not None else {}),
                "response": {"object": "chat.completion", "model": "gpt-5.6-luna", "usage": usage}}

    log = tmp_path / "luna.jsonl"
    log.write_text("".join(json.dumps(line(ts)) + "\n"
                           for ts in ("2026-07-20T10:00:00Z", "2026-08-01T10:00:00Z", None)))
    result = _run("--usage", str(log), "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    # launch: 4,000 x 1 + 2,000 x 1.25 + 4,000 x 0.10 + 1,000 x 6 = 12,900; cut: 800 + 500 + 80 + 1,200 = 2,580
    assert [r["cost_usd"] for r in doc["requests"]] == pytest.approx([0.0129, 0.00258, 0.00258])
    notes = " | ".join(doc["notes"])
    assert "gpt-5.6-luna: calls dated 2026-07-09 to 2026-07-29 priced at the rates in force then" in notes
    assert "calls without a date" in notes and "today's rates, in force since 2026-07-30" in notes


def test_audit_reads_the_responses_own_created_time(tmp_path):
    created = int(at("2026-07-20"))
    log = tmp_path / "created.jsonl"
    log.write_text(json.dumps({"object": "chat.completion", "created": created, "model": "gpt-5.6-luna",
                               "usage": {"prompt_tokens": 1000, "completion_tokens": 0}}) + "\n")
    doc = json.loads(_run("--usage", str(log), "--format", "json").stdout)
    assert doc["requests"][0]["cost_usd"] == pytest.approx(0.001)   # 1,000 x $1 (launch), not 1,000 x $0.20


def test_simulate_prices_requests_before_and_after_the_cut(table):
    def req(ts):
        return parse_request({"timestamp": ts, "model": "gpt-5.6-sol", "output_tokens": 0,
                              "messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(3000))}]})

    report = simulate_requests([req("2026-08-20T12:00:00Z"), req("2026-08-22T12:00:00Z")], table=table,
                               source="t", text_counter=lambda s: len(s.split()))
    a, b = report.requests
    assert a.cache_creation_input_tokens == b.cache_creation_input_tokens > 0   # a day apart: both write again
    # every rate of the launch price is 1.25x the cut one (5/4, 6.25/5, 0.50/0.40)
    assert a.cost_usd == pytest.approx(1.25 * b.cost_usd)
    assert any("2026-07-09 to 2026-08-20" in n for n in report.notes)


def test_simulate_with_relative_times_says_todays_rates(table):
    reqs = [parse_request({"timestamp": 60 * i, "model": "gpt-5.6-sol", "output_tokens": 0,
                           "messages": [{"role": "user", "content": "a b c"}]}) for i in range(2)]
    report = simulate_requests(reqs, table=table, source="t", text_counter=lambda s: len(s.split()))
    assert any("calls without a date" in n for n in report.notes)


def _own_prices(tmp_path, history, effective_from="2026-03-01"):
    own = tmp_path / "own.json"
    own.write_text(json.dumps({"models": {"acme-1": {
        "provider": "openai", "input": 1, "output": 4, "cache_read": 0.1, "min_cacheable_tokens": 1024,
        "source": "acme.example/pricing", "effective_from": effective_from, "history": history}}}))
    return own


def test_a_prices_file_carries_history(tmp_path):
    own = _own_prices(tmp_path, [{"from": "2026-01-01", "input": 2, "output": 8, "source": "acme.example/2026-01"}])
    log = tmp_path / "acme.jsonl"
    log.write_text("".join(json.dumps({"timestamp": ts, "model": "acme-1",
                                       "usage": {"prompt_tokens": 1000, "completion_tokens": 100,
                                                 "prompt_tokens_details": {"cached_tokens": 500}}}) + "\n"
                           for ts in ("2026-02-15T00:00:00Z", "2026-03-01T00:00:00Z")))
    result = _run("--usage", str(log), "--prices", str(own), "--format", "json")
    assert result.exit_code == 0, result.output
    # before: 500 x 2 + 500 x 0.2 (the read keeps its 0.1x multiple) + 100 x 8 = 1,900; after: 500 + 50 + 400 = 950
    assert [r["cost_usd"] for r in json.loads(result.stdout)["requests"]] == pytest.approx([0.0019, 0.00095])
    listed = _run("--list-models", "--prices", str(own))
    assert "acme-1: 2026-01-01 to 2026-02-28: input 2, write -, read 0.2, output 8; acme.example/2026-01" \
        in listed.output
    assert "acme-1: since 2026-03-01" in listed.output


@pytest.mark.parametrize("history,effective_from,message", [
    ([{"from": "2026-01-01", "to": "2026-04-01", "input": 2, "output": 8}], "2026-03-01", "past 2026-03-01"),
    ([{"from": "2026-01-01", "input": 2, "output": 8}], None, "needs 'to'"),
    ([{"from": "2026-02-30", "to": "2026-03-01", "input": 2, "output": 8}], "2026-03-01", "expected a date"),
    ([{"from": "2026-01-01", "to": "2026-01-01", "input": 2, "output": 8}], "2026-03-01", "must be after"),
    ([{"from": "2026-01-01", "output": 8}], "2026-03-01", "input"),
])
def test_a_prices_files_history_is_checked(tmp_path, history, effective_from, message):
    own = _own_prices(tmp_path, history, effective_from)
    result = _run("--list-models", "--prices", str(own))
    assert result.exit_code == 2 and message in result.output, result.output


def test_list_models_shows_each_entrys_history_in_text_and_json():
    text = _run("--list-models").output
    assert "gpt-5.6-sol: 2026-07-09 to 2026-08-20: input 5, write 6.25, read 0.5, output 30; launch price" in text
    assert "gpt-5.6-terra: 2026-07-09 to 2026-07-29: input 2.5, write 3.125, read 0.25, output 15" in text
    assert "claude-sonnet-5: no date, not used to price calls: an increase to $3/$15" in text
    models = {m["model"]: m for m in json.loads(_run("--list-models", "--format", "json").stdout)["models"]}
    sol = models["gpt-5.6-sol"]
    assert sol["effective_from"] == "2026-08-21"
    assert [(s["effective_from"], s["effective_to"], s["input"], s["cache_write"]) for s in sol["price_sets"]] \
        == [("2026-07-09", "2026-08-21", 5, 6.25)]
    assert models["claude-opus-4-5"]["aliases_source"].startswith("platform.claude.com/docs/en/about-claude/models")


# ------------------------------------------------------------------------------ item 4: the shipped data


def test_every_shipped_source_is_a_public_page():
    raw = load_data("prices.json")
    text = json.dumps(raw)
    assert "FACTS" not in text and "shared/" not in text


def test_gpt_5_6_and_later_list_their_write_price_at_1_25x_input(table):
    for p in table.models.values():
        if p.cache_mode != "breakpoints":
            continue
        assert p.cache_write == pytest.approx(1.25 * p.input), p.model
        for s in p.price_sets:
            assert s.cache_write == pytest.approx(1.25 * s.input), p.model
    rows = {line.split()[0]: line.split() for line in _run("--list-models").output.splitlines() if line.strip()}
    assert rows["gpt-5.6-luna"][5:7] == ["0.2", "0.25"]     # input, write: not '-'


def test_dated_claude_ids_are_only_the_providers(table):
    """From the 4.6 generation on, Claude model IDs carry no date (the provider's model-IDs page): an id such as
    claude-opus-4-6-20260205 is no provider's, so it is not an alias; the dated ones that are have a source."""
    aliases = table.aliases()
    for fake in ("claude-opus-4-6-20260205", "claude-opus-4-7-20260416"):
        assert fake not in aliases
    assert aliases["claude-sonnet-4-5-20250929"] == "claude-sonnet-4-5"
    assert aliases["claude-haiku-4-5-20251001"] == "claude-haiku-4-5"
    for p in table.models.values():
        if p.provider == "anthropic" and p.aliases:
            assert p.aliases_source and "platform.claude.com" in p.aliases_source, p.model


@pytest.mark.parametrize("change, field, says", [
    # an explicit-cache model's null rate was priced as input: reads at full price, writes with no premium
    ({"cache_read": None}, "models.own-claude.cache_read", "an explicit-cache model needs this rate"),
    ({"cache_write_5m": None}, "models.own-claude.cache_write_5m", "an explicit-cache model needs this rate"),
    ({"input": 1e300}, "models.own-claude.input", "expected a price from 0 to 1,000,000"),
    ({"schema_version": 999}, "schema_version", "schema_version 999 is not one this cachectl reads"),
])
def test_a_prices_file_with_a_rate_it_cannot_price_is_refused(tmp_path, change, field, says):
    entry = {"provider": "anthropic", "input": 3, "output": 15, "cache_write_5m": 3.75, "cache_write_1h": 6,
             "cache_read": 0.3, "min_cacheable_tokens": 1024, "cache_mode": "explicit", "source": "acme.example"}
    doc: dict = {"schema_version": 1, "models": {"own-claude": entry}}
    if "schema_version" in change:
        doc.update(change)
    else:
        entry.update(change)
    own = tmp_path / "own.json"
    own.write_text(json.dumps(doc))
    r = _run("--prices", str(own), "-m", "own-claude", "--prefix-tokens", "5000", "--calls", "2", "--every", "1m")
    assert r.exit_code == 2
    assert f"field '{field}': {says}" in r.output
