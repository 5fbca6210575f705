"""Flag values and partition manifests past what the simulations can take are one line and exit 2: they were an
internal error (a NaN turned into an int), a silent different number (``inf`` ms a token), a run of days or a
process growing without end (found by fuzzing the CLI from the outside)."""

from __future__ import annotations

import json

import pytest

from .conftest import FIXTURES

TRACES = FIXTURES / "traces"


@pytest.mark.parametrize("args, message", [
    (["replay", TRACES / "rag.jsonl", "--capacity-gib", "1e300", "--model", "llama-3.1-8b"],
     "1e+300 GiB is more memory than any capacity in blocks holds"),
    (["fleet", TRACES / "fleet.jsonl", "--capacity-blocks", "300", "--replicas", "2", "--cpu-offload-gib", "1e300",
      "--model", "llama-3.1-8b"], "1e+300 GiB is more memory than any capacity in blocks holds"),
    (["replay", TRACES / "rag.jsonl", "--capacity-blocks", "200", "--concurrency", "4", "--decode-ms-per-token",
      "inf"], "'--decode-ms-per-token'"),
    (["curve", TRACES / "rag.jsonl", "--curve", "--curve-points", "99999999999999"], "'--curve-points'"),
    (["fleet", TRACES / "fleet.jsonl", "--capacity-blocks", "300", "--replicas", "99999999"], "'--replicas'"),
])
def test_a_flag_past_its_bound_is_one_line(cli, args, message):
    r = cli("simulate-prefix", *args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert "internal error" not in r.stderr


def test_a_finite_decode_time_still_runs(cli):
    r = cli("simulate-prefix", "replay", TRACES / "rag.jsonl", "--capacity-blocks", "200", "--concurrency", "4",
            "--decode-ms-per-token", "3600000")
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("field, value, message", [
    ("router", {"a": 1}, "field 'router': expected a router's name"),
    ("router", "cache-aware", "field 'router': expected one of round-robin, random, session, prefix-hash"),
    ("replicas", "2", "field 'replicas': expected the number of partitions (2)"),
    ("replicas", 3, "field 'replicas': expected the number of partitions (2)"),
    ("hash_block_size", 0, "field 'hash_block_size': expected a block size"),
    ("router_params", [], "field 'router_params': expected an object"),
])
def test_a_manifest_that_says_another_routing_is_refused_at_its_field(cli, tmp_path, field, value, message):
    pytest.importorskip("pyarrow")
    parts = tmp_path / "parts"
    r = cli("simulate-prefix", TRACES / "fleet.jsonl", "--partition-dir", parts, "--replicas", "2", "--router",
            "round-robin")
    assert r.exit_code == 0, r.stderr
    assert cli("simulate-prefix", "fleet", parts, "--capacity-blocks", "300").exit_code == 0
    manifest = parts / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc[field] = value
    manifest.write_text(json.dumps(doc))
    r = cli("simulate-prefix", "fleet", parts, "--capacity-blocks", "300")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert "manifest.json" in r.stderr and r.stdout == ""


def test_an_empty_partition_directory_name_is_refused(cli):
    pytest.importorskip("pyarrow")
    r = cli("simulate-prefix", TRACES / "fleet.jsonl", "--partition-dir", "", "--replicas", "2", "--router",
            "round-robin")  # (it said ": cannot create: No such file or directory")
    assert r.exit_code == 2 and "--partition-dir takes a directory name, and was given an empty one" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--batch", str(2**64), "-f", "json"], "'--batch'"),            # JSON: an internal error past 64 bits
    (["--block-size", str(2**64), "-f", "json"], "'--block-size'"),
    (["--run", "--random-weights", "--prompt", "hi", "--threads", "100000"], "'--threads'"),  # a segfault (139)
])
def test_kv_inspect_flags_past_their_bounds(cli, args, message):
    r = cli("kv-inspect", FIXTURES / "tiny-llama", "--context", "100", *args)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr


def test_kv_inspect_run_past_learned_positions_is_one_line(cli, tmp_path):
    """A GPT-2 (learned absolute positions) decoding past n_positions was an internal IndexError in the model."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "vocab_size": 1300, "n_embd": 64, "n_layer": 1, "n_head": 4, "n_positions": 16}))
    args = ("kv-inspect", tmp_path, "--run", "--random-weights", "--tokenizer", FIXTURES / "tok", "--prompt", "hello")
    r = cli(*args, "--max-new-tokens", "40")
    assert r.exit_code == 2 and "internal error" not in r.stderr
    assert "--max-new-tokens 40 need" in r.stderr and "learned position embeddings hold 16" in r.stderr, r.stderr
    r = cli(*args, "--max-new-tokens", "5")
    assert r.exit_code == 0 and "agree" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("context, message", [
    ("4096.9", "got 4096.9 (4096.9 tokens)"),   # taken as 4,096
    ("0.5", "got 0.5 (0.5 tokens)"),            # said "got 0"
    ("0.3k", "got 0.3k (307.2 tokens)"),
])
def test_kv_inspect_context_lengths_are_whole_tokens(cli, context, message):
    r = cli("kv-inspect", FIXTURES / "tiny-llama", "--context", context)
    assert r.exit_code == 2 and r.stderr.strip() == f"cachectl: error: --context-lengths expects whole token counts, " \
                                                   f"{message}", r.stderr
    assert cli("kv-inspect", FIXTURES / "tiny-llama", "--context", "1.5k,4096").exit_code == 0
