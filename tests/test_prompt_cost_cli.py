"""prompt-cost through the CLI, including the real anthropic SDK against a count_tokens server on loopback."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from .conftest import ROOT, TOK_DIR

REPORT_FIELDS = {"schema_version", "requests", "total_cost_usd", "uncached_cost_usd", "savings_usd"}
COUNTERS = {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens", "cost_usd"}


def jsonl(write, name, rows):
    return write(name, "\n".join(json.dumps(r) for r in rows) + "\n")


def test_what_if_json_contract(cli):
    r = cli("prompt-cost", "--model", "claude-sonnet-4-5", "--prefix-tokens", "180000", "--suffix-tokens", "2000",
            "--output-tokens", "500", "--calls", "20", "--every", "2m", "--format", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert REPORT_FIELDS <= set(d) and d["schema_version"] == 1 and d["mode"] == "what-if"
    assert len(d["requests"]) == 20 and all(COUNTERS <= set(q) for q in d["requests"])
    assert d["total_cost_usd"] == pytest.approx(1.971) and d["savings_usd"] == pytest.approx(11.07 - 1.971)
    assert d["break_even_reads"] == 1


def test_what_if_text(cli):
    r = cli("prompt-cost", "--model", "claude-sonnet-4-5", "--prefix-tokens", "50000", "--calls", "3", "--every", "10m")
    assert r.exit_code == 0
    assert "costs $" in r.stdout and "more" in r.stdout and "outlive the 5m TTL" in r.stdout


def test_what_if_prices_an_unknown_model_as_model_as(cli):
    """``--model-as`` worked on a log and was left out of the what-if: an unknown ``--model`` stayed an error."""
    args = ("prompt-cost", "--prefix-tokens", "2000", "--calls", "2", "--every", "2m", "-f", "json")
    assert cli(*args, "--model", "my-local-model").exit_code == 2
    r = cli(*args, "--model", "my-local-model", "--model-as", "gpt-4.1")
    assert r.exit_code == 0, r.stderr
    known = json.loads(cli(*args, "--model", "gpt-4.1").stdout)
    d = json.loads(r.stdout)
    assert d["total_cost_usd"] == known["total_cost_usd"] and d["requests"] == known["requests"]
    assert any("'my-local-model' is not in the price table: priced as gpt-4.1" in n for n in d["notes"])


def test_list_models(cli):
    r = cli("prompt-cost", "--list-models")
    assert r.exit_code == 0 and "claude-3-5-sonnet" in r.stdout and "gpt-4o" in r.stdout
    d = json.loads(cli("prompt-cost", "--list-models", "-f", "json").stdout)
    entry = next(m for m in d["models"] if m["model"] == "claude-3-5-sonnet")
    assert entry["input"] == 3 and entry["output"] == 15 and entry["source"] and entry["as_of"]


def test_audit_mode(cli, write):
    path = jsonl(write, "responses.jsonl", [
        {"type": "message", "model": "claude-sonnet-4-5", "usage": {"input_tokens": 100, "output_tokens": 10,
                                                                    "cache_creation_input_tokens": 2000,
                                                                    "cache_read_input_tokens": 0}},
        {"type": "message", "model": "claude-sonnet-4-5", "usage": {"input_tokens": 120, "output_tokens": 10,
                                                                    "cache_creation_input_tokens": 0,
                                                                    "cache_read_input_tokens": 2000}},
    ])
    r = cli("prompt-cost", "--usage", path, "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert [q["line"] for q in d["requests"]] == [1, 2]
    assert d["total_cost_usd"] == pytest.approx((100 * 3 + 10 * 15 + 2000 * 3.75 + 120 * 3 + 10 * 15 + 2000 * 0.3) / 1e6)
    assert d["hit_rate"] == pytest.approx(2000 / 4220)


def test_simulate_mode_layouts(cli, write):
    block = {"id": "sys", "tokens": 4000, "cache_control": {"type": "ephemeral"}}
    path = jsonl(write, "req.jsonl", [
        {"timestamp": 0, "model": "claude-sonnet-4-5", "blocks": [block, {"id": "q1", "tokens": 10}], "output_tokens": 5},
        {"timestamp": "1970-01-01T00:01:00Z", "blocks": [block, {"id": "q2", "tokens": 10}], "output_tokens": 5},
    ])
    r = cli("prompt-cost", path, "--model", "claude-sonnet-4-5", "-f", "json")
    assert r.exit_code == 0, r.stderr
    q = json.loads(r.stdout)["requests"]
    assert [(x["cache_creation_input_tokens"], x["cache_read_input_tokens"]) for x in q] == [(4000, 0), (0, 4000)]
    assert q[1]["timestamp"] == 60.0


@pytest.mark.parametrize("args, rows, expect", [
    (["--usage"], [{"model": "claude-nope-9", "usage": {"input_tokens": 1, "output_tokens": 1}}], "unknown model 'claude-nope-9'"),
    (["--usage"], [{"model": "claude-sonnet-4-5", "usage": {"input_tokens": 1, "output_tokens": 1}},
                   {"what": "ever"}], "r.jsonl:2: neither a response nor a usage object"),
    (["--usage"], [{"model": "claude-sonnet-4-5", "usage": {"input_tokens": -3, "output_tokens": 1}}],
     "r.jsonl:1: field 'usage.input_tokens': negative token count -3"),
    # (a counter past 64 bits reached the JSON output before: an internal error; past 32, no request holds it)
    (["--usage"], [{"model": "claude-sonnet-4-5", "usage": {"input_tokens": 2**40, "output_tokens": 1}}],
     "r.jsonl:1: field 'usage.input_tokens': a token count of 1.1e+12 is past the 2,147,483,647"),
    ([], [{"model": "claude-sonnet-4-5", "blocks": [{"id": "a", "tokens": 2000, "cache_control": {"type": "ephemeral"}}]},
          {"model": "claude-sonnet-4-5", "blocks": [{"id": "a", "tokens": 2000}]}], "r.jsonl:2: no timestamp"),
    ([], [{"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}],
     "r.jsonl:1: request bodies need token counts"),
])
def test_bad_input_exit_2(cli, write, args, rows, expect):
    path = jsonl(write, "r.jsonl", rows)
    r = cli("prompt-cost", *args, path) if args else cli("prompt-cost", path)
    assert r.exit_code == 2
    assert expect in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stdout == ""


def test_mode_usage_errors(cli):
    assert cli("prompt-cost").exit_code == 2
    r = cli("prompt-cost", "--prefix-tokens", "100")
    assert r.exit_code == 2 and "--model" in r.stderr


def test_prompt_cost_path_does_not_import_heavy_libraries():
    code = ("import sys\nfrom cachectl.cli import app\n"
            "try:\n    app(['prompt-cost', '--model', 'claude-sonnet-4-5', '--prefix-tokens', '5000', '--calls', '3',"
            " '--every', '1m'], prog_name='cachectl')\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(','.join(m for m in ('torch', 'transformers', 'sentence_transformers', 'tokenizers')"
            " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert "total $" in out.stdout
    assert out.stderr.strip() == ""


def test_tokenizer_estimate_for_bodies(cli, write):

    body = {"timestamp": 0, "model": "claude-sonnet-4-5",
            "system": [{"type": "text", "text": "You are a helpful assistant. " * 400, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "How do I reset my password?"}]}
    path = jsonl(write, "b.jsonl", [body, {**body, "timestamp": 30}])
    d = json.loads(cli("prompt-cost", path, "--tokenizer", TOK_DIR, "-f", "json").stdout)
    assert d["estimate"] is True and "estimate" in d["token_source"]
    first, second = d["requests"]
    assert first["cache_creation_input_tokens"] > 1024 and second["cache_read_input_tokens"] == first["cache_creation_input_tokens"]


# ------------------------------------------------------------------------------- real SDK over loopback


def _count(body: dict) -> int:
    """The fake service's token count: whitespace-separated pieces of the request's content."""
    parts = [body.get("tools"), body.get("system"), body.get("messages"), body.get("tool_choice")]
    return sum(len(json.dumps(p).split()) for p in parts if p is not None)


class _Handler(BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        auth = self.headers.get("authorization", "")
        key = self.headers.get("x-api-key") or (auth[len("Bearer "):] if auth.startswith("Bearer ") else None)
        type(self).seen.append({"path": self.path, "key": key, "body": body})
        if self.path != "/v1/messages/count_tokens":
            self.send_response(404)
            self.end_headers()
            return
        payload = json.dumps({"input_tokens": _count(body)}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def count_server():
    _Handler.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Handler.seen
    server.shutdown()
    server.server_close()


def test_count_with_api_uses_the_sdk_over_http(cli, write, count_server):
    url, seen = count_server
    system = [{"type": "text", "text": "word " * 3000, "cache_control": {"type": "ephemeral"}}]
    body = {"model": "claude-sonnet-4-5", "system": system,
            "messages": [{"role": "user", "content": "How do I reset my password?"}]}
    path = jsonl(write, "b.jsonl", [{**body, "timestamp": 0}, {**body, "timestamp": 60}])
    secret = "sk-test-not-a-real-key-123"
    r = cli("prompt-cost", path, "--count-with-api", "-f", "json",
            env={"ANTHROPIC_API_KEY": secret, "ANTHROPIC_BASE_URL": url})
    assert r.exit_code == 0, r.stderr
    assert secret not in r.stdout and secret not in r.stderr
    assert seen and all(s["path"] == "/v1/messages/count_tokens" and s["key"] == secret for s in seen)
    d = json.loads(r.stdout)
    filler = {"messages": [{"role": "user", "content": "."}]}
    at_system = _count({**filler, "system": system}) - _count(filler)
    total = _count(body)
    first, second = d["requests"]
    assert first["cache_creation_input_tokens"] == at_system
    assert first["input_tokens"] == total - at_system
    assert (second["cache_read_input_tokens"], second["input_tokens"]) == (at_system, total - at_system)
    assert d["estimate"] is True and "count_tokens" in d["token_source"]
    # memoized by prefix: the second, identical request asks nothing new
    assert len(seen) == 3  # the filler baseline, the cut at the system block, the full request


class _OddHandler(BaseHTTPRequestHandler):
    """A count_tokens service answering ``answer`` (the body's bytes), or a byte every 0.2 s without end."""

    answer: bytes | None = None

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["content-length"]))
        trickle = self.answer is None
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(10**6 if trickle else len(self.answer)))
        self.end_headers()
        if not trickle:
            self.wfile.write(self.answer)
            return
        with contextlib.suppress(OSError):
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("answer, says", [
    (b'{"input_tokens": -5000}', "answered input_tokens -5000, not a token count"),
    (b'{"input_tokens": 1e308}', "answered input_tokens 1e+308, not a token count"),
    (b'{"input_tokens": 99999999999999999999}', "answered input_tokens 99999999999999999999, not a token count"),
    (b'{"input_tokens": "12"}', "answered input_tokens '12', not a token count"),
    (b'{"input_tokens": true}', "answered input_tokens True, not a token count"),
    (b"{}", "answered input_tokens None, not a token count"),
    (b"not json", "answered what is not a token count (JSONDecodeError"),
    (None, "did not finish its answer within 6.5 s"),
])
def test_count_with_api_takes_only_a_token_count_and_waits_a_bounded_time(cli, write, answer, says):
    """The SDK's answer model takes any JSON value as input_tokens: a negative or huge count was priced (exit 0, $-0.015
    or $inf), a string or a missing one was an internal error; and its timeout bounds each read, so a server that
    sends its answer a byte at a time was waited on without end."""
    _OddHandler.answer = answer
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OddHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        path = jsonl(write, "b.jsonl", [{"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "x"}]}])
        t0 = time.monotonic()
        r = cli("prompt-cost", path, "--count-with-api", env={
            "ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}",
            "CACHECTL_API_TIMEOUT": "0.5"})
        assert r.exit_code == 2 and r.stdout == "", r.stdout
        assert r.stderr.count("\n") == 1 and "internal error" not in r.stderr and says in r.stderr, r.stderr
        assert time.monotonic() - t0 < 30
    finally:
        server.shutdown()
        server.server_close()


def test_count_with_api_needs_a_key(cli, write):
    path = jsonl(write, "b.jsonl", [{"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "x"}]}])
    r = cli("prompt-cost", path, "--count-with-api", env={"ANTHROPIC_API_KEY": "", "ANTHROPIC_AUTH_TOKEN": ""})
    assert r.exit_code == 2 and "ANTHROPIC_API_KEY" in r.stderr


def test_what_if_several_calls_need_every(cli):
    r = cli("prompt-cost", "--model", "claude-sonnet-4-5", "--prefix-tokens", "5000", "--calls", "3")
    assert r.exit_code == 2 and "--every" in r.stderr


@pytest.mark.parametrize("args,flag", [
    (["--prefix-tokens", "99999999999999999999"], "--prefix-tokens"),
    (["--prefix-tokens", "100", "--calls", "99999999999", "--every", "1s"], "--calls"),
    (["--prefix-tokens", "10000000", "--calls", "101", "--every", "1s"], "--calls x (--prefix-tokens"),
])
def test_a_what_if_too_large_to_simulate_is_one_line(cli, args, flag):
    """Sizes that once ran out of memory (the process killed, no message) are refused up front."""
    r = cli("prompt-cost", "-m", "gpt-4.1", *args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and flag in r.stderr and r.stdout == ""


def test_a_wrapped_response_takes_its_model_from_the_request_body(cli, write):
    """`{timestamp, body, usage}` lines name the model in the body: --usage needs no --model for them."""
    log = ROOT / "fixtures" / "prompts" / "anthropic_billed.jsonl"
    alone = cli("prompt-cost", "--usage", log, "-f", "json")
    assert alone.exit_code == 0, alone.stderr
    assert alone.stdout == cli("prompt-cost", "--usage", log, "-m", "claude-sonnet-4-5", "-f", "json").stdout
    assert json.loads(alone.stdout)["models"] == ["claude-sonnet-4-5"]
    bad = jsonl(write, "bad.jsonl", [{"body": {"model": 7}, "usage": {"input_tokens": 1, "output_tokens": 1}}])
    r = cli("prompt-cost", "--usage", bad)
    assert r.exit_code == 2 and "field 'body.model'" in r.stderr


def test_unknown_output_is_noted(cli, write):
    block = {"id": "sys", "tokens": 2000, "cache_control": {"type": "ephemeral"}}
    path = jsonl(write, "req.jsonl", [{"timestamp": 0, "model": "claude-sonnet-4-5", "blocks": [block]}])
    d = json.loads(cli("prompt-cost", path, "-f", "json").stdout)
    assert any("no output_tokens" in n for n in d["notes"])


@pytest.mark.parametrize("model", ["gpt-4.1", "claude-sonnet-4-5"])   # automatic caching, and breakpoints
def test_a_text_too_long_to_count_names_its_line(cli, write, monkeypatch, model):
    """A position's text past the tokenizer's bound, counted for the provider's cache: the error names the request's
    file and line (it named neither before; for Claude's breakpoints, until session 53)."""
    monkeypatch.setenv("CACHECTL_MAX_TOKENIZE_CHARS", "5000")
    body = {"model": model, "timestamp": 1, "messages": [{"role": "user", "content": "word " * 2000}]}
    first = {"model": model, "timestamp": 0, "messages": [{"role": "user", "content": "hi"}]}
    path = jsonl(write, "r.jsonl", [first, body])
    r = cli("prompt-cost", path, "-t", str(TOK_DIR))
    assert r.exit_code == 2 and "Traceback" not in r.stderr
    assert "r.jsonl:2: a prompt of 10,000 characters to tokenize" in r.stderr, r.stderr
