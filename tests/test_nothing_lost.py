"""Nothing lost (issue 27, items 1, 3 and 7): outputs never overwrite an input and are written whole or not at all,
text output shows input's control characters escaped, and the errors of the environment (the provider's API, the
disk, a pipe) are one line instead of the catch-all."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cachectl import outputs
from cachectl.errors import Interrupted, OutputError, printable

from .conftest import FIXTURES, PROMPTS, ROOT, TOK_DIR

LOG = PROMPTS / "demo_log.jsonl"
FIX_LOG = PROMPTS / "fix_log.jsonl"
TRACE = FIXTURES / "traces" / "rag.jsonl"
EVIL = "\x1b]0;pwned\x07\x1b[2J"        # retitle the terminal window, then clear the screen
EVIL_SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J"


def _run(*args: str, stdin=None, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cachectl", *map(str, args)], stdin=stdin, capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          timeout=timeout)


def _one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and stderr.startswith("cachectl: error: "), stderr
    assert "internal error" not in stderr and "Traceback" not in stderr
    return stderr


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".cachectl-tmp"))


# ------------------------------------------------------------------------- 1. never over an input of the run


def test_fix_out_on_stdin_s_file_is_refused_before_reading(tmp_path):
    log = tmp_path / "log.jsonl"
    shutil.copy(FIX_LOG, log)
    with open(log, "rb") as stdin:  # fix - -o LOG < LOG
        r = _run("fix", "-", "-o", log, stdin=stdin)
    assert r.returncode == 2
    assert f"--out {log} is the input log (stdin) (refusing to overwrite an input)" in _one_line(r.stderr)
    assert log.read_bytes() == FIX_LOG.read_bytes()
    # the same for report, whose stdin is spooled: the check comes first
    with open(log, "rb") as stdin:
        r = _run("report", "-", "-t", TOK_DIR, "--html", log, stdin=stdin)
    assert r.returncode == 2 and "(stdin)" in _one_line(r.stderr) and log.read_bytes() == FIX_LOG.read_bytes()


def test_hard_links_and_symlinks_to_the_input_are_refused(cli, tmp_path):
    log = tmp_path / "log.jsonl"
    shutil.copy(LOG, log)
    hard = tmp_path / "hard.jsonl"
    os.link(log, hard)
    soft = tmp_path / "soft.jsonl"
    soft.symlink_to(log)
    dotted = tmp_path / "sub" / ".." / "log.jsonl"
    (tmp_path / "sub").mkdir()
    for out in (log, hard, soft, dotted):
        for args in (["fix", log, "-o", out], ["report", log, "-t", TOK_DIR, "--html", out],
                     ["fix", soft, "-o", hard]):
            r = cli(*args)
            assert r.exit_code == 2 and "refusing to overwrite an input" in r.stderr, (args, r.stderr)
    r = cli("fix", log, "-o", hard)
    assert f"--out {hard} is the input log {log} (refusing to overwrite an input)" in r.stderr
    assert log.read_bytes() == LOG.read_bytes()


def test_the_tokenizer_template_and_prices_are_inputs_too(cli, tmp_path):
    tok = tmp_path / "tok"
    shutil.copytree(TOK_DIR, tok)
    template = tmp_path / "t.jinja"
    shutil.copy(FIXTURES / "chat_templates" / "Apertus-8B-Instruct.jinja", template)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {}}))
    before = {p: p.read_bytes() for p in [*tok.iterdir(), template, prices]}
    cases = [
        (["report", LOG, "-t", tok, "--html", tok / "tokenizer_config.json"], "a file of the tokenizer"),
        (["report", LOG, "-t", tok / "tokenizer_config.json", "--html", tok / "tokenizer.json"],
         "a file of the tokenizer"),
        (["fix", LOG, "-t", tok / "tokenizer.json", "-o", tok / "tokenizer.json"], "a file of the tokenizer"),
        (["fix", LOG, "-t", tok, "--chat-template", template, "-o", template], "the chat template"),
        (["report", LOG, "-t", tok, "--chat-template", template, "--html", template], "the chat template"),
        (["fix", LOG, "--prices", prices, "-o", prices], "the price file"),
        (["simulate-prefix", TRACE, "--sweep-capacity", "100,200", "--plot", TRACE], "the input trace"),
        (["simulate-prefix", LOG, "-t", tok, "--sweep-capacity", "100,200", "--plot", tok / "tokenizer.json"],
         "a file of the tokenizer"),
    ]
    for args, label in cases:
        r = cli(*args)
        assert r.exit_code == 2 and f"is {label}" in r.stderr and "refusing to overwrite" in r.stderr, \
            (args, r.stderr)
    assert {p: p.read_bytes() for p in before} == before


def test_refuse_inputs_unit(tmp_path):
    a = tmp_path / "a"
    a.write_text("x")
    outputs.refuse_inputs(str(tmp_path / "b"), "--out", [("the input log", str(a)), ("the config", None)])
    with pytest.raises(Exception, match=r"--out .*a is the config \(refusing"):
        outputs.refuse_inputs(str(a), "--out", [("the input log", str(tmp_path / "other")), ("the config", str(a))])
    assert outputs.resolves_to(str(tmp_path / "new"), str(tmp_path / "new"))  # the same path, not yet a file


# ------------------------------------------------------------------------------ 1. whole or not at all


def _failing_write(err: int, after: int = 1000):
    """os.write that writes ``after`` bytes, then fails with ``err`` (a disk that fills up mid-file)."""
    written = [0]

    def write(fd, data):
        if written[0] >= after:
            raise OSError(err, os.strerror(err))
        n = os.write(fd, bytes(data[:max(1, after - written[0])]))
        written[0] += n
        return n

    return write


@pytest.mark.parametrize("err, reason", [(errno.ENOSPC, "no space left on the device"),
                                         (errno.EIO, "input/output error"), (errno.EACCES, "permission denied")])
def test_a_write_error_leaves_the_old_file_and_no_temporary(monkeypatch, tmp_path, err, reason):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old content\n")
    monkeypatch.setattr(outputs, "_write", _failing_write(err))
    with pytest.raises(OutputError) as info:
        outputs.write_bytes(str(target), b"new line\n" * 100_000)
    assert str(info.value) == f"cannot write {target}: {reason} (nothing written: {target} is as it was)"
    assert target.read_bytes() == b"old content\n" and _leftovers(tmp_path) == []


def test_a_write_that_cannot_start_names_the_file(monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(outputs.tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError, match=r"cannot write .*out\.txt: permission denied"):
        outputs.write_text(str(tmp_path / "out.txt"), "x")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_mid_write_is_one_line_and_leaves_nothing(tmp_path):
    target = tmp_path / "out.txt"
    with pytest.raises(Interrupted) as info:
        with outputs.atomic_write(str(target)) as fh:
            fh.write(b"half")
            raise KeyboardInterrupt
    assert info.value.exit_code == 130 and "interrupted while writing" in str(info.value)
    assert not target.exists() and _leftovers(tmp_path) == []


def test_atomic_writes_keep_modes_links_and_devices(tmp_path):
    target = tmp_path / "t.j2"
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link.j2"
    link.symlink_to(target)
    outputs.write_text(str(link), "new")
    assert link.is_symlink() and target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640
    outputs.write_text(os.devnull, "discarded")  # a device is written in place, never replaced
    assert Path(os.devnull).is_char_device()
    fresh = tmp_path / "fresh.txt"
    outputs.write_text(str(fresh), "x")
    mask = os.umask(0)
    os.umask(mask)
    assert (fresh.stat().st_mode & 0o777) == 0o666 & ~mask and _leftovers(tmp_path) == []


def test_fix_report_lint_and_plot_on_a_full_disk(cli, monkeypatch, tmp_path):
    out = tmp_path / "fixed.jsonl"
    out.write_text("the previous output\n")
    page = tmp_path / "page.html"
    template = tmp_path / "tools.j2"
    shutil.copy(FIXTURES / "lint" / "bad" / "tools_tojson.j2", template)
    before = template.read_bytes()
    monkeypatch.setattr(outputs, "_write", _failing_write(errno.ENOSPC, after=100))
    for args, target in ((["fix", FIX_LOG, "-o", out], out), (["report", LOG, "-t", TOK_DIR, "--html", page], page),
                         (["lint", template, "--fix"], template),
                         (["simulate-prefix", TRACE, "--sweep-capacity", "100,200", "--plot", tmp_path / "p.png"],
                          tmp_path / "p.png")):
        r = cli(*args)
        assert r.exit_code == 2, (args, r.stderr)
        assert f"cachectl: error: cannot write {target}: no space left on the device" in _one_line(r.stderr)
    assert out.read_text() == "the previous output\n" and not page.exists() and template.read_bytes() == before
    assert not (tmp_path / "p.png").exists() and _leftovers(tmp_path) == []


def test_partitions_leave_nothing_when_the_trace_fails_midway(cli, tmp_path):
    pytest.importorskip("pyarrow")
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE.read_text() + '{"tokens": [1, "two"]}\n')
    parts = tmp_path / "parts"
    r = cli("simulate-prefix", trace, "--partition-dir", parts, "--replicas", "2", "--router", "round-robin")
    assert r.exit_code == 2 and "t.jsonl:121" in r.stderr
    assert not parts.exists()  # no partition, no temporary file, not even the directory it made
    ok = cli("simulate-prefix", TRACE, "--partition-dir", parts, "--replicas", "2", "--router", "round-robin")
    assert ok.exit_code == 0, ok.stderr
    assert sorted(p.name for p in parts.iterdir()) == ["manifest.json", "replica-00000.parquet",
                                                       "replica-00001.parquet"]


@pytest.mark.parametrize("sig, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_while_fix_writes_leaves_the_old_output(tmp_path, sig, code, word):
    log = tmp_path / "big.jsonl"
    pad = "x" * 250_000
    with open(log, "w") as fh:  # ~25 MB: the write takes long enough to be caught in the middle
        for i in range(100):
            fh.write(json.dumps({"session": f"s{i % 10}", "messages": [
                {"role": "system", "content": f"Current time: 2026-11-29T10:{i % 60:02d}:00Z. You are helpful."},
                {"role": "user", "content": pad + str(i)}]}) + "\n")
    out = tmp_path / "out.jsonl"
    for _attempt in range(4):
        out.write_text("the previous output\n")
        proc = subprocess.Popen([sys.executable, "-m", "cachectl", "fix", str(log), "--key", "session", "-o", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        caught = False
        while proc.poll() is None:
            if _leftovers(tmp_path):  # the temporary file exists: the write has begun
                proc.send_signal(sig)
                caught = True
                break
            time.sleep(0.0005)
        _, stderr = proc.communicate(timeout=120)
        assert _leftovers(tmp_path) == []
        if caught and proc.returncode == code:
            assert f"cachectl: error: {word} while writing {out}: nothing written" in stderr, stderr
            assert stderr.count("\n") == 1 and "Traceback" not in stderr
            assert out.read_text() == "the previous output\n"
            return
        # the signal came after the rename: the output is whole
        assert out.read_bytes().count(b"\n") == 100, stderr
    pytest.fail("the write was never caught in the middle")


def test_lint_fix_never_follows_a_symlink_out_of_its_tree(cli, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "tools.j2"
    shutil.copy(FIXTURES / "lint" / "bad" / "tools_tojson.j2", victim)
    before = victim.read_bytes()
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "escape.j2").symlink_to(victim)
    (tree / "linked_dir").symlink_to(outside, target_is_directory=True)
    inside = tree / "own.j2"
    shutil.copy(FIXTURES / "lint" / "bad" / "tools_tojson.j2", inside)
    (tree / "alias.j2").symlink_to(inside)  # a link that stays in the tree is followed
    r = cli("lint", tree, "--fix")
    assert victim.read_bytes() == before
    assert "tojson(sort_keys=true)" in inside.read_text() and (tree / "alias.j2").is_symlink()
    assert f"cachectl: note: {tree / 'escape.j2'}: a symlink to {victim}, outside {tree}: not fixed" in r.stderr
    assert "internal error" not in r.stderr
    # named itself, the file is the user's to fix
    cli("lint", victim, "--fix")
    assert "tojson(sort_keys=true)" in victim.read_text()


# ---------------------------------------------------------------------------- 3. text safe for terminals


def test_printable_is_the_one_escaping():
    assert printable(EVIL) == EVIL_SHOWN
    assert printable("a\tb\nc") == "a\tb\nc" and printable("a\tb\nc", newlines=False) == "a\\tb\\nc"
    assert printable("\x9b31m \x7f \u202e \x00") == "\\x9b31m \\x7f \\u202e \\x00"
    assert printable("plain é ␣ [bold]") == "plain é ␣ [bold]"


def _log_with_keys(tmp_path: Path, keys: dict) -> Path:
    log = tmp_path / "log.jsonl"
    lines = [json.loads(line) for line in LOG.read_text().splitlines()]
    log.write_text("".join(json.dumps({**d, "session": keys.get(d["session"], d["session"])}) + "\n" for d in lines))
    return log


def _safe(text: str) -> None:
    assert not any(c in text for c in "\x1b\x07\x9b"), repr(text)


def test_diff_tokens_log_and_report_escape_keys_and_keep_markup_as_text(cli, tmp_path):
    key = f"{EVIL}[bold]s2[/bold]"  # the conversation that loses tokens: report names it
    log = _log_with_keys(tmp_path, {"s1": "[red]s1[/]", "s2": key})
    shown = f"{EVIL_SHOWN}[bold]s2[/bold]"
    r = cli("diff-tokens", "--log", log, "--key", "session", "-t", TOK_DIR)
    assert r.exit_code == 1
    _safe(r.stdout)
    assert f"[{shown}]" in r.stdout and "[[red]s1[/]]" in r.stdout
    keys = [json.loads(x).get("key") for x in cli("diff-tokens", "--log", log, "--key", "session", "-t", TOK_DIR,
                                                    "-f", "json").stdout.splitlines()]
    assert key in keys  # JSON carries the value itself (escaped by JSON)
    r = cli("report", log, "--key", "session", "-t", TOK_DIR)
    _safe(r.stdout)
    assert f"worst conversations: {shown} (28 tokens)" in r.stdout  # (25 + the generation prompt)
    data = json.loads(cli("report", log, "--key", "session", "-t", TOK_DIR, "-f", "json").stdout)
    assert [w["key"] for w in data["worst"]] == [key]


def test_file_names_tenants_and_texts_are_escaped_in_every_text_renderer(cli, tmp_path):
    evil_dir = tmp_path / f"d{EVIL}"
    evil_dir.mkdir()
    log = evil_dir / "log.jsonl"
    shutil.copy(FIX_LOG, log)
    r = cli("fix", log)
    _safe(r.stdout)
    assert EVIL_SHOWN in r.stdout
    tok = evil_dir / "tok"
    shutil.copytree(TOK_DIR, tok)
    r = cli("prompt-cost", PROMPTS / "openai_requests.jsonl", "--tokenizer", tok)
    assert r.exit_code == 0, r.stderr
    _safe(r.stdout)
    assert "tokens from: tokenizer" in r.stdout and EVIL_SHOWN in r.stdout
    template = evil_dir / "tools.j2"
    shutil.copy(FIXTURES / "lint" / "bad" / "tools_tojson.j2", template)
    r = cli("lint", template)
    assert r.exit_code == 1
    _safe(r.stdout)
    assert EVIL_SHOWN in r.stdout
    trace = tmp_path / "tenants.jsonl"
    trace.write_text("".join(json.dumps({"tokens": list(range(i, i + 40)), "tenant": t}) + "\n"
                             for i, t in enumerate([EVIL, "[red]acme[/red]", EVIL, "[red]acme[/red]"])))
    r = cli("simulate-prefix", trace, "--tenant-field", "tenant", "--capacity-blocks", "50")
    assert r.exit_code == 0, r.stderr
    _safe(r.stdout)
    assert EVIL_SHOWN in r.stdout and "[red]acme[/red]" in r.stdout
    d = json.loads(cli("simulate-prefix", trace, "--tenant-field", "tenant", "--capacity-blocks", "50",
                       "-f", "json").stdout)
    assert {t["tenant"] for t in d["per_tenant"]} == {EVIL, "[red]acme[/red]"}  # JSON: the values themselves
    # an error that quotes the name escapes it too
    r = cli("fix", evil_dir / "missing.jsonl")
    assert r.exit_code == 2 and EVIL_SHOWN in r.stderr
    _safe(r.stderr)


def test_semantic_probe_pairs_escapes_the_texts(cli, tmp_path):
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"text_a": f"reset my password {EVIL}", "text_b": "[bold]reset[/bold] the password"}) + "\n")
    r = cli("semantic-probe", "pairs", pairs, "--threads", "1")
    assert r.exit_code == 0, r.stderr
    _safe(r.stdout)
    assert EVIL_SHOWN in r.stdout and "[bold]reset[/bold]" in r.stdout


# ------------------------------------------------------------------------------ 7. the catch-all never reached


class _ApiHandler(BaseHTTPRequestHandler):
    status = 200
    delay = 0.0

    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["content-length"]))
        if self.delay:
            time.sleep(self.delay)
        cls = type(self)
        body = {"input_tokens": 10} if cls.status == 200 else \
            {"type": "error", "error": {"type": "some_error", "message": f"status {cls.status}{EVIL}"}}
        payload = json.dumps(body).encode()
        try:
            self.send_response(cls.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.send_header("retry-after-ms", "1")  # the SDK's retries, at once
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout)
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def api_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    _ApiHandler.status, _ApiHandler.delay = 200, 0.0


@pytest.mark.parametrize("status, delay, says", [
    (401, 0, "refused the key (401 authentication error: status 401"),
    (403, 0, "(403 permission denied"),
    (429, 0, "rate limiting this key (429"),
    (500, 0, "failed (500 server error"),
    (529, 0, "is overloaded (529"),
    (None, 2.0, "did not answer in time (CACHECTL_API_TIMEOUT, 0.3 s): retry later"),
])
def test_count_with_api_errors_are_one_line_saying_what_to_do(cli, tmp_path, api_server, status, delay, says):
    pytest.importorskip("anthropic")
    _ApiHandler.status, _ApiHandler.delay = status or 200, delay
    body = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "How do I reset my password?"}]}
    log = tmp_path / "b.jsonl"
    log.write_text(json.dumps(body) + "\n")
    secret = "sk-test-not-a-real-key-456"
    r = cli("prompt-cost", log, "--count-with-api",
            env={"ANTHROPIC_API_KEY": secret, "ANTHROPIC_BASE_URL": api_server, "CACHECTL_API_TIMEOUT": "0.3"})
    assert r.exit_code == 2
    line = _one_line(r.stderr)
    assert says in line and secret not in line
    _safe(line)
    assert ("ANTHROPIC_API_KEY" in line) if status in (401, 403) else ("retry later" in line)


def test_count_with_api_refused_connection_is_one_line(cli, tmp_path):
    pytest.importorskip("anthropic")
    log = tmp_path / "b.jsonl"
    log.write_text(json.dumps({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "x"}]}) + "\n")
    r = cli("prompt-cost", log, "--count-with-api",
            env={"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
    assert r.exit_code == 2 and "cannot reach the Anthropic API" in _one_line(r.stderr)


def test_an_unknown_plot_format_is_one_line_before_any_work(cli, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out.xyz"
    r = cli("simulate-prefix", TRACE, "--sweep-capacity", "100,200", "--plot", out)
    assert r.exit_code == 2 and r.stdout == ""
    line = _one_line(r.stderr)
    assert f"--plot {out}: matplotlib cannot write .xyz files (formats: " in line and "png" in line and "svg" in line
    assert not out.exists()
    ok = cli("simulate-prefix", TRACE, "--sweep-capacity", "100,200", "--plot", tmp_path / "curve.svg")
    assert ok.exit_code == 0 and (tmp_path / "curve.svg").read_text().rstrip().endswith("</svg>")


def test_eio_on_read_is_one_line_naming_the_file():
    # /proc/self/mem answers a read at offset 0 with EIO: a real I/O error, no mock
    for args in (["fix", "/proc/self/mem"], ["prompt-cost", "/proc/self/mem"],
                 ["diff-tokens", "--log", "/proc/self/mem", "-t", TOK_DIR]):
        r = _run(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "/proc/self/mem: cannot read: input/output error" in _one_line(r.stderr)


def _report_json(stdout: str, name: str) -> dict:
    """The report's data with the log's name (in its source, notes and fixes) left out."""
    return json.loads(stdout.replace(json.dumps(name)[1:-1], "LOG"))


def test_report_reads_stdin_dev_stdin_and_a_named_pipe(tmp_path):
    want = _run("report", LOG, "--key", "session", "-t", TOK_DIR, "-f", "json")
    assert want.returncode == 1, want.stderr
    for name in ("-", "/dev/stdin"):  # cat LOG | cachectl report /dev/stdin
        cat = subprocess.Popen(["cat", str(LOG)], stdout=subprocess.PIPE)
        got = _run("report", name, "--key", "session", "-t", TOK_DIR, "-f", "json", stdin=cat.stdout)
        cat.wait()
        assert got.returncode == 1, got.stderr
        shown = "<stdin>" if name == "-" else name
        assert json.loads(got.stdout)["source"] == shown
        assert _report_json(got.stdout, shown) == _report_json(want.stdout, str(LOG))
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(LOG.read_bytes()), daemon=True)
    writer.start()
    got = _run("report", fifo, "--key", "session", "-t", TOK_DIR, "-f", "json", timeout=120)
    writer.join(10)
    assert got.returncode == 1, got.stderr
    assert _report_json(got.stdout, str(fifo)) == _report_json(want.stdout, str(LOG))
    # errors in a spooled log still name it, and the copy is gone
    bad = subprocess.Popen(["printf", '{"messages": 5}\\n'], stdout=subprocess.PIPE)
    r = _run("report", "/dev/stdin", "-t", TOK_DIR, stdin=bad.stdout)
    bad.wait()
    assert r.returncode == 2 and "/dev/stdin:1: field 'messages'" in _one_line(r.stderr)


def test_fix_names_the_first_bad_line(cli, tmp_path):
    lines = FIX_LOG.read_text().splitlines()
    log = tmp_path / "bad.jsonl"
    log.write_text("\n".join([*lines[:2], '{"messages": 5}', "not json", *lines[2:]]) + "\n")
    r = cli("fix", log)
    assert r.exit_code == 2 and f"{log}:3: field 'messages'" in _one_line(r.stderr)


def test_an_interrupt_as_the_rename_ends_says_the_file_is_written(tmp_path, monkeypatch):
    """A signal held back through the rename is raised once it is done: the message said "nothing written (as it
    was)" of a file written whole."""
    target = tmp_path / "out.txt"
    target.write_text("old")
    real = os.replace

    def replace(src, dst):
        real(src, dst)
        signal.raise_signal(signal.SIGINT)  # (held: raised after the rename, as a Ctrl-C at that instant is)

    monkeypatch.setattr(outputs.os, "replace", replace)
    with pytest.raises(Interrupted) as info:
        outputs.write_text(str(target), "new")
    assert info.value.exit_code == 130 and target.read_text() == "new"
    assert str(info.value) == f"interrupted once {target} was written: it is written whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
