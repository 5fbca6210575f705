"""The models added for issue #24's open prices, each costed by hand at the rates its provider's page states.

Rates in USD per million tokens (input | 5m or 30m write | 1h write | read | output):
- claude-haiku-5-5 (platform.claude.com/docs/en/models/haiku-5-5/overview): 0.10 | 0.125 | 0.20 | 0.01 | 0.50 for a
  prompt up to 100,000 tokens; 0.50 | 0.625 | 1 | 0.05 | 2.50 over it (the whole request, output included);
- claude-mythos-5 (the pricing page's row): 10 | 12.50 | 20 | 1 | 50;
- claude-sonnet-5 (its model page): 2 | 2.50 | 4 | 0.20 | 10 (not the cancelled 3 / 15);
- gpt-6-sol 2 | 2.50 | - | 0.20 | 10; gpt-6.1-sol and gpt-6.2-sol 2 | 2.50 | - | 0.10 | 10;
  gpt-6-luna 0.10 | 0.125 | - | 0.01 | 0.50; gpt-6.1-terra (developers.openai.com/api/docs/models/gpt-6.1-terra)
  1 | 1.25 | - | 0.05 | 5; over 272K input tokens input and cache rates 2x, output 1.5x.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cachectl.cli import app
from cachectl.engines.provider import PriceTable, Usage
from cachectl.engines.provider.prices import UnknownModelError, cost_usd, uncached_cost_usd


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


def anthropic(inp=0, w5=0, w1=0, read=0, out=0) -> Usage:
    return Usage(input_tokens=inp, cache_creation_input_tokens=w5 + w1, cache_read_input_tokens=read,
                 output_tokens=out, cache_write_5m_tokens=w5, cache_write_1h_tokens=w1)


def openai(inp=0, write=0, read=0, out=0) -> Usage:
    """``inp``: prompt tokens neither read from nor written to the cache."""
    return Usage(input_tokens=inp, cache_creation_input_tokens=write, cache_read_input_tokens=read,
                 output_tokens=out, cache_write_5m_tokens=write)


# --------------------------------------------------------------------------------------------- Anthropic


def test_haiku_5_5_short_band(table):
    p = table.lookup("claude-haiku-5-5")
    # 2,000 x 0.10 + 10,000 x 0.125 + 30,000 x 0.01 + 500 x 0.50 = 200 + 1,250 + 300 + 250 = 2,000 / 1e6
    assert cost_usd(p, anthropic(inp=2000, w5=10_000, read=30_000, out=500)) == pytest.approx(0.002)
    # a 1h write at 0.20: 1,000 x 0.10 + 10,000 x 0.20 = 2,100 / 1e6
    assert cost_usd(p, anthropic(inp=1000, w1=10_000)) == pytest.approx(0.0021)
    assert p.min_cacheable_tokens == 512 and p.cache_mode == "explicit"


def test_haiku_5_5_long_band_counts_cache_tokens_and_prices_the_whole_request(table):
    p = table.lookup("claude-haiku-5-5")
    # prompt = 20,000 + 50,000 + 40,000 = 110,000 > 100,000: every token at the long band, output included
    # 20,000 x 0.50 + 50,000 x 0.625 + 40,000 x 0.05 + 1,000 x 2.50 = 10,000 + 31,250 + 2,000 + 2,500
    assert cost_usd(p, anthropic(inp=20_000, w5=50_000, read=40_000, out=1000)) == pytest.approx(0.04575)
    # 1h writes in the long band at 1.00: 60,000 x 0.50 + 50,000 x 1 = 80,000 / 1e6
    assert cost_usd(p, anthropic(inp=60_000, w1=50_000)) == pytest.approx(0.08)


def test_haiku_5_5_band_edge_is_over_100000(table):
    p = table.lookup("claude-haiku-5-5")
    assert cost_usd(p, anthropic(inp=100_000)) == pytest.approx(0.01)            # exactly 100,000: short band
    assert cost_usd(p, anthropic(inp=100_001)) == pytest.approx(0.0500005)       # one more: long band
    assert uncached_cost_usd(p, anthropic(inp=50_000, read=50_001, out=10)) == pytest.approx(
        (100_001 * 0.5 + 10 * 2.5) / 1e6)


def test_mythos_5_is_the_fable_5_card(table):
    p = table.lookup("claude-mythos-5")
    # 1,000 x 10 + 2,000 x 12.50 + 1,000 x 20 + 10,000 x 1 + 100 x 50 = 10,000 + 25,000 + 20,000 + 10,000 + 5,000
    assert cost_usd(p, anthropic(inp=1000, w5=2000, w1=1000, read=10_000, out=100)) == pytest.approx(0.07)
    assert table.lookup("claude-fable-5").input == p.input and p.cache_read == 1


def test_sonnet_5_keeps_the_model_pages_price_not_the_cancelled_increase(table):
    p = table.lookup("claude-sonnet-5")
    # 1,000 x 2 + 2,000 x 2.50 + 10,000 x 0.20 + 100 x 10 = 2,000 + 5,000 + 2,000 + 1,000 (3 / 15 would give 0.015)
    assert cost_usd(p, anthropic(inp=1000, w5=2000, read=10_000, out=100)) == pytest.approx(0.01)
    assert "sonnet-5/overview" in p.source and "cancelled" in p.source


def test_mythos_preview_is_still_not_shipped(table):
    with pytest.raises(UnknownModelError):
        table.lookup("claude-mythos-preview")
    assert "Mythos Preview" in (table.not_shipped or "")


# ------------------------------------------------------------------------------------------------ OpenAI

SMALL = openai(inp=1000, write=8000, read=20_000, out=400)   # 29,000 prompt tokens


@pytest.mark.parametrize("model, expected", [
    # 1,000 x 2 + 8,000 x 2.50 + 20,000 x 0.20 + 400 x 10 = 2,000 + 20,000 + 4,000 + 4,000
    ("gpt-6-sol", 0.030),
    # the same with reads at 0.10: 2,000 + 20,000 + 2,000 + 4,000
    ("gpt-6.1-sol", 0.028),
    ("gpt-6.2-sol", 0.028),
    # 1,000 x 0.10 + 8,000 x 0.125 + 20,000 x 0.01 + 400 x 0.50 = 100 + 1,000 + 200 + 200
    ("gpt-6-luna", 0.0015),
    # 1,000 x 1 + 8,000 x 1.25 + 20,000 x 0.05 + 400 x 5 = 1,000 + 10,000 + 1,000 + 2,000
    ("gpt-6.1-terra", 0.014),
])
def test_gpt_6_small_request(table, model, expected):
    p = table.lookup(model)
    assert p.cache_mode == "breakpoints" and p.rule == "openai 5.6+ breakpoints"
    assert cost_usd(p, SMALL) == pytest.approx(expected)


@pytest.mark.parametrize("model, usage, expected", [
    # 280,000 prompt tokens > 272,000: 200,000 x 4 + 80,000 x 5 + 1,000 x 15 = 800,000 + 400,000 + 15,000
    ("gpt-6-sol", openai(inp=200_000, write=80_000, out=1000), 1.215),
    # 200,000 x 0.20 + 80,000 x 0.25 + 1,000 x 0.75 = 40,000 + 20,000 + 750
    ("gpt-6-luna", openai(inp=200_000, write=80_000, out=1000), 0.06075),
    # 300,000 prompt tokens: 100,000 x 4 + 200,000 x 0.20 + 1,000 x 15 = 400,000 + 40,000 + 15,000
    ("gpt-6.1-sol", openai(inp=100_000, read=200_000, out=1000), 0.455),
    ("gpt-6.2-sol", openai(inp=100_000, read=200_000, out=1000), 0.455),
    # 300,000 prompt tokens: 100,000 x 2 + 200,000 x 0.10 + 1,000 x 7.50 = 200,000 + 20,000 + 7,500
    ("gpt-6.1-terra", openai(inp=100_000, read=200_000, out=1000), 0.2275),
])
def test_gpt_6_long_context_band(table, model, usage, expected):
    assert cost_usd(table.lookup(model), usage) == pytest.approx(expected)


def test_gpt_6_band_edge_is_over_272000(table):
    p = table.lookup("gpt-6-sol")
    assert cost_usd(p, openai(inp=272_000)) == pytest.approx(0.544)          # 272,000 x 2
    assert cost_usd(p, openai(inp=272_001)) == pytest.approx(272_001 * 4 / 1e6)


def test_gpt_6_1_terra_band_edge_and_half_price_reads(table):
    p = table.lookup("gpt-6.1-terra")
    assert cost_usd(p, openai(inp=272_000)) == pytest.approx(0.272)          # 272,000 x 1
    assert cost_usd(p, openai(inp=272_001)) == pytest.approx(272_001 * 2 / 1e6)
    # reads are 5% of input on this model, not the 10% of the other GPT-6.x entries: 100,000 x 0.05
    assert cost_usd(p, openai(read=100_000)) == pytest.approx(0.005)
    assert "gpt-6.1-terra" in p.source and "stored copy of the page" in p.source


def test_fable_5_2_is_not_shipped_without_a_provider_price(table):
    for name in ("claude-fable-5-2", "claude-mythos-5-2"):
        with pytest.raises(UnknownModelError):
            table.lookup(name)
    reason = table.not_shipped or ""
    assert "Fable 5.2" in reason and "GPT-6.1 Terra" not in reason
    # the base rates are the provider's (release notes, models overview); the cache rates are not, so no entry
    assert "release-notes" in reason and "$8 input and $40 output" in reason and "cache rates" in reason


def test_a_withheld_model_says_why_and_what_to_pass(table, tmp_path):
    """A current model the table knows of but cannot price is not just "unknown": the error says what is known,
    what is missing, and the two ways on; a price file that adds it prices it."""
    import json as _json

    from typer.testing import CliRunner

    from cachectl.cli import app

    with pytest.raises(UnknownModelError, match=r"not priced by cachectl: released 2026-11-09 at \$8 input"):
        table.lookup("claude-fable-5-2")
    run = CliRunner().invoke(app, ["prompt-cost", "--model", "claude-mythos-5-2", "--prefix-tokens", "10000",
                                   "--calls", "3", "--every", "1m"])
    assert run.exit_code == 2
    line = run.output.strip()
    assert "cache write and read rates" in line and "--prices FILE" in line and "--model-as" in line
    assert "`" not in line and "\n" not in line
    own = tmp_path / "prices.json"
    own.write_text(_json.dumps({"models": {"claude-mythos-5-2": {
        "provider": "anthropic", "input": 8, "output": 40, "cache_write_5m": 10, "cache_write_1h": 16,
        "cache_read": 0.8, "min_cacheable_tokens": 512}}}))
    run = CliRunner().invoke(app, ["prompt-cost", "--model", "claude-mythos-5-2", "--prefix-tokens", "10000",
                                   "--calls", "3", "--every", "1m", "--prices", str(own), "--format", "json"])
    assert run.exit_code == 0, run.output


def test_gpt_5_6_prices_are_the_cut_ones_with_the_launch_price_as_history(table):
    got = {m: (table.lookup(m).input, table.lookup(m).output, table.lookup(m).cache_read)
           for m in ("gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna")}
    assert got == {"gpt-5.6-sol": (4, 20, 0.4), "gpt-5.6-terra": (2, 12, 0.2), "gpt-5.6-luna": (0.2, 1.2, 0.02)}
    launch = {m: (table.lookup(m).history[0]["input"], table.lookup(m).history[0]["output"]) for m in got}
    assert launch == {"gpt-5.6-sol": (5, 30), "gpt-5.6-terra": (2.5, 15), "gpt-5.6-luna": (1, 6)}
    assert "2026-11-21" in (table.lookup("gpt-5.6-sol").notes or "")


# ------------------------------------------------------------------------------------------------ the CLI

NEW = {"claude-haiku-5-5": "anthropic breakpoints", "claude-mythos-5": "anthropic breakpoints",
       "gpt-6-sol": "openai 5.6+ breakpoints", "gpt-6-luna": "openai 5.6+ breakpoints",
       "gpt-6.1-sol": "openai 5.6+ breakpoints", "gpt-6.2-sol": "openai 5.6+ breakpoints",
       "gpt-6.1-terra": "openai 5.6+ breakpoints"}


def test_list_models_lists_the_new_models_with_their_rule_and_date():
    result = CliRunner().invoke(app, ["prompt-cost", "--list-models"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.strip()}
    for model, rule in NEW.items():
        assert rule in rows[model] and "2026-12-01" in rows[model], model
    data = json.loads(CliRunner().invoke(app, ["prompt-cost", "--list-models", "--format", "json"]).output)
    by_name = {m["model"]: m for m in data["models"]}
    assert {m: by_name[m]["rule"] for m in NEW} == NEW
    assert by_name["gpt-6-luna"]["cache_write"] == 0.125 and by_name["claude-haiku-5-5"]["input"] == 0.1
    assert all("developers.openai.com" in by_name[m]["source"] or "platform.claude.com" in by_name[m]["source"]
               for m in NEW)


def test_prompt_cost_bills_a_haiku_5_5_log_in_both_bands(tmp_path):
    log = tmp_path / "haiku.jsonl"
    lines = [{"type": "message", "model": "claude-haiku-5-5",
              "usage": {"input_tokens": 2000, "output_tokens": 500, "cache_creation_input_tokens": 10_000,
                        "cache_read_input_tokens": 30_000}},
             {"type": "message", "model": "claude-haiku-5-5",
              "usage": {"input_tokens": 20_000, "output_tokens": 1000, "cache_creation_input_tokens": 50_000,
                        "cache_read_input_tokens": 40_000}}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = CliRunner().invoke(app, ["prompt-cost", "--usage", str(log), "--format", "json"])
    assert result.exit_code == 0, result.output
    costs = [r["cost_usd"] for r in json.loads(result.output)["requests"]]
    assert costs == pytest.approx([0.002, 0.04575])


def test_a_price_entry_of_an_unknown_provider_needs_its_caching_rules():
    """A typo ('antropic') took OpenAI's caching rules (automatic, no breakpoints) for the model, unsaid."""
    from cachectl.engines.provider.prices import PriceTable
    from cachectl.errors import InputError

    entry = {"provider": "antropic", "input": 3, "output": 15, "cache_write_5m": 3.75, "cache_read": 0.3}
    with pytest.raises(InputError, match=r"field 'models.my-claude.provider': unknown provider 'antropic' \(known: "
                                         r"anthropic, openai; another one needs its cache_mode and usage_style given\)"):
        PriceTable.load(({"models": {"my-claude": entry}}, "prices.json"))
    table = PriceTable.load(({"models": {"my-model": {**entry, "provider": "acme", "cache_mode": "explicit",
                                                      "usage_style": "anthropic"}}}, "prices.json"))
    assert table.lookup("my-model").cache_mode == "explicit"
