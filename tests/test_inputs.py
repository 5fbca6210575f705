"""The shared readers: detection, normalization, and located errors."""

from __future__ import annotations

import json

import pytest

from cachectl.errors import InputError
from cachectl.inputs import iter_log, prompt_from_value, read_prompt

from .conftest import PROMPTS


def test_detects_each_kind(write):
    assert read_prompt(str(write("p.txt", "Hello there\n"))).kind == "text"
    assert read_prompt(str(write("c.json", [{"role": "user", "content": "hi"}]))).kind == "chat"
    assert read_prompt(str(write("o.json", {"messages": [{"role": "user", "content": "hi"}]}))).kind == "openai"
    assert read_prompt(str(PROMPTS / "anthropic_body.json")).kind == "anthropic"
    ids = read_prompt(str(write("i.json", [1, 2, 3])))
    assert ids.kind == "ids" and ids.ids == (1, 2, 3)
    assert read_prompt(str(write("t.json", {"tokens": [4, 5]}))).ids == (4, 5)
    assert read_prompt(str(write("q.json", {"prompt": "Complete this"}))).text == "Complete this"


def test_as_text_forces_raw(write):
    p = read_prompt(str(write("x.json", "[1, 2, 3]")), as_kind="text")
    assert p.kind == "text" and p.text == "[1, 2, 3]"


def test_anthropic_normalization():
    p = read_prompt(str(PROMPTS / "anthropic_body.json"))
    roles = [m["role"] for m in p.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assert p.messages[0]["content"] == "You are a cache expert. Answer briefly."
    assert p.messages[2]["tool_calls"][0]["function"] == {"name": "search_docs", "arguments": {"query": "rate limit"}}
    assert p.messages[3] == {"role": "tool", "tool_call_id": "toolu_01A09q90qw90", "content": "50 requests per minute"}
    assert p.tools[0]["function"]["parameters"]["required"] == ["query"]
    assert "cache_control" not in str(p.messages)
    assert p.field_paths[0] == "system" and p.field_paths[3] == "messages[2].content[0].content"


def test_openai_content_parts_and_string_arguments():
    p = prompt_from_value({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
    ]}, source="s", line=3)
    assert p.messages[0]["content"] == "a\nb"
    assert p.messages[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}


def test_openai_batch_line_is_unwrapped():
    p = prompt_from_value({"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
                           "body": {"messages": [{"role": "user", "content": "hi"}]}}, source="s", line=1)
    assert p.kind == "openai" and p.meta["custom_id"] == "r1"


@pytest.mark.parametrize("content, message", [
    (b"", "file is empty"),
    (b"   \n", "file is empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "binary"),
    (b"ok line\n\xff\xfe bad\n", "not valid UTF-8"),
])
def test_bad_bytes(write, content, message):
    with pytest.raises(InputError, match=message):
        read_prompt(str(write("f.txt", content)))


def test_invalid_utf8_names_the_line(write):
    path = write("f.txt", b"line one\nline two \xc3\x28\n")
    with pytest.raises(InputError) as exc:
        read_prompt(str(path))
    assert str(exc.value).startswith(f"{path}:2: not valid UTF-8")


def test_malformed_json_names_line_and_column(write):
    path = write("bad.json", '[\n  {"role": "user", "content": "hi"},\n  {"role": "user" "content": "x"}\n]')
    with pytest.raises(InputError) as exc:
        read_prompt(str(path))
    msg = str(exc.value)
    assert f"{path}:3: invalid JSON" in msg and "column" in msg and "--as text" in msg


def test_non_integer_token_id_names_the_element(write):
    with pytest.raises(InputError, match=r"field '\[2\]': token ID 'x' is not a non-negative integer"):
        read_prompt(str(write("ids.json", [1, 2, "x"])))
    with pytest.raises(InputError, match=r"field 'tokens\[1\]'"):
        read_prompt(str(write("ids2.json", {"tokens": [1, -5]})))
    with pytest.raises(InputError, match="not a non-negative integer"):
        read_prompt(str(write("ids3.json", [1, True])))
    with pytest.raises(InputError, match=r"not a non-negative integer"):
        read_prompt(str(write("ids4.json", [1, 2.5])))


def test_message_errors_name_the_field(write):
    with pytest.raises(InputError, match=r"field 'messages\[1\].role'"):
        read_prompt(str(write("m.json", {"messages": [{"role": "user", "content": "a"}, {"content": "b"}]})))
    with pytest.raises(InputError, match=r"field 'messages\[0\].content\[0\]'.*image"):
        read_prompt(str(write("img.json", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:"}}]}]})))


def test_unknown_object(write):
    with pytest.raises(InputError, match="not a prompt"):
        read_prompt(str(write("u.json", {"hello": 1})))


def test_missing_file():
    with pytest.raises(InputError, match="no such file"):
        read_prompt("/nonexistent/prompt.txt")


def test_log_streams_and_locates_errors(write):
    path = write("log.jsonl", '{"s": 1, "prompt": "a"}\n\n{"s": 2, "prompt": "b"}\n{"s": 3, "prompt": \n')
    it = iter_log(str(path), "s")
    first = next(it)
    assert (first.line, first.key, first.prompt.text) == (1, 1, "a")
    second = next(it)
    assert second.line == 3  # the blank line is skipped but still counted
    with pytest.raises(InputError, match=r"log.jsonl:4: invalid JSON: the line ends before its value does"):
        next(it)


@pytest.mark.parametrize("cut", [b'{"model": "gpt-4.1", "messa', b'{"a": 1,', b'{"a": [1, 2', b'{"a": 1,\r'])
def test_a_line_cut_short_is_said_to_end_before_its_value(write, cut):
    """A line cut inside a string, an object or an array is said to end early, not named by the parser's last
    complaint ('unexpected control character in string' at the newline); other errors keep their column."""
    path = write("log.jsonl", b'{"prompt": "a"}\n' + cut + b"\n")
    with pytest.raises(InputError, match=r"log.jsonl:2: invalid JSON: the line ends before its value does"):
        list(iter_log(str(path)))
    bad = write("bad.jsonl", b'{"prompt": "a\tb"}\n{"prompt": "a"}}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:1: invalid JSON: unexpected control character in string \(col"):
        list(iter_log(str(bad)))


def test_log_missing_key_names_line_and_field(write):
    path = write("log.jsonl", '{"meta": {"sid": "x"}, "prompt": "a"}\n{"prompt": "b"}\n')
    it = iter_log(str(path), "meta.sid")
    assert next(it).key == "x"
    with pytest.raises(InputError, match=r"log.jsonl:2: field 'meta.sid': missing conversation key"):
        next(it)


def test_log_bad_utf8_line(write):
    path = write("log.jsonl", b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(InputError, match=r"log.jsonl:2: not valid UTF-8"):
        list(iter_log(str(path)))


def test_empty_log(write):
    with pytest.raises(InputError, match="file is empty"):
        list(iter_log(str(write("e.jsonl", "\n\n"))))


def test_a_parquet_file_where_jsonl_is_expected_is_named_as_parquet(cli):
    from .conftest import FIXTURES

    part = str(FIXTURES / "partitions" / "fleet-session" / "replica-00000.parquet")
    r = cli("fix", part)
    assert r.exit_code == 2 and "a Parquet file, expected JSONL" in r.stderr and part in r.stderr


def test_a_slow_pipe_and_a_fifo_are_read_whole(tmp_path):
    """gzip/zstd are told by their first bytes even when a pipe delivers them one write at a time, and a named
    pipe (`<(zcat t.gz)`) is not read ahead by the Parquet check (its bytes are read once, by the reader)."""
    import gzip
    import os
    import subprocess
    import sys
    import threading
    import time

    root = PROMPTS.parent.parent
    text = "".join(json.dumps({"tokens": list(range(i % 30 + 1))}) + "\n" for i in range(200))
    args = ["simulate-prefix", "-", "--capacity-blocks", "40", "--block-size", "4", "-f", "json"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    want = subprocess.run([sys.executable, "-m", "cachectl", *args], input=text.encode(), capture_output=True,
                          env=env, timeout=120)
    assert want.returncode == 0
    data = gzip.compress(text.encode())
    proc = subprocess.Popen([sys.executable, "-m", "cachectl", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdin.write(data[:1])
    proc.stdin.flush()
    time.sleep(1.0)  # the command has started and looked at what is there: one byte
    out, err = proc.communicate(data[1:], timeout=120)
    assert proc.returncode == 0, err
    assert out == want.stdout
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(text))
    writer.start()
    got = subprocess.run([sys.executable, "-m", "cachectl", *[str(fifo) if a == "-" else a for a in args]],
                         capture_output=True, env=env, timeout=30)  # a pipe read twice never ends
    writer.join(timeout=30)
    assert got.returncode == 0, got.stderr
    assert got.stdout == want.stdout


def test_jsonl_where_one_json_document_is_expected_is_named(cli, tmp_path):
    from cachectl.errors import InputError
    from cachectl.inputs.files import JSONL_NOT_JSON, parse_json_document

    with pytest.raises(InputError) as info:
        parse_json_document('{"a": 1}\n\n{"b": [2]}\n', "t.json")
    assert info.value.message == JSONL_NOT_JSON and info.value.line == 3
    for text in ('{"a": 1} x', '{"a": 1}\n{"b": 2'):          # not JSONL: the parser's own words
        with pytest.raises(InputError, match="invalid JSON: Extra data"):
            parse_json_document(text, "t.json")
    log = tmp_path / "log.jsonl"
    log.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    r = cli("diff-tokens", log, log, "-t", "fixtures/tok")
    assert r.exit_code == 2 and "JSONL" in r.stderr and "diff-tokens --log" in r.stderr and "--as text" not in r.stderr
    r = cli("lint", log)
    assert r.exit_code == 2 and f"log.jsonl:2: {JSONL_NOT_JSON}" in r.stderr


@pytest.mark.parametrize("body, field, message", [
    # the OpenAI API refuses both (messages: at least one; a function tool: its function's name); they were read,
    # an empty list priced at 0 tokens by prompt-cost and a string rendered as an undefined name
    ({"model": "gpt-4.1", "messages": []}, "messages", "at least one message"),
    ({"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": "get_weather"}]}, "tools[0].function", "a string 'name'"),
    ({"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": 7}}]}, "tools[0].function", "a string 'name'"),
    ({"model": "gpt-4.1", "input": "hi", "tools": [{"type": "function", "parameters": {}}]}, "tools[0].name",
     "a string 'name'"),
])
def test_bodies_the_api_refuses_are_refused_at_their_field(body, field, message):
    with pytest.raises(InputError, match=message) as exc:
        prompt_from_value(body, source="s", line=4)
    assert exc.value.field == field and exc.value.line == 4


def test_responses_and_chat_function_tools_with_names_are_read():
    flat = prompt_from_value({"model": "gpt-4.1", "input": "hi", "tools": [
        {"type": "function", "name": "f", "parameters": {}}, {"type": "web_search"}]}, source="s", line=1)
    assert flat.tools[0]["function"]["name"] == "f"
    chat = prompt_from_value({"messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {}}}]}, source="s", line=1)
    assert chat.tools[0]["function"]["name"] == "f"


def test_a_line_that_is_a_list_of_requests_is_named_as_one(write):
    """A JSON array of request records (one JSON document, not JSONL) was read as a list of messages, and refused as
    `messages[0].role`; a bare message list's own errors are named from the list, not from a `messages` it lacks."""
    rec = {"timestamp": 1, "body": {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}}
    with pytest.raises(InputError, match=r"a JSON list of 2 objects that are requests.*jq -c '\.\[\]'"):
        prompt_from_value([rec, rec], source="s", line=1)
    from cachectl.inputs import parse_request  # (prompt-cost's reader of a log line)

    with pytest.raises(InputError, match=r"got a list of 1 object; expected one request per line .*jq -c '\.\[\]'"):
        parse_request([rec["body"]], source="s", line=1)
    with pytest.raises(InputError) as exc:
        read_prompt(str(write("m.json", [{"role": "user", "content": "a"}, {"role": 3, "content": "b"}])))
    assert exc.value.field == "[1].role"


def test_a_lone_surrogate_in_a_json_document_is_refused_at_its_line(write):
    """Python's JSON parser reads ``"\\ud800"`` (orjson, reading JSONL, refuses it); no tokenizer encodes it, and
    diff-tokens ended in an internal error. A pair, and an escaped backslash before ``ud800``, are read."""
    path = write("c.json", '[\n {"role": "user",\n  "content": "\\ud800 hi"}]')
    with pytest.raises(InputError, match=r"a lone surrogate \\ud800") as exc:
        read_prompt(str(path))
    assert exc.value.line == 3
    pair = read_prompt(str(write("p.json", '[{"role": "user", "content": "\\ud83d\\ude00 \\\\ud800"}]')))
    assert pair.messages[0]["content"] == "\U0001F600 \\ud800"


@pytest.mark.parametrize("args", [
    ("lint", "--config", "/dev/zero", str(PROMPTS / "chat_no_system.json")),
    ("diff-tokens", "-t", "TOK", "--chat-template", "/dev/zero", str(PROMPTS / "chat_no_system.json"),
     str(PROMPTS / "chat_no_system.json")),
    ("diff-tokens", "-t", "TOK", "/dev/zero", str(PROMPTS / "chat_no_system.json")),
    ("prompt-cost", "--prices", "/dev/zero", "--list-models"),
    ("semantic-probe", "pairs", "/dev/zero"),
])
def test_a_stream_read_whole_stops_at_its_bound(cli, args):
    """A file read whole that is a stream (no size to check first: /dev/zero, a FIFO, stdin) was read until memory
    ran out: an internal MemoryError, and `lint --config /dev/zero` was killed at 23 GB. Now 64 MiB is the most."""
    from .conftest import TOK_DIR

    r = cli(*[str(TOK_DIR) if a == "TOK" else a for a in args])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1] == ("cachectl: error: /dev/zero: more than 64 MiB: past what cachectl "
                                                 "reads whole (a stream that never ends?)")


@pytest.mark.parametrize("line, field", [
    ({"timestamp": 0, "model": "claude-sonnet-4-5", "blocks": [{"id": "s", "tokens": 10**15}]}, "blocks[0].tokens"),
    ({"timestamp": 0, "model": "claude-sonnet-4-5", "blocks": [{"id": "s", "tokens": 5}], "output_tokens": 10**15},
     "output_tokens"),
])
def test_a_token_layout_count_past_the_bound_is_refused(line, field):
    """A layout block of 10^15 tokens was priced at $7,500,000,000; the bound every usage counter has holds here."""
    from cachectl.inputs import parse_request

    with pytest.raises(InputError, match="2,147,483,647") as exc:
        parse_request(line, source="s", line=2)
    assert exc.value.field == field and exc.value.line == 2
