"""Benchmark: the shared-prefix fork analysis (`cachectl.engines.prefix.analyze_forks`) against `cachectl
simulate-prefix --policy infinite` on the same log, in the same run (interleaved, process start included), with
each process's peak RSS. Goal: the fork analysis within 2x the no-eviction replay.

Two logs, generated here:
  chat    (default 2,000 requests) OpenAI chat requests of 12 users sharing a ~1,500-token system prompt that
          opens with a clock line, a request id and the user's e-mail (the shape of
          fixtures/prompts/shared_prefix_log.jsonl), rendered with fixtures/tok by both sides: the whole
          analysis (tree, causes, the counterfactual passes and replays)
  tokens  (default 200,000 requests) token-ID requests of the same shape (a 256-token shared prompt with a
          per-request span in its first block): the streaming tree pass and its replay at scale (token IDs have
          no text, so no cause and no counterfactual)

    python3 bench/bench_forks.py [--mode chat|tokens] [--requests N] [--runs 3]
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

from benchutil import ENV, ROOT

FORKS = """
import json, sys
import cachectl
from cachectl.engines.prefix import analyze_forks, trace_records
from cachectl.engines.prefix.forks import pack_requests
path, mode = sys.argv[1], sys.argv[2]
tok = cachectl.load_tokenizer("fixtures/tok") if mode == "chat" else None
reqs = pack_requests(trace_records(path), source=path, tokenizer=tok)   # read once, kept packed
rep = analyze_forks(reqs, tokenizer=tok, block_size=16)
print(json.dumps({"hit_tokens": rep.hit_tokens, "fixed_hit_tokens": rep.fixed_hit_tokens, "passes": rep.passes,
                  "replays": rep.replays, "forks": [f.to_dict() for f in rep.forks[:4]]}))
"""


def make_chat(path: Path, requests: int, seed: int = 5) -> None:
    sys.path.insert(0, str(ROOT / "fixtures"))
    from make_request_logs import prose

    rng = random.Random(seed)
    stable = prose(51, 6000)
    users = [f"user{i}@tenant{i % 4}.example" for i in range(12)]
    with path.open("w", encoding="utf-8") as fh:
        for k in range(requests):
            u = rng.randrange(len(users))
            system = "\n".join(["You are the support assistant.", f"Current time: 2026-12-01T{k // 3600 % 24:02d}:"
                                f"{k // 60 % 60:02d}:{k % 60:02d}Z", f"Request id: req_{rng.getrandbits(40):010x}",
                                f"user: {users[u]}", "", stable])
            body = {"model": "gpt-4.1", "user": f"u-{u}", "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Question {rng.getrandbits(32):08x}: why did my cache miss?"}]}
            fh.write(json.dumps(body) + "\n")


def make_tokens(path: Path, requests: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    head, tail = [rng.randrange(50_000) for _ in range(8)], [rng.randrange(50_000) for _ in range(240)]
    users = [[rng.randrange(50_000) for _ in range(4)] for _ in range(500)]
    with path.open("w", encoding="utf-8") as fh:
        for _ in range(requests):
            tokens = head + [rng.randrange(50_000) for _ in range(4)] + rng.choice(users) + tail
            tokens += [rng.randrange(50_000) for _ in range(rng.randrange(8, 40))]
            fh.write(json.dumps({"tokens": tokens}) + "\n")


def run(cmd: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (MiB) and stdout of one process."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, cwd=ROOT, env=ENV)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        if status:
            raise SystemExit(f"{cmd[:4]} failed: {proc.stderr.read().decode()[-500:] if proc.stderr else ''}")
        out.seek(0)
        return elapsed, usage.ru_maxrss // 1024, out.read().decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("chat", "tokens"), default="chat")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    n = args.requests or (2000 if args.mode == "chat" else 200_000)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / f"{args.mode}.jsonl"
        (make_chat if args.mode == "chat" else make_tokens)(log, n)
        sim = [sys.executable, "-m", "cachectl", "simulate-prefix", str(log), "--policy", "infinite",
               "--format", "json", "--read-jobs", "1"] + (["--tokenizer", "fixtures/tok"] if args.mode == "chat" else [])
        forks = [sys.executable, "-c", FORKS, str(log), args.mode]
        times: dict[str, list[float]] = {"simulate": [], "forks": []}
        rss: dict[str, int] = {}
        outs: dict[str, str] = {}
        for _ in range(args.runs):
            for name, cmd in (("simulate", sim), ("forks", forks)):
                t, r, out = run(cmd)
                times[name].append(t)
                rss[name] = max(rss.get(name, 0), r)
                outs[name] = out
        hits = json.loads(outs["simulate"])["hit_tokens"]
        got = json.loads(outs["forks"])
        assert got["hit_tokens"] == hits, (got["hit_tokens"], hits)
        sim_s, forks_s = statistics.median(times["simulate"]), statistics.median(times["forks"])
        print(f"{args.mode} log: {n:,} requests, {log.stat().st_size / 2**20:.1f} MiB; load average "
              f"{os.getloadavg()[0]:.2f}")
        print(f"simulate-prefix --policy infinite  {sim_s:7.2f} s  peak RSS {rss['simulate']:6,} MiB  "
              f"hit tokens {hits:,}")
        print(f"fork analysis                      {forks_s:7.2f} s  peak RSS {rss['forks']:6,} MiB  "
              f"{got['passes']} tree passes, {got['replays']} replays, fixed: {got['fixed_hit_tokens']:,} hit tokens")
        print(f"ratio {forks_s / sim_s:.2f}x (goal <= 2x); medians of {args.runs} interleaved runs")
        for f in got["forks"]:
            print(f"  fork {f['cause']:16} {str(f['path']):22} char {f['char']}  values {f['distinct_values']:,}  "
                  f"requests {f['requests']:,}  tokens lost {f['tokens_lost']:,}  {f['fixable']}")


if __name__ == "__main__":
    main()
