"""cachectl/spool.py: the key index maps what a dict of the same pairs maps (through merges and overwrites), and
refuses what it cannot hold; the spool's full disk is one line."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cachectl.spool import KeyIndex


@pytest.mark.parametrize("seed,dtype", [(0, "int64"), (1, "int64"), (0, "uint8")])
def test_key_index_is_the_dict_of_its_pairs(seed, dtype, monkeypatch):
    # through many merges of its dict into the arrays (MERGE made small), overwrites of keys in either part, and
    # the extremes of a signed 64-bit key; values of a narrow type (the replay's masks of a few versions) up to its top
    monkeypatch.setattr(KeyIndex, "MERGE", 64)
    rng = random.Random(seed)
    table, want = KeyIndex(dtype), {}
    top = 255 if dtype == "uint8" else 2**63 - 1
    keys = [rng.getrandbits(64) - 2**63 for _ in range(20_000)] + [-2**63, 2**63 - 1, 0, -1]
    for start in range(0, len(keys), 37):
        batch = keys[start:start + 37]
        vals = [v % (top + 1) for v in range(start, start + len(batch))]
        vals[0] = top
        table.put(batch, vals)
        want.update(zip(batch, vals))
        again = rng.sample(keys[:start + len(batch)], 5)           # overwritten in place: not counted twice
        table.put(list(dict.fromkeys(again)), [7] * len(set(again)))
        want.update(dict.fromkeys(again, 7))
        assert len(table) == len(want)
    assert all(table.get(k) == v for k, v in want.items())
    assert table.values(keys[:500]) == [want[k] for k in keys[:500]]
    misses = [rng.getrandbits(64) - 2**63 for _ in range(2_000)]
    assert table.values(misses) == [want.get(k, -1) for k in misses]
    assert all((table.get(k) is None) == (k not in want) for k in misses)


def test_key_index_refuses_what_it_cannot_hold():
    table = KeyIndex()
    with pytest.raises(ValueError):
        table[5] = -1
    for key in (2**63, -2**63 - 1):
        with pytest.raises(OverflowError):
            table[key] = 1
    assert len(table) == 0 and table.get(5) is None and table.values([5, 6]) == [-1, -1]
    narrow = KeyIndex("uint8")  # a value past its type is refused, not wrapped: in the dict part and in the arrays
    narrow.put(list(range(5000)), [255] * 5000)
    for key in (3, 10_000):
        with pytest.raises(ValueError):
            narrow[key] = 256
        with pytest.raises(ValueError):
            narrow.put([key], [256])
    assert narrow.get(3) == 255 and narrow.get(10_000) is None and len(narrow) == 5000


@pytest.mark.parametrize("seed", [0, 1])
def test_compact_key_table_is_dict_setdefault(seed, monkeypatch):
    # the no-eviction replay's table (pools._KeyTable): the tenants of a run of keys up to the first absent, then
    # setdefault on each key from there, as a dict does it; keys in a run twice, keys that are no signed 64-bit int
    from cachectl.engines.prefix.pools import _KeyTable

    monkeypatch.setattr(KeyIndex, "MERGE", 32)
    rng = random.Random(seed)
    table, want = _KeyTable(), {}
    pool = [rng.getrandbits(64) - 2**63 for _ in range(3_000)] + [-2**63, 2**63 - 1, 2**64, b"sha"]
    for step in range(400):
        run = [rng.choice(pool) for _ in range(rng.randrange(0, 40))]
        limit = rng.randrange(0, 45)
        got = table.run(run, limit, step)
        expect = []
        for k in run[:limit]:
            if k not in want:
                break
            expect.append(want[k])
        assert got == expect
        for k in run[len(got):]:
            want.setdefault(k, step)
        assert len(table) == len(want)


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


def test_dict_streams_round_trip_from_many_threads_against_one_dictionary():
    """Payloads compressed by several threads at once all read back, whichever thread reads them: one dictionary,
    made from the first payload, whichever thread sent it; and a payload that repeats the first costs a few bytes."""
    import threading

    from cachectl.spool import DictStreams

    z = DictStreams()
    rng = random.Random(7)
    top = bytes(rng.randrange(256) for _ in range(4000))  # (random: only the dictionary can make it small)
    payloads = [top + str(i).encode() * rng.randrange(1, 50) for i in range(400)]
    blobs: dict[int, bytes] = {}
    start = threading.Barrier(4)

    def work(part: int) -> None:
        start.wait()
        for i in range(part, len(payloads), 4):
            blobs[i] = z.compress(payloads[i])

    threads = [threading.Thread(target=work, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [z.decompress(blobs[i]) for i in range(len(payloads))] == payloads
    assert max(len(b) for b in blobs.values()) < 200  # (each payload holds 4,000 random bytes of the first's)
    other = DictStreams()
    other.compress(b"something else")
    import zstandard

    with pytest.raises(zstandard.ZstdError):  # another stream's dictionary does not read these
        other.decompress(blobs[0])
