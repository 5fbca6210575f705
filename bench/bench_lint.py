"""Benchmark: `cachectl lint` over 200 generated templates in one run.

Writes 200 Jinja prompt templates (about 2 KB each; a third with a volatile value at the top, a third at
the end, a third with none) plus 20 request bodies, then times the real CLI process (start included) and
the engine in process, and counts renders: a template is rendered once, plus once per volatile variable.

    python bench/bench_lint.py [--templates 200] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def make(tmp: Path, n: int) -> None:
    stable = "\n".join(f"Rule {i}: be precise about limits and quotas; cite the documentation section you used."
                       for i in range(24))
    for i in range(n):
        kind = i % 3
        head = "Current time: {{ current_time }}\n" if kind == 0 else ""
        tail = "\nCustomer: {{ user_name }}\n" if kind == 1 else ""
        (tmp / f"t{i:03d}.j2").write_text(head + f"Template {i}.\n" + stable + tail + "\n{{ question }}\n")
    for i in range(20):
        body = {"model": "claude-sonnet-4-5", "system": [{"type": "text", "text": stable * 3,
                                                          "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": "{{ question }}"}]}
        (tmp / f"b{i:02d}.json").write_text(json.dumps(body))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--templates", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    from cachectl.engines import lint
    from cachectl.engines.lint import templates as lint_templates

    with tempfile.TemporaryDirectory() as tmp:
        make(Path(tmp), args.templates)
        renders = 0
        original = lint_templates._render

        def counting(*a, **k):
            nonlocal renders
            renders += 1
            return original(*a, **k)

        lint_templates._render = counting
        t0 = time.perf_counter()
        report = lint.lint_paths([tmp], lint.LintConfig())
        engine = time.perf_counter() - t0
        lint_templates._render = original
        cmd = [sys.executable, "-m", "cachectl", "lint", tmp, "-f", "json", "--exit-zero"]
        subprocess.run(cmd, capture_output=True, check=True, cwd=ROOT, env=ENV)  # warm-up
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True, cwd=ROOT, env=ENV)
            times.append(time.perf_counter() - t0)
    files = report.files
    print(f"{files} files ({args.templates} templates + 20 bodies), {len(report.findings)} findings, "
          f"{renders} renders ({renders / args.templates:.2f} per template)")
    print(f"engine in process: {engine:.3f} s ({files / engine:,.0f} files/s)")
    print(f"CLI, process start incl., median of {args.runs}: {statistics.median(times):.3f} s")


if __name__ == "__main__":
    main()
