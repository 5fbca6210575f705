"""simulate-prefix split by mode: the commands (replay, served, curve, fleet, partition) and the plain spelling
`simulate-prefix TRACE [OPTIONS]` that every README example and older script uses give the same output."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest
import typer

from .conftest import FIXTURES, ROOT

TRACES = FIXTURES / "traces"
RAG, SERVED, FLEET, MOONCAKE = (str(TRACES / n) for n in ("rag.jsonl", "served.jsonl", "fleet.jsonl",
                                                          "mooncake_conv.jsonl"))
PARTS = str(FIXTURES / "partitions" / "fleet-session")
GPU = ("--model", "llama-3.1-8b", "--gpu", "H100", "--gpu-hour-usd", "3")

#: (the plain spelling's arguments, the command that runs the same mode): README's examples and the tests'
SPELLINGS = [
    ([RAG, "--capacity-blocks", "300"], "replay"),
    ([RAG, "--capacity-blocks", "300", "--tenant-field", "salt", "--no-salt"], "replay"),
    ([RAG, "--capacity-blocks", "300", "--policy", "chunk", "--chunk-size", "100"], "replay"),
    ([RAG, "--capacity-blocks", "300", "--per-request", "--warmup", "0.5", "-f", "json"], "replay"),
    ([RAG, "--capacity-blocks", "300", *GPU], "replay"),
    ([SERVED, "--capacity-blocks", "400"], "served"),
    ([SERVED, "--capacity-blocks", "120", "-f", "json"], "served"),
    ([SERVED, "--capacity-blocks", "400"], "replay"),
    ([RAG, "--sweep-capacity", "100,200,400,800", "--sweep-block-size", "16,64"], "curve"),
    ([RAG, "--sweep-capacity", "100,200,400,800", "--sweep-block-size", "16,64", "-f", "json"], "curve"),
    ([RAG, "--policy", "radix", "--sweep-capacity", "100,400"], "curve"),
    ([MOONCAKE, "--block-size", "512", "--curve", "--curve-points", "12", "--optimal"], "curve"),
    ([RAG, "--curve", "--curve-points", "5", "--tenant-field", "salt", "-f", "json"], "curve"),
    ([FLEET, "--capacity-blocks", "200", "--replicas", "4", "--router", "all"], "fleet"),
    ([FLEET, "--capacity-blocks", "100", "--replicas", "4", "--router", "all", "--cpu-offload-blocks", "400", *GPU,
      "-f", "json"], "fleet"),
    ([RAG, "--capacity-blocks", "300", "--cpu-offload-blocks", "400"], "fleet"),
    ([PARTS, "--capacity-blocks", "200", "--jobs", "2"], "fleet"),
    # mistakes: the same one line, exit 2
    ([RAG, "--curve", "--sweep-capacity", "100"], "curve"),
    ([RAG, "--capacity-blocks", "300", "--warmup", "1.5"], "replay"),
    ([PARTS, "--capacity-blocks", "200", "--seed", "3"], "fleet"),
    ([FLEET, "--replicas", "2", "--router", "least-loaded", "--partition-dir", "unused"], "partition"),
]


@pytest.mark.parametrize("plain,command", SPELLINGS, ids=[f"{c}:{' '.join(a[1:])}" for a, c in SPELLINGS])
def test_the_plain_spelling_and_the_command_give_the_same_output(cli, plain, command):
    old = cli("simulate-prefix", *plain)
    new = cli("simulate-prefix", command, *plain)
    assert old.exit_code in (0, 2) and old.exit_code == new.exit_code, (old.stderr, new.stderr)
    assert (old.stdout, old.stderr) == (new.stdout, new.stderr)
    assert old.stdout if old.exit_code == 0 else old.stderr.count("\n") == 1


def test_the_curve_command_draws_the_whole_curve_unless_points_are_given(cli):
    implied = cli("simulate-prefix", "curve", MOONCAKE, "--block-size", "512", "--curve-points", "12", "-f", "json")
    plain = cli("simulate-prefix", MOONCAKE, "--block-size", "512", "--curve", "--curve-points", "12", "-f", "json")
    assert implied.exit_code == 0 and implied.stdout == plain.stdout
    assert json.loads(implied.stdout)["mode"] == "curve"
    one = json.loads(cli("simulate-prefix", "curve", RAG, "--capacity-blocks", "300", "-f", "json").stdout)
    assert one["mode"] == "sweep" and [r["capacity_blocks"] for r in one["sweep"]] == [300]
    r = cli("simulate-prefix", "curve", RAG, "--policy", "chunk")
    assert r.exit_code == 2 and "--sweep-capacity" in r.stderr and r.stderr.count("\n") == 1


def test_partition_writes_what_the_plain_spelling_writes(cli, tmp_path):
    args = [FLEET, "--replicas", "4", "--router", "session"]
    old = cli("simulate-prefix", *args, "--partition-dir", tmp_path / "old", "-f", "json")
    new = cli("simulate-prefix", "partition", *args, "--partition-dir", tmp_path / "new", "-f", "json")
    assert old.exit_code == new.exit_code == 0, (old.stderr, new.stderr)
    assert old.stdout.replace(str(tmp_path / "old"), "DIR") == new.stdout.replace(str(tmp_path / "new"), "DIR")
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == sorted(p.name for p in (tmp_path / "new").iterdir())
    replayed = [cli("simulate-prefix", "fleet", tmp_path / d, "--capacity-blocks", "200", "-f", "json")
                for d in ("old", "new")]
    assert replayed[0].exit_code == 0 and replayed[0].stdout.replace("old", "new") == replayed[1].stdout


@pytest.mark.parametrize("args,words", [
    (["served", RAG, "--capacity-blocks", "300"], "no request carries the server's cached tokens"),
    (["replay", PARTS, "--capacity-blocks", "200"], "is a partition directory: cachectl simulate-prefix fleet"),
    (["curve", PARTS], "is a partition directory"),
    (["partition", FLEET, "--replicas", "2"], "--partition-dir"),
    (["fleet", RAG, "--curve"], "No such option: --curve"),
    (["replay", RAG, "--capacity-blocks", "abc"], "valid integer"),
    (["curv", RAG], "Did you mean 'curve'?"),
])
def test_a_mistake_with_a_command_is_one_line_and_exit_2(cli, args, words):
    r = cli("simulate-prefix", *args)
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr


def test_the_plain_spelling_names_itself_as_typed(cli):
    r = cli("simulate-prefix", RAG, "--capacity-blocks", "abc")
    assert r.exit_code == 2 and "(see 'cachectl simulate-prefix --help')" in r.stderr
    out = cli("simulate-prefix", RAG, "--help").stdout
    assert out.startswith("Usage: cachectl simulate-prefix [OPTIONS] TRACE")
    assert all(flag in out for flag in ("--sweep-capacity", "--replicas", "--partition-dir", "--per-request"))


def _group():
    from cachectl.cli import app

    return typer.main.get_command(app).commands["simulate-prefix"]


def _help(*args: str) -> str:
    """Help as a 100-column terminal shows it (the test runner's console renders at 80)."""
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-m", "cachectl", "simulate-prefix", *args, "--help"], capture_output=True,
                         text=True, cwd=ROOT, env=env, check=True)
    return run.stdout


def test_help_fits_on_a_screen_and_each_command_is_short():
    top = _help()
    assert len(top.splitlines()) <= 40, top
    for name in _group().commands:
        assert f"  {name} " in top
        description = _help(name).split("\nArguments:")[0].splitlines()
        assert len(description) <= 8, name


def test_the_commands_take_the_plain_spellings_options_as_declared():
    """Each command's options are the plain command's (flags, help, defaults), and the defaults are _start's."""
    from cachectl.cli import simulate_prefix as sp

    plain = {p.name: p for p in sp._plain().params}
    start = inspect.signature(sp._start).parameters
    for name, cmd in _group().commands.items():
        for p in cmd.params:
            if p.name == "help" or (name, p.name) == ("partition", "partition_dir"):
                continue
            assert p.opts == plain[p.name].opts and p.help == plain[p.name].help, (name, p.name)
            if p.name in start and p.param_type_name == "option":
                assert p.default == start[p.name].default, (name, p.name)
    for p in plain.values():
        if p.param_type_name == "option" and p.name != "help":
            assert p.default == start[p.name].default, p.name
