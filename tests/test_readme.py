"""The README's first two commands are the set-up and test commands that CI runs."""

from __future__ import annotations

from .conftest import ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("```", 2)[1]
    return [line.strip() for line in block.strip().splitlines() if line.strip()]


def test_readme_starts_with_two_commands_that_ci_runs():
    commands = readme_commands()
    assert len(commands) == 2
    setup, test = commands
    assert "torch" not in setup or "==" in setup  # never a bare torch
    assert "-c constraints.txt" in setup
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert setup in ci and test in ci
    assert ci.index(setup) < ci.index(test)


def test_constraints_pin_the_cpu_torch():
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text(encoding="utf-8").split()
