"""Benchmark: `cachectl simulate-prefix` end to end against parse-only and a naive replay, in one run.

Generates a JSONL trace of token-ID requests (default 1,000 requests, about 1.2M prompt tokens) that share
system prompts and conversation prefixes, then times, interleaved, with process start included:
  (a) parse     a script that only reads and parses the trace with orjson (the JSON library cachectl uses)
  (b) naive     a pure-Python replay: stdlib json, Python hash() over block tuples, an OrderedDict LRU
  cachectl      python -m cachectl simulate-prefix TRACE --capacity-blocks N --format json
Targets: cachectl <= 1.5x (a); cachectl >= 2x faster than (b).

    python bench/bench_simulate_prefix.py [--requests 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

PARSE = """
import sys, orjson
n = 0
with open(sys.argv[1], "rb") as fh:
    for line in fh:
        n += len(orjson.loads(line)["tokens"])
print(n)
"""

#: the naive seed replay (stdlib json, tuple hash, OrderedDict LRU): one file, shared with bench_prefix_curve.py
NAIVE_PY = Path(__file__).resolve().parent / "naive_seed_prefix.py"


def make_trace(path: Path, requests: int, seed: int = 11) -> int:
    rng = random.Random(seed)
    systems = [[rng.randrange(50_000) for _ in range(800)] for _ in range(4)]
    convs: list[list[int]] = []
    total = 0
    with path.open("w", encoding="utf-8") as fh:
        for _ in range(requests):
            if convs and rng.random() < 0.7:  # continue a conversation: its history is a prefix
                i = rng.randrange(len(convs))
                convs[i] = convs[i] + [rng.randrange(50_000) for _ in range(rng.randrange(40, 200))]
                tokens = convs[i]
                if len(tokens) > 3000:
                    convs.pop(i)
            else:
                tokens = rng.choice(systems) + [rng.randrange(50_000) for _ in range(rng.randrange(100, 400))]
                convs.append(tokens)
            total += len(tokens)
            fh.write(json.dumps({"tokens": tokens}) + "\n")
    return total


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=ENV).stdout
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--capacity-blocks", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        tokens = make_trace(trace, args.requests)
        parse_py, naive_py = Path(tmp) / "parse.py", NAIVE_PY
        parse_py.write_text(PARSE)
        cmds = {
            "(a) parse only, orjson": [sys.executable, str(parse_py), str(trace)],
            "(b) naive replay, stdlib json": [sys.executable, str(naive_py), str(trace), "16", str(args.capacity_blocks)],
            "cachectl simulate-prefix": [sys.executable, "-m", "cachectl", "simulate-prefix", str(trace),
                                         "--capacity-blocks", str(args.capacity_blocks), "--format", "json"],
        }
        outs = {name: timed(cmd)[1] for name, cmd in cmds.items()}  # warm-up, and the answers
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(args.runs):
            for name, cmd in cmds.items():
                times[name].append(timed(cmd)[0])
        size = trace.stat().st_size / 1e6
    med = {k: statistics.median(v) for k, v in times.items()}
    ours = med["cachectl simulate-prefix"]
    print(f"trace: {args.requests} requests, {tokens:,} prompt tokens, {size:.1f} MB; capacity "
          f"{args.capacity_blocks} blocks of 16; {args.runs} runs each, median, process start included")
    print(f"{'command':<34}{'seconds':>9}{'cachectl / this':>17}")
    for name, m in med.items():
        print(f"{name:<34}{m:>9.3f}{ours / m:>17.2f}")
    print(f"hit rate: naive (LRU over hashes, no ref counts) {float(outs['(b) naive replay, stdlib json']):.4f}, "
          f"cachectl {json.loads(outs['cachectl simulate-prefix'])['hit_rate']:.4f}")


if __name__ == "__main__":
    main()
