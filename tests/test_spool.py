"""cachectl/spool.py: the digest table maps what a dict of the same pairs maps (through growth, overwrites and
probe chains that wrap around its end), and refuses what it cannot hold."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cachectl.spool import DigestTable


@pytest.mark.parametrize("seed", [0, 1])
def test_digest_table_is_the_dict_of_its_pairs(seed):
    rng = random.Random(seed)
    table, want = DigestTable(2), {}
    keys = [rng.getrandbits(64) for _ in range(30_000)]
    keys += [k ^ 1 for k in keys[:500]] + [0, 2**64 - 1]      # neighbours in the same slot, the extremes
    for i, k in enumerate(keys):
        table[k] = want[k] = i
        if i % 7 == 0:                                         # overwritten in place: not counted twice
            table[k] = want[k] = i + 1
    assert len(table) == len(want)
    assert all(table.get(k) == v for k, v in want.items())
    misses = [rng.getrandbits(64) for _ in range(2_000)]
    assert all((table.get(k) is None) == (k not in want) for k in misses)
    flipped = keys[3] ^ 2**63
    assert keys[3] in table and (flipped in table) == (flipped in want)


def test_digest_table_collisions_in_one_small_table():
    table = DigestTable(8)      # all keys in slot 7 of 8, then of 16: the probe wraps past the end
    keys = [7 + 16 * i for i in range(3)]
    for i, k in enumerate(keys):
        table[k] = i
    assert [table.get(k) for k in keys] == [0, 1, 2] and table.get(7 + 16 * 3) is None


@pytest.mark.parametrize("seed", [0, 1])
def test_digest_table_prefix_lookup_and_fill_are_dict_setdefault(seed):
    # leading(): the values of a run of digests up to the first absent; fill(): setdefault on each, growing from a
    # two-slot table, with digests that share slots and the extremes
    rng = random.Random(seed)
    table, want = DigestTable(2), {}
    pool = [rng.getrandbits(64) for _ in range(3_000)] + [0, 2**64 - 1, 7, 7 + 2**40]
    for step in range(400):
        run = [rng.choice(pool) for _ in range(rng.randrange(0, 40))]
        limit = rng.randrange(0, 45)
        got = table.leading(run, limit)
        expect = []
        for d in run[:limit]:
            if d not in want:
                break
            expect.append(want[d])
        assert got == expect
        table.fill(run[len(got):], step)
        for d in run[len(got):]:
            want.setdefault(d, step)
        assert len(table) == len(want)
    assert all(table.get(k) == v for k, v in want.items())
    for bad in ([2**64], [-1], [1, 2**64 + 5]):
        with pytest.raises(ValueError):
            table.fill(bad, 1)
    with pytest.raises(ValueError):
        table.fill([1], 2**31)
    assert len(table) == len(want)


def test_digest_table_refuses_what_it_cannot_hold():
    table = DigestTable()
    for digest, value in [(5, -1), (5, 2**31), (2**64, 1), (-1, 1)]:
        with pytest.raises(ValueError):
            table[digest] = value
    assert len(table) == 0 and table.get(5) is None


def test_a_full_disk_under_the_spool_is_one_line_naming_tmpdir(cli, monkeypatch, tmp_path):
    """report keeps the log on disk: a full disk there is one line saying where and what to set, exit 2, not an
    internal error; a write the kernel cuts short is finished, not lost."""
    import errno
    import os

    from cachectl import spool

    root = Path(__file__).resolve().parent.parent
    log, tok = root / "fixtures" / "prompts" / "fix_log.jsonl", root / "fixtures" / "tok"
    real = os.pwrite
    calls = []

    def short(fd, data, offset):   # the kernel writes at most 7 bytes a call
        calls.append(len(data))
        return real(fd, bytes(data[:7]), offset)

    monkeypatch.setattr(spool.os, "pwrite", short)
    ok = cli("report", str(log), "-t", str(tok), "--format", "json")
    monkeypatch.setattr(spool.os, "pwrite", real)
    want = cli("report", str(log), "-t", str(tok), "--format", "json")
    assert ok.exit_code == want.exit_code == 1 and ok.stdout == want.stdout and max(calls) > 7

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(spool.os, "pwrite", full)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(spool.tempfile, "tempdir", None)
    got = cli("report", str(log), "-t", str(tok))
    assert got.exit_code == 2 and got.stdout == ""
    line = got.stderr.strip()
    assert "\n" not in line and "internal error" not in line
    assert str(tmp_path) in line and "no space left on device" in line and "TMPDIR" in line


def test_content_digest_reads_content_not_object_identity():
    from cachectl.spool import content_digest

    shared = "You are terse." * 3
    a = [{"role": "system", "content": shared}, {"role": "user", "content": shared}]   # one string object twice
    b = [{"role": "system", "content": "You are terse." * 3}, {"role": "user", "content": "".join(["You are terse."] * 3)}]
    assert a == b and a[0]["content"] is a[1]["content"] and b[0]["content"] is not b[1]["content"]
    assert content_digest(a) == content_digest(b)  # (plain pickle writes a memo reference for the shared one)
    assert len({content_digest(x) for x in ([1], [1.0], [True], (1,), ["1"])}) == 5
    assert content_digest([{"a": 1, "b": 2}]) != content_digest([{"b": 2, "a": 1}])  # key order is content
    loop: list = []
    loop.append(loop)
    assert content_digest(loop) is None and len(content_digest(a, size=8) or b"") == 8
