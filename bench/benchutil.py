"""What the process-level benchmarks share: the environment of the runs and one timed subprocess call."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Bytecode caching on (this sandbox sets PYTHONDONTWRITEBYTECODE; a user's machine does not), the checkout
# first on the path.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPATH"] = str(ROOT) + os.pathsep + ENV.get("PYTHONPATH", "")


def timed(cmd: list[str]) -> tuple[float, str]:
    """Wall seconds of one run (process start included) and its stdout; a failed run stops the benchmark."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, cwd=ROOT, env=ENV)
    elapsed = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{cmd} failed: {proc.stderr.decode()[-500:]}")
    return elapsed, proc.stdout.decode()
