"""Bad input to the log readers of every shape: a stream that never ends a line is refused promptly and in
bounded memory (never held whole), a file in no known shape names what cachectl reads, a file that one shape
almost fits names that shape and what it lacks, and with several bad lines the first is the one named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .conftest import ROOT

TOK = str(ROOT / "fixtures" / "tok")
GIB = 1 << 30


def _run_fed(args: list[str], total: int) -> tuple[int, str, float, int]:
    """Run cachectl with ``total`` bytes of one unended line on stdin (written until the reader stops reading);
    ``(exit code, stderr, seconds, the child's peak RSS in bytes)``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CACHECTL_DEBUG", None)
    start = time.monotonic()
    # the command in a process that says its own peak RSS as it exits (a last stderr line, taken off below):
    # VmHWM, the high-water mark of its own memory (ru_maxrss would count the forking parent's RSS: Linux keeps it
    # across exec)
    code = ("import atexit, sys\n"
            "def peak():\n"
            "    hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]\n"
            "    sys.stderr.write('PEAK %s\\n' % hwm)\n"
            "atexit.register(peak)\n"
            "from cachectl.cli import main\n"
            f"sys.argv = ['cachectl', *{args!r}]\n"
            "main()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)
    assert proc.stdin is not None
    chunk = b'{"body": {"messages": [{"role": "user", "content": "' + b"x" * (1 << 20)
    sent = 0
    try:
        while sent < total:
            proc.stdin.write(chunk)
            sent += len(chunk)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    _, raw = proc.communicate(timeout=120)
    seconds = time.monotonic() - start
    lines = raw.decode().splitlines()
    assert lines and lines[-1].startswith("PEAK "), raw[-2000:]
    peak = int(lines[-1].split()[1]) * 1024  # kB
    return proc.returncode, "\n".join(lines[:-1]) + "\n", seconds, peak


@pytest.mark.parametrize("command", [["prompt-cost", "-", "-t", TOK], ["report", "-", "-t", TOK],
                                     ["simulate-prefix", "-", "--policy", "infinite"]],
                         ids=["prompt-cost", "report", "simulate-prefix"])
def test_a_line_that_never_ends_is_refused_without_reading_it_whole(command):
    code, err, seconds, peak = _run_fed(command, 1 * GIB)
    assert code == 2, err
    assert err.startswith("cachectl: error: <stdin>") and "a line over 64 MiB" in err and len(err.splitlines()) == 1
    assert "Traceback" not in err
    # a reader that held the line would hold 1 GiB; the bound is 64 MiB (and the interpreter, tokenizers, torch-free)
    assert peak < 600 * 2**20, f"peak RSS {peak / 2**20:.0f} MiB"
    assert seconds < 60


def test_a_file_in_no_known_shape_lists_the_shapes(cli, write):
    r = cli("prompt-cost", write("notes.txt", "just some notes\nnot a log at all\n"), "-t", TOK)
    assert r.exit_code == 2
    assert "not a log shape cachectl reads (it reads: " in r.stderr and "litellm" in r.stderr and "vcr" in r.stderr
    assert "notes.txt:1" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_file_one_shape_almost_fits_names_it_and_what_it_lacks(cli, write):
    lines = [{"sessionId": "s1", "uuid": f"u{i}", "message": {"role": "user", "content": "hi"}} for i in range(3)]
    r = cli("report", write("t.jsonl", "".join(json.dumps(x) + "\n" for x in lines)), "-t", TOK)
    assert r.exit_code == 2
    assert "looks like Claude Code session transcripts but" in r.stderr and "`type`" in r.stderr


def test_with_several_bad_lines_the_first_is_named(cli):
    """A LiteLLM log whose lines 3 and 5 are broken: the error names line 3."""
    src = (ROOT / "fixtures" / "logs" / "litellm_payloads.jsonl").read_text(encoding="utf-8").splitlines()
    good = src[0]
    lines = [good, good, '{"call_type": "completion", "startTime": 1, "messages": "oops"', good, "{not json", good]
    path = ROOT / "fixtures" / "logs" / "litellm_payloads.jsonl"
    assert path.is_file()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "bad.jsonl")
        with open(log, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        r = cli("prompt-cost", log, "-t", TOK)
    assert r.exit_code == 2
    assert f"{log}:3" in r.stderr and ":5" not in r.stderr
