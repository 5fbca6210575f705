"""Every command's help at 80 and 120 columns: summaries whole, metavars without braces, every value of an
option listed (fixed choices and the names of the data tables), tables kept as tables, list defaults whole."""

from __future__ import annotations

import inspect
import json
import re
from importlib import resources

import pytest

from .test_help import COMMANDS, _choices

WIDTHS = (80, 120)


def _table(file: str, table: str) -> list[str]:
    return list(json.loads(resources.files("cachectl.data").joinpath(file).read_text(encoding="utf-8"))[table])


#: options whose values are the entries of a data file: help must list them all
DATA_CHOICES = {
    ("simulate-prefix", "--link"): _table("links.json", "links"),
    ("simulate-prefix", "--gpu"): _table("gpu_flops.json", "gpus"),
    ("kv-inspect", "--gpu"): _table("gpus.json", "gpus"),
}

CASES = [(width, path, cmd) for width in WIDTHS for path, cmd in COMMANDS]
IDS = [f"{' '.join(path) or 'cachectl'}@{width}" for width, path, _ in CASES]


def _help(cli, path, width: int) -> str:
    r = cli(*path, "--help", env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.stderr
    return r.stdout


def _summary(cmd) -> str:
    """The first sentence of a command's help: what a group's help lists beside it."""
    words = []
    for word in inspect.cleandoc(cmd.help or "").split("\n\n")[0].split():
        words.append(word)
        if word.endswith(".") and not word.endswith("..."):
            break
    return " ".join(words)


def _no_rewrap_blocks(text: str) -> list[list[str]]:
    """The paragraphs of a help text marked with click's no-rewrap marker (a ``\\b`` line above them)."""
    blocks = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines = para.splitlines()
        if lines and lines[0].strip() == "\b":
            blocks.append(lines[1:])
    return blocks


@pytest.mark.parametrize("width,path,cmd", CASES, ids=IDS)
def test_help_fits_and_cuts_no_summary(cli, width, path, cmd):
    out = _help(cli, path, width)
    lines = out.splitlines()
    assert max(map(len, lines)) <= width, [line for line in lines if len(line) > width]
    for name, sub in getattr(cmd, "commands", {}).items():
        summary = _summary(sub)
        assert summary.endswith("."), f"{name}: its help starts with no sentence"
        rows = [line for line in lines if line.startswith(f"  {name} ")]
        assert rows, f"{name} is not listed"
        assert rows[0].split(None, 1)[1] == summary, f"{name}: summary cut at {width} columns: {rows[0]!r}"
        assert "..." not in rows[0] and "…" not in rows[0]


@pytest.mark.parametrize("width,path,cmd", CASES, ids=IDS)
def test_no_metavar_in_braces(cli, width, path, cmd):
    # typer writes required arguments `{TRACE}`, which reads as a list of choices
    out = _help(cli, path, width)
    assert not re.search(r"\{[A-Z][\w.]*\}", out), out.splitlines()[0]


@pytest.mark.parametrize("width,path,cmd", CASES, ids=IDS)
def test_every_choice_is_listed(cli, width, path, cmd):
    out = _help(cli, path, width)
    shown = "".join(out.split())  # wrapping aside
    for param in cmd.params:
        flags = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        values = list(_choices(param) or [])
        for flag in flags:
            values += DATA_CHOICES.get((" ".join(path), flag), [])
        for value in values:
            assert value in shown, f"{' '.join(path)} {flags}: {value!r} not listed at {width} columns"


def test_the_data_backed_options_are_the_ones_the_table_names(cli):
    for (command, flag), names in DATA_CHOICES.items():
        block = cli(command, "--help", env={"COLUMNS": "80"}).stdout.split(f"  {flag} ", 1)[1]
        block = "".join(block.split("\n  -", 1)[0].split())
        assert all(name in block for name in names), (command, flag)


@pytest.mark.parametrize("width,path,cmd", CASES, ids=IDS)
def test_tables_are_not_reflowed(cli, width, path, cmd):
    out = _help(cli, path, width)
    lines = out.splitlines()
    text = inspect.cleandoc(cmd.help or "")
    # a paragraph laid out in columns (indented lines) is a table: it must be marked not to rewrap
    marked = [line for block in _no_rewrap_blocks(text) for line in block]
    for para in text.split("\n\n"):
        if any(line.startswith("  ") for line in para.splitlines()):
            assert all(line in marked for line in para.splitlines() if line.strip() != "\b"), \
                f"{' '.join(path)}: a table without a no-rewrap marker: {para[:60]!r}"
    for line in marked:
        assert "  " + line in lines, f"{' '.join(path)}: table line reflowed at {width} columns: {line!r}"


@pytest.mark.parametrize("width,path,cmd", CASES, ids=IDS)
def test_list_defaults_wrap_between_values(cli, width, path, cmd):
    out = _help(cli, path, width)
    assert not [line for line in out.splitlines() if line.strip().startswith(",")]
    flat = " ".join(out.split())
    for param in cmd.params:
        default = param.default
        if param.param_type_name == "option" and isinstance(default, str) and "," in default \
                and param.show_default is not False:
            shown = ", ".join(v.strip() for v in default.split(","))
            assert f"[default: {shown}]" in flat, f"{' '.join(path)} {param.opts}: default {default!r} cut"


def test_prompt_cost_modes_stay_a_table(cli):
    for width in WIDTHS:
        lines = _help(cli, ("prompt-cost",), width).splitlines()
        start = lines.index("  Modes:")
        assert lines[start + 1].startswith("    --usage RESPONSES.jsonl  audit logged responses")
        assert any(line.startswith("    --list-models            the price table") for line in lines)
