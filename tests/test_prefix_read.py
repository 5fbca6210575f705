"""Reading and keying a trace in forked workers gives what one process reads: the same replay, the same
curve, the same first error at the same line."""

from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines.prefix import read as prefix_read
from cachectl.engines.prefix.curve import capacity_curve, key_trace
from cachectl.engines.prefix.pools import CapacityError
from cachectl.engines.prefix.read import KeyedTrace, can_read_in_parallel
from cachectl.engines.prefix.replay import simulate
from cachectl.engines.prefix.trace import iter_trace, trace_records
from cachectl.errors import CachectlError, InputError
from cachectl.inputs.files import JsonlChunks

OPTS = {"salt_field": None, "tenant_field": None, "hash_block_size": 4, "no_salt": False}


def sequential(path, **opts):
    return iter_trace(trace_records(str(path)), source=str(path), **{**OPTS, **opts})


def parallel(path, bs, jobs=3, chunk=64, hash_fn="builtin", **opts):
    return KeyedTrace(JsonlChunks(str(path), chunk, chunk // 4), block_size=bs, hash_fn=hash_fn, jobs=jobs,
                      **{**OPTS, **opts})


def lines_of(trace, salts, blanks, bom, mooncake_every):
    """JSONL lines: token requests (some salted, with timestamps and outputs), blank lines, Mooncake lines."""
    out = []
    for i, t in enumerate(trace):
        rec: dict = {"tokens": t}
        if salts[i % len(salts)] is not None:
            rec["salt"] = salts[i % len(salts)]
        if i % 3 == 0:
            rec["timestamp"] = float(i)
            rec["output_tokens"] = i % 5
        if mooncake_every and i % mooncake_every == 1:
            n = -(-len(t) // 4)
            rec = {"input_length": len(t), "hash_ids": list(range(i * 100, i * 100 + n)), "timestamp": i}
        out.append(json.dumps(rec))
        if blanks and i % blanks == 0:
            out.append("   ")
    text = "\n".join(out) + ("\n" if len(trace) % 2 else "")
    return ("\ufeff" if bom else "") + text


tokens = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=30)


@given(tokens, st.lists(st.sampled_from([None, "a", "b"]), min_size=1, max_size=5), st.integers(0, 4),
       st.booleans(), st.integers(0, 5), st.sampled_from([8, 48, 200, 10_000]), st.integers(1, 4),
       st.sampled_from([2, 4]))
@settings(max_examples=40, deadline=None)
def test_parallel_replay_equals_one_process(tmp_path_factory, trace, salts, blanks, bom, mooncake, chunk, jobs, bs):
    path = tmp_path_factory.mktemp("t") / "trace.jsonl"
    path.write_text(lines_of(trace, salts, blanks, bom, mooncake if bs == 4 else 0), encoding="utf-8")
    need = max(-(-len(t) // bs) for t in trace)
    for cap in (need, need + 3, 4 * need + 10):
        one = simulate(sequential(path), block_size=bs, capacity_blocks=cap, per_request=True)
        many = simulate(parallel(path, bs, jobs, chunk), block_size=bs, capacity_blocks=cap, per_request=True)
        assert many == one
    one_inf = simulate(sequential(path), policy="infinite", block_size=bs)
    assert simulate(parallel(path, bs, jobs, chunk), policy="infinite", block_size=bs) == one_inf
    # the curve: the keyed trace is the same, so every point is
    a = key_trace(sequential(path), [bs])[bs]
    b = key_trace(parallel(path, bs, jobs, chunk), [bs])[bs]
    assert [(r.line, r.prompt_tokens, list(r.hash_ids)) for r in a.requests] == \
        [(r.line, r.prompt_tokens, list(r.hash_ids)) for r in b.requests]
    assert capacity_curve(a, None, points=6) == capacity_curve(b, None, points=6)


def test_sha256_keys_and_tenants_cross_processes(tmp_path):
    rng = random.Random(3)
    base = [rng.randrange(50) for _ in range(64)]
    lines = [json.dumps({"tokens": base + [rng.randrange(50) for _ in range(rng.randrange(40))],
                         "user": {"id": f"u{i % 3}"}, "salt": f"s{i % 2}"}) for i in range(300)]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    opts = {"tenant_field": "user.id"}
    for hash_fn in ("builtin", "sha256"):
        one = simulate(sequential(path, **opts), block_size=16, capacity_blocks=40, hash_fn=hash_fn)
        many = simulate(parallel(path, 16, 2, 2000, hash_fn=hash_fn, **opts), block_size=16, capacity_blocks=40,
                        hash_fn=hash_fn)
        assert many == one and one.hit_tokens > 0 and len(one.per_tenant) == 3


@pytest.mark.parametrize("bad", [
    '{"tokens": [1, true]}', '{"tokens": [1, -2]}', '{"tokens": []}', "not json", '{"prompt": "needs a tokenizer"}',
    '{"tokens": [1], "timestamp": "noon"}', '{"input_length": 9, "hash_ids": [1]}', "[1, 2]",
])
@pytest.mark.parametrize("where", [0, 37, 199])
def test_the_same_first_error_at_the_same_line(tmp_path, bad, where):
    lines = [json.dumps({"tokens": list(range(i % 20 + 1))}) for i in range(200)]
    lines[where] = bad
    lines[where + 1 if where + 1 < 200 else 0] = bad  # a second bad line later: the first one is reported
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as one:
        simulate(sequential(path), block_size=4, capacity_blocks=100)
    with pytest.raises(InputError) as many:
        simulate(parallel(path, 4, 3, 300), block_size=4, capacity_blocks=100)
    assert str(many.value) == str(one.value)
    assert f":{min(where, (where + 1) % 200) + 1}:" in str(one.value)


def test_an_earlier_capacity_error_comes_before_a_later_bad_line(tmp_path):
    lines = [json.dumps({"tokens": list(range(8))})] * 50 + [json.dumps({"tokens": list(range(80))})] + \
        ["{broken"] * 3
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines))
    for reqs in (sequential(path), parallel(path, 4, 2, 100)):
        with pytest.raises(CapacityError, match=":51: a request of 80 tokens"):
            simulate(reqs, block_size=4, capacity_blocks=10)
    assert _children() == []  # the workers were ended, not left behind


def test_blank_file_is_empty_and_workers_end(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n   \n" * 500)
    with pytest.raises(InputError, match="file is empty") as one:
        list(sequential(path))
    with pytest.raises(InputError, match="file is empty") as many:
        list(parallel(path, 4, 3, 100))
    assert str(one.value) == str(many.value)
    reader = parallel(path, 4, 3, 100)
    reader.start()
    reader.close()              # started, never read: the workers are ended
    assert _children() == []


def test_a_worker_that_dies_is_named(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"tokens": [i, 1, 2]}) for i in range(300)))
    monkeypatch.setattr(prefix_read, "_serve", lambda *a: os._exit(3))
    with pytest.raises(CachectlError, match="a reading process stopped with exit code 3; rerun with --read-jobs 1"):
        list(parallel(path, 4, 2, 200))
    monkeypatch.setattr(prefix_read, "_serve", lambda *a: os.kill(os.getpid(), 9))
    with pytest.raises(CachectlError, match="a reading process was killed by signal 9"):
        list(parallel(path, 4, 2, 200))


@pytest.fixture
def sigchld_ignored():
    """SIGCHLD ignored, as a parent may pass it on (``trap '' CHLD``): the system reaps every child at once,
    and waitpid() finds none."""
    import signal

    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGCHLD, old)


def test_workers_reaped_by_the_system_give_the_same_answer(cli, tmp_path, monkeypatch, sigchld_ignored):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"tokens": [i % 5] * (3 + i % 40)}) for i in range(300)) + "\n")
    args = ["simulate-prefix", path, "--capacity-blocks", "20", "--block-size", "4", "--format", "json"]
    one = cli(*args)
    monkeypatch.setattr(prefix_read, "MIN_BYTES", 1)
    many = cli(*args, "--read-jobs", "3")
    assert one.exit_code == 0 and many.exit_code == 0, many.stderr
    assert many.stdout == one.stdout
    monkeypatch.setattr(prefix_read, "_serve", lambda *a: os._exit(3))
    with pytest.raises(CachectlError, match="a reading process stopped; rerun with --read-jobs 1"):
        list(parallel(path, 4, 2, 200))


def test_no_more_processes_means_one_process_and_the_same_answer(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"tokens": [i % 7, 1, 2, 3, 4, i % 3]}) for i in range(400)))
    one = simulate(sequential(path), block_size=2, capacity_blocks=20)

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    made = []
    real_pipe = os.pipe

    def pipe():
        fds = real_pipe()
        made.extend((fd, os.fstat(fd).st_ino) for fd in fds)
        return fds

    monkeypatch.setattr(os, "fork", no_fork)
    monkeypatch.setattr(os, "pipe", pipe)
    assert simulate(parallel(path, 2, 3, 200), block_size=2, capacity_blocks=20) == one
    assert made
    for fd, inode in made:  # no pipe left open (a number may have been reused for something else since)
        try:
            assert os.fstat(fd).st_ino != inode
        except OSError:
            pass


def test_a_bug_in_a_worker_is_raised_as_itself(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"tokens": [i, 1, 2]}) for i in range(300)))

    def broken(req, bs, hash_fn):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(prefix_read, "request_keys", broken)
    with pytest.raises(ZeroDivisionError, match="a bug"):
        list(parallel(path, 4, 2, 200))


@pytest.mark.parametrize("depth", [3, 64, 65, 975])
def test_a_nested_salt_is_taken_or_refused_the_same_way(tmp_path, depth):
    lines = [json.dumps({"tokens": list(range(i % 9 + 1))}) for i in range(300)]
    lines[250] = '{"tokens": [1, 2, 3, 4, 5], "salt": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines))
    if depth <= 64:
        one = simulate(sequential(path), block_size=2, capacity_blocks=30)
        assert simulate(parallel(path, 2, 2, 300), block_size=2, capacity_blocks=30) == one
        return
    with pytest.raises(InputError) as one:
        simulate(sequential(path), block_size=2, capacity_blocks=30)
    with pytest.raises(InputError) as many:
        simulate(parallel(path, 2, 2, 300), block_size=2, capacity_blocks=30)
    assert str(one.value) == str(many.value) == f"{path}:251: field 'salt': nested deeper than 64 levels"


def test_chunks_cut_at_line_ends(tmp_path):
    path = tmp_path / "t.jsonl"
    data = b"".join(b'{"tokens": [%d]}\n' % i for i in range(1000)) + b'{"tokens": [7]}'
    path.write_bytes(data)
    bounds = JsonlChunks(str(path), 700, 100).bounds
    assert bounds[0][0] == 0 and bounds[-1][1] is None
    assert [b[1] for b in bounds[:-1]] == [b[0] for b in bounds[1:]]
    assert all(data[e - 1:e] == b"\n" for _, e in bounds[:-1] if e is not None)
    assert bounds[1][1] - bounds[1][0] < bounds[4][1] - bounds[4][0]  # small first chunks, then larger
    assert not can_read_in_parallel(str(path), 4)  # under 8 MiB
    assert can_read_in_parallel(str(path), 4, min_bytes=1) and not can_read_in_parallel(str(path), 1, min_bytes=1)
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b" + b"\0" * 100)
    assert not can_read_in_parallel(str(gz), 4, min_bytes=1) and not can_read_in_parallel("-", 4, min_bytes=1)


def test_cli_reads_in_workers_with_the_same_output(cli, tmp_path, monkeypatch):
    rng = random.Random(5)
    systems = [[rng.randrange(1000) for _ in range(40)] for _ in range(3)]
    lines = []
    for i in range(400):
        lines.append(json.dumps({"tokens": systems[i % 3] + [rng.randrange(1000) for _ in range(rng.randrange(30))],
                                 "tenant": f"t{i % 2}"}))
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    calls = []
    real = prefix_read.KeyedTrace.__init__

    def init(self, chunks, **kw):
        calls.append(kw["jobs"])
        real(self, chunks, **kw)

    monkeypatch.setattr(prefix_read.KeyedTrace, "__init__", init)
    args = ["simulate-prefix", path, "--capacity-blocks", "60", "--tenant-field", "tenant", "--format", "json"]
    one = cli(*args)
    assert one.exit_code == 0 and calls == []      # a small file is read in this process
    monkeypatch.setattr(prefix_read, "MIN_BYTES", 1)
    many = cli(*args, "--read-jobs", "3")
    assert many.exit_code == 0 and calls == [3]
    assert many.stdout == one.stdout
    assert cli(*args, "--read-jobs", "1").stdout == one.stdout and calls == [3]
    curve = ["simulate-prefix", path, "--curve", "--curve-points", "5", "--format", "json"]
    assert cli(*curve, "--read-jobs", "2").stdout == cli(*curve, "--read-jobs", "1").stdout and calls == [3, 2]


def _children() -> list[int]:
    """Children of this process not yet reaped (zombies or running)."""
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return []
    return [pid] if pid else [-1]
