"""Benchmark: one capacity and the whole curve of `simulate-prefix` against the naive seed, in one run.

Generates a chat-like JSONL token trace (conversations that grow turn by turn over shared system prompts;
default 4,800 requests, about 6.3M prompt tokens, the generator of `bench_simulate_prefix.py`), then
times, interleaved, process start included, median of --runs:
  naive     bench/naive_seed_prefix.py: stdlib json, tuple hash, an OrderedDict LRU, no vLLM rules
  single    cachectl simulate-prefix TRACE --capacity-blocks N --format json
  curve     cachectl simulate-prefix TRACE --curve --format json   (32 capacities, minimum to ceiling)
  1 proc    single with --read-jobs 1 (the trace read and keyed in the command's own process; by default a
            file this size is read by one forked worker per CPU)
and the peak RSS of `single` and `curve` on the trace and on its first half (memory against trace length).
Targets (issue 13): single >= 1.3x faster than naive; curve <= 2.5x single; memory flat in trace length.
With --mooncake N (default 12,000), the same for a Mooncake-style hash_ids trace of N requests
(fixtures/make_mooncake_trace.py, 512-token blocks): one capacity, a 5-point --sweep-capacity, --curve.

    python bench/bench_prefix_curve.py [--requests 4800] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_simulate_prefix import make_trace  # noqa: E402
from benchutil import ENV, timed  # noqa: E402


def peak_rss(cmd: list[str]) -> int:
    """Peak RSS in MiB of one run of cmd, as GNU time reports it."""
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, cwd=ROOT, env=ENV)
    if proc.returncode:
        raise SystemExit(f"{cmd} failed: {proc.stderr.decode()[-500:]}")
    return int(proc.stderr.decode().strip().splitlines()[-1]) // 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4800)
    ap.add_argument("--capacity-blocks", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--mooncake", type=int, default=12_000, help="requests of the Mooncake-style trace (0: skip)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        tokens = make_trace(trace, args.requests)
        half = Path(tmp) / "half.jsonl"
        with trace.open("rb") as src, half.open("wb") as dst:
            for i, line in enumerate(src):
                if i < args.requests // 2:
                    dst.write(line)
        py = sys.executable

        def cmds(path: Path) -> dict[str, list[str]]:
            return {
                "naive seed": [py, str(ROOT / "bench" / "naive_seed_prefix.py"), str(path), "16",
                               str(args.capacity_blocks)],
                "cachectl, one capacity": [py, "-m", "cachectl", "simulate-prefix", str(path), "--capacity-blocks",
                                           str(args.capacity_blocks), "--format", "json"],
                "cachectl --curve (32 points)": [py, "-m", "cachectl", "simulate-prefix", str(path), "--curve",
                                                 "--format", "json"],
                "one capacity, --read-jobs 1": [py, "-m", "cachectl", "simulate-prefix", str(path),
                                                "--capacity-blocks", str(args.capacity_blocks), "--format", "json",
                                                "--read-jobs", "1"],
            }

        full = cmds(trace)
        outs = {name: timed(cmd)[1] for name, cmd in full.items()}  # warm-up, and the answers
        times: dict[str, list[float]] = {k: [] for k in full}
        for _ in range(args.runs):
            for name, cmd in full.items():
                times[name].append(timed(cmd)[0])
        rss = {name: (peak_rss(cmds(half)[name]), peak_rss(cmd)) for name, cmd in full.items()}
        size = trace.stat().st_size / 1e6
    med = {k: statistics.median(v) for k, v in times.items()}
    naive, single, curve, one_process = (med[k] for k in full)
    print(f"trace: {args.requests} requests, {tokens:,} prompt tokens, {size:.1f} MB; capacity "
          f"{args.capacity_blocks} blocks of 16; {args.runs} interleaved runs each, median, process start included")
    print(f"{'command':<32}{'seconds':>9}{'runs':>40}{'peak RSS half/full trace':>27}")
    for name, m in med.items():
        runs = " ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:<32}{m:>9.3f}  {runs:>38}{rss[name][0]:>17} / {rss[name][1]} MiB")
    print(f"one capacity: naive / cachectl = {naive / single:.2f}x faster (target >= 1.3x); read in one "
          f"process (--read-jobs 1): {naive / one_process:.2f}x; CPUs: {len(os.sched_getaffinity(0))}")
    if outs["one capacity, --read-jobs 1"] != outs["cachectl, one capacity"]:
        raise SystemExit("--read-jobs 1 and the default gave different answers")
    print(f"curve / one capacity = {curve / single:.2f}x (target <= 2.5x); curve points: "
          f"{len(json.loads(outs['cachectl --curve (32 points)'])['sweep'])}")
    print(f"hit rate at {args.capacity_blocks} blocks: naive (LRU, no vLLM rules) {float(outs['naive seed']):.4f}, "
          f"cachectl {json.loads(outs['cachectl, one capacity'])['hit_rate']:.4f}")


    if args.mooncake:
        mooncake(args.mooncake, args.runs)


def mooncake(requests: int, runs: int) -> None:
    sys.path.insert(0, str(ROOT / "fixtures"))
    from make_mooncake_trace import build

    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "mooncake.jsonl"
        build(requests, out=trace)
        base = [py, "-m", "cachectl", "simulate-prefix", str(trace), "--block-size", "512", "--format", "json"]
        cmds = {
            "one capacity (500 blocks)": base + ["--capacity-blocks", "500"],
            "5-point sweep": base + ["--sweep-capacity", "250,500,1000,2000,4000"],
            "--curve (32 points)": base + ["--curve"],
        }
        outs = {name: timed(cmd)[1] for name, cmd in cmds.items()}
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(runs):
            for name, cmd in cmds.items():
                times[name].append(timed(cmd)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    one = med["one capacity (500 blocks)"]
    curve = json.loads(outs["--curve (32 points)"])["curves"][0]
    print(f"\nMooncake-style trace: {requests} requests, {curve['query_tokens']:,} prompt tokens in 512-token "
          f"hash_ids blocks; minimum {curve['min_capacity_blocks']} blocks, ceiling "
          f"{curve['ceiling_capacity_blocks']:,}; {runs} interleaved runs, median")
    for name, m in med.items():
        runs_s = " ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:<32}{m:>9.3f}  {runs_s:>38}{m / one:>8.2f}x one capacity")


if __name__ == "__main__":
    main()
