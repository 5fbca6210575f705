"""Inputs that just work (issue #26): inline prompts for diff-tokens, a request log given to --usage, one
pretty-printed body given to fix."""

from __future__ import annotations

import json


def test_diff_tokens_compares_texts_written_on_the_command_line(cli):
    r = cli("diff-tokens", "--text", "hello world", "hello there", "-t", "fixtures/tok")
    assert r.exit_code == 1, r.stderr
    assert r.stdout.startswith("A: 'hello world' (text, 8 tokens)\nB: 'hello there' (text, 6 tokens)\n")
    assert "mismatch at token 4" in r.stdout
    same = cli("diff-tokens", "--text", "hello", "hello", "-t", "fixtures/tok")
    assert same.exit_code == 0, same.stderr


def test_without_text_a_missing_file_says_how_to_pass_a_text(cli):
    r = cli("diff-tokens", "hello world", "hello there", "-t", "fixtures/tok")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "hello world: no such file (prompt A)" in r.stderr and "--text" in r.stderr


def test_diff_tokens_reads_token_ids_and_chats_given_inline(cli):
    r = cli("diff-tokens", "--as", "ids", "[1,2,3]", "[1,2,4]", "-f", "json")
    assert r.exit_code == 1, r.stderr
    out = json.loads(r.stdout)
    assert out["first_diff_index"] == 2 and out["tokens_a"] == 3
    chat = [{"role": "user", "content": "hi"}]
    r = cli("diff-tokens", "--text", "--as", "chat", json.dumps(chat), json.dumps(chat), "-t", "fixtures/tok")
    assert r.exit_code == 0 and "(chat," in r.stdout, r.stderr


def test_a_request_log_given_to_usage_names_the_simulate_mode(cli):
    r = cli("prompt-cost", "--usage", "fixtures/prompts/openai_requests.jsonl")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "unknown usage counter" not in r.stderr
    assert "openai_requests.jsonl:1: a request, not a response" in r.stderr
    assert "cachectl prompt-cost fixtures/prompts/openai_requests.jsonl --tokenizer" in r.stderr


def test_fix_reads_one_pretty_printed_body_as_a_log_of_one_line(cli, tmp_path):
    body = json.loads(open("fixtures/prompts/openai_tools_a.json", encoding="utf-8").read())
    body["messages"][0]["content"] = "Today is 2026-11-30T10:00:00Z. You are a helpful assistant."
    pretty = tmp_path / "body.json"
    pretty.write_text(json.dumps(body, indent=2))
    line = tmp_path / "body.jsonl"
    line.write_text(json.dumps(body) + "\n")
    a = cli("fix", str(pretty), "-f", "json")
    b = cli("fix", str(line), "-f", "json")
    assert a.exit_code == b.exit_code and a.exit_code in (0, 1), a.stderr
    assert json.loads(a.stdout)["changed_lines"] == json.loads(b.stdout)["changed_lines"]
    assert cli("fix", "-", "-f", "json", input=pretty.read_text()).exit_code == a.exit_code
    # a broken pretty-printed document: its own error, at its line
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "model": "gpt-4.1",\n  "messages": [\n    {"role": "user" "content": "x"}]}\n')
    r = cli("fix", str(broken))
    assert r.exit_code == 2 and "broken.json:4: invalid JSON" in r.stderr, r.stderr
