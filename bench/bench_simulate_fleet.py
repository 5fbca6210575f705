"""Benchmark: `simulate-prefix --replicas 4 --router all` with --jobs 1 and --jobs 2, side by side, one run.

Generates the chat-like trace of `bench_simulate_prefix.py` (default 2,400 requests), then times both
commands interleaved, process start included, median of --runs, and checks that they print the same JSON.
Routing runs once in the parent (it is sequential by nature); the replays of the 6 routers x 4 replicas are
what --jobs spreads over processes, so the ratio is bounded by the share of time spent replaying.

    python bench/bench_simulate_fleet.py [--requests 2400] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_simulate_prefix import make_trace  # noqa: E402
from benchutil import timed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2400)
    ap.add_argument("--capacity-blocks", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--policy", default="vllm", help="vllm (replays in C, little to spread) or radix")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        make_trace(trace, args.requests)
        base = [sys.executable, "-m", "cachectl", "simulate-prefix", str(trace), "--capacity-blocks",
                str(args.capacity_blocks), "--replicas", "4", "--router", "all", "--policy", args.policy, "--format", "json"]
        times: dict[int, list[float]] = {1: [], 2: []}
        outs: dict[int, str] = {}
        for _ in range(args.runs):
            for jobs in (1, 2):
                t, out = timed(base + ["--jobs", str(jobs)])
                times[jobs].append(t)
                outs[jobs] = out
        if json.loads(outs[1]) != json.loads(outs[2]):
            raise SystemExit("--jobs 2 printed other numbers than --jobs 1")
        m1, m2 = statistics.median(times[1]), statistics.median(times[2])
        print(f"{args.requests} requests, 4 replicas, 6 routers, policy {args.policy}, cpus {os.cpu_count()}, "
              f"load average {os.getloadavg()[0]:.1f} (other work on the machine takes the second core)")
        print(f"--jobs 1  {m1:7.2f} s")
        print(f"--jobs 2  {m2:7.2f} s   ({m1 / m2:.2f}x)")


if __name__ == "__main__":
    main()
