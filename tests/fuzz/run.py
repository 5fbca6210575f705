"""The long fuzz run, outside CI: every target in turn until the time is up; findings minimized and saved.

    python -m tests.fuzz.run --minutes 5 [--target lint.template ...] [--out fuzz-findings] [--corpus]

Each finding (an input that breaks the property of :mod:`tests.fuzz.harness`) is minimized by removing
chunks of bytes while the same violation persists, written to ``--out``, and with ``--corpus`` also added to
``tests/fuzz_corpus`` (replayed by the normal test suite). Prints how many inputs were generated and what
was found. Memory is capped with RLIMIT_AS (``--memory-gib``) so that an unbounded allocation fails fast.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from . import corpus
from .harness import violations
from .strategies import strings
from .targets import OPTION_TARGETS, TARGETS, run_option, run_target, size


def signature(found: list[str]) -> str:
    """What makes two findings the same bug: the first violation without numbers and quoted values."""
    first = found[0]
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", first)
    first = re.sub(r"\d+", "N", first)
    return first[:120]


def minimize(check, data: bytes, sig: str, budget_s: float = 30.0) -> bytes:
    """Greedy chunk removal (halving chunk sizes) while ``check(data)`` still gives ``sig``."""
    deadline = time.monotonic() + budget_s
    chunk = max(1, len(data) // 2)
    while chunk >= 1 and time.monotonic() < deadline:
        i = 0
        progressed = False
        while i < len(data) and time.monotonic() < deadline:
            candidate = data[:i] + data[i + chunk:]
            if candidate != data and check(candidate) == sig:
                data = candidate
                progressed = True
            else:
                i += chunk
        if not progressed:
            chunk //= 2
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.run", description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--target", action="append", help="only these targets (repeatable); default all")
    ap.add_argument("--batch", type=int, default=40, help="inputs per target before moving to the next")
    ap.add_argument("--out", default="bench/out/fuzz", help="where findings go (git-ignored)")
    ap.add_argument("--corpus", action="store_true", help="add minimized findings to tests/fuzz_corpus")
    ap.add_argument("--memory-gib", type=float, default=8.0)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds one input may take")
    args = ap.parse_args(argv)

    limit = int(args.memory_gib * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="cachectl-fuzz-"))
    targets = [t for t in TARGETS if not args.target or t.name in args.target]
    options = [o for o in OPTION_TARGETS if not args.target or o[0] in args.target]
    z = size(long=True)
    generated: dict[str, int] = {}
    findings: dict[tuple[str, str], dict] = {}
    deadline = time.monotonic() + args.minutes * 60
    cfg = settings(max_examples=args.batch, deadline=None, database=None, derandomize=False,
                   suppress_health_check=list(HealthCheck))

    def record(name: str, found: list[str], data: bytes, describe: str) -> None:
        key = (name, signature(found))
        if key not in findings:
            findings[key] = {"target": name, "violation": found[0], "data": data, "describe": describe, "count": 0}
            print(f"[{time.strftime('%H:%M:%S')}] {name}: {found[0][:160]}", flush=True)
        findings[key]["count"] += 1

    rounds = 0
    while time.monotonic() < deadline:
        rounds += 1
        for t in targets:
            if time.monotonic() >= deadline:
                break

            def make(t):
                @cfg
                @given(t.strategy(z))
                def one(data: bytes) -> None:
                    if time.monotonic() >= deadline:
                        return
                    generated[t.name] = generated.get(t.name, 0) + 1
                    outcome, expect = run_target(t, data, work, timeout=args.timeout)
                    found = violations(outcome, expect)
                    if found:
                        record(t.name, found, data, outcome.describe())
                return one

            make(t)()
        for name, argv in options:
            if time.monotonic() >= deadline:
                break

            def make_opt(name, argv):
                @cfg
                @given(strings())
                def opt(value: str) -> None:
                    if time.monotonic() >= deadline or "\x00" in value:
                        return
                    generated[name] = generated.get(name, 0) + 1
                    outcome, expect = run_option(name, argv, value, timeout=args.timeout)
                    found = violations(outcome, expect)
                    if found:
                        record(name, found, value.encode("utf-8", "surrogatepass"), outcome.describe())
                return opt

            make_opt(name, argv)()

    total = sum(generated.values())
    print(f"\n{total:,} inputs generated in {rounds} round(s) over {len(generated)} targets:")
    for name, n in sorted(generated.items()):
        print(f"  {name:28} {n:6,}")
    by_name = {t.name: t for t in targets}
    summary = []
    for (name, sig), f in sorted(findings.items()):
        data = f["data"]
        if name in by_name:
            t = by_name[name]

            def check(candidate: bytes, t=t) -> str | None:
                outcome, expect = run_target(t, candidate, work, timeout=args.timeout)
                found = violations(outcome, expect)
                return signature(found) if found else None
        else:
            argv = dict(options)[name]

            def check(candidate: bytes, name=name, argv=argv) -> str | None:
                try:
                    value = candidate.decode("utf-8", "surrogatepass")
                except UnicodeDecodeError:
                    return None
                outcome, expect = run_option(name, argv, value, timeout=args.timeout)
                found = violations(outcome, expect)
                return signature(found) if found else None
        # a hang or a memory finding takes up to --timeout per try: kept as found
        slow = f["violation"].startswith(("hang", "peak memory"))
        small = data if slow else minimize(check, data, sig, budget_s=20.0)
        digest = hashlib.sha256(small).hexdigest()[:10]
        path = out_dir / f"{name}-{digest}.bin"
        path.write_bytes(small)
        summary.append({"target": name, "violation": f["violation"], "hits": f["count"], "file": str(path),
                        "bytes": len(small)})
        if args.corpus:
            corpus.add_case(name, small, note=f["violation"][:200])
    (out_dir / "summary.json").write_text(json.dumps({"generated": generated, "total": total,
                                                      "findings": summary}, indent=2))
    print(f"\n{len(summary)} distinct finding(s)" + (":" if summary else ""))
    for s in summary:
        print(f"  {s['target']}: {s['violation'][:200]} ({s['hits']} hits; minimized to {s['bytes']} bytes: "
              f"{s['file']})")
    return 1 if summary else 0


if __name__ == "__main__":
    sys.exit(main())
