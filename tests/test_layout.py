"""The house: the package's import graph has no cycle (module-level, function-level and TYPE_CHECKING imports
all count), the layers point one way (engines never reach the CLI, typer or rich; inputs and tokenization never
reach an engine), and the Architecture page (docs/architecture.md) names every engine package, and only real ones."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "cachectl"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: str) -> list[tuple[str, int]]:
    """Every import in the module's source, wherever it stands, as (imported module, line)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # `from pkg import sub` imports the submodule; `from mod import name` imports mod
                found.append((sub if sub in MODULES else base, node.lineno))
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, _ in imports_of(m):
            while target and target not in MODULES and "." in target:  # `import cachectl.x.y` -> the module
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != m:
                edges[m].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each a cycle or a knot of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_walker_sees_function_level_and_type_checking_imports():
    # the walker itself: the engines package is found with its packages, and an import inside a function counts
    assert {"cachectl.engines.prefix.pools", "cachectl.engines.lint.rules", "cachectl.cli.common"} <= set(MODULES)
    live = dict(imports_of("cachectl.engines.repair.measure"))
    assert "cachectl.engines.prefix.replay" in live  # imported inside _Version.__init__()
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles (module-level or inside functions): " + "; ".join(" <-> ".join(c) for c in found)


def _violations(prefixes: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for m in MODULES:
        if not m.startswith(prefixes):
            continue
        for target, line in imports_of(m):
            if any(target == f or target.startswith(f + ".") for f in forbidden):
                bad.append(f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}")
    return bad


def test_engines_never_import_the_cli_typer_or_rich():
    bad = _violations(("cachectl.engines",), ("cachectl.cli", "typer", "rich", "click"))
    assert not bad, "\n".join(bad)


def test_inputs_tokenization_and_the_detector_sit_below_the_engines():
    below = ("cachectl.inputs", "cachectl.tokenization", "cachectl.sandbox", "cachectl.volatile", "cachectl.outputs",
             "cachectl.errors", "cachectl.datafiles")
    bad = _violations(below, ("cachectl.engines", "cachectl.cli", "typer", "rich", "click"))
    assert not bad, "\n".join(bad)


def readme_entries() -> dict[str, str]:
    """Each path the Architecture page's tree names (from its indentation: two spaces a level), with its entry: its
    line and its description's further lines (not the lines of the paths nested under it)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    blocks = text.split("```")[1::2]
    tree = next(b for b in blocks if b.lstrip("\n").startswith("cachectl/"))
    entries: dict[str, str] = {}
    stack: list[str] = []
    for line in tree.strip("\n").splitlines():
        m = re.match(r"^( *)([\w.]+(?:/|\.py))(?:\s|$)", line)
        if not m or len(m.group(1)) % 2 or len(m.group(1)) > 16:
            if stack:  # a description's second line
                entries["".join(stack)] += "\n" + line
            continue
        depth = len(m.group(1)) // 2
        stack[depth:] = [m.group(2)]
        entries["".join(stack)] = line
    return entries


def readme_tree() -> tuple[set[str], str]:
    """The paths the Architecture page's tree names, and the tree's text."""
    entries = readme_entries()
    return set(entries), "\n".join(entries.values())


def test_the_readme_tree_is_read_by_its_indentation():
    named, _ = readme_tree()
    assert {"cachectl/", "cachectl/engines/", "cachectl/engines/prefix/", "cachectl/cli/"} <= named
    entries = readme_entries()
    # a package's entry holds its description's further lines, not those of a package nested under it
    assert "replay.py" in entries["cachectl/engines/prefix/"]
    assert "fx001_volatile_to_end.py" in entries["cachectl/engines/repair/fixes/"]
    assert "fx001_volatile_to_end.py" not in entries["cachectl/engines/repair/"]


def test_the_readme_architecture_names_every_engine_package():
    entries = readme_entries()
    named = set(entries)
    # each path named in the tree is a real file or package folder
    for path in sorted(named):
        p = ROOT / path
        assert p.is_file() or (p.is_dir() if path.endswith("/") else False), f"docs/architecture.md names {path}, which does not exist"
    # each engine package, nested ones too (and each engine module beside them), has its line in the tree
    engines = PKG / "engines"
    packages = sorted(p.parent for p in engines.rglob("__init__.py") if p.parent != engines)
    wanted = {f"{p.relative_to(ROOT).as_posix()}/" for p in packages}
    wanted |= {f"cachectl/engines/{p.name}" for p in engines.glob("*.py") if p.name != "__init__.py"}
    missing = sorted(wanted - named)
    assert not missing, f"docs/architecture.md does not name {missing}"
    # and each module of an engine package is named in its package's own entry
    for pkg in packages:
        path = f"{pkg.relative_to(ROOT).as_posix()}/"
        for mod in sorted(pkg.glob("*.py")):
            if mod.name != "__init__.py":
                assert re.search(rf"\b{re.escape(mod.name)}\b", entries[path]), \
                    f"docs/architecture.md's tree does not name {mod.relative_to(engines)} in {path}'s entry"
