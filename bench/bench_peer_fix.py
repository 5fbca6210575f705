"""Benchmark: ``report`` and ``fix`` against the peer's whole-log fix (kvlint's ``fix``) and against
``simulate-prefix --policy infinite``, on the same generated logs, side by side (issue 37's "both faster than the
peer's whole-log fix on the same log").

Each size's log comes from ``bench_log_memory.py``'s generator; kvlint reads the same requests as its OpenAI JSONL
(each line's body with ``session_id`` and ``timestamp`` beside it). Every command runs in its own process, one after
the other, round after round (``--rounds``): ``simulate-prefix --policy infinite``, ``report`` and
``fix --unsafe-fixes -o`` in one process (``--jobs 1``) and with the default workers, and ``kvlint fix --apply
--out`` (one process; it rewrites the log, tokenizes it again and replays it for vLLM and SGLang). Two more give the
floor of a fix that measures what it wrote: ``simulate-prefix`` on the log the round's ``fix`` wrote, and on a log of
one request (a process's start-up). The floor, printed after the table, is the two logs' ``simulate-prefix`` less one
start-up: each line read, rendered and encoded as it is and as the fix left it, and replayed, once. cachectl uses the
fixture tokenizer (``fixtures/tok``); kvlint loads the same directory with transformers' ``AutoTokenizer``.

kvlint runs from a virtualenv of its own (``--kvlint-venv``; made and installed from the package index the first
time: ``pip install kvlint==VERSION``), so that its dependencies never meet cachectl's. Printed per run: wall
seconds, CPU seconds (user and system, of the process and the children it reaped) and peak RSS of the main process;
then, per size and command, the fastest round's wall and its ratios to ``simulate-prefix`` and to kvlint's
``fix``. Seconds depend on the machine and its load: only the ratios of one run of this script compare.

    python bench/bench_peer_fix.py [--sizes 5000,20000] [--rounds 2] [--kvlint-venv DIR] [--kvlint-version 0.1.1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_log_memory import TOK, make_log  # noqa: E402
from benchutil import ENV, ROOT  # noqa: E402

#: name -> cachectl arguments ({log}, {out}, {fixed}, {one}); "kvlint fix" is the peer's (its arguments are made in :func:`main`)
COMMANDS: dict[str, list[str]] = {
    "simulate-prefix": ["simulate-prefix", "{log}", "--policy", "infinite", "-t", TOK, "--format", "json"],
    "report --jobs 1": ["report", "{log}", "-t", TOK, "--format", "json", "--jobs", "1"],
    "fix --jobs 1": ["fix", "{log}", "-t", TOK, "--unsafe-fixes", "-o", "{out}", "--format", "json", "--jobs", "1"],
    "report": ["report", "{log}", "-t", TOK, "--format", "json"],
    "fix": ["fix", "{log}", "-t", TOK, "--unsafe-fixes", "-o", "{out}", "--format", "json"],
    # the floor of a whole-log fix: what reading the fixed log costs (a fix must render and encode every line it
    # changed to measure it), and what a process costs that reads one request (its start-up, imports included)
    "simulate-prefix fixed": ["simulate-prefix", "{fixed}", "--policy", "infinite", "-t", TOK, "--format", "json"],
    "simulate-prefix 1": ["simulate-prefix", "{one}", "--policy", "infinite", "-t", TOK, "--format", "json"],
    "kvlint fix": [],
}


def kvlint_log(src: Path, dst: Path) -> int:
    """``src`` (the generator's ``{timestamp, session, body}`` lines) as kvlint's OpenAI JSONL; the lines written."""
    n = 0
    with src.open(encoding="utf-8") as fh, dst.open("w", encoding="utf-8") as out:
        for line in fh:
            d = json.loads(line)
            out.write(json.dumps({**d["body"], "session_id": d["session"], "timestamp": d["timestamp"]}) + "\n")
            n += 1
    return n


def kvlint_exe(venv: Path, version: str) -> tuple[Path, str]:
    """kvlint's command in ``venv`` (installed there first where it is not) and the version installed there."""
    exe = venv / "bin" / "kvlint"
    if exe.exists():
        return exe, _installed(venv)
    print(f"installing kvlint=={version} into {venv}", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", f"kvlint=={version}"], check=True)
    if not exe.exists():
        raise SystemExit(f"no {exe} after installing kvlint=={version}")
    return exe, _installed(venv)


def _installed(venv: Path) -> str:
    """The version of kvlint in ``venv`` (the one measured, whatever ``--kvlint-version`` asked for)."""
    code = "import importlib.metadata as m; print(m.version('kvlint'))"
    got = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return got.stdout.strip()


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and the main process's peak RSS (bytes) of one command; stdout discarded. Exit 0
    and 1 (a report that found a fix) pass; any other stops the benchmark."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"{cmd[:3]} failed ({code}): {err[-800:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="5000,20000", help="comma-separated request counts")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--commands", default=",".join(COMMANDS), help=f"among: {', '.join(COMMANDS)}")
    ap.add_argument("--kvlint-venv", type=Path,
                    help="kvlint's own virtualenv, made where missing (default: cachectl-bench-kvlint-VERSION in the "
                         "temporary directory)")
    ap.add_argument("--kvlint-version", default="0.1.1")
    args = ap.parse_args()
    names = [c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = [c for c in names if c not in COMMANDS]
    if unknown:
        raise SystemExit(f"unknown command(s) {unknown}; known: {', '.join(COMMANDS)}")
    fixes = [i for i, c in enumerate(names) if c.startswith("fix")]
    if "simulate-prefix fixed" in names and (not fixes or fixes[0] > names.index("simulate-prefix fixed")):
        raise SystemExit("'simulate-prefix fixed' reads the log a fix wrote: name a fix command before it")
    venv = args.kvlint_venv or Path(tempfile.gettempdir()) / f"cachectl-bench-kvlint-{args.kvlint_version}"
    exe, version = kvlint_exe(venv, args.kvlint_version) if "kvlint fix" in names else (None, "not run")
    # (kvlint as a user runs it: not on the checkout's path, bytecode caching on, as cachectl's runs have it)
    kv_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    print(f"{sys.platform}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; kvlint {version}; wall "
          "and CPU seconds, the main process's peak RSS")
    print(f"{'requests':>9} {'round':>5}  {'command':<22}{'wall s':>8}{'CPU s':>8}{'RSS MB':>8}")
    summary: list[tuple[int, str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(s) for s in args.sizes.split(",") if s]:
            log, kv = Path(tmp) / f"log{n}.jsonl", Path(tmp) / f"kv{n}.jsonl"
            one, fixed = Path(tmp) / "one.jsonl", Path(tmp) / "fixed.jsonl"
            make_log(log, n)
            with log.open(encoding="utf-8") as fh, one.open("w", encoding="utf-8") as o:
                o.write(fh.readline())
            kvlint_log(log, kv)
            best: dict[str, float] = {}
            for r in range(1, args.rounds + 1):
                for name in names:
                    out = fixed if name.startswith("fix") else Path(tmp) / "out.jsonl"
                    if name == "kvlint fix":
                        assert exe is not None
                        cmd, env = [str(exe), "fix", str(kv), "--model", TOK, "--apply", "--out", str(out)], kv_env
                    else:
                        cmd = [sys.executable, "-m", "cachectl",
                               *(a.format(log=log, out=out, fixed=fixed, one=one) for a in COMMANDS[name])]
                        env = ENV
                    wall, cpu, rss = run(cmd, ROOT, env)
                    best[name] = min(best.get(name, wall), wall)
                    print(f"{n:>9,} {r:>5}  {name:<22}{wall:>8.1f}{cpu:>8.1f}{rss / 2**20:>8.0f}", flush=True)
            summary += [(n, name, best[name]) for name in names]
            for f in (log, kv, one, fixed):
                f.unlink(missing_ok=True)
    print(f"\nfastest round{'s' if args.rounds > 1 else ''}: wall, and as a multiple of simulate-prefix's and of "
          "kvlint fix's on the same log")
    print(f"{'requests':>9}  {'command':<22}{'wall s':>8}{'x sim':>8}{'x kvlint':>10}")
    rows = list(summary)
    for n in dict.fromkeys(m for m, _, _ in summary):
        ref = {nm: w for m, nm, w in summary if m == n}
        if {"simulate-prefix", "simulate-prefix fixed", "simulate-prefix 1"} <= set(ref):
            rows.append((n, "floor", ref["simulate-prefix"] + ref["simulate-prefix fixed"] - ref["simulate-prefix 1"]))
    for n, name, wall in sorted(rows, key=lambda r: r[0]):
        ref = {nm: w for m, nm, w in summary if m == n}
        sim, kvl = ref.get("simulate-prefix"), ref.get("kvlint fix")
        print(f"{n:>9,}  {name:<22}{wall:>8.1f}{wall / sim if sim else float('nan'):>8.2f}"
              f"{wall / kvl if kvl else float('nan'):>10.2f}")


if __name__ == "__main__":
    main()
