"""The documentation site: every command, fix code, lint rule, cause and log shape is documented; the generated
reference pages are in step with the code; `mkdocs build --strict` passes; the built pages load in a real
browser and their links resolve."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from .browser import CHROMEDRIVER, CHROMIUM
from .conftest import ROOT

DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"


def _generator():
    sys.path.insert(0, str(DOCS))
    try:
        import gen_reference
    finally:
        sys.path.remove(str(DOCS))
    return gen_reference


def test_the_reference_pages_are_generated_from_the_code_and_in_step():
    gen = _generator()
    built = gen.pages()
    for name in ("causes.md", "fix-codes.md", "lint-rules.md", "log-shapes.md", "prices.md"):
        assert name in built
    stale = [n for n, text in built.items() if not (REFERENCE / n).is_file() or
             (REFERENCE / n).read_text(encoding="utf-8") != text]
    assert not stale, f"stale reference pages {stale}: run python docs/gen_reference.py"


def test_every_command_has_a_page_with_an_example():
    from cachectl.cli import COMMANDS

    for name in COMMANDS:
        page = DOCS / "commands" / f"{name}.md"
        assert page.is_file(), f"cachectl {name} has no page {page.relative_to(ROOT)}"
        assert f"$ cachectl {name}" in page.read_text(encoding="utf-8"), f"{page.name} shows no example of {name}"


def _section(page: str, heading: str) -> str:
    """The text under a `## heading` of a generated page, up to the next heading."""
    text = (REFERENCE / page).read_text(encoding="utf-8")
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_every_fix_code_lint_rule_cause_and_log_shape_is_documented_with_text():
    from cachectl.engines.causes import CAUSES
    from cachectl.engines.lint.rules import RULES
    from cachectl.engines.repair.fixes import FIXES
    from cachectl.inputs.formats import SHAPES

    for code, fix in FIXES.items():
        assert fix.description.strip() and fix.name, code
        assert fix.description in _section("fix-codes.md", f"{code} `{fix.name}`")
    for rule in RULES.values():
        assert rule.summary.strip() and rule.fix.strip(), rule.id
        assert rule.summary in _section("lint-rules.md", f"{rule.id} `{rule.name}`")
    for cause in CAUSES.values():
        assert cause.label and cause.what.strip() and cause.remedy.strip(), cause.id
        assert cause.what in _section("causes.md", f"`{cause.id}`")
    for shape in SHAPES.values():
        assert shape.recognized and shape.carries and shape.commands, shape.name
        assert shape.carries in _section("log-shapes.md", f"`{shape.name}`")


def _cause_ids_in(path: Path) -> set[str]:
    """Cause ids a module returns: `Cause("id", ...)` and `"cause": "id"` / `final = "id"` string literals."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Cause" and node.args:
            if isinstance(node.args[0], ast.Constant):
                out.add(node.args[0].value)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "cause" and isinstance(v, ast.Constant) and v.value:
                    out.add(v.value)
    return out


def test_every_cause_the_code_can_name_is_in_the_registry():
    from cachectl.engines.causes import CAUSES
    from cachectl.engines.prefix import forks
    from cachectl.engines.prefix.forks import causes
    from cachectl.engines.repair.fixes import FIXES

    found = _cause_ids_in(ROOT / "cachectl" / "engines" / "tokendiff.py")
    for path in sorted((ROOT / "cachectl" / "engines" / "prefix" / "forks").glob("*.py")):
        found |= _cause_ids_in(path)
    assert len(found) >= 18  # the scan itself finds them
    assert found <= set(CAUSES), f"causes without an entry in cachectl/engines/causes.py: {found - set(CAUSES)}"
    for fix in FIXES.values():
        assert set(fix.causes) <= set(CAUSES), fix.code
    assert set(forks.FIX_CODES) <= set(CAUSES)
    from cachectl.engines.provider import transcript

    assert set(transcript.CAUSES) <= set(CAUSES)
    assert set(causes._LINE_CAUSES + causes._STRUCTURAL + causes._TEXTUAL) <= set(CAUSES)


#: how each command reads a log for the log-shape test (a document is read as the two sides of a diff)
def _invocation(command: str, example: str, shape: str) -> list[str]:
    tok = str(ROOT / "fixtures" / "tok")
    path = str(ROOT / example)
    document = not example.endswith(".jsonl") and shape != "vcr"  # a cassette is a log of calls
    if command == "prompt-cost":
        if shape in ("provider-usage", "codex", "openai-batch-output", "claude-code"):
            return ["prompt-cost", "--usage", path]
        if shape == "openai-batch-input":  # joined to its output by custom_id; no timestamps in a batch
            output = str(ROOT / example.replace("_input", "_output"))
            return ["prompt-cost", path, "--usage", output, "-t", tok, "--every", "1s"]
        if shape == "vcr":  # a cassette records no times: the calls spaced as --every says
            return ["prompt-cost", path, "-t", tok, "--every", "1s"]
        return ["prompt-cost", path, "-t", tok]
    if command == "diff-tokens":
        return ["diff-tokens", path, path, "-t", tok] if document else ["diff-tokens", "--log", path, "-t", tok]
    if command == "simulate-prefix":
        extra = ["--block-size", "512"] if shape == "mooncake" else ["-t", tok]
        return ["simulate-prefix", path, "--policy", "infinite", *extra]
    if command == "lint":
        return ["lint", path]
    if command == "semantic-probe dupes":
        return ["semantic-probe", "dupes", path]
    return [command, path, "-t", tok]


def _shape_runs() -> list[tuple[str, str]]:
    from cachectl.inputs.formats import SHAPES

    return [(s.name, c) for s in SHAPES.values() for c in s.commands]


@pytest.mark.parametrize("shape,command", _shape_runs(), ids=[f"{s}-{c}" for s, c in _shape_runs()])
def test_each_log_shape_is_read_by_each_command_it_lists(cli, shape, command, tmp_path):
    from cachectl.inputs.formats import SHAPES

    example = SHAPES[shape].example
    assert (ROOT / example).is_file(), f"{shape}: example {example} is missing"
    args = _invocation(command, example, shape)
    if command == "fix":
        args += ["-o", str(tmp_path / "fixed.jsonl")]
    r = cli(*args)
    assert r.exit_code in (0, 1), f"cachectl {' '.join(args)}: {r.stderr}"
    assert r.stdout.strip()


def _mkdocs_build(site: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs", reason="the docs site is built with mkdocs (the test extra installs it)")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    run = _mkdocs_build(out)
    assert run.returncode == 0, run.stderr[-4000:]
    return out


def test_mkdocs_builds_strict_and_every_docs_page_is_in_the_nav(site):
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(nav) -> set[str]:
        out = set()
        for item in nav:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            out |= pages(value) if isinstance(value, list) else {value}
        return out

    listed = pages(config["nav"])
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk == listed, f"not in the nav: {on_disk - listed}; missing files: {listed - on_disk}"
    for page in listed:
        html = site / (page[:-3] + "/index.html" if not page.endswith("index.md") else page[:-3] + ".html")
        assert html.is_file(), f"{page} was not built ({html})"


def _internal_links(html: str, page: Path, site: Path) -> list[Path]:
    out = []
    for href in re.findall(r'href="([^"#?]+)(?:[#?][^"]*)?"', html):
        if urlparse(href).scheme or href.startswith("//") or href.startswith("mailto:"):
            continue
        # the 404 page links from the site's root (it is served at any depth)
        target = (site / unquote(href).lstrip("/")) if href.startswith("/") else (page.parent / unquote(href))
        target = target.resolve()
        if target.is_dir():
            target = target / "index.html"
        out.append(target)
    return out


def test_every_internal_link_of_the_built_site_resolves(site):
    broken = []
    for page in site.rglob("*.html"):
        for target in _internal_links(page.read_text(encoding="utf-8"), page, site):
            if not target.exists():
                broken.append(f"{page.relative_to(site)} -> {target}")
    assert not broken, "\n".join(broken[:20])


@pytest.fixture
def served(site):
    """The built site served over loopback HTTP, as a reader's browser gets it (search needs a server)."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")
def test_the_built_pages_load_in_a_real_browser_without_errors(site, served, tmp_path):
    from .browser import visit, visit_all

    pages = sorted(p.relative_to(site).parent.as_posix() for p in site.rglob("index.html")
                   if p.parent.name != "404")
    assert len(pages) >= 10
    urls = [f"{served}/{p}/" if p != "." else f"{served}/" for p in pages]
    for url, seen in zip(urls, visit_all(urls)):
        errors = [m for m in seen.console if m.get("level") == "SEVERE"]
        assert not errors, f"{url}: {errors[:3]}"
        assert seen.text.strip() and seen.title, url
        outside = [u for u in seen.requests if u.startswith("http") and not u.startswith(served)]
        assert not outside, f"{url} asks outside the site (the docs must read offline): {outside[:3]}"
    # the home page as a person sees it
    shot = tmp_path / "home.png"
    home = visit(f"{served}/", screenshot=shot)
    assert "cachectl" in home.title
    from PIL import Image

    with Image.open(shot) as img:
        assert img.width >= 800 and img.height >= 400
