"""Benchmark: wall time of `cachectl prompt-cost` what-if mode against the floor of any Typer + rich CLI.

Runs, interleaved, N times each (process start included):
  bare      python -c "import typer, rich"
  minimal   a Typer app of two commands that prints a small rich table (written to a temp file)
  cachectl  python -m cachectl prompt-cost --model claude-sonnet-4-5 --prefix-tokens 180000 ... --calls 20
and prints the median seconds and ratios. Target: cachectl <= 1.3x minimal.

    python bench/bench_prompt_cost_startup.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MINIMAL = '''
import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer()


@app.command()
def cost(model: str = "m", calls: int = 20):
    table = Table("call", "cost")
    for i in range(calls):
        table.add_row(str(i), f"${0.0675 * (i + 1):.4f}")
    Console().print(table)


@app.command()
def other():
    print("other")


if __name__ == "__main__":
    app()
'''


# As a user runs it: bytecode caches on (some sandboxes set PYTHONDONTWRITEBYTECODE, which makes every
# start compile cachectl from source while site-packages keep the .pyc files pip wrote).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=ROOT, env=ENV)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "minimal.py"
        app.write_text(MINIMAL, encoding="utf-8")
        cmds = {
            "bare import typer, rich": [sys.executable, "-c", "import typer, rich"],
            "minimal typer+rich app": [sys.executable, str(app), "cost", "--calls", "20"],
            "cachectl prompt-cost what-if": [sys.executable, "-m", "cachectl", "prompt-cost", "--model",
                                             "claude-sonnet-4-5", "--prefix-tokens", "180000", "--suffix-tokens",
                                             "2000", "--output-tokens", "500", "--calls", "20", "--every", "2m"],
        }
        for cmd in cmds.values():  # warm the file cache
            timed(cmd)
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(args.runs):
            for name, cmd in cmds.items():
                times[name].append(timed(cmd))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["minimal typer+rich app"]
    print(f"{args.runs} runs each, interleaved; median wall seconds, process start included")
    print(f"{'command':<32}{'median s':>10}{'vs minimal':>12}")
    for name, m in med.items():
        print(f"{name:<32}{m:>10.3f}{m / base:>12.2f}")


if __name__ == "__main__":
    main()
