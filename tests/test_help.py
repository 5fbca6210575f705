"""Every command's and subcommand's --help: renders, lists the choices of fixed-choice options, loses no text."""

from __future__ import annotations

import re
from enum import Enum

import pytest
import typer

from cachectl.cli import app

#: options whose values are a fixed set: help must list them and click must validate them
FIXED_CHOICE = {"--policy", "--hash", "--dtype", "--cache", "--ttl", "--normalize", "--nbits", "--quantized",
                "--format", "--as"}


def _commands():
    """(path, click command) for the root, every command and every subcommand."""
    root = typer.main.get_command(app)
    out = [((), root)]
    todo = [((), root)]
    while todo:
        path, cmd = todo.pop()
        for name, sub in getattr(cmd, "commands", {}).items():
            out.append(((*path, name), sub))
            todo.append(((*path, name), sub))
    return out


COMMANDS = _commands()


def _choices(param) -> list[str] | None:
    """The fixed values of a parameter: a click Choice (typer <= 0.2x) or the enum behind it (newer typer)."""
    kind = getattr(param, "type", None)
    if getattr(kind, "choices", None):
        return [str(getattr(c, "value", c)) for c in kind.choices]
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [str(m.value) for m in annotation]
    return None


def _squash(text: str) -> str:
    return "".join(text.split())


def test_the_tree_is_complete():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"diff-tokens", "simulate-prefix", "prompt-cost", "kv-inspect", "lint", "semantic-probe",
            "semantic-probe pairs", "semantic-probe probe", "semantic-probe sweep", "semantic-probe replay",
            "semantic-probe dupes"} <= names


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) or "cachectl" for p, _ in COMMANDS])
def test_help_renders_every_option_with_its_help_and_choices(cli, path, cmd):
    r = cli(*path, "--help")
    assert r.exit_code == 0, r.stderr
    assert "\\[" not in r.stdout  # markup escapes leaking into plain help (typer < 0.21.1)
    assert "<bool>" not in r.stdout  # a flag takes no value
    shown = _squash(r.stdout)
    # the command's own description, whole (wrapping aside)
    description = "\n".join(line for line in (cmd.help or "").splitlines() if line.strip() != "\b")
    assert _squash(description) in shown
    for param in cmd.params:
        if param.name == "help":
            continue
        flags = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        assert param.help, f"{' '.join(path)}: {flags or param.name} has no help"
        assert _squash(param.help) in shown, f"{' '.join(path)}: the help of {flags or param.name} is cut"
        choices = _choices(param)
        if set(flags) & FIXED_CHOICE:
            assert choices, f"{' '.join(path)} {flags}: a fixed set of values must be a choice"
        if choices:
            for value in choices:
                assert value in r.stdout, f"{' '.join(path)} {flags}: choice {value!r} not listed"


def test_bracketed_text_survives_and_exit_codes_are_stated(cli):
    assert "[tool.cachectl.lint]" in cli("lint", "--help").stdout
    top = _squash(cli("--help").stdout)
    assert _squash("Exit codes: 0 success") in top and _squash("2 usage or input error") in top


@pytest.mark.parametrize("args,bad", [
    (["simulate-prefix", "t.jsonl", "--policy", "lru"], "lru"),
    (["simulate-prefix", "t.jsonl", "--hash", "md5"], "md5"),
    (["kv-inspect", "llama-3.1-8b", "--dtype", "fp7"], "fp7"),
    (["kv-inspect", "llama-3.1-8b", "--nbits", "5"], "5"),
    (["prompt-cost", "--ttl", "2h"], "2h"),
    (["semantic-probe", "dupes", "x.jsonl", "--normalize", "unicode"], "unicode"),
])
def test_a_value_outside_the_choices_is_one_line_listing_them(cli, args, bad):
    r = cli(*args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and r.stdout == ""
    line = r.stderr
    assert line.startswith("cachectl: error: Invalid value for") and repr(bad) in line and "Value error" not in line


@pytest.mark.parametrize("args,word", [
    (["simulate-prefix", "fixtures/traces/fleet.jsonl", "--capacity-blocks", "abc"], "valid integer"),
    (["prompt-cost", "--calls", "x"], "valid integer"),
    (["simulate-prefix", "fixtures/traces/fleet.jsonl", "--block-size", "1.5"], "valid integer"),
])
def test_a_value_of_the_wrong_type_is_named_in_words(cli, args, word):
    r = cli(*args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and word in r.stderr
    assert " int " not in r.stderr and "int range" not in r.stderr


def test_an_option_typo_is_one_line(cli):
    r = cli("kv-inspect", "llama-3.1-8b", "--contxt", "4k")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "╭" not in r.stderr
    assert "No such option: --contxt" in r.stderr and "--context" in r.stderr
    assert "'cachectl kv-inspect --help'" in r.stderr


@pytest.mark.parametrize("args, helped", [
    (("semantic-probe", "dupes", "log.jsonl", "--normalize"), "cachectl semantic-probe dupes"),
    (("report", "log.jsonl", "--block-size"), "cachectl report"),
    (("--bogus",), "cachectl"),
])
def test_an_option_without_its_value_points_to_its_commands_help(cli, args, helped):
    """The option parser's "requires an argument" comes with no command: it pointed to `cachectl --help`."""
    r = cli(*args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert r.stderr.rstrip().endswith(f"(see '{helped} --help')"), r.stderr


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) or "cachectl" for p, _ in COMMANDS])
def test_help_names_values_not_python_types(cli, path, cmd):
    # typer 0.29 prints `<str>` beside arguments and `<int range>` beside options that name no metavar
    out = cli(*path, "--help").stdout
    for tag in ("<str>", "<int>", "<float>", "<int range>", "<float range>", "<list[str]>", "<path>"):
        assert tag not in out, f"{' '.join(path)}: {tag} in help"


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) or "cachectl" for p, _ in COMMANDS])
def test_an_argument_of_several_values_says_so_in_the_usage(cli, path, cmd):
    """`lint PATH...`: every typer version the package allows puts the dots after a variadic argument."""
    usage = cli(*path, "--help").stdout.splitlines()[0]
    for param in getattr(cmd, "params", ()):
        if param.param_type_name == "argument":
            name = param.metavar or param.name.upper()
            dots = param.nargs != 1
            assert re.search(re.escape(name) + r"[]}]?" + (r"\.\.\." if dots else r"(?!\S*\.\.\.)"), usage), usage


@pytest.mark.parametrize("new,old", [
    (["kv-inspect", "llama-3.1-8b", "--context-lengths", "8k", "-f", "json"],
     ["kv-inspect", "llama-3.1-8b", "--context", "8k", "-f", "json"]),
    (["diff-tokens", "--log", "fixtures/prompts/demo_log.jsonl", "--session-field", "session",
      "-t", "fixtures/tok", "-f", "json"],
     ["diff-tokens", "--log", "fixtures/prompts/demo_log.jsonl", "--key", "session", "-t", "fixtures/tok",
      "-f", "json"]),
    (["semantic-probe", "dupes", "fixtures/semantic/log.jsonl", "--prompt-field", "prompt", "-f", "json"],
     ["semantic-probe", "dupes", "fixtures/semantic/log.jsonl", "--field", "prompt", "-f", "json"]),
])
def test_one_vocabulary_new_names_and_the_older_ones_give_the_same_result(cli, new, old):
    a, b = cli(*new), cli(*old)
    assert a.exit_code == b.exit_code and a.exit_code in (0, 1), a.stderr
    assert a.stdout == b.stdout and a.stdout


def test_a_model_given_to_the_wrong_kind_of_option_says_which_kind_it_is(cli):
    r = cli("kv-inspect", "claude-sonnet-4-5")
    assert r.exit_code == 2 and "is a provider model of the price table" in r.stderr
    r = cli("prompt-cost", "--model", "llama-3.1-8b", "--prefix-tokens", "5000")
    assert r.exit_code == 2 and "is a model architecture of kv-inspect's catalog" in r.stderr


def test_simulate_prefix_help_lists_its_options_in_panels_with_one_flag_column(cli):
    out = cli("simulate-prefix", "--help").stdout
    titles = [line[:-1] for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["Arguments", "Input", "Cache", "Curve and sweeps", "Fleet and tiers", "Partitions",
                      "What the hits are worth", "Output", "Options"]
    options = out.split("\nInput:\n", 1)[1]  # the description above quotes flags too
    columns = {m.start(2) - m.start() for m in re.finditer(r"^  (-\S.*?) {2,}(\S.*)$", options, re.M)}
    assert len(columns) == 1, columns  # the help text starts in one column across the panels
    # other commands name no panel: typer's one list of options
    assert "Options:" in cli("fix", "--help").stdout and "Input:" not in cli("fix", "--help").stdout


@pytest.mark.parametrize("args, says", [
    (("--text", "hello", "hel\udcfflo"), "--text B: bytes that are not UTF-8 at character 4"),
    (("--template-var", "date_string=\udcff", "A", "A"), "--template-var: bytes that are not UTF-8"),
    (("--template-var", "messages=[]", "A", "A"), "--template-var messages: the render passes messages itself"),
])
def test_command_line_texts_a_render_cannot_take_are_one_line(cli, args, says):
    """Bytes that are not UTF-8 in an argument reach Python as lone surrogates, which the tokenizer refused with
    an internal TypeError; a --template-var named as a render argument was an internal error of the render."""
    from .conftest import PROMPTS, TOK_DIR

    a = str(PROMPTS / "chat_no_system.json")
    r = cli("diff-tokens", "-t", TOK_DIR, *[a if x == "A" else x for x in args])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert says in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize("level", ["nan", "1.5", "0", "1", "-0.5"])
def test_a_confidence_level_outside_0_to_1_is_refused(cli, level):
    """A bound "at nan% confidence", or at 150%, was printed as a recommendation."""
    from .conftest import FIXTURES

    r = cli("semantic-probe", "sweep", FIXTURES / "semantic" / "labeled.tsv", "--confidence", level)
    assert r.exit_code == 2 and "--confidence is a level between 0 and 1" in r.stderr
