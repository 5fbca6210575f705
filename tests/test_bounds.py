"""Resource bounds of the whole-log commands, each run in its own process: a huge message or prompt file is
refused in one line before it costs gigabytes, the before/after measure of ``fix`` no longer keeps a full
encoding per line (peak RSS per request, measured), and progress shows on a terminal and never on a pipe."""

from __future__ import annotations

import json
import os
import pty
import resource
import subprocess
import sys
import time

import pytest

from .conftest import ROOT, TOK_DIR

ENV = {**{k: v for k, v in os.environ.items() if k not in ("CI", "FORCE_COLOR", "FORCE_TERMINAL")},
       "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", "COLUMNS": "120"}

sys.path.insert(0, str(ROOT / "bench"))
from bench_log_memory import make_log  # noqa: E402


def run(args: list[str], limit_mb: int | None = None) -> tuple[int, str, int]:
    """Exit code, stderr and peak RSS (bytes) of ``cachectl ARGS`` in its own process (under an address-space
    limit when ``limit_mb``)."""

    def limit() -> None:
        if limit_mb is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_mb * 2**20, limit_mb * 2**20))

    proc = subprocess.Popen([sys.executable, "-m", "cachectl", *args], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=limit)
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    return os.waitstatus_to_exitcode(status), err, usage.ru_maxrss * 1024


def test_a_huge_message_is_refused_in_one_line_within_bounded_memory(tmp_path):
    log = tmp_path / "big.jsonl"
    big = ("cache block prefix " * 200_000)[:3_000_000]
    log.write_text(json.dumps({"timestamp": 1.0, "body": {"model": "gpt-4.1", "messages": [
        {"role": "user", "content": big}]}}) + "\n")
    code, err, peak = run(["prompt-cost", str(log), "-t", str(TOK_DIR)], limit_mb=3000)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "3,000,000 characters" in lines[0] and "2,097,152" in lines[0]
    assert peak < 400 * 2**20


def test_a_huge_prompt_file_is_refused_before_it_is_read(tmp_path):
    body = tmp_path / "body.json"
    with body.open("w") as fh:
        fh.write('{"model": "gpt-4.1", "messages": [{"role": "user", "content": "')
        fh.write("x" * (33 * 2**20))
        fh.write('"}]}')
    code, err, peak = run(["diff-tokens", str(body), str(body), "-t", str(TOK_DIR)], limit_mb=2000)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "bytes" in err, err
    assert peak < 250 * 2**20


def test_fix_keeps_no_encoding_per_line(tmp_path):
    """Peak RSS of `fix` grows with the log by much less than the ~150 KB per request it took when every
    line's encoding (and a list copy of its IDs) was kept for the before/after measure."""
    peaks = {}
    for n in (100, 700):
        log = tmp_path / f"log{n}.jsonl"
        make_log(log, n)
        code, err, peak = run(["fix", str(log), "-t", str(TOK_DIR), "--format", "json"])
        assert code in (0, 1), err
        peaks[n] = peak
    per_request = (peaks[700] - peaks[100]) / 600
    assert per_request < 120_000, per_request  # measured: 177 KB before, 77 KB now


def _progress_output(args: list[str], tty: bool) -> str:
    if not tty:
        proc = subprocess.run([sys.executable, "-m", "cachectl", *args], cwd=ROOT, env=ENV, capture_output=True)
        return proc.stderr.decode(errors="replace")
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "cachectl", *args], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=slave)
    os.close(slave)
    out = b""
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        out += chunk
    proc.wait()
    os.close(master)
    return out.decode(errors="replace")


@pytest.mark.parametrize("command", ["prompt-cost", "fix", "report"])
def test_progress_shows_on_a_terminal_and_not_on_a_pipe(tmp_path, command):
    log = tmp_path / "log.jsonl"
    make_log(log, 1500 if command == "prompt-cost" else 300)
    args = [command, str(log), "-t", str(TOK_DIR), "--format", "json"]
    label = {"prompt-cost": "prompt-cost: requests", "fix": "fix: lines read", "report": "report: lines read"}[command]
    assert label in _progress_output(args, tty=True)
    assert _progress_output(args, tty=False) == ""
