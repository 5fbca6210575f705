"""Benchmark: `diff-tokens --log` throughput against raw `tokenizers` encode_batch of the same texts.

Generates a JSONL log of conversations whose prompts share a long system prompt and grow turn by turn
(default 2,000 prompts of about 2,000 tokens), then, in the same run:
  raw      tokenizers.Tokenizer.encode_batch over all the texts at once, plus reading out the IDs
  engine   cachectl's diff_log over the log file (read, parse, tokenize in batches, compare, serialize)
  cli      the real `python -m cachectl diff-tokens --log ... --format json` process, start-up included
and prints tokens/s and the ratio engine/raw (target >= 0.8x). Peak memory of the CLI is measured on
the log and on a log 3x longer with the same number of open conversations: it should not grow with it.

    python bench/bench_diff_log.py [--prompts 2000] [--tokenizer fixtures/tok] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cachectl.engines.tokendiff import diff_log  # noqa: E402
from cachectl.inputs import iter_log  # noqa: E402
from cachectl.tokenization import load_tokenizer  # noqa: E402


def words() -> list[str]:
    return (ROOT / "fixtures" / "corpus.txt").read_text(encoding="utf-8").split()


def make_log(path: Path, prompts: int, active: int, turns: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    vocab = words()

    def sentence(n: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(n))

    system = "You are a helpful assistant for cache diagnostics.\n" + "\n".join(sentence(25) for _ in range(40))
    written = 0
    conv = 0
    with path.open("w", encoding="utf-8") as fh:
        while written < prompts:
            group = [{"sid": f"c{conv + i}", "history": "", "stamp": rng.random() < 0.1} for i in range(active)]
            conv += active
            for turn in range(turns):
                for c in group:
                    if written >= prompts:
                        break
                    c["history"] += f"\nUser: {sentence(30)}\nAssistant: {sentence(40)}"
                    top = f"Current time: 2026-11-29T10:{turn:02d}:00Z\n" if c["stamp"] else ""
                    fh.write(json.dumps({"sid": c["sid"], "prompt": top + system + c["history"]}) + "\n")
                    written += 1


def run_raw(tok, texts: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    encs = tok.backend.encode_batch(texts, add_special_tokens=True)
    ids = [e.ids for e in encs]
    n = sum(len(x) for x in ids)
    del encs, ids  # freeing the results is part of any consumer's work
    return time.perf_counter() - t0, n


def run_engine(tok, path: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    sink = 0
    for item in diff_log(iter_log(str(path), "sid"), tok):
        # serialized exactly as the CLI writes it
        sink += len(orjson.dumps(item.to_json_obj(), option=orjson.OPT_NON_STR_KEYS))
    dt = time.perf_counter() - t0
    return dt, sink


def run_cli(path: Path, tokenizer: str) -> tuple[float, float]:
    code = ("import resource, subprocess, sys, time; t0 = time.perf_counter(); "
            "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "dt = time.perf_counter() - t0; "
            "print(dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    cmd = [sys.executable, "-c", code, sys.executable, "-m", "cachectl", "diff-tokens", "--log", str(path),
           "--key", "sid", "-t", tokenizer, "--format", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--active", type=int, default=20, help="conversations open at once (the working set)")
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--tokenizer", default=str(ROOT / "fixtures" / "tok"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    tok = load_tokenizer(args.tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.jsonl"
        make_log(log, args.prompts, args.active, args.turns)
        texts = [orjson.loads(line)["prompt"] for line in log.open("rb")]
        raw_best = eng_best = float("inf")
        tokens = 0
        for _ in range(args.repeat):  # interleaved, best of N, so both see the same machine state
            dt, tokens = run_raw(tok, texts)
            raw_best = min(raw_best, dt)
            dt, _ = run_engine(tok, log)
            eng_best = min(eng_best, dt)
        cli_time, cli_rss = run_cli(log, args.tokenizer)
        long_log = Path(tmp) / "long.jsonl"
        make_log(long_log, args.prompts * 3, args.active, args.turns)
        _, long_rss = run_cli(long_log, args.tokenizer)
        size_mb = log.stat().st_size / 1e6

    print(f"log: {args.prompts} prompts, {tokens} tokens ({tokens / args.prompts:.0f}/prompt), {size_mb:.1f} MB; "
          f"tokenizer {args.tokenizer}; {os.cpu_count()} CPUs")
    print(f"{'run':<34}{'seconds':>10}{'Mtok/s':>10}{'vs raw':>10}")
    print(f"{'raw tokenizers encode_batch':<34}{raw_best:>10.3f}{tokens / raw_best / 1e6:>10.2f}{1.0:>10.2f}")
    print(f"{'cachectl diff_log (engine)':<34}{eng_best:>10.3f}{tokens / eng_best / 1e6:>10.2f}"
          f"{raw_best / eng_best:>10.2f}")
    print(f"{'cachectl CLI, process start incl.':<34}{cli_time:>10.3f}{tokens / cli_time / 1e6:>10.2f}"
          f"{raw_best / cli_time:>10.2f}")
    print(f"CLI peak RSS: {cli_rss:.0f} MiB on {args.prompts} prompts, {long_rss:.0f} MiB on {args.prompts * 3} "
          f"(same {args.active} open conversations)")


if __name__ == "__main__":
    main()
