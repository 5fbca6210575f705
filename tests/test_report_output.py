"""What report and the plots show a person: the log's own conversation ids, which headline rate matters, and tick
labels that do not run into each other."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES, TOK_DIR

DEMO = FIXTURES / "prompts" / "demo_log.jsonl"


def test_conversations_found_automatically_keep_the_logs_own_ids(cli, write):
    r = cli("report", DEMO, "-t", TOK_DIR)  # no --key: grouped automatically, the lines carry "session"
    assert "worst conversations: s2 (" in r.stdout and "auto-" not in r.stdout
    d = cli("diff-tokens", "--log", DEMO, "-t", TOK_DIR)
    assert "line 3 [s1]" in d.stdout and "line 4 [s2]" in d.stdout
    # lines without an id of their own are still auto-N
    bare = write("bare.jsonl", "".join(json.dumps({k: v for k, v in json.loads(line).items() if k != "session"}) + "\n"
                                       for line in DEMO.read_text(encoding="utf-8").splitlines()))
    assert "auto-" in cli("diff-tokens", "--log", bare, "-t", TOK_DIR).stdout


def test_two_conversations_of_one_id_stay_apart():
    from cachectl.engines.repair.groups import LogLine
    from cachectl.engines.repair.shared_prefix import conversation_names

    lines = [LogLine(line=i, value={"session": s}, prompt=None, request=None)  # type: ignore[arg-type]
             for i, s in enumerate(["a", "b", "a", "a"], start=1)]
    assert conversation_names(lines, (0, 1, 0, 2)) == ["a", "b", "a", "a (2)"]
    assert conversation_names([LogLine(1, {}, None, None)], (0,)) == ["auto-1"]  # type: ignore[arg-type]


def test_the_report_says_which_headline_rate_matters(cli):
    r = cli("report", FIXTURES / "prompts" / "agent_log.jsonl", "--key", "session", "-t", TOK_DIR)
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("which rate matters:")]
    assert "the provider's hit rate (56.0%) sets the bill" in line and "prefix reuse (71.8%)" in line
    no_cost = cli("report", DEMO, "-t", TOK_DIR)  # no model: no provider cache, the vLLM rate is the one
    assert "which rate matters: the vLLM hit rate (16.2%)" in no_cost.stdout


@pytest.mark.parametrize("lo, hi", [(1.5e4, 2.6e6), (1_600, 12_800), (4_700, 11_000), (100, 6.5e6)])
def test_log_axis_tick_labels_never_overlap_and_carry_separators(lo, hi):
    from cachectl.cli.common import _readable_ticks, new_figure

    fig, ax = new_figure("t", "KV capacity (tokens)", "%")
    ax.plot([lo, hi], [10, 60])
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    _readable_ticks(ax)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()
              and lo <= t.get_position()[0] <= hi]
    assert len(labels) >= 2, [t.get_text() for t in ax.get_xticklabels()]
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    for a, b in zip(boxes, boxes[1:]):
        assert a.x1 < b.x0, [t.get_text() for t in labels]
    assert all("^" not in t.get_text() and "times" not in t.get_text() for t in labels)
    assert any("," in t.get_text() for t in labels)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_fix_without_unsafe_fixes_shows_what_they_would_add(cli):
    log = FIXTURES / "prompts" / "fix_log.jsonl"
    safe = cli("fix", log, "-t", TOK_DIR, "--capacity-blocks", "512")
    full = cli("fix", log, "-t", TOK_DIR, "--capacity-blocks", "512", "--unsafe-fixes")
    (line,) = [x for x in safe.stdout.splitlines() if x.startswith("with --unsafe-fixes")]
    assert "(6 more fixes, which move content the model reads)" in line
    # its "all fixes" figure is what --unsafe-fixes measures
    after = next(x for x in full.stdout.splitlines() if x.startswith("vLLM prefix hit rate")).split()[-1]
    assert f"-> {after} (all fixes)" in line
    assert "with --unsafe-fixes" not in full.stdout  # nothing left to preview
    doc = json.loads(cli("fix", log, "-t", TOK_DIR, "--capacity-blocks", "512", "-f", "json").stdout)
    assert doc["with_unsafe_fixes"]["applied"] == 19 and f"{doc['with_unsafe_fixes']['vllm_hit_rate']:.1%}" == after


def test_a_log_whose_name_is_not_utf8_is_named_with_its_bytes_escaped(cli, tmp_path):
    """A file name with a byte that is not UTF-8 (Linux allows any): ``-f json`` and ``--html`` were internal errors
    (orjson and the page's encoding refuse the lone surrogate Python reads it as); lint's JSON was not UTF-8."""
    import os

    log = tmp_path / os.fsdecode(b"bad\xffname.jsonl")
    log.write_bytes((FIXTURES / "prompts" / "demo_log.jsonl").read_bytes())
    r = cli("report", log, "-t", TOK_DIR, "-j", "1", "-f", "json")
    assert r.exit_code in (0, 1), r.stderr
    assert json.loads(r.stdout)["source"] == f"{tmp_path}/bad\\xffname.jsonl"
    page = tmp_path / "r.html"
    r = cli("report", log, "-t", TOK_DIR, "-j", "1", "--html", page)
    assert r.exit_code in (0, 1), r.stderr
    assert "bad\\xffname.jsonl" in page.read_text(encoding="utf-8")
    template = tmp_path / os.fsdecode(b"a\xff.j2")
    template.write_text("Tools:\n{% for tool in tools %}{{ tool | tojson }}{% endfor %}\n")
    r = cli("lint", template, "-f", "json")
    assert r.exit_code == 1 and json.loads(r.stdout)["findings"][0]["path"] == f"{tmp_path}/a\\xff.j2"
    r = cli("lint", template, "-f", "sarif")
    assert r.exit_code == 1 and json.loads(r.stdout)["version"] == "2.1.0"


def test_the_page_writes_control_characters_and_bidi_overrides_visibly(cli, tmp_path):
    """A conversation key with a NUL (a parse error in HTML) and a U+202E (which turns the text after it around:
    'user\\u202egpj.exe' showed as 'userexe.jpg') was written raw into the page; the text output escaped them."""
    key = "user\u202egpj.exe\x00"
    lines = [{"session": key, "messages": [{"role": "system", "content": "A"}, {"role": "user", "content": "q"}]},
             {"session": key, "messages": [{"role": "system", "content": "B"}, {"role": "user", "content": "q"},
                                           {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]}]
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    page = tmp_path / "r.html"
    r = cli("report", log, "-t", TOK_DIR, "-j", "1", "--key", "session", "--html", page)
    assert r.exit_code in (0, 1), r.stderr
    html = page.read_text(encoding="utf-8")
    assert "\x00" not in html and "\u202e" not in html
    assert "user\\u202egpj.exe\\x00" in html
