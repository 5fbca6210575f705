"""cachectl/spool.py: the digest table maps what a dict of the same pairs maps (through growth, overwrites and
probe chains that wrap around its end), and refuses what it cannot hold."""

from __future__ import annotations

import random

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


def test_digest_table_refuses_what_it_cannot_hold():
    table = DigestTable()
    for digest, value in [(5, -1), (5, 2**31), (2**64, 1), (-1, 1)]:
        with pytest.raises(ValueError):
            table[digest] = value
    assert len(table) == 0 and table.get(5) is None
