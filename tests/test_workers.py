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


# ------------------------------------------------------------------------------ a sweep's items computed ahead


def _slow_square(i, s=0.0):
    time.sleep(s)
    return i * i


def _swept(w, n, fn, here):
    """What a sweep over ``Workers.ahead`` sees: each item's value, and where it was computed."""
    return [(v, at) for v, at in w.ahead(n, fn, here)]


@forks
def test_a_sweeps_items_come_in_order_computed_by_a_free_child_or_here():
    parent = os.getpid()
    with Workers(jobs=2) as w:
        got = _swept(w, 100, lambda i: (os.getpid(), i * i), lambda i: (os.getpid(), _slow_square(i, 0.02)))
        assert w._running == []  # (the child ended with the sweep)
    assert [v for (_, v), _ in got] == [i * i for i in range(100)]
    by_child = [pid for (pid, _), here in got if not here]
    assert by_child and parent not in by_child   # (this process was the slower: the child took items)
    assert all(pid == parent for (pid, _), here in got if here)


@forks
def test_while_the_child_computes_the_item_due_this_process_computes_the_next_ones():
    parent = os.getpid()
    with Workers(jobs=2) as w:
        got = _swept(w, 12, lambda i: _slow_square(i, 0.3), lambda i: _slow_square(i))
    assert [v for v, _ in got] == [i * i for i in range(12)]
    assert sum(here for _, here in got) >= 6 and os.getpid() == parent  # (the child took few: it is slow)


def _dies_at_3(parent, i):
    if os.getpid() != parent and i >= 3:
        os._exit(3)
    return _slow_square(i)


@forks
def test_a_child_that_dies_leaves_its_items_to_the_sweep_with_a_line():
    said: list[str] = []
    with Workers(jobs=2, say=said.append) as w:
        got = _swept(w, 30, lambda i, parent=os.getpid(): _dies_at_3(parent, i), lambda i: _slow_square(i, 0.05))
    assert [v for v, _ in got] == [i * i for i in range(30)]
    assert said == ["a worker process ended without its result (exit status 3); its part runs in this process"]


@forks
def test_a_sweep_that_stops_early_stops_its_child():
    with Workers(jobs=2) as w:
        t0 = time.monotonic()
        for k, (v, _) in enumerate(w.ahead(1000, lambda i: _slow_square(i, 0.05), lambda i: _slow_square(i, 0.05))):
            assert v == k * k
            if k == 3:
                break
        assert w._running == [] and time.monotonic() - t0 < 5


def test_with_one_job_or_a_child_running_every_item_is_computed_here():
    with Workers(jobs=1) as w:
        assert _swept(w, 5, lambda i: 1 / 0, _slow_square) == [(i * i, True) for i in range(5)]
    if workers.available_jobs() < 2:
        return
    with Workers(jobs=2) as w:
        busy = w.submit(_slow_square, 3, 0.5)  # (the other core is taken)
        assert _swept(w, 5, lambda i: 1 / 0, _slow_square) == [(i * i, True) for i in range(5)]
        assert busy.result() == 9


@forks
@pytest.mark.parametrize("command", ["report", "fix"])
def test_the_sweep_of_the_fixes_shares_its_batches_with_the_idle_child(cli, monkeypatch, tmp_path, command):
    """The sweep of the fixes' versions takes the renders and tokens of the batches a free child computed: the output
    is the one process's, byte for byte."""
    from cachectl.engines.repair import measure
    from cachectl.tokenization import TokenizerHandle

    monkeypatch.setattr(measure, "BATCH", 3)   # (60 lines: 20 batches; the child is forked after this)
    monkeypatch.setattr(measure, "SHARED_BATCH", 3)
    # (on a log this small the first child may still be running when the sweep starts: it is waited for; and the
    # batches this process computes itself are made slower, so that the child takes some)
    monkeypatch.setattr(Workers, "ahead", lambda self, *a, _a=Workers.ahead: [j._drain(None) for j in self._running]
                        and False or _a(self, *a))
    monkeypatch.setattr(measure, "tokenized_rows", lambda *a, _t=measure.tokenized_rows: time.sleep(0.05)
                        or _t(*a) if a[3] is None else _t(*a))
    received: list[int] = []
    monkeypatch.setattr(TokenizerHandle, "received",
                        lambda self, p, t, _r=TokenizerHandle.received: received.append(1) or _r(self, p, t))
    _alike_with_one_job_and_two(cli, tmp_path, command, received, least=1)


# ------------------------------------------------------------------------------ items computed beside, as they come


def _put_all(w, items, fn, here):
    """What a reader handing ``items`` to ``Workers.beside`` one at a time sees: (item, value, computed here)."""
    b = w.beside(fn, here)
    got = []
    for x in items:
        got += b.put(x)
    return got + b.close()


@forks
def test_items_put_come_back_in_order_computed_by_the_child_while_it_has_a_free_hand():
    parent = os.getpid()
    with Workers(jobs=2) as w:
        got = _put_all(w, range(60), lambda i: (os.getpid(), i * i),
                       lambda i: (os.getpid(), _slow_square(i, 0.02)))
        assert w._besides == []  # (its child ended with close)
    assert [x for x, _, _ in got] == list(range(60)) and [v for _, (_, v), _ in got] == [i * i for i in range(60)]
    by_child = [pid for _, (pid, _), here in got if not here]
    assert len(by_child) > 30 and parent not in by_child   # (this process is the slower: the child takes most)
    assert all(pid == parent for _, (pid, _), here in got if here)


@forks
def test_while_the_child_holds_two_items_the_next_ones_wait_and_are_computed_here_when_the_caller_waits():
    with Workers(jobs=2) as w:
        b = w.beside(lambda i: _slow_square(i, 0.5), _slow_square)
        first = [b.put(i) for i in range(4)]
        assert first == [[], [], [], []] and b.held == 4   # (two sent, two waiting)
        rest = b.close()
    assert [(x, v, here) for x, v, here in rest] == [(0, 0, False), (1, 1, False), (2, 4, True), (3, 9, True)]


@forks
def test_an_item_waiting_goes_to_the_child_once_it_has_a_free_hand():
    with Workers(jobs=2) as w:
        b = w.beside(lambda i: _slow_square(i, 0.2), lambda i: _slow_square(i, 5))
        assert [b.put(i) for i in range(3)] == [[], [], []]   # (two sent, one waiting)
        time.sleep(1.0)   # (the caller's own work: the child ends both meanwhile)
        assert b.put(3) == [(0, 0, False), (1, 1, False)]
        assert b.close() == [(2, 4, False), (3, 9, False)]   # (neither waited to be computed here)


@forks
def test_an_item_put_while_four_wait_waits_for_the_first():
    with Workers(jobs=2) as w:
        b = w.beside(lambda i: _slow_square(i, 0.3), _slow_square)
        got = [b.put(i) for i in range(5)]
        assert got == [[], [], [], [], [(0, 0, False)]] and b.held == workers.HELD  # (no more held than that)
        assert [x for x, _, _ in b.close()] == [1, 2, 3, 4]


def _fails_on_2(parent, i):
    if os.getpid() != parent and i == 2:
        raise InputError("only the child fails here", source="x", line=i)
    return i * i


@forks
@pytest.mark.parametrize("how", ["fails", "dies"])
def test_an_item_the_child_fails_on_or_dies_at_is_computed_here(how):
    """A child's error on an item leaves that item to this process, without a line; a child that dies leaves it the
    rest of the items, with one line."""
    said: list[str] = []
    child = _fails_on_2 if how == "fails" else _dies_at_3
    with Workers(jobs=2, say=said.append) as w:
        got = _put_all(w, range(20), lambda i, parent=os.getpid(): child(parent, i), lambda i: _slow_square(i, 0.05))
        assert w._besides == []
    assert [(x, v) for x, v, _ in got] == [(i, i * i) for i in range(20)]
    here = {x for x, _, h in got if h}
    if how == "fails":
        assert 0 not in here and said == []  # (the first item goes to the child)
    else:
        assert set(range(3, 20)) <= here
        assert said == ["a worker process ended without its result (exit status 3); its part runs in this process"]


@forks
def test_closing_the_workers_kills_the_child_of_items_put():
    with Workers(jobs=2) as w:
        b = w.beside(lambda i: _slow_square(i, 30), _slow_square)
        b.put(1)
        pid = next(iter(b._executor._processes))
    assert w._besides == []
    with pytest.raises(ProcessLookupError):
        for _ in range(50):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_with_one_job_every_item_is_computed_here_as_it_is_put():
    with Workers(jobs=1) as w:
        b = w.beside(lambda i: 1 / 0, _slow_square)
        assert [b.put(i) for i in range(3)] == [[(i, i * i, True)] for i in range(3)] and b.close() == []


@forks
def test_while_another_child_runs_items_wait_and_the_child_forks_once_its_core_is_free():
    with Workers(jobs=2) as w:
        busy = w.submit(_slow_square, 3, 0.6)  # (the other core is taken)
        b = w.beside(lambda i: i * i, lambda i: _slow_square(i, 0.01))
        got = [x for i in range(5) for x in b.put(i)]
        assert got == [(0, 0, True)] and w._besides == []  # (four held: the fifth put has the first computed here)
        assert busy.result() == 9
        got += b.put(5) + b.close()
    assert [(x, v) for x, v, _ in got] == [(i, i * i) for i in range(6)]
    assert not got[1][2]  # (the oldest item waiting went to a child of its own once the other ended)


@forks
@pytest.mark.parametrize("command", ["report", "fix"])
def test_the_first_read_has_its_batches_tokenized_by_a_child(cli, monkeypatch, tmp_path, command):
    """The lines' first read hands its batches of prompts to a child as it reads on: the output is the one process's,
    byte for byte."""
    from cachectl.engines.prefix.forks import requests
    from cachectl.tokenization import TokenizerHandle

    monkeypatch.setattr(requests, "BESIDE_BATCH", 3)   # (60 lines: 20 batches)
    monkeypatch.setattr(requests.ForkRecords, "_tokenized", lambda self, p, _t=requests.ForkRecords._tokenized:
                        time.sleep(0.05) or _t(self, p))  # (this process is the slower: the child takes batches)
    received: list[int] = []
    monkeypatch.setattr(TokenizerHandle, "received",
                        lambda self, p, t, _r=TokenizerHandle.received: received.append(1) or _r(self, p, t))
    _alike_with_one_job_and_two(cli, tmp_path, command, received, least=21)  # (the sweep's one batch: not shared)


def _alike_with_one_job_and_two(cli, tmp_path, command, received, least):
    """``command`` on the 60-line fixture log with one job, then two: the same output byte for byte, and at least
    ``least`` prompts (``received``: counted as they come) from a child with two jobs only."""
    path = PROMPTS / "shared_prefix_log.jsonl"
    outs = []
    for jobs in ("1", "2"):
        extra = ["--unsafe-fixes", "-o", tmp_path / f"fixed{jobs}.jsonl"] if command == "fix" else []
        r = cli(command, path, "-t", TOK_DIR, "-f", "json", "--jobs", jobs, *extra)
        assert r.exit_code in (0, 1), r.stderr
        outs.append((r.exit_code, r.stdout.replace(str(tmp_path / f"fixed{jobs}.jsonl"), "OUT"), r.stderr,
                     (tmp_path / f"fixed{jobs}.jsonl").read_bytes() if extra else b""))
        assert (len(received) >= least) == (jobs == "2")
    assert outs[0] == outs[1]


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
