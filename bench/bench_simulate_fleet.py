"""Benchmark: the fleet path of `simulate-prefix` with --jobs 1 and --jobs 2, side by side, one run.

Generates the chat-like trace of `bench_simulate_prefix.py` (default 2,400 requests, 3.1M tokens), then times,
interleaved, process start included, median of --runs, checking that each pair prints the same numbers:

1. `--replicas 4 --router all` on the JSONL trace (5 routers: the trace has no sessions), --jobs 1 vs
   --jobs J. The trace is parsed and keyed once in the parent (sequential); with J <= 5 each forked worker
   routes and replays whole routers.
2. The same trace routed once by prefix-hash into 4 Parquet partitions (`--partition-dir`, with pyarrow),
   then replayed with --jobs 1 vs J: each worker reads, keys and replays its own partitions, so parsing is
   spread too.
3. With ray installed: the partitions as Ray tasks on a local Ray with J CPUs (Ray's start-up included),
   against the --jobs 1 replay.

    python bench/bench_simulate_fleet.py [--requests 2400] [--runs 5] [--jobs 2] [--policy vllm|radix]
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


def _pair(name: str, base: list[str], runs: int, alt: list[str], ref: list[str] = ("--jobs", "1")) -> None:
    times: dict[int, list[float]] = {0: [], 1: []}
    outs: dict[int, str] = {}
    for _ in range(runs):
        for k, extra in enumerate((list(ref), list(alt))):
            t, out = timed(base + extra)
            times[k].append(t)
            outs[k] = out
    a, b = json.loads(outs[0]), json.loads(outs[1])
    if a["results"] != b["results"]:
        raise SystemExit(f"{name}: {' '.join(alt)} printed other numbers than {' '.join(ref)}")
    m0, m1 = statistics.median(times[0]), statistics.median(times[1])
    print(f"{name}: {' '.join(ref)} {m0:6.2f} s   {' '.join(alt)} {m1:6.2f} s   ({m0 / m1:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--capacity-blocks", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--policy", default="vllm", help="vllm (replays in C, little to spread) or radix")
    ap.add_argument("--jobs", type=int, default=2, help="the --jobs timed against --jobs 1")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray pair even if ray is installed")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        make_trace(trace, args.requests)
        cli = [sys.executable, "-m", "cachectl", "simulate-prefix"]
        replay = ["--capacity-blocks", str(args.capacity_blocks), "--policy", args.policy, "--format", "json"]
        print(f"{args.requests} requests, policy {args.policy}, {args.runs} runs, cpus {os.cpu_count()}, "
              f"load average {os.getloadavg()[0]:.1f} before the runs")
        _pair("JSONL, 4 replicas, --router all (5 routers)", cli + [str(trace), "--replicas", "4", "--router", "all"] + replay,
              args.runs, ["--jobs", str(args.jobs)])
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            print("partitions: skipped (pyarrow is not installed)")
            return
        parts = Path(tmp) / "parts"
        subprocess.run(cli + [str(trace), "--replicas", "4", "--router", "prefix-hash", "--partition-dir", str(parts)],
                       check=True, capture_output=True, cwd=ROOT, env=ENV)
        _pair("Parquet partitions, 4 replicas (prefix-hash)", cli + [str(parts)] + replay, args.runs,
              ["--jobs", str(args.jobs)])
        try:
            import ray  # noqa: F401
        except ImportError:
            print("ray: skipped (ray is not installed)")
            return
        if not args.no_ray:
            _pair(f"Parquet partitions on a local Ray ({args.jobs} CPUs, start-up included)",
                  cli + [str(parts)] + replay, max(1, args.runs // 2), ["--ray", "--jobs", str(args.jobs)])
        print(f"load average {os.getloadavg()[0]:.1f} after the runs (other work on the machine shares the cores)")


if __name__ == "__main__":
    main()
