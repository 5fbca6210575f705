"""Benchmark: the work one whole-log command does per request, against the floor (issue 37's before/after table).

Runs ``report`` and ``fix`` in this process (``--jobs 1``, so that every part is counted here) on a log written by
``bench_log_memory.py``'s generator, under cProfile, and prints per request:

- **parses**: calls of ``parse_request`` (a JSON value read as a request);
- **renders**: chat-template renders (``render_chat_template``; the instrumented renders that find the spans
  count too);
- **tokens encoded**: tokens the tokenizer produced (``encode_batch`` and ``encode`` through cachectl's sized
  backend), as a multiple of the floor's: each distinct prompt rendered and tokenized once;
- **replays**: passes of a prefix-cache replay over the whole log: ``simulate`` calls (the vLLM replays of the
  measures, in the threads of a sweep too), the fork analysis' own tree passes, and the sweep's no-eviction replay
  of every version at once (``InfiniteVersions``: one pass however many versions);
- **measure passes**: passes over the log by the before/after measures (``measure_versions`` calls: one sweep
  measures several versions of the log; before it, ``measure`` calls, one version each).

The floor parses each line once, renders each distinct prompt once and encodes its tokens once. Counts, not
seconds: they do not depend on the machine's load.

    python bench/bench_report_work.py [--requests 2000] [--commands report,fix] [--log LOG.jsonl]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TOK = str(ROOT / "fixtures" / "tok")

COMMANDS = {
    "report": ["report", "{log}", "--key", "session", "-t", TOK, "--format", "json", "--jobs", "1"],
    "fix": ["fix", "{log}", "-t", TOK, "--key", "session", "--unsafe-fixes", "-o", "{out}", "--format", "json",
            "--jobs", "1"],
    "simulate-prefix": ["simulate-prefix", "{log}", "--policy", "infinite", "-t", TOK, "--format", "json"],
}


class Tokens:
    """Tokens encoded through cachectl's sized backend (every encode of the tokenizer goes through it)."""

    def __init__(self) -> None:
        self.n = 0

    @contextlib.contextmanager
    def counting(self):
        from cachectl.tokenization import _SizedBackend

        enc, batch = _SizedBackend.encode, _SizedBackend.encode_batch

        def encode(this, text, *a, **k):
            got = enc(this, text, *a, **k)
            self.n += len(got.ids)
            return got

        def encode_batch(this, texts, *a, **k):
            got = batch(this, texts, *a, **k)
            self.n += sum(len(e.ids) for e in got)
            return got

        _SizedBackend.encode, _SizedBackend.encode_batch = encode, encode_batch
        try:
            yield self
        finally:
            _SizedBackend.encode, _SizedBackend.encode_batch = enc, batch


def calls(stats: pstats.Stats, module: str, name: str) -> int:
    """Calls of function ``name`` defined in a file ending with ``module``."""
    return sum(v[1] for (file, _, fn), v in stats.stats.items()  # type: ignore[attr-defined]
               if fn == name and file.replace(os.sep, "/").endswith(module))


def floor(log: Path) -> tuple[int, int]:
    """Requests, and tokens with each distinct prompt rendered and tokenized once."""
    import orjson

    import cachectl
    from cachectl.inputs import prompt_from_value

    tok = cachectl.load_tokenizer(TOK)
    seen: set[bytes] = set()
    prompts = []
    n = 0
    with log.open("rb") as fh:
        for n, line in enumerate(fh, 1):
            v = orjson.loads(line)
            key = orjson.dumps(v["body"])
            if key in seen:
                continue
            seen.add(key)
            prompts.append(prompt_from_value(v, source=str(log), line=n))
    tokens = sum(len(t.ids) for t in tok.tokenize_many(prompts, add_generation_prompt=True))
    return n, tokens


def measure(command: str, log: Path, out: Path) -> dict[str, int]:
    from typer.testing import CliRunner

    from cachectl.cli import app

    args = [a.format(log=log, out=out) for a in COMMANDS[command]]
    prof = cProfile.Profile()
    profs = [prof]

    def in_thread(*_: object) -> None:  # a thread's first event: its own profiler (the sweep's engines run in threads)
        p = cProfile.Profile()
        profs.append(p)
        p.enable()

    counter = Tokens()
    with counter.counting():
        threading.setprofile(in_thread)
        prof.enable()
        result = CliRunner().invoke(app, args, catch_exceptions=False)
        prof.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
    if result.exit_code not in (0, 1):
        raise SystemExit(f"{command} failed ({result.exit_code}): {result.output[-500:]}")
    stats = pstats.Stats(*profs, stream=io.StringIO())
    passes = calls(stats, "engines/prefix/forks/cost.py", "tree_pass")
    return {"parses": calls(stats, "inputs/request.py", "parse_request"),
            "renders": calls(stats, "tokenization.py", "render_chat_template"),
            "tokens": counter.n,
            "replays": (calls(stats, "engines/prefix/replay.py", "simulate") + passes
                        + calls(stats, "engines/prefix/replay.py", "__init__")),
            "measure passes": (calls(stats, "repair/measure.py", "measure_versions")
                               or calls(stats, "repair/measure.py", "measure"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--log", type=Path, help="a log to read (default: one written by bench_log_memory's generator)")
    ap.add_argument("--commands", default="report,fix")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = args.log
        if log is None:
            from bench_log_memory import make_log

            log = Path(tmp) / f"log{args.requests}.jsonl"
            make_log(log, args.requests)
        n, floor_tokens = floor(log)
        print(f"{log.name}: {n:,} requests; floor: {n:,} parses, {n:,} renders (at most), {floor_tokens:,} tokens")
        print(f"{'command':<16} {'parses/req':>10} {'renders/req':>11} {'tokens (x floor)':>16} {'replays':>8} "
              f"{'measure passes':>14}")
        for command in args.commands.split(","):
            got = measure(command, log, Path(tmp) / "out.jsonl")
            print(f"{command:<16} {got['parses'] / n:>10.1f} {got['renders'] / n:>11.1f} "
                  f"{got['tokens'] / floor_tokens:>15.1f}x {got['replays']:>8} {got['measure passes']:>14}")


if __name__ == "__main__":
    main()
