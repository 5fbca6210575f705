"""``cachectl lint --fix`` / ``--diff``: the safe template fix (CC006, tojson(sort_keys=true) on tool schemas),
checked on the real chat templates of fixtures/chat_templates rendered through transformers' environment."""

from __future__ import annotations

import json
import shutil

import pytest

from cachectl.engines import lint
from cachectl.engines.lint import fix as lint_fix
from cachectl.tokenization import render_chat_template, template_environment

from .conftest import FIXTURES

CORPUS = FIXTURES / "chat_templates"
CONV = [{"role": "system", "content": "You are a concise assistant for a weather service."},
        {"role": "user", "content": "What is the weather in Paris today?"},
        {"role": "assistant", "content": "It is sunny in Paris."},
        {"role": "user", "content": "And in Berlin?"}]
NO_SYSTEM = CONV[1:]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                         "parameters": {"type": "object",
                                                        "properties": {"city": {"type": "string"},
                                                                       "unit": {"type": "string"}},
                                                        "required": ["city"]}}}


def _reordered(obj):
    """The same JSON value with every object's keys in reverse order (what another client may send)."""
    if isinstance(obj, dict):
        return {k: _reordered(obj[k]) for k in reversed(list(obj))}
    if isinstance(obj, list):
        return [_reordered(x) for x in obj]
    return obj


def _deep_sorted(obj):
    if isinstance(obj, dict):
        return {k: _deep_sorted(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_deep_sorted(x) for x in obj]
    return obj


def _render(source: str, messages, tools=None) -> str:
    return render_chat_template(template_environment().from_string(source), messages, tools=tools,
                                add_generation_prompt=True, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})


def _render_any(source: str, tools=None) -> str | None:
    for msgs in (CONV, NO_SYSTEM):
        try:
            return _render(source, msgs, tools)
        except Exception:
            continue
    return None


FIXABLE = sorted(p.name for p in CORPUS.glob("*.jinja")
                 if lint_fix.fix_template(str(p), p.read_text(encoding="utf-8"), lint.LintConfig())[1])


def test_the_corpus_has_templates_to_fix():
    # Qwen3, Llama 3.1, Hermes 3, ... serialize tool schemas with a bare tojson (CC006)
    assert len(FIXABLE) >= 10 and "Qwen-Qwen3-0.6B.jinja" in FIXABLE


@pytest.mark.parametrize("name", FIXABLE)
def test_fixed_real_template_renders_the_same_without_tools_and_sorted_with_them(name):
    path = CORPUS / name
    source = path.read_text(encoding="utf-8")
    fixed, edits = lint_fix.fix_template(str(path), source, lint.LintConfig())
    assert edits and fixed != source
    assert all("sort_keys=true" in e.after and "sort_keys=true" not in e.before for e in edits)
    # the fixed template has no CC006 left (lint itself, static and rendered) and still renders everywhere
    found = lint.lint_template(str(path), fixed, lint.LintConfig())
    assert not [f for f in found if f.rule == "CC006"]
    # without tools: byte-identical renders (Hermes' tool_use template raises without tools, fixed or not)
    before, after = _render_any(source), _render_any(fixed)
    assert before == after
    assert before is not None or name.startswith("NousResearch-Hermes-3")
    # with tools: the fixed template, given the caller's key order, renders what the original renders given
    # schemas in sorted key order (tojson(sort_keys=true) is that, and nothing else)
    with_tools = _render_any(fixed, [TOOL])
    if name == "llama-cpp-deepseek-r1.jinja":  # wants tools without a "function" wrapper, fixed or not
        assert with_tools is None and _render_any(source, [TOOL]) is None
        return
    assert with_tools is not None
    if name == "mistralai-Mistral-Nemo-Instruct-2407.jinja":
        # it walks each tool's top-level keys itself, and tojson prints the values: those come out sorted
        params = TOOL["function"]["parameters"]
        assert json.dumps(params, sort_keys=True) in with_tools and json.dumps(params) not in with_tools
    else:
        assert with_tools == _render_any(source, [_deep_sorted(TOOL)])
        if json.dumps(TOOL, sort_keys=True) in with_tools or json.dumps(TOOL, sort_keys=True, indent=4) in with_tools:
            assert _render_any(fixed, [_reordered(TOOL)]) == with_tools  # the whole schema is order-free now


def test_only_flagged_filters_are_touched():
    src = ("{# tools | tojson in a comment #}{{ 'tools | tojson' }}\n"
           "{% for tool in tools %}{{ tool | tojson(indent=2) }}{% endfor %}\n"
           "{% for m in messages %}{% for c in m.tool_calls %}{{ c.arguments | tojson }}{% endfor %}{% endfor %}\n"
           "{{ tools | tojson(sort_keys=false) | safe }}\n")
    fixed, edits = lint_fix.fix_template("t.j2", src, lint.LintConfig())
    assert fixed.splitlines() == [
        "{# tools | tojson in a comment #}{{ 'tools | tojson' }}",
        "{% for tool in tools %}{{ tool | tojson(indent=2, sort_keys=true) }}{% endfor %}",
        "{% for m in messages %}{% for c in m.tool_calls %}{{ c.arguments | tojson }}{% endfor %}{% endfor %}",
        "{{ tools | tojson(sort_keys=true) | safe }}"]
    assert [(e.rule, e.line) for e in edits] == [("CC006", 2), ("CC006", 4)]


def test_ignored_and_deselected_findings_are_not_fixed():
    src = "{# cachectl: ignore[CC006] #}\n{{ tools | tojson }}\n"
    assert lint_fix.fix_template("t.j2", src, lint.LintConfig())[1] == []
    src = "{{ tools | tojson }}\n"
    assert lint_fix.fix_template("t.j2", src, lint.LintConfig(select=frozenset({"CC001"})))[1] == []


def test_cli_fix_writes_prints_the_diff_and_keeps_the_exit_contract(cli, tmp_path):
    qwen = tmp_path / "qwen.jinja"
    shutil.copy(CORPUS / "Qwen-Qwen3-0.6B.jinja", qwen)
    tools = tmp_path / "tools.j2"
    shutil.copy(FIXTURES / "lint" / "bad" / "tools_tojson.j2", tools)
    before = qwen.read_text(encoding="utf-8")
    r = cli("lint", str(tools), str(qwen), "--diff")
    assert r.exit_code == 1, r.stderr
    assert f"--- {tools}" in r.stdout and "+{% for tool in tools %}{{ tool | tojson(sort_keys=true) }}" in r.stdout
    assert qwen.read_text(encoding="utf-8") == before  # --diff writes nothing
    r = cli("lint", str(tools), str(qwen), "--fix")
    assert "-        {{- tool | tojson }}" in r.stdout and "fixed 2 finding(s) in 2 file(s)" in r.stdout
    # Qwen3's template also rewrites history (CC007, an unsafe fix): a finding remains, so exit 1
    assert "CC007" in r.stdout and "CC006" not in r.stdout.split("fixed 2")[1]
    assert r.exit_code == 1
    assert "tojson(sort_keys=true)" in qwen.read_text(encoding="utf-8")
    r = cli("lint", str(tools), "--fix")  # nothing left to fix, and clean
    assert r.exit_code == 0 and r.stdout.strip().endswith("clean")
    assert cli("lint", str(tools), "--diff").exit_code == 0


def test_cli_fix_json_output_stays_json(cli, tmp_path):
    tools = tmp_path / "tools.j2"
    shutil.copy(FIXTURES / "lint" / "bad" / "tools_tojson.j2", tools)
    r = cli("lint", str(tools), "--fix", "-f", "json")
    assert json.loads(r.stdout)["findings"] == [] and r.exit_code == 0
    assert "tojson(sort_keys=true)" in r.stderr


def test_tokenizer_config_chat_template_is_fixed_in_its_json_string(cli, tmp_path):
    template = (CORPUS / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"model_max_length": 32768, "chat_template": template, "eos_token": "<|im_end|>"},
                              indent=2), encoding="utf-8")
    r = cli("lint", str(cfg), "--fix")
    assert "fixed 1 finding(s)" in r.stdout
    doc = json.loads(cfg.read_text(encoding="utf-8"))
    assert doc["chat_template"] == template.replace("tool | tojson }}", "tool | tojson(sort_keys=true) }}")
    assert doc["model_max_length"] == 32768 and list(doc) == ["model_max_length", "chat_template", "eos_token"]


def test_bom_and_crlf_survive_a_fix(tmp_path):
    p = tmp_path / "t.j2"
    p.write_bytes(b"\xef\xbb\xbfTools:\r\n{{ tools | tojson }}\r\nEnd\r\n")
    result = lint_fix.fix_paths([str(p)], lint.LintConfig())
    lint_fix.write_fixes(result)
    assert p.read_bytes() == b"\xef\xbb\xbfTools:\r\n{{ tools | tojson(sort_keys=true) }}\r\nEnd\r\n"


def test_diff_with_json_gives_each_file_its_fixes_and_diff_and_other_formats_are_refused(cli):
    bad = str(FIXTURES / "lint" / "bad" / "tools_tojson.j2")
    r = cli("lint", bad, "--diff", "-f", "json")
    assert r.exit_code == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["errors"] == [] and [f["path"] for f in doc["files"]] == [bad]
    assert doc["files"][0]["fixes"][0]["rule"] == "CC006" and "tojson(sort_keys=true)" in doc["files"][0]["diff"]
    assert doc["files"][0]["diff"] == cli("lint", bad, "--diff").stdout
    r = cli("lint", bad, "--diff", "-f", "sarif")
    assert r.exit_code == 2 and "--diff prints a unified diff" in r.stderr


def test_compressed_templates_are_linted_and_never_rewritten(cli, tmp_path):
    """A gzip or zstd template is linted as the template it holds; --fix and --diff refuse to write it back
    (it would lose its compression) and say so, leaving it byte for byte."""
    import gzip

    data = (FIXTURES / "lint" / "bad" / "tools_tojson.j2").read_bytes()
    plain = tmp_path / "tools.j2"
    plain.write_bytes(data)
    packed = {"gzip": tmp_path / "tools.j2.gz"}
    packed["gzip"].write_bytes(gzip.compress(data))
    try:
        import pyarrow as pa
    except ImportError:
        pa = None
    if pa is not None:
        packed["zstd"] = tmp_path / "tools.j2.zst"
        with pa.CompressedOutputStream(str(packed["zstd"]), "zstd") as out:
            out.write(data)
    want = json.loads(cli("lint", plain, "-f", "json").stdout)
    for kind, path in packed.items():
        before = path.read_bytes()
        got = json.loads(cli("lint", path, "-f", "json").stdout)
        assert [(f["rule"], f["line"]) for f in got["findings"]] == [(f["rule"], f["line"]) for f in want["findings"]]
        assert any(f["rule"] == "CC006" for f in got["findings"])
        message = f"cachectl: error: {path}: {kind}-compressed: fixes are written to plain files"
        fixed = cli("lint", path, "--fix")
        assert fixed.exit_code == 2 and message in fixed.stderr and "CC006" in fixed.stdout
        diff = cli("lint", path, "--diff")
        assert diff.exit_code == 2 and message in diff.stderr and diff.stdout == ""
        assert path.read_bytes() == before
    assert cli("lint", plain, "--fix").exit_code == 0 and b"sort_keys=true" in plain.read_bytes()


def _apply_patch(diff: str, files: dict[str, str]) -> dict[str, str]:
    """Apply a unified diff as ``patch -p0`` reads it (lines ended by ``\\n``; a ``\\ No newline at end of file``
    line takes the line end off the line before it) over ``files`` (name -> text)."""
    import re

    def split(text: str) -> list[str]:
        return re.findall(r"[^\n]*\n|[^\n]+\Z", text)

    out, lines, i = dict(files), split(diff), 0
    while i < len(lines):
        assert lines[i].startswith("--- ") and lines[i + 1].startswith("+++ "), lines[i:i + 2]
        name, old, new, at, i = lines[i][4:].rstrip("\n"), split(out[lines[i][4:].rstrip("\n")]), [], 0, i + 2
        while i < len(lines) and lines[i].startswith("@@"):
            m = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,(\d+))? @@", lines[i])
            first = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
            olds, news = int(m.group(2) or 1), int(m.group(3) or 1)  # (the hunk's lengths: where it ends)
            new, at, i = new + old[at:first], first, i + 1
            while olds or news:
                kind, text = lines[i][0], lines[i][1:]
                cut = i + 1 < len(lines) and lines[i + 1].startswith("\\ ")
                if cut:
                    text = text[:-1]
                if kind in " -":
                    assert old[at] == text, (old[at], text)
                    at, olds = at + 1, olds - 1
                if kind in " +":
                    new.append(text)
                    news -= 1
                i += 2 if cut else 1
        out[name] = "".join(new + old[at:])
    return out


def test_a_diff_of_files_without_a_final_newline_or_with_cr_lines_applies(cli, tmp_path, monkeypatch):
    """A last line without a line end was written with none in the diff (no '\\ No newline at end of file'): the
    next line of the diff ran on after it, and patch -p0 and git apply refused the patch. A template whose lines end
    with CR alone was an internal error (IndexError) in --fix and --diff, which ended the run before the other
    files."""
    monkeypatch.chdir(tmp_path)
    files = {"a.j2": "Tools: {{ tools | tojson }}",
             "b.j2": "Tools:\n{% for tool in tools %}\n{{ tool | tojson }}\n{% endfor %}",
             "cr.j2": "Tools:\r{% for tool in tools %}\r{{ tool | tojson }}\r{% endfor %}\r"}
    for name, text in files.items():
        (tmp_path / name).write_bytes(text.encode())
    r = cli("lint", "--diff", *files)
    assert r.exit_code == 1, r.stderr
    diff = r.stdout_bytes.decode()  # (click's stdout turns "\r\n" into "\n")
    # a.j2's and cr.j2's last line, before and after; b.j2's, a line of context
    assert diff.count("\\ No newline at end of file\n") == 5
    patched = _apply_patch(diff, files)
    r = cli("lint", "--fix", *files)
    assert r.exit_code == 0 and "fixed 3 finding(s) in 3 file(s)" in r.stdout, r.stdout + r.stderr
    for name in files:
        assert (tmp_path / name).read_bytes().decode() == patched[name]
        assert patched[name] != files[name] and "sort_keys=true" in patched[name]
    assert patched["cr.j2"].count("\r") == 4 and "\n" not in patched["cr.j2"]
    if shutil.which("patch"):  # and the real patch agrees
        import subprocess

        for name, text in files.items():
            (tmp_path / name).write_bytes(text.encode())
        diff = cli("lint", "--diff", *files).stdout_bytes.decode()
        done = subprocess.run(["patch", "-p0"], input=diff, text=True, capture_output=True, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert all((tmp_path / n).read_bytes().decode() == patched[n] for n in files)


def test_fix_leaves_hard_linked_and_read_only_files_and_still_writes_and_shows_the_others(cli, tmp_path, monkeypatch):
    """A fixed copy renamed over a hard-linked file left its other names with the old text, and over a read-only one
    wrote what its mode forbids; and a file that could not be written ended the run with the files written before
    it said nowhere (no diff, no count)."""
    import os

    bad = (FIXTURES / "lint" / "bad" / "tools_tojson.j2").read_text()
    for name in ("a.j2", "linked.j2", "ro.j2", "z.j2"):
        (tmp_path / name).write_text(bad)
    os.link(tmp_path / "linked.j2", tmp_path / "other_name")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: not str(p).endswith("ro.j2") and real_access(p, mode, **k))
    r = cli("lint", "--fix", *(tmp_path / n for n in ("a.j2", "linked.j2", "ro.j2", "z.j2")))
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        f"cachectl: error: {tmp_path / 'linked.j2'}: has 2 hard links, which a fixed copy renamed over it would leave "
        "with the old text (not fixed: the file is as it was)",
        f"cachectl: error: {tmp_path / 'ro.j2'}: is read-only (not fixed: the file is as it was)"]
    assert "fixed 2 finding(s) in 2 file(s)" in r.stdout
    assert r.stdout.count("+++ ") == 2 and "a.j2" in r.stdout and "z.j2" in r.stdout
    for name in ("a.j2", "z.j2"):
        assert "sort_keys=true" in (tmp_path / name).read_text()
    for name in ("linked.j2", "other_name", "ro.j2"):
        assert (tmp_path / name).read_text() == bad
    assert (tmp_path / "linked.j2").stat().st_ino == (tmp_path / "other_name").stat().st_ino


@pytest.mark.parametrize("raw", [
    r"{% for message in messages %}\u003c|{{ message['role'] }}|\u003e<\/s> caf\u00e9 é \ud83d\ude00 \"q\" \\ "
    r"{% endfor %}{{ tools | tojson }}",
    r"plain {{ tools | tojson }}\n{{ tools|tojson(indent=2) }}",
])
def test_a_tokenizer_config_fix_keeps_the_templates_escapes(raw, tmp_path):
    """The fix re-encoded the whole chat_template string: every `\\u003c`, `\\/`, `\\u00e9` in it changed, a diff far
    past the one edit. Now only the inserted text is written, encoded as the literal is."""
    import json as _json

    text = '{\n  "chat_template": "' + raw + '",\n  "eos_token": "</s>"\n}\n'
    path = tmp_path / "tokenizer_config.json"
    path.write_text(text, encoding="utf-8")
    result = lint_fix.fix_paths([str(path)], lint.LintConfig())
    (f,) = result.files
    template = _json.loads(text)["chat_template"]
    assert _json.loads(f.fixed)["chat_template"] == template.replace("tojson }}", "tojson(sort_keys=true) }}").replace(
        "tojson(indent=2)", "tojson(indent=2, sort_keys=true)")
    removed = [ln for ln in f.diff().splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln for ln in f.diff().splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert len(removed) == len(added) == 1
    assert added[0][1:].replace("(sort_keys=true)", "").replace(", sort_keys=true", "") == removed[0][1:]  # no other
