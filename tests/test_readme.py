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


def test_ci_runs_the_oldest_versions_job_on_the_declared_floors():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "bash .ci/oldest" in ci and ci.index("bash .ci/oldest") > ci.index("python3 -m pytest -q")
    assert "python3 -m mypy" in ci and "python3 -m ruff check ." in ci
    oldest = (ROOT / ".ci" / "oldest").read_text(encoding="utf-8")
    # the pins come from pyproject.toml itself, and the job checks they were installed
    assert 'tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]' in oldest
    assert "zz-cachectl-parent.pth" in oldest and "floors installed" in oldest


def test_ci_runs_the_readme_commands_in_a_virtualenv_of_its_own():
    """A fresh machine, for real: .ci/run makes a new virtualenv and activates it before the README's commands, so
    nothing from the machine's site-packages can hide a missing dependency."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    setup, _ = readme_commands()
    made = next(i for i, line in enumerate(ci) if line.startswith('python3 -m venv "$VENV"'))
    active = ci.index('source "$VENV/bin/activate"')
    assert made < active < ci.index(setup)
    assert not any("--system-site-packages" in line for line in ci)
    assert 'python3 -m pytest -q -m ray' in ci and ci.index(setup) < ci.index("python3 -m pytest -q -m ray")
    assert any(line.startswith("python3 -m mkdocs build --strict") for line in ci)


def test_the_setup_installs_the_tour_and_tests_without_ray_and_ci_adds_it():
    import tomllib

    setup, _ = readme_commands()
    assert '".[dev]"' in setup and "ray" not in setup and "[all" not in setup
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    dev = extras["dev"][0]
    assert "ray" not in dev and "test" in dev and "ray" in extras["all"][0]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    ray = 'python3 -m pip install -c constraints.txt -e ".[ray]"'
    # the README's commands first, as a user runs them; then the extra, and the tests that need it
    assert ray in ci and ci.index(setup) < ci.index("python3 -m pytest -q") < ci.index(ray) < \
        ci.index("python3 -m pytest -q -m ray")
