"""Every command's errors and notes name its flags, never an engine's parameter: the engines write `param` (they
know no CLI), and the one table in cachectl/cli/common.py (PARAM_FLAGS) turns it into the flag. Each case below is
an error path of an engine's ``raise ... Error(`` message (or a note) that names a parameter, run through the
command; what it prints must hold no backticked library name and must name the flag."""

from __future__ import annotations

import json
import re

import pytest

from .conftest import FIXTURES, TOK_DIR

PROMPTS = FIXTURES / "prompts"
TRACES = FIXTURES / "traces"
#: a backticked library name (`default_model`, `warmup`): what the engines write for a parameter
LIBRARY_NAME = re.compile(r"`([a-z_]+)`")


def _line(model: str | None = "claude-sonnet-4-5", timestamp: float | None = 0.0) -> dict:
    body: dict = {"messages": [{"role": "user", "content": "hello there"}]}
    if model is not None:
        body["model"] = model
    return {"body": body} if timestamp is None else {"timestamp": timestamp, "body": body}


def _log(write, name: str, *lines: dict):
    return write(name, "".join(json.dumps(x) + "\n" for x in lines))


CASES = {
    # provider engine: cache.py, prices.py
    "prompt-cost, a line without a model": (lambda w: ("prompt-cost", _log(w, "l.jsonl", _line(None)), "-t", TOK_DIR),
                                           "--model"),
    "prompt-cost, a line without a timestamp": (
        lambda w: ("prompt-cost", _log(w, "l.jsonl", _line(), _line(timestamp=None)), "-t", TOK_DIR), "--every"),
    "prompt-cost, bodies without token counts": (
        lambda w: ("prompt-cost", _log(w, "l.jsonl", _line())), "--tokenizer"),
    "prompt-cost, an unknown model in the log": (
        lambda w: ("prompt-cost", _log(w, "l.jsonl", _line("nosuch-model")), "-t", TOK_DIR), "--list-models"),
    "prompt-cost --usage, a request instead of a response": (
        lambda w: ("prompt-cost", "--usage", _log(w, "l.jsonl", _line()["body"])), "--usage"),
    "prompt-cost --usage, a response without a model": (
        lambda w: ("prompt-cost", "--usage", _log(w, "u.jsonl", {"usage": {"input_tokens": 5}})), "--model"),
    "prompt-cost what-if, too many tokens": (
        lambda w: ("prompt-cost", "-m", "claude-sonnet-4-5", "--prefix-tokens", "99999999"), "--prefix-tokens"),
    "prompt-cost what-if, no calls": (
        lambda w: ("prompt-cost", "-m", "claude-sonnet-4-5", "--prefix-tokens", "1000", "--calls", "0"), "--calls"),
    # prefix engine: replay.py, curve.py, fleet.py
    "simulate-prefix, warm-up covers the trace": (
        lambda w: ("simulate-prefix", TRACES / "rag.jsonl", "--capacity-blocks", "300", "--warmup", "120"),
        "--warmup"),
    "simulate-prefix curve, warm-up covers the trace": (
        lambda w: ("simulate-prefix", TRACES / "rag.jsonl", "--curve", "--warmup", "120"), "--warmup"),
    "simulate-prefix, a warm-up share that is neither": (
        lambda w: ("simulate-prefix", TRACES / "rag.jsonl", "--capacity-blocks", "300", "--warmup", "1.5"),
        "--warmup"),
    "simulate-prefix fleet, warm-up covers the trace": (
        lambda w: ("simulate-prefix", TRACES / "rag.jsonl", "--capacity-blocks", "300", "--replicas", "2",
                   "--warmup", "120"), "--warmup"),
    # kv engine: config.py
    "kv-inspect, a context of 0 tokens": (lambda w: ("kv-inspect", "llama-3.1-8b", "--context-lengths", "0"),
                                          "--context-lengths"),
    # repair engine (report, fix): notes of the provider cache and of the measurement
    "report, a log without a model": (lambda w: ("report", _log(w, "l.jsonl", _line(None)), "-t", TOK_DIR),
                                      "--model"),
    "report, an unknown model in the log": (
        lambda w: ("report", _log(w, "l.jsonl", _line("nosuch-model")), "-t", TOK_DIR), "--prices"),
    "fix, a log without a model": (lambda w: ("fix", _log(w, "l.jsonl", _line(None)), "-t", TOK_DIR), "--model"),
    "fix, without a tokenizer": (lambda w: ("fix", _log(w, "l.jsonl", _line())), "--tokenizer"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_errors_and_notes_name_the_flag_not_the_parameter(cli, write, case):
    make, flag = CASES[case]
    r = cli(*make(write))
    said = r.stdout + r.stderr
    assert r.exit_code in (0, 1, 2) and ("error:" in said or "note:" in said), said
    leaked = [m.group(0) for m in LIBRARY_NAME.finditer(said)]
    assert not leaked, f"{case}: library names {leaked} in\n{said}"
    assert flag in said, f"{case}: the flag {flag} is not named in\n{said}"


def test_the_html_report_names_flags_too(cli, write, tmp_path):
    page = tmp_path / "r.html"
    r = cli("report", _log(write, "l.jsonl", _line(None)), "-t", TOK_DIR, "--html", page)
    html = page.read_text(encoding="utf-8")
    assert r.exit_code in (0, 1) and "pass --model" in html and "`default_model`" not in html


def test_every_parameter_the_table_maps_becomes_a_flag():
    from cachectl.cli.common import PARAM_FLAGS, flags_for_params

    for name, flag in PARAM_FLAGS.items():
        assert flags_for_params(f"pass `{name}`") == f"pass {flag}"
    assert flags_for_params("`not_a_param`") == "`not_a_param`"  # unknown: left, so that the tests above see it
