"""Benchmark: what hashing prefix-cache blocks costs per prompt token on this machine.

vLLM hashes every full block of every prompt, hit or not (its default: SHA-256 over a pickle of
``(parent hash, block tokens, extra keys)``; cachectl's ``block_keys(..., hash_fn="sha256")`` does the same
work), so on traffic with no reuse it is pure cost. Times, interleaved, on 2,000-token prompts:
  sha256    cachectl.engines.prefix.trace.block_keys(tokens, 16, hash_fn="sha256")
  builtin   the same with Python's tuple hash (cachectl's default key; vLLM's ``builtin`` option is close)
and prints nanoseconds per token (the median of --runs). ``--write`` stores the figures, with the machine and
the date, in cachectl/data/block_hash_cost.json, which ``simulate-prefix --gpu`` prints beside the hashing
cost it derives.

    python bench/bench_block_hash.py [--runs 7] [--write]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cachectl.engines.prefix.trace import block_keys  # noqa: E402

DATA = ROOT / "cachectl" / "data" / "block_hash_cost.json"


def per_token_ns(prompts: list[list[int]], block_size: int, hash_fn: str) -> float:
    tokens = sum(len(p) for p in prompts)
    t = time.perf_counter()
    for p in prompts:
        block_keys(p, block_size, None, hash_fn)
    return (time.perf_counter() - t) / tokens * 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    rng = random.Random(0)
    prompts = [[rng.randrange(150_000) for _ in range(2000)] for _ in range(a.prompts)]
    times: dict[str, list[float]] = {"sha256": [], "builtin": []}
    for _ in range(a.runs):
        for fn in times:
            times[fn].append(per_token_ns(prompts, a.block_size, fn))
    med = {fn: statistics.median(v) for fn, v in times.items()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    for fn, v in med.items():
        print(f"{fn:8s} {v:8.1f} ns per token (median of {a.runs}; block size {a.block_size}; "
              f"{a.prompts} prompts of 2,000 tokens)")
    print(f"load average {load}")
    if a.write:
        table = json.loads(DATA.read_text(encoding="utf-8")) if DATA.exists() else {}
        table.update({
            "schema_version": 1,
            "units": "ns_per_token: CPU nanoseconds per prompt token to key the prompt's full blocks, one thread",
            "measured": {
                "by": "bench/bench_block_hash.py",
                "date": datetime.date.today().isoformat(),
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
                           f"load average {load:.1f}" if load is not None else platform.machine(),
                "block_size": a.block_size,
                "sha256_ns_per_token": round(med["sha256"], 1),
                "builtin_ns_per_token": round(med["builtin"], 1),
            },
        })
        DATA.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {DATA}")


if __name__ == "__main__":
    main()
