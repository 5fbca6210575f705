"""cachectl/workers.py: a part computed in a forked child gives what it gives in one process; its error, its
progress and its death reach the parent; the spools, the render watchdog and the tokenizers' thread pool are the
child's own. Then ``report`` and ``fix`` give the same output, byte for byte, with one process and with two."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from cachectl import sandbox, workers
from cachectl.errors import InputError
from cachectl.spool import Spool
from cachectl.workers import Workers

from .conftest import PROMPTS, TOK_DIR

forks = pytest.mark.skipif(workers.available_jobs() < 2, reason="one core, or no os.fork: every part runs here")


def _pid_and(x):
    return os.getpid(), x * 2


@forks
def test_a_part_runs_in_a_child_and_its_value_comes_back():
    with Workers(jobs=2) as w:
        job = w.submit(_pid_and, 21)
        pid, value = job.result()
    assert value == 42 and pid != os.getpid()


def test_with_one_job_a_part_runs_here_when_its_result_is_asked_for():
    calls = []
    with Workers(jobs=1) as w:
        job = w.submit(lambda: calls.append(1) or os.getpid())
        assert calls == []
        assert job.result() == os.getpid() and job.result() == os.getpid() and calls == [1]


def _bad_line():
    raise InputError("not JSON", source="log.jsonl", line=7, field="body")


@forks
def test_a_childs_error_is_raised_in_the_parent_with_its_line():
    with Workers(jobs=2) as w:
        job = w.submit(_bad_line)
        with pytest.raises(InputError) as err:
            job.result()
    assert str(err.value) == "log.jsonl:7: field 'body': not JSON"


@forks
def test_a_child_that_dies_has_its_part_run_in_the_parent_with_a_line():
    parent = os.getpid()

    def die_in_child():
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return "computed here"

    said = []
    with Workers(jobs=2, say=said.append) as w:
        assert w.submit(die_in_child).result() == "computed here"
    assert said == ["a worker process ended without its result (signal 9); its part runs in this process"]


@forks
def test_a_childs_progress_reaches_the_parent():
    got = []
    with Workers(jobs=2, progress=got.append) as w:
        def work():
            for _ in range(200):
                w.tick(1)
                time.sleep(0.005)  # 1 s in all: more than one message (one each TICK_S)
            return "done"

        assert w.submit(work).result() == "done"
    assert sum(got) == 200 and len(got) >= 2


@forks
def test_closing_the_workers_kills_a_running_child():
    w = Workers(jobs=2)
    job = w.submit(time.sleep, 60)
    pid = job.pid
    assert pid is not None
    w.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@forks
def test_a_child_appends_to_a_spool_of_its_own():
    spool = Spool()
    spool.put("before the fork")
    go = os.pipe()

    def child_writes():
        os.read(go[0], 1)  # after the parent's own write, at the same offset the child would use
        k = spool.put("the child's")
        return spool.get(0), spool.get(k)

    with Workers(jobs=2) as w:
        job = w.submit(child_writes)
        mine = spool.put("the parent's")
        os.write(go[1], b"x")
        assert job.result() == ("before the fork", "the child's")
    assert spool.get(0) == "before the fork" and spool.get(mine) == "the parent's"
    os.close(go[0])
    os.close(go[1])


def _render(source, seconds=10.0):
    from cachectl.tokenization import template_environment

    with sandbox.budget(sandbox.RenderBudget(seconds, 256 * 2 ** 20)):
        return template_environment().from_string(source).render()


@forks
def test_the_render_watchdog_and_the_tokenizer_work_in_a_child():
    from cachectl.tokenization import load_tokenizer

    tok = load_tokenizer(str(TOK_DIR))
    here = _render("{{ 'ab' * 3 }}")  # the watchdog thread is running in the parent now
    assert sandbox._WATCHDOG._thread is not None and sandbox._WATCHDOG._thread.is_alive()
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    texts = [f"question {i} about caches" for i in range(300)]
    with Workers(jobs=2) as w:
        there = w.submit(lambda: (_render("{{ 'ab' * 3 }}"), [e.ids for e in tok.backend.encode_batch(texts)],
                                  os.environ.get("TOKENIZERS_PARALLELISM"))).result()
    assert there[0] == here == "ababab"
    assert there[1] == [e.ids for e in tok.backend.encode_batch(texts)]
    assert there[2] == "false" and os.environ.get("TOKENIZERS_PARALLELISM") == before


@forks
def test_a_render_over_budget_in_a_child_is_stopped_by_the_childs_watchdog():
    _render("{{ 1 }}")  # (the parent's watchdog is running at the fork)
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    t0 = time.monotonic()
    with Workers(jobs=2) as w:
        with pytest.raises(sandbox.RenderBudgetExceeded, match="past its budget of 0.3 s"):
            w.submit(_render, loop, 0.3).result()
    assert time.monotonic() - t0 < 5


# ------------------------------------------------------------------------------ the commands, one job and two


@forks
@pytest.mark.parametrize("log", ["agent_log.jsonl", "shared_prefix_log.jsonl", "three_apps_log.jsonl",
                                 "fix_log.jsonl"])
def test_report_is_the_same_with_one_process_and_with_two(cli, log):
    path = PROMPTS / log
    if not path.exists():
        pytest.skip(f"no {log}")
    one = cli("report", path, "-t", TOK_DIR, "-f", "json", "--jobs", "1")
    two = cli("report", path, "-t", TOK_DIR, "-f", "json", "--jobs", "2")
    assert one.stderr == two.stderr
    assert one.exit_code == two.exit_code and one.exit_code in (0, 1)
    assert one.stdout == two.stdout and json.loads(two.stdout)["fixes"]["columns"]


@forks
@pytest.mark.parametrize("command", ["report", "fix"])
def test_the_child_takes_the_token_ids_the_first_read_packed(cli, monkeypatch, tmp_path, command):
    """With two processes the child measures the log as it is with the token IDs the first read packed for the fork
    analysis: it renders and tokenizes no prompt of the log again (before, it rendered every line a second time);
    this process tokenizes what one process tokenizes. The output is the one process's."""
    from cachectl import tokenization

    asked = tmp_path / "asked"   # (the prompts tokenized, a line per call: "child N" or "main N")

    def later(self, prompts, *a, _later=tokenization.TokenizerHandle.tokenize_later, **k):
        with asked.open("a") as fh:
            fh.write(f"{'child' if workers.in_child() else 'main'} {len(prompts)}\n")
        return _later(self, prompts, *a, **k)

    monkeypatch.setattr(tokenization.TokenizerHandle, "tokenize_later", later)

    def run(jobs: str) -> tuple[str, dict[str, int]]:
        asked.unlink(missing_ok=True)
        extra = ["--unsafe-fixes"] if command == "fix" else []
        r = cli(command, PROMPTS / "agent_log.jsonl", "-t", TOK_DIR, "-f", "json", *extra, "--jobs", jobs)
        assert r.exit_code == 1, r.stderr
        got = {"child": 0, "main": 0}
        for row in asked.read_text().split("\n") if asked.exists() else ():
            if row:
                who, n = row.split()
                got[who] += int(n)
        return r.stdout, got

    one, in_one = run("1")
    two, in_two = run("2")
    lines = len((PROMPTS / "agent_log.jsonl").read_text(encoding="utf-8").splitlines())
    assert one == two
    assert in_one["child"] == 0 and in_one["main"] >= lines
    assert in_two == {"child": 0, "main": in_one["main"]}


@forks
def test_fix_is_the_same_with_one_process_and_with_two(cli, tmp_path):
    path = PROMPTS / "agent_log.jsonl"
    outs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"fixed{jobs}.jsonl"
        r = cli("fix", path, "-t", TOK_DIR, "--unsafe-fixes", "-o", out, "-f", "json", "--jobs", jobs)
        assert r.exit_code == 1, r.stderr
        outs.append((r.stdout.replace(str(out), "OUT"), out.read_bytes()))
    assert outs[0] == outs[1] and json.loads(outs[1][0])["per_cause"]


@forks
def test_a_child_forked_while_the_watchdog_holds_its_lock_still_renders():
    """The watchdog's lock, held by another thread at the fork, stays held in the child: the child makes its own."""
    _render("{{ 1 }}")
    with sandbox._WATCHDOG._cond:  # (what the watchdog thread does many times a second while a render runs)
        w = Workers(jobs=2)
        job = w.submit(_render, "{{ 'ab' * 3 }}")
    if not job.wait(20):
        w.close()
        pytest.fail("the child hangs on the lock it inherited")
    assert job.result() == "ababab"
    w.close()


@forks
def test_a_child_dies_with_its_parent(tmp_path):
    """A parent killed outright (SIGKILL: no handler runs) leaves no child computing on."""
    import subprocess
    import sys

    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys, time\n"
        "from cachectl.workers import Workers\n"
        "w = Workers(jobs=2)\n"
        "job = w.submit(time.sleep, 60)\n"
        "print(job.pid, flush=True)\n"
        "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":  # (dead, not yet reaped by its new parent)
                    return
        except OSError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the child outlived its parent")


@forks
@pytest.mark.parametrize("hook", ["after_in_parent", "after_in_child"])
def test_an_interrupt_during_the_fork_is_not_lost_in_its_hooks(tmp_path, hook):
    """A Ctrl-C that reached the fork's own hooks (threading's, logging's, the interpreter's: in the parent or in
    the child before it set its handlers) was printed as "Exception ignored" and lost: `fix -o` went on to write
    the log and exit 1, or a child stayed stuck before its first call. The signals are held through the fork: the
    parent raises it once the child is known (and killed), a child starting goes on."""
    import subprocess
    import sys

    script = tmp_path / "fork.py"
    script.write_text(
        "import operator, os, signal, time\n"
        "from cachectl.workers import Workers\n"
        "fired = []\n"
        "def hook():\n"
        "    if not fired:\n"
        "        fired.append(1)\n"
        "        signal.raise_signal(signal.SIGINT)\n"
        f"os.register_at_fork({hook}=hook)\n"
        "try:\n"
        "    with Workers(jobs=2) as w:\n"
        "        job = w.submit(operator.add, 40, 2)\n"
        "        print('result', job.result(), flush=True)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert run.stdout == ("interrupted\n" if hook == "after_in_parent" else "result 42\n")
    assert run.stderr == ""
