"""Benchmark: where one ``report`` (or ``fix``) spends its time, phase by phase and process by process.

Runs the command once, in a process of its own, with each phase of the whole-log pipeline timed where it runs
(wall clock from the process's start, and the CPU the process had used by then; the fixture tokenizer,
``--format json``): the first read, the fork
analysis (``fix.forked``), the rewrites of the fix codes (``fix.rewrites``), and each sweep that measures versions
of the log (``fix.measured_pass``: the fixes' sweep in the main process; with two processes, the child's sweep,
which measures the log as it is and feeds the provider and curve sections as it goes). A forked child reports under
its own pid. The phases are found by name in ``cachectl.engines.repair.fix``: a renamed phase stops the benchmark,
never a table with a phase missing.

This is what says which process sets the pace (the one whose phases end last) and where the second core is idle
(a phase of one process with nothing beside it in the other). Seconds depend on the machine and its load: compare
runs made one after the other, on the same machine.

    python bench/bench_report_phases.py LOG.jsonl [--command report|fix] [--jobs N] [-- EXTRA ARGS]
    python bench/bench_log_memory.py --write LOG.jsonl --requests 20000     # a log of the bench's generator
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchutil import ENV, ROOT

TOK = str(ROOT / "fixtures" / "tok")

# the runner: wraps each phase, then runs the CLI as `python -m cachectl` would
RUNNER = r"""
import functools, os, resource, sys, time
T0 = float(sys.argv[1])

def stamp(name, edge):
    r = resource.getrusage(resource.RUSAGE_SELF)
    print(f"PHASE {name} {edge} {os.getpid()} {time.time() - T0:.3f} {r.ru_utime + r.ru_stime:.3f}",
          file=sys.stderr, flush=True)

def wrap(owner, attr, name):
    f = getattr(owner, attr)  # (a renamed phase: AttributeError, and the benchmark stops)
    @functools.wraps(f)
    def timed(*a, **k):
        stamp(name, "start")
        try:
            return f(*a, **k)
        finally:
            stamp(name, "end")
    setattr(owner, attr, timed)

from cachectl.engines.repair import fix
for attr, name in (("forked", "fork analysis"), ("rewrites", "rewrites"), ("measured_pass", "sweep")):
    wrap(fix, attr, name)
stamp("process", "start")
sys.argv = ["cachectl"] + sys.argv[2:]
from cachectl.cli import main
try:
    main()
finally:
    stamp("process", "end")
"""

LINE = re.compile(r"^PHASE (.+) (start|end) (\d+) ([\d.]+) ([\d.]+)$")


def phases(stderr: str) -> list[tuple[int, str, float, float, float | None]]:
    """(pid, phase, start, end, CPU seconds in it) of each phase the run reported, in the order they started; the
    first read is the main process's time from its start to the fork analysis (its CPU: None, not told apart)."""
    open_: dict[tuple[int, str], tuple[float, float]] = {}
    out: list[tuple[int, str, float, float, float | None]] = []
    for line in stderr.splitlines():
        m = LINE.match(line)
        if m is None:
            continue
        name, edge, pid, at, cpu = m.group(1), m.group(2), int(m.group(3)), float(m.group(4)), float(m.group(5))
        if edge == "start":
            open_[pid, name] = (at, cpu)
        elif (pid, name) in open_:
            t0, c0 = open_.pop((pid, name))
            out.append((pid, name, t0, at, cpu - c0))
    main = next((r for r in out if r[1] == "process"), None)
    fork = next((r for r in out if r[1] == "fork analysis"), None)
    if main is not None and fork is not None and fork[0] == main[0]:
        out.append((main[0], "first read (to the fork analysis)", main[2], fork[2], None))
    return sorted(out, key=lambda r: (r[2], r[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="a JSONL log (bench_log_memory.py --write makes one)")
    ap.add_argument("--command", choices=("report", "fix"), default="report")
    ap.add_argument("--jobs", type=int, default=None, help="the command's --jobs (default: its own)")
    args, extra = ap.parse_known_args()  # (the rest, after --, goes to the command)
    args.extra = [a for a in extra if a != "--"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [args.command, args.log, "-t", TOK, "--format", "json", *args.extra]
        if args.command == "fix":
            cmd += ["-o", str(Path(tmp) / "fixed.jsonl")]
        if args.jobs is not None:
            cmd += ["--jobs", str(args.jobs)]
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-c", RUNNER, repr(t0), *cmd], capture_output=True, cwd=ROOT,
                              env=ENV, text=True)
    if proc.returncode not in (0, 1):  # (1: the log loses prefix tokens, or a fork has a fix)
        raise SystemExit(f"{args.command} failed ({proc.returncode}): {proc.stderr[-800:]}")
    rows = phases(proc.stderr)
    main_pid = next((r[0] for r in rows if r[1] == "process"), None)
    missing = {"fork analysis", "rewrites", "sweep"} - {r[1] for r in rows if r[0] == main_pid}
    if main_pid is None or missing:  # (a phase renamed, or a run that ended before it: no table with a gap)
        raise SystemExit(f"{args.command} did not report {sorted(missing) or ['its end']} "
                         f"(exit {proc.returncode}): {proc.stderr[-800:]}")
    print(f"{args.command} {args.log} ({' '.join(cmd[2:])}); seconds from the main process's start")
    print(f"{'process':>12} {'phase':<36} {'from':>9} {'to':>9} {'seconds':>9} {'CPU s':>9}")
    for pid, name, start, end, cpu in rows:
        who = "main" if pid == main_pid else f"child {pid}"
        cpu_s = "" if cpu is None else f"{cpu:9.1f}"
        print(f"{who:>12} {name:<36} {start:9.1f} {end:9.1f} {end - start:9.1f} {cpu_s:>9}")


if __name__ == "__main__":
    main()
