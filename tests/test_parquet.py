"""Parquet traces: the same requests, and so exactly the same numbers, as the same trace in JSONL; errors
name the file, the row and the column."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TRACES = FIXTURES / "traces"


def to_parquet(jsonl, path, **kw):
    rows = [json.loads(line) for line in open(jsonl, encoding="utf-8") if line.strip()]
    pq.write_table(pa.Table.from_pylist(rows), str(path), **kw)
    return path


def same_json(cli, a, b, *args):
    ra, rb = cli("simulate-prefix", a, *args, "-f", "json"), cli("simulate-prefix", b, *args, "-f", "json")
    assert ra.exit_code == 0, ra.stderr
    assert rb.exit_code == 0, rb.stderr
    return json.loads(ra.stdout), json.loads(rb.stdout)


@pytest.mark.parametrize("trace, args", [
    ("rag.jsonl", ["--capacity-blocks", "300"]),                       # tokens with salts
    ("rag.jsonl", ["--capacity-blocks", "300", "--concurrency", "3", "--warmup", "0.25"]),
    ("rag.jsonl", ["--curve", "--curve-points", "6"]),
    ("mooncake_conv.jsonl", ["--capacity-blocks", "120", "--block-size", "512", "--concurrency", "4"]),  # hash_ids
    ("fleet.jsonl", ["--capacity-blocks", "200", "--replicas", "4", "--router", "all"]),   # sessions, timestamps
    ("fleet.jsonl", ["--policy", "radix", "--capacity-blocks", "400", "--tenant-field", "app"]),
])
def test_a_parquet_trace_gives_the_numbers_of_the_same_jsonl(cli, tmp_path, trace, args):
    # small row groups and batches: the reader crosses row-group boundaries
    parquet = to_parquet(TRACES / trace, tmp_path / "t.parquet", row_group_size=37)
    a, b = same_json(cli, TRACES / trace, parquet, *args)
    assert a == b


def test_parquet_is_found_by_its_magic_bytes_without_the_suffix(cli, tmp_path):
    parquet = to_parquet(TRACES / "rag.jsonl", tmp_path / "trace.bin")
    a, b = same_json(cli, TRACES / "rag.jsonl", parquet, "--capacity-blocks", "200")
    assert a == b and a["hit_tokens"] > 0


def test_struct_fields_and_arrow_timestamps(cli, tmp_path):
    rows = [{"tokens": [i % 3] * 40 + [i] * 9, "user": {"org": f"o{i % 2}"}, "t": i * 0.5, "output_tokens": 30}
            for i in range(40)]
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("\n".join(json.dumps({**r, "timestamp": r.pop("t")}) for r in rows) + "\n")
    table = pa.table({
        "tokens": [r["tokens"] for r in rows],
        "user": [r["user"] for r in rows],
        "timestamp": pa.array([int(i * 0.5 * 1e6) for i in range(40)], pa.timestamp("us")),
        "output_tokens": [30] * 40,
    })
    pq.write_table(table, str(tmp_path / "t.parquet"))
    args = ["--capacity-blocks", "12", "--concurrency", "2", "--tenant-field", "user.org"]
    a, b = same_json(cli, jsonl, tmp_path / "t.parquet", *args)
    assert a == b and len(a["per_tenant"]) == 2


@pytest.mark.parametrize("table, expect", [
    ({"tokens": [[1, 2, 3], [4, None, 6]]}, "t.parquet: row 2: column 'tokens[1]': token ID None is not"),
    ({"tokens": [[1, 2, 3], [-4, 5, 6]]}, "t.parquet: row 2: column 'tokens[0]': token ID -4"),
    ({"tokens": [["a"], ["b"]]}, "t.parquet: column 'tokens' is list<element: string>: expected a list of integers"),
    ({"tokens": [[1, 2], [3, 4]], "timestamp": ["a", "b"]}, "t.parquet: row 1: column 'timestamp': expected a time"),
    ({"hash_ids": [[1, 2]], "input_length": [5000]}, "t.parquet: row 1: column 'hash_ids': 2 hash_ids do not cover"),
    ({"x": [1]}, "t.parquet: no trace columns"),
])
def test_errors_name_file_row_and_column(cli, tmp_path, table, expect):
    pq.write_table(pa.table(table), str(tmp_path / "t.parquet"))
    r = cli("simulate-prefix", tmp_path / "t.parquet", "--capacity-blocks", "30", "--block-size", "2")
    assert r.exit_code == 2 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_not_parquet_and_stdin(cli, tmp_path):
    bad = tmp_path / "t.parquet"
    bad.write_bytes(b"PAR1 not really")
    r = cli("simulate-prefix", bad, "--capacity-blocks", "30")
    assert r.exit_code == 2 and "not a readable Parquet file" in r.stderr
    good = to_parquet(TRACES / "rag.jsonl", tmp_path / "rag.parquet")
    with open(good, "rb") as fh:
        data = fh.read()
    r = cli("simulate-prefix", "-", "--capacity-blocks", "30", input=data)
    assert r.exit_code == 2 and "Parquet cannot be read from stdin" in r.stderr, r.stderr


def test_memory_is_read_a_batch_at_a_time(tmp_path):
    """The reader holds one record batch of Python rows: after 10 rows only the first batch was decoded."""
    from cachectl.inputs import parquet

    n = 3 * parquet.BATCH_ROWS
    pq.write_table(pa.table({"tokens": [[i, i + 1] for i in range(n)]}), str(tmp_path / "t.parquet"),
                   row_group_size=parquet.BATCH_ROWS)
    it = parquet.parquet_records(str(tmp_path / "t.parquet"))
    first = [next(it) for _ in range(10)]
    assert first[0] == (1, {"tokens": [0, 1]}, False) and first[-1][0] == 10
    frame = it.gi_frame
    assert frame is not None and len(frame.f_locals["cols"][0]) == parquet.BATCH_ROWS
    assert sum(1 for _ in it) == n - 10


def test_a_missing_session_field_is_named_by_row_and_column(cli, tmp_path):
    src = to_parquet(TRACES / "fleet.jsonl", tmp_path / "fleet.parquet")
    route = ["--replicas", "2", "--router", "session", "--session-field", "nosuch"]
    for extra in (["--capacity-blocks", "100"], ["--partition-dir", str(tmp_path / "parts")]):
        r = cli("simulate-prefix", src, *route, *extra)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "fleet.parquet: row 1: column 'nosuch': missing: the session router needs it" in r.stderr
