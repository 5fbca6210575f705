"""Benchmark: peak memory and time of the whole-log commands as the log grows, against `simulate-prefix
--policy infinite` on the same log.

Generates OpenAI Chat request logs ({timestamp, session, body} wrappers; default 10k and 100k requests, 500k
with --large) of interleaved support conversations: a shared system prompt and tool list, 2 to 6 turns each,
some with a clock at the top of the system prompt, some with tool keys in another order (so `fix` has work).
About 40 conversations are open at a time; each closes within the 30-minute grouping window of `fix`. Each
command runs in its own process (the fixture tokenizer, `--format json`), and prints its wall time and peak
memory above the same command's peak on a 200-request log (start-up, tokenizer and imports), per request: the
goal is at most 2 KB per request and a time linear in the log. The peak is the summed PSS of the command and
the worker processes `report` and `fix` fork (sampled every 0.2 s; pages a child shares with its parent count
once); the main process's ``ru_maxrss`` is printed beside it. ``--jobs 1`` runs them in one process.

    python bench/bench_log_memory.py [--sizes 10000,100000] [--large] [--commands report,fix,...]
    python bench/bench_log_memory.py --checkout ../main ...             # the same runs of another checkout
    python bench/bench_log_memory.py --write LOG.jsonl --requests N     # only the generator
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPATH"] = str(ROOT) + os.pathsep + ENV.get("PYTHONPATH", "")
TOK = str(ROOT / "fixtures" / "tok")

TOOLS = [
    {"type": "function", "function": {"name": "search_docs", "description": "Search the documentation.",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                     "required": ["q"]}}},
    {"type": "function", "function": {"name": "open_ticket", "description": "Open a support ticket.",
                                      "parameters": {"type": "object", "properties": {"title": {"type": "string"}},
                                                     "required": ["title"]}}},
]


def _reordered(tool: dict) -> dict:
    fn = tool["function"]
    return {"function": {"parameters": fn["parameters"], "name": fn["name"], "description": fn["description"]},
            "type": "function"}


def make_log(path: Path, requests: int, seed: int = 5, active: int = 40) -> int:
    """Write ``requests`` lines; the number of bytes written."""
    rng = random.Random(seed)
    vocab = (ROOT / "fixtures" / "corpus.txt").read_text(encoding="utf-8").split()

    def sentence(n: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(n))

    system = "You are a support agent for a cache diagnostics product.\n" + sentence(60)
    t0 = 1_796_032_800.0  # 2026-11-30T10:00:00Z
    convs: list[dict] = []
    made = 0
    written = 0
    with path.open("w", encoding="utf-8") as fh:
        for i in range(requests):
            if len(convs) < active:
                convs.append({"sid": f"c{made}", "msgs": [], "turns": rng.randint(2, 6),
                              "clock": rng.random() < 0.15, "keys": rng.random() < 0.1})
                made += 1
            c = convs[rng.randrange(len(convs))]
            now = t0 + 2 * i
            if c["msgs"]:
                c["msgs"].append({"role": "assistant", "content": sentence(25)})
            c["msgs"].append({"role": "user", "content": sentence(20)})
            top = f"Current time: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))}\n\n" if c["clock"] else ""
            tools = TOOLS if not (c["keys"] and len(c["msgs"]) % 4 == 3) else [_reordered(TOOLS[0]), TOOLS[1]]
            body = {"model": "gpt-4.1", "messages": [{"role": "system", "content": top + system}, *c["msgs"]],
                    "tools": tools}
            line = json.dumps({"timestamp": now, "session": c["sid"],
                               "body": body}) + "\n"
            fh.write(line)
            written += len(line)
            if len(c["msgs"]) >= 2 * c["turns"] - 1:
                convs.remove(c)
    return written


COMMANDS: dict[str, list[str]] = {
    "report": ["report", "{log}", "--key", "session", "-t", TOK, "--format", "json"],
    "report-auto": ["report", "{log}", "-t", TOK, "--format", "json"],
    # the prompts rendered and tokenized on a local Ray instance started for the run (its processes counted)
    "report-ray": ["report", "{log}", "--key", "session", "-t", TOK, "--format", "json", "--ray", "local"],
    "fix": ["fix", "{log}", "-t", TOK, "--unsafe-fixes", "-o", "{out}", "--format", "json"],
    "prompt-cost": ["prompt-cost", "{log}", "-t", TOK, "--format", "json"],
    "diff-tokens": ["diff-tokens", "--log", "{log}", "--key", "session", "-t", TOK, "--format", "json"],
    "diff-tokens-auto": ["diff-tokens", "--log", "{log}", "-t", TOK, "--format", "json"],
    "simulate-prefix": ["simulate-prefix", "{log}", "--policy", "infinite", "-t", TOK, "--format", "json"],
}


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (Linux: /proc/PID/task/PID/children)."""
    pids, i = [root], 0
    while i < len(pids):
        try:
            with open(f"/proc/{pids[i]}/task/{pids[i]}/children") as fh:
                pids += [int(c) for c in fh.read().split()]
        except OSError:
            pass
        i += 1
    return pids


def _pss(pid: int) -> int:
    """The proportional set size of ``pid`` in bytes (pages shared with a forked child count half to each)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class TreeMemory:
    """The peak of the summed PSS of a process and its children (the worker processes of `report` and `fix`
    share the parent's pages until they write them: RSS would count those pages once per process), sampled every
    0.2 s in a thread."""

    def __init__(self, pid: int):
        self.pid, self.peak, self.procs = pid, 0, 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = _tree(self.pid)
            self.peak = max(self.peak, sum(_pss(p) for p in pids))
            self.procs = max(self.procs, len(pids))
            self._stop.wait(0.2)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run(name: str, log: Path, out: Path, checkout: Path = ROOT, jobs: int | None = None) -> tuple[float, int, int]:
    """Wall seconds, peak RSS of the command's main process (bytes, ``ru_maxrss``) and peak PSS of it and its
    worker processes together (bytes; 0 where /proc has no smaps_rollup); stdout discarded."""
    args = [a.format(log=log, out=out) for a in COMMANDS[name]]
    if jobs is not None and name.split("-")[0] in ("report", "fix"):
        args += ["--jobs", str(jobs)]
    env = {**ENV, "PYTHONPATH": str(checkout)}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "cachectl", *args], cwd=checkout, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    mem = TreeMemory(proc.pid)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    tree = mem.stop()
    err = proc.stderr.read().decode() if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{name} on {log.name} failed ({code}): {err[-800:]}")
    return elapsed, usage.ru_maxrss * 1024, tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000", help="comma-separated request counts")
    ap.add_argument("--large", action="store_true", help="also 500,000 requests (minutes per command)")
    ap.add_argument("--commands", default=",".join(COMMANDS), help=f"among {', '.join(COMMANDS)}")
    ap.add_argument("--write", metavar="LOG", help="only write a generated log of --requests lines here")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, help="--jobs for report and fix (default: theirs, the cores available)")
    ap.add_argument("--checkout", type=Path, default=ROOT,
                    help="run the commands of another checkout (a before/after on the same machine)")
    args = ap.parse_args()
    if args.write:
        n = make_log(Path(args.write), args.requests)
        print(f"wrote {args.write}: {args.requests} requests, {n / 1e6:.1f} MB")
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.large:
        sizes.append(500_000)
    names = [c for c in args.commands.split(",") if c]
    unknown = [c for c in names if c not in COMMANDS]
    if unknown:
        raise SystemExit(f"unknown command(s) {unknown}; known: {', '.join(COMMANDS)}")
    with tempfile.TemporaryDirectory() as tmp:
        base_log = Path(tmp) / "base.jsonl"
        make_log(base_log, 200)
        base = {name: run(name, base_log, Path(tmp) / "out.jsonl", args.checkout, args.jobs) for name in names}
        print(f"{sys.platform}, {os.cpu_count()} CPUs; peak memory above each command's peak on 200 requests "
              f"({', '.join(f'{n} {b[2] / 2**20:.0f} MB' for n, b in base.items())}); 'peak MB': the summed PSS of "
              "the command and its worker processes, 'main RSS': its main process's ru_maxrss")
        print(f"{'requests':>9} {'MB':>7} {'command':<16}{'seconds':>9}{'us/req':>8}{'peak MB':>9}"
              f"{'above MB':>10}{'B/req':>8}{'main RSS':>10}")
        for n in sizes:
            log = Path(tmp) / f"log{n}.jsonl"
            size = make_log(log, n)
            for name in names:
                secs, rss, peak = run(name, log, Path(tmp) / "out.jsonl", args.checkout, args.jobs)
                above = max(0, peak - base[name][2])
                print(f"{n:>9,} {size / 1e6:>7.1f} {name:<16}{secs:>9.1f}{secs / n * 1e6:>8.0f}{peak / 2**20:>9.0f}"
                      f"{above / 2**20:>10.0f}{above / n:>8.0f}{rss / 2**20:>10.0f}", flush=True)
            log.unlink()


if __name__ == "__main__":
    main()
