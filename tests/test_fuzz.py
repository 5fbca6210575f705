"""Generated adversarial inputs for every command and reader (bounded for CI; tests/fuzz/run.py runs longer).

Each input goes through the real command in this process; the property (tests/fuzz/harness.py): exit 0/1
with valid output, or exit 2 with one stderr line naming the input, and never the catch-all "internal
error", a traceback, a hang or unbounded memory. Runs are derandomized, so CI sees the same inputs every
time; ``CACHECTL_FUZZ_EXAMPLES`` raises the count per target.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from .fuzz import strategies as S
from .fuzz.harness import Expect, invoke, violations
from .fuzz.known import known
from .fuzz.targets import OPTION_TARGETS, TARGETS, gguf_seeds, run_option, run_target, size

EXAMPLES = int(os.environ.get("CACHECTL_FUZZ_EXAMPLES", "35"))
CI = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))


def _assert_holds(name: str, outcome, expect) -> None:
    new = [v for v in violations(outcome, expect) if not known(name, v, outcome.stderr)]
    assert not new, "; ".join(new) + "\n" + outcome.describe()


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_generated_inputs(target, tmp_path):
    work = tmp_path  # (pytest's, which it prunes: nothing left in the system's temporary folder)

    @CI
    @given(target.strategy(size(long=False)))
    def run(data: bytes) -> None:
        _assert_holds(target.name, *run_target(target, data, work))

    run()


@pytest.mark.parametrize("name,argv", OPTION_TARGETS, ids=[o[0] for o in OPTION_TARGETS])
def test_generated_option_values(name, argv):
    @CI
    @given(S.strings())
    def run(value: str) -> None:
        if "\x00" in value:  # not passable on a real command line
            return
        _assert_holds(name, *run_option(name, argv, value))

    run()


# ------------------------------------------------------------------------------------- GGUF, exhaustive


def _gguf_check(tmp_path: Path, data: bytes, label: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    out = invoke(["kv-inspect", str(path), "--format", "json"])
    found = violations(out, Expect(names=[str(path)]))
    assert not found, f"{label}: " + "; ".join(found) + "\n" + out.describe()


def test_gguf_truncated_at_every_byte(tmp_path):
    """Every prefix of a valid GGUF header is refused with one line (or read, once the metadata is whole)."""
    data = gguf_seeds()[1]
    assert invoke(["kv-inspect", _write(tmp_path, "whole.gguf", data), "--format", "json"]).exit_code == 0
    for n in range(len(data)):
        _gguf_check(tmp_path, data[:n], f"truncated to {n} bytes")


def _write(tmp_path: Path, name: str, data: bytes) -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _fields(data: bytes) -> list[tuple[int, str]]:
    """Offsets of every count and length in the seed's header, found by walking it."""
    pos = 24
    out = [(8, "tensor count"), (16, "metadata count")]
    (kv_count,) = struct.unpack_from("<Q", data, 16)

    def value(vtype: int) -> None:
        nonlocal pos
        if vtype == 8:
            out.append((pos, "string length"))
            (n,) = struct.unpack_from("<Q", data, pos)
            pos += 8 + n
        elif vtype == 9:
            (itype,) = struct.unpack_from("<I", data, pos)
            out.append((pos + 4, "array count"))
            (count,) = struct.unpack_from("<Q", data, pos + 4)
            pos += 12
            for _ in range(count):
                value(itype)
        else:
            pos += struct.calcsize(S_SCALARS[vtype])

    for _ in range(kv_count):
        out.append((pos, "key length"))
        (klen,) = struct.unpack_from("<Q", data, pos)
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", data, pos)
        pos += 4
        value(vtype)
    return out


S_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@pytest.mark.parametrize("big", [2 ** 64 - 1, 2 ** 63, 2 ** 40, 2 ** 32 + 1])
def test_gguf_counts_beyond_the_file(tmp_path, big):
    """A count or length far beyond the file size, at every place the header has one: refused, not allocated."""
    data = gguf_seeds()[1]
    fields = _fields(data)
    assert len(fields) > 10
    for offset, what in fields:
        corrupt = bytearray(data)
        corrupt[offset:offset + 8] = struct.pack("<Q", big)
        _gguf_check(tmp_path, bytes(corrupt), f"{what} at offset {offset} set to {big}")
