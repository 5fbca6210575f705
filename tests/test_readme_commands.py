"""Every `$ cachectl ...` command in the README and the documentation site (docs/**/*.md, but not the generated
docs/reference/) runs and prints what the page shows.

Expected output may elide lines with a line `...`; in live transformers runs (timings) decimal numbers are
masked and runs of spaces compared as one.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

LIVE = ("--run", "--turns", "--shared-prefix", "--quantized")


def doc_pages() -> list[Path]:
    """README.md, then every Markdown page under docs/ (sorted), less the generated reference."""
    docs = ROOT / "docs"
    pages = sorted(p for p in docs.rglob("*.md") if "reference" not in p.relative_to(docs).parts[:1])
    return [ROOT / "README.md", *pages]


def page_examples(path: Path) -> list[tuple[str, str, list[str]]]:
    """(`path:line`, command, expected output lines) for every `$ cachectl` line in a fenced block."""
    name = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[tuple[str, str, list[str]]] = []
    in_block = False
    current = None
    for number, line in enumerate(lines, start=1):
        if line.startswith("```"):
            in_block = not in_block
            current = None
            continue
        if not in_block:
            continue
        if line.startswith("$ cachectl "):
            current = (f"{name}:{number}", line[2:], [])
            out.append(current)
        elif current is not None:
            current[2].append(line)
    return out


EXAMPLES = [example for page in doc_pages() for example in page_examples(page)]


def _normalize(lines: list[str], live: bool) -> list[str]:
    out = []
    for line in lines:
        line = line.rstrip()
        if live:
            line = re.sub(r"\d[\d,]*(\.\d+)? tokens/s", "# tokens/s", line)
            line = re.sub(r"-?\d[\d,]*\.\d+", "#", line)
            line = re.sub(r" +", " ", line)
        out.append(line)
    while out and not out[-1]:
        out.pop()
    return out


def _matches(expected: list[str], actual: list[str]) -> bool:
    """`...` in expected stands for any number of lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(_matches(expected[1:], actual[i:]) for i in range(len(actual) + 1))
    return bool(actual) and expected[0] == actual[0] and _matches(expected[1:], actual[1:])


def test_the_examples_are_collected_from_the_readme_and_every_docs_page():
    where = {w.split(":")[0] for w, _, _ in EXAMPLES}
    assert "README.md" in where
    for command in ("diff-tokens", "simulate-prefix", "prompt-cost", "kv-inspect", "lint", "fix", "report",
                    "semantic-probe"):
        assert f"docs/commands/{command}.md" in where, f"docs/commands/{command}.md has no example"
    assert not any(w.startswith("docs/reference/") for w in where)


def test_every_command_and_subcommand_is_documented():
    """Each command of the app has an example (README or docs); each subcommand an example or a `name` in the
    text."""
    import typer

    from cachectl.cli import app

    text = "\n".join(page.read_text(encoding="utf-8") for page in doc_pages())
    examples = {tuple(shlex.split(c)[1:3]) for _, c, _ in EXAMPLES} | {tuple(shlex.split(c)[1:2]) for _, c, _ in
                                                                       EXAMPLES}
    root = typer.main.get_command(app)
    for name, cmd in root.commands.items():
        assert (name,) in examples, f"no example of cachectl {name} in the README or docs/"
        for sub in getattr(cmd, "commands", {}):
            assert (name, sub) in examples or f"`{sub}`" in text, f"cachectl {name} {sub} is not documented"


@pytest.mark.parametrize("where,command,expected", EXAMPLES, ids=[w for w, _, _ in EXAMPLES])
def test_doc_command_output(where, command, expected):
    args = shlex.split(command)[1:]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "CACHECTL_DEBUG")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-m", "cachectl", *args], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=600)
    assert run.returncode in (0, 1), run.stderr
    live = any(flag in args for flag in LIVE)
    want, got = _normalize(expected, live), _normalize(run.stdout.splitlines(), live)
    assert _matches(want, got), f"{where}: {command}\n--- documented\n" + "\n".join(want) + \
        "\n--- actual\n" + "\n".join(got)
