"""The command line: contracts (JSON fields, exit codes), help, errors and the import budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import PROMPTS, ROOT, TOK_DIR

TOK = str(TOK_DIR)
DIFF_FIELDS = {"schema_version", "kind", "first_diff_index", "common_prefix_tokens", "tokens_a", "tokens_b",
               "block_size", "reusable_blocks", "a", "b", "cause"}


def test_version(cli):
    from cachectl import __version__

    r = cli("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"cachectl {__version__}"


def test_every_command_has_help(cli):
    from cachectl.cli import COMMANDS

    names = list(COMMANDS)
    assert {"diff-tokens", "simulate-prefix", "prompt-cost", "semantic-probe", "kv-inspect", "lint"} <= set(names)
    top = cli("--help")
    assert top.exit_code == 0
    for name in names:
        assert name in top.stdout
        r = cli(name, "--help")
        assert r.exit_code == 0, name
        assert "--format" in r.stdout or name == "semantic-probe", name
        first = r.stdout.split("Usage:")[1]
        assert len(first.strip()) > 40, name


def test_json_contract_and_exit_codes(cli):
    r = cli("diff-tokens", PROMPTS / "system_time_a.txt", PROMPTS / "system_time_b.txt", "-t", TOK, "--format", "json")
    assert r.exit_code == 1, r.stderr
    d = json.loads(r.stdout)
    assert DIFF_FIELDS <= set(d)
    assert d["schema_version"] == 1 and d["kind"] == "mismatch"
    assert d["reusable_blocks"] == d["common_prefix_tokens"] // d["block_size"]
    for side in ("a", "b"):
        assert {"window_ids", "window_tokens", "location"} <= set(d[side])
        assert len(d[side]["window_ids"]) == len(d[side]["window_tokens"])
    assert d["cause"]["id"] == "date_time"
    assert r.stderr == ""


def test_identical_exits_zero(cli):
    p = PROMPTS / "chat_with_system.json"
    r = cli("diff-tokens", p, p, "-t", TOK, "-f", "json")
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert d["kind"] == "identical" and d["first_diff_index"] is None and d["cause"] is None


def test_prefix_kind_and_block_size(cli, write):
    a = write("a.json", list(range(40)))
    b = write("b.json", list(range(50)))
    r = cli("diff-tokens", a, b, "--block-size", "8", "-f", "json")
    d = json.loads(r.stdout)
    assert r.exit_code == 1
    assert (d["kind"], d["first_diff_index"], d["reusable_blocks"]) == ("a_prefix_of_b", 40, 5)


def test_text_output_names_cause_and_location(cli):
    r = cli("diff-tokens", PROMPTS / "chat_no_system.json", PROMPTS / "chat_with_system.json", "-t", TOK)
    assert r.exit_code == 1
    assert "mismatch at token" in r.stdout and "default_system_prompt" in r.stdout
    assert "chat-template text" in r.stdout and "message 0 (system)" in r.stdout


def test_stdin_input(cli):
    text = (PROMPTS / "system_time_a.txt").read_text()
    r = cli("diff-tokens", "-", PROMPTS / "system_time_a.txt", "-t", TOK, "-f", "json", input=text)
    assert r.exit_code == 0 and json.loads(r.stdout)["a"]["source"] == "<stdin>"


def test_add_generation_prompt_and_template_var(cli, write):
    conv = write("c.json", [{"role": "user", "content": "hi"}])
    plain = json.loads(cli("diff-tokens", conv, conv, "-t", TOK, "-f", "json").stdout)
    gen = json.loads(cli("diff-tokens", conv, conv, "-t", TOK, "-f", "json", "--add-generation-prompt").stdout)
    assert gen["tokens_a"] > plain["tokens_a"]
    dated = json.loads(cli("diff-tokens", conv, conv, "-t", TOK, "-f", "json",
                           "--template-var", "date_string=29 Nov 2026").stdout)
    assert dated["tokens_a"] > plain["tokens_a"]


@pytest.mark.parametrize("make, expect", [
    (lambda w: [w("e.txt", ""), w("ok.txt", "hi")], "e.txt: file is empty"),
    (lambda w: [w("bin.txt", b"\x00\x01\x02"), w("ok.txt", "hi")], "binary"),
    (lambda w: [w("u.txt", b"caf\xe9\n"), w("ok.txt", "hi")], "u.txt:1: not valid UTF-8"),
    (lambda w: [w("bad.json", '{"messages": [}'), w("ok.txt", "hi")], "bad.json:1: invalid JSON"),
    (lambda w: [w("ids.json", "[1, 2, \"x\"]"), w("ok.txt", "hi")], "field '[2]'"),
    (lambda w: ["/nonexistent/a.txt", w("ok.txt", "hi")], "/nonexistent/a.txt: no such file"),
])
def test_bad_input_is_one_line_exit_2(cli, write, make, expect):
    a, b = make(write)
    r = cli("diff-tokens", a, b, "-t", TOK)
    assert r.exit_code == 2
    assert r.stdout == ""
    assert expect in r.stderr
    assert r.stderr.startswith("cachectl: error: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr


def test_unknown_tokenizer_path(cli, write):
    r = cli("diff-tokens", write("a.txt", "hi"), write("b.txt", "ho"), "-t", "./no/such/tokenizer.json")
    assert r.exit_code == 2 and "tokenizer path not found" in r.stderr and r.stderr.count("\n") == 1


def test_text_without_tokenizer_says_what_to_pass(cli, write):
    r = cli("diff-tokens", write("a.txt", "hi"), write("b.txt", "ho"))
    assert r.exit_code == 2 and "pass --tokenizer" in r.stderr


def test_usage_errors(cli, write):
    a = write("a.txt", "hi")
    assert cli("diff-tokens", a).exit_code == 2
    assert cli("diff-tokens", a, a, "--log", a).exit_code == 2
    r = cli("diff-tokens", a, a, "--block-size", "0", "-t", TOK)
    assert r.exit_code == 2


def test_debug_lets_the_traceback_through(cli, write):
    a = write("e.txt", "")
    r = cli("diff-tokens", a, a, "-t", TOK, env={"CACHECTL_DEBUG": "1"})
    # the traceback is shown, and the exit code stays the one without debugging (2: input error)
    assert r.exit_code == 2 and "Traceback (most recent call last)" in r.stderr
    assert "cachectl.errors.InputError" in r.stderr and r.stderr.strip().splitlines()[-1].startswith("cachectl: error:")
    plain = cli("diff-tokens", a, a, "-t", TOK)
    assert plain.exit_code == 2 and plain.stderr.count("\n") == 1


# ------------------------------------------------------------------------------------------ log mode


def _log(write, rows):
    return write("log.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")


def test_log_mode_json_lines_and_summary(cli, write):
    sys_a = "You are a helpful assistant. Current time: 2026-11-28T09:15:00Z."
    sys_b = "You are a helpful assistant. Current time: 2026-11-28T09:16:00Z."
    rows = [
        {"sid": "s1", "messages": [{"role": "system", "content": sys_a}, {"role": "user", "content": "hi"}]},
        {"sid": "s2", "messages": [{"role": "user", "content": "What is the weather in Paris today?"}]},
        {"sid": "s1", "messages": [{"role": "system", "content": sys_a}, {"role": "user", "content": "hi"},
                                   {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]},
        {"sid": "s1", "messages": [{"role": "system", "content": sys_b}, {"role": "user", "content": "hi"}]},
    ]
    r = cli("diff-tokens", "--log", _log(write, rows), "--key", "sid", "-t", TOK, "-f", "json")
    assert r.exit_code == 1, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    pairs = [x for x in lines if x["record"] == "pair"]
    summary = lines[-1]
    assert summary["record"] == "summary" and len(lines) == 3
    assert [(p["line_a"], p["line_b"]) for p in pairs] == [(1, 3), (3, 4)]
    assert all(p["key"] == "s1" for p in pairs)
    assert pairs[0]["kind"] == "a_prefix_of_b"
    assert pairs[1]["kind"] == "mismatch" and pairs[1]["cause"]["id"] == "date_time"
    assert DIFF_FIELDS <= set(pairs[0])
    assert summary["requests"] == 4 and summary["conversations"] == 2 and summary["pairs"] == 2
    assert summary["kinds"]["mismatch"] == 1 and summary["kinds"]["a_prefix_of_b"] == 1
    assert summary["reused_tokens"] == pairs[0]["common_prefix_tokens"] + pairs[1]["common_prefix_tokens"]
    assert summary["reusable_tokens"] == sum(min(p["tokens_a"], p["tokens_b"]) for p in pairs)
    assert summary["top_causes"] == [{"cause": "date_time", "pairs": 1}]


def test_log_mode_groups_like_fix_without_a_key_and_text(cli, write):
    # without --key: fix's and report's grouping (group_sessions): the second prompt extends the first, the token
    # IDs start a conversation of their own (no pair to blame)
    rows = [{"prompt": "You are a helpful assistant."}, {"prompt": "You are a helpful assistant. More"},
            {"tokens": [1, 2, 3]}]
    r = cli("diff-tokens", "--log", _log(write, rows), "-t", TOK)
    assert r.exit_code == 0, r.stdout
    assert "3 requests, 2 conversations found automatically" in r.stdout
    assert "line 2 [auto-1]: A is a token prefix of B" in r.stdout
    assert "line 3" not in r.stdout
    assert "3 requests, 2 conversations, 1 pair" in r.stdout  # one plural helper: not "1 pairs"
    keyed = [{**row, "s": "one"} for row in rows]    # one key: each line against the previous one
    r = cli("diff-tokens", "--log", _log(write, keyed), "-t", TOK, "--key", "s")
    assert r.exit_code == 1 and "line 3 [one]: mismatch" in r.stdout and "3 requests, 1 conversation, 2 pairs" in r.stdout


def test_log_mode_all_prefixes_exit_zero_ids_only(cli, write):
    rows = [{"tokens": [1, 2, 3]}, {"tokens": [1, 2, 3, 4]}, {"tokens": [1, 2, 3, 4, 5]}]
    r = cli("diff-tokens", "--log", _log(write, rows), "-f", "json")
    assert r.exit_code == 0
    assert json.loads(r.stdout.splitlines()[-1])["reuse_ratio"] == 1.0


def test_log_mode_bad_line_exit_2(cli, write):
    path = write("log.jsonl", '{"tokens": [1, 2]}\n{"tokens": [1, "a"]}\n')
    r = cli("diff-tokens", "--log", path, "-f", "json")
    assert r.exit_code == 2 and "log.jsonl:2: field 'tokens[1]'" in r.stderr


def test_log_mode_text_needs_tokenizer(cli, write):
    r = cli("diff-tokens", "--log", _log(write, [{"prompt": "a"}]))
    assert r.exit_code == 2 and "log.jsonl:1" in r.stderr and "--tokenizer" in r.stderr


# ----------------------------------------------------------------------------------------- stability


def test_stability_exit_codes(cli):
    bad = cli("diff-tokens", "--stability", PROMPTS / "think_conversation.json", "-t", TOK, "-f", "json")
    assert bad.exit_code == 1
    report = json.loads(bad.stdout)
    assert report["stable"] is False and report["first_unstable_k"] == 3 and report["schema_version"] == 1
    good = cli("diff-tokens", "--stability", PROMPTS / "stable_conversation.json", "-t", TOK)
    assert good.exit_code == 0 and "stable" in good.stdout


# ------------------------------------------------------------------------------------- import budget


def test_cli_import_does_not_load_heavy_libraries():
    code = ("import sys, cachectl.cli, cachectl.engines.tokendiff, cachectl.tokenization; "
            "print(','.join(m for m in ('torch', 'transformers', 'sentence_transformers', 'tokenizers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_a_command_that_runs_imports_no_pydantic(tmp_path):
    """No command's own start-up imports pydantic: under typer before 0.29 nothing does. typer 0.29 converts
    options through pydantic itself (its cost is measured by bench/bench_prompt_cost_startup.py, not here), and
    the package does not cap typer to avoid it."""
    from importlib.metadata import requires, version

    declared = next(r for r in requires("llm-cachectl") or () if r.startswith("typer"))
    assert "<" not in declared, "typer is not capped"
    if tuple(int(x) for x in version("typer").split(".")[:2]) >= (0, 29):
        pytest.skip("typer 0.29+ imports pydantic to convert options")
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"tokens": list(range(40))}) + "\n")
    code = ("import sys, runpy; sys.argv = ['cachectl', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('cachectl', run_name='__main__')\n"
            "finally:\n    print('pydantic' in sys.modules, file=sys.stderr)")
    for args in (["simulate-prefix", str(trace), "--capacity-blocks", "8", "--format", "json"],
                 ["kv-inspect", "llama-3.1-8b", "--format", "json"]):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
        assert out.stderr.strip().splitlines()[-1] == "False", args


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "cachectl", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "diff-tokens" in out.stdout


def test_no_traceback_from_the_real_process(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = subprocess.run([sys.executable, "-m", "cachectl", "diff-tokens", str(empty), str(empty), "-t", TOK],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.strip().endswith("file is empty") and "Traceback" not in out.stderr


def test_library_api_is_reexported():
    import cachectl

    for name in cachectl.__all__:
        assert getattr(cachectl, name) is not None


def test_log_text_shows_keys_that_look_like_markup(cli):
    r = cli("diff-tokens", "--log", PROMPTS / "demo_log.jsonl", "--key", "session", "-t", TOK)
    assert r.exit_code == 1
    assert "line 3 [s1]: A is a token prefix of B" in r.stdout
    assert "line 4 [s2]: mismatch" in r.stdout and "cause=date_time" in r.stdout


def test_count_with_api_offline_is_one_clear_line(tmp_path):
    pytest.importorskip("anthropic")
    body = {"timestamp": 0, "model": "claude-sonnet-4-5", "max_tokens": 10,
            "system": [{"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "Hi"}]}
    log = tmp_path / "req.jsonl"
    log.write_text(json.dumps(body) + "\n")
    # a port nothing listens on: the SDK's APIConnectionError, as offline
    env = {**os.environ, "ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-m", "cachectl", "prompt-cost", str(log), "--count-with-api"],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "cannot reach the Anthropic API" in out.stderr and "internal error" not in out.stderr
    assert "test-key" not in out.stderr


def test_a_closed_pipe_exits_quietly_with_the_commands_own_code(tmp_path):
    # `cachectl diff-tokens --log big.jsonl | head -1`: far more output than a pipe buffers (~270 kB), the reader
    # gone after one line: no traceback, and the code the command has without the pipe (1: prompts differ)
    log = tmp_path / "big.jsonl"
    log.write_text("".join(json.dumps({"s": "one", "prompt": f"System prompt number {i} for a long chat. "
                                                             f"Question {i % 7}"}) + "\n" for i in range(3000)))
    args = [sys.executable, "-m", "cachectl", "diff-tokens", "--log", str(log), "-t", str(TOK_DIR), "--key", "s"]
    alone = subprocess.run(args, capture_output=True, cwd=ROOT)
    assert alone.returncode == 1 and len(alone.stdout) > 200_000
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert proc.stdout.readline().startswith(b"line 2 [one]: mismatch")
    proc.stdout.close()                                   # the reader is gone
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err == b""


def test_pretty_printed_json_where_jsonl_is_expected(cli, tmp_path):
    pretty = tmp_path / "trace.jsonl"
    pretty.write_text(json.dumps({"tokens": [1, 2, 3]}, indent=2) + "\n")
    for args in (["simulate-prefix", pretty, "--policy", "infinite"], ["semantic-probe", "dupes", pretty]):
        r = cli(*args)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1
        assert "trace.jsonl:1: this is pretty-printed JSON" in r.stderr and "one JSON value per line" in r.stderr
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"tokens": [1, 2,\n')
    assert "invalid JSON" in cli("simulate-prefix", broken, "--policy", "infinite").stderr


def test_a_tokenizer_path_typo_is_not_sent_to_the_hub(cli, tmp_path):
    (tmp_path / "tok").mkdir()
    a = tmp_path / "a.txt"
    a.write_text("hello")
    r = cli("diff-tokens", a, a, "-t", f"{tmp_path}/tokk")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"tokenizer path not found: {tmp_path}/tokk (did you mean {tmp_path}/tok?)" in r.stderr
    assert "hf download" not in r.stderr


def test_running_one_command_builds_only_that_command(runner):
    """Commands are imported and built when they run (typer makes a pydantic adapter per parameter), and
    help still lists them all, in order."""
    import typer

    from cachectl.cli import COMMANDS, app

    root = typer.main.get_command(app)
    assert dict.keys(root.commands) == set() and list(root.commands) == list(COMMANDS)
    ctx = root.context_class(root, info_name="cachectl")
    cmd = root.get_command(ctx, "prompt-cost")
    assert cmd.name == "prompt-cost" and "--format" in cmd.get_help(ctx)
    assert set(dict.keys(root.commands)) == {"prompt-cost"}
    assert root.get_command(ctx, "nope") is None
    text = root.get_help(ctx)
    assert all(name in text for name in COMMANDS) and set(dict.keys(root.commands)) == set(COMMANDS)
    assert runner.invoke(app, ["nope"]).exit_code == 2


def test_characters_that_print_as_nothing_are_shown_escaped(cli, tmp_path):
    """A prompt diverging at a zero-width space showed its tokens blank (U+200B, U+FEFF, U+00AD, U+2060 and the
    bidi mark U+061C were printed raw, where U+200E and U+202E were escaped); the joiners U+200C/D stay."""
    from cachectl.errors import printable

    assert printable("a\u200bb\ufeffc\u00add\u2060e\u061cf\u200dg") == "a\\u200bb\\ufeffc\\xadd\\u2060e\\u061cf\u200dg"
    (tmp_path / "a.txt").write_text("hello\u200bworld", encoding="utf-8")
    (tmp_path / "b.txt").write_text("helloworld", encoding="utf-8")
    r = cli("diff-tokens", tmp_path / "a.txt", tmp_path / "b.txt", "-t", TOK_DIR)
    assert r.exit_code == 1 and "\u200b" not in r.stdout
    row = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("4 "))
    assert "\\u200b" in row, r.stdout


def test_diff_tokens_refuses_what_it_would_pass_over(cli, tmp_path):
    """--as ids on a request body rendered it through the chat template; --key, --max-open, --log-format,
    --time-zone without --log were taken and unused, bad values unchecked."""
    body = tmp_path / "b.json"
    body.write_text('{"messages": [{"role": "user", "content": "hello world"}]}')
    r = cli("diff-tokens", "--as", "ids", body, body, "-t", TOK_DIR)
    assert r.exit_code == 2 and "a request body (messages) cannot be read as 'ids'" in r.stderr, r.stderr
    r = cli("diff-tokens", "--as", "ids", "--text", "[1,2,3]", "[1,2,4]", "--log-format", "bogus", "--time-zone",
            "Mars/Olympus", "--key", "x", "--max-open", "5")
    assert r.exit_code == 2 and r.stderr.strip() == (
        "cachectl: error: --key, --max-open, --log-format, --time-zone apply to --log; two prompts A B take none")
    assert cli("diff-tokens", "--as", "ids", "--text", "[1,2,3]", "[1,2,4]").exit_code == 1
