"""Run a cachectl command in-process and check the property every input must satisfy.

The property: exit 0 or 1 with valid output (``--format json`` output parses as strict JSON), or exit 2
with exactly one stderr line ``cachectl: error: ...`` that names the input (the file, or the option the
value came from), and never the catch-all "internal error" (counted in
``cachectl.cli.common.internal_errors``), a traceback, an uncaught exception, a hang past ``timeout``
seconds, or a peak-memory growth past ``MEMORY_LIMIT_MB``.
"""

from __future__ import annotations

import json
import re
import resource
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Optional

import typer
from click.testing import CliRunner

#: a single input may raise this process's peak RSS by at most this much
MEMORY_LIMIT_MB = 768
#: an input that gives no answer in this long is a hang (one that never ends: a loop, a read that blocks); the
#: slowest answer seen, simulate-prefix --model importing transformers on a 2-core machine at load 4, took 20 s
DEFAULT_TIMEOUT_S = 60.0


class Hang(BaseException):
    """Raised by the alarm inside a command that runs too long (a BaseException: the catch-all lets it through)."""


@dataclass
class Outcome:
    args: list[str]
    exit_code: int | None
    stdout: str
    stderr: str
    internal: list[str]
    exception: BaseException | None
    seconds: float
    rss_growth_mb: float
    hang: bool = False

    def describe(self) -> str:
        return (f"cachectl {' '.join(self.args)}\n  exit {self.exit_code} in {self.seconds:.2f}s, "
                f"peak RSS +{self.rss_growth_mb:.0f} MB\n  stderr: {self.stderr[:600]!r}\n"
                f"  stdout: {self.stdout[:300]!r}")


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _reader_app() -> typer.Typer:
    """Readers whose command would load an embedding model next: run them alone, behind the same error
    handler as every command (the fuzz tests never load a model)."""
    from cachectl.cli.common import handle_errors

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.command("pairs")
    @handle_errors
    def pairs(file: str, label: Annotated[bool, typer.Option("--label")] = False,
              columns: Annotated[Optional[str], typer.Option("--columns")] = None) -> None:
        from cachectl.cli.semantic_probe import _columns
        from cachectl.engines import semantic

        got = semantic.read_pairs(file, _columns(columns), need_label=label)
        typer.echo(json.dumps({"pairs": len(got)}))

    @app.command("log-prompts")
    @handle_errors
    def log_prompts(file: str, field_name: Annotated[str, typer.Option("--field")] = "prompt") -> None:
        from cachectl.engines import semantic

        n = sum(1 for _ in semantic.iter_log_prompts(file, field_name))
        typer.echo(json.dumps({"prompts": n}))

    @app.command("boom")
    @handle_errors
    def boom() -> None:
        """A bug on purpose: shows that the catch-all is counted."""
        raise RuntimeError("a bug")

    return app


_APPS: dict = {}


def _app(name: str):
    """The click command of a Typer app, built once (typer builds it anew on every invocation otherwise)."""
    if name not in _APPS:
        if name == "cachectl":
            from cachectl.cli import app
        else:
            app = _reader_app()
        _APPS[name] = typer.main.get_command(app)
    return _APPS[name]


def invoke(args: Sequence[str], *, app: str = "cachectl", stdin: bytes | None = None,
           timeout: float = DEFAULT_TIMEOUT_S) -> Outcome:
    """Invoke the Typer app in this process, with an alarm for hangs and the catch-all counted."""
    from cachectl.cli import common

    args = [str(a) for a in args]
    before = len(common.internal_errors)
    runner = CliRunner()
    rss0 = _peak_rss_mb()
    hang = False
    result = None

    def on_alarm(signum, frame):
        raise Hang(f"no answer in {timeout:g}s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    t0 = time.perf_counter()
    try:
        result = runner.invoke(_app(app), args, input=stdin, env={"CACHECTL_DEBUG": None, "COLUMNS": "160"})
    except Hang:
        hang = True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    seconds = time.perf_counter() - t0
    internal = common.internal_errors[before:]
    del common.internal_errors[before:]
    if result is None:
        return Outcome(args, None, "", "", internal, None, seconds, _peak_rss_mb() - rss0, hang=hang)
    return Outcome(args, result.exit_code, result.stdout, result.stderr, internal, result.exception, seconds,
                   _peak_rss_mb() - rss0, hang=hang)


def _strict_json(text: str) -> None:
    def bad_constant(name: str):
        raise ValueError(f"non-standard JSON constant {name}")

    text = text.strip()
    if not text:
        raise ValueError("empty output")
    try:
        json.loads(text, parse_constant=bad_constant)
        return
    except json.JSONDecodeError:
        pass
    # JSON lines, or several documents one after another: split at "\n" only (``splitlines`` also splits at U+0085,
    # U+2028 and U+2029, which a JSON string may hold as they are)
    for line in text.split("\n"):
        if line.strip():
            json.loads(line, parse_constant=bad_constant)


_LOCATED = re.compile(r":(\d+): ")


@dataclass
class Expect:
    """What the caller knows about the input: the names an error must mention, the output format."""

    names: Sequence[str] = ()
    json_output: bool = True
    max_line: int | None = None          # the input's number of lines, when an error may name one
    codes: Sequence[int] = field(default=(0, 1, 2))


def violations(out: Outcome, expect: Expect) -> list[str]:
    """Every way ``out`` breaks the property (an empty list: it holds)."""
    found = []
    if out.hang:
        found.append(f"hang: {out.describe()}")
        return found
    if out.internal:
        found.append(f"internal error reached ({out.internal[0]})")
    if out.exception is not None and not isinstance(out.exception, SystemExit):
        found.append(f"uncaught {type(out.exception).__name__}: {out.exception}")
    if "Traceback (most recent call last)" in out.stderr or "Traceback (most recent call last)" in out.stdout:
        found.append("a traceback was printed")
    if out.rss_growth_mb > MEMORY_LIMIT_MB:
        found.append(f"peak memory grew by {out.rss_growth_mb:.0f} MB (bound {MEMORY_LIMIT_MB} MB)")
    if out.exit_code not in expect.codes:
        found.append(f"exit code {out.exit_code}, expected one of {tuple(expect.codes)}")
    elif out.exit_code in (0, 1):
        if expect.json_output:
            try:
                _strict_json(out.stdout)
            except ValueError as exc:
                found.append(f"exit {out.exit_code} but the output is not valid JSON ({exc})")
    elif out.exit_code == 2 and not out.internal:
        lines = out.stderr.strip("\n").split("\n")
        if len(lines) != 1:
            found.append(f"exit 2 with {len(lines)} stderr lines, expected one")
        elif not lines[0].startswith("cachectl: error: "):
            found.append("exit 2 without a 'cachectl: error:' line")
        else:
            line = lines[0]
            if expect.names and not any(n in line for n in expect.names):
                found.append(f"the error does not name the input ({', '.join(expect.names)})")
            m = _LOCATED.search(line)
            if m and expect.max_line is not None and not 1 <= int(m.group(1)) <= expect.max_line + 1:
                found.append(f"the error names line {m.group(1)} of an input of {expect.max_line} lines")
    return found


def check(out: Outcome, expect: Expect) -> None:
    """Assert the property, with the command line and the output in the message."""
    found = violations(out, expect)
    assert not found, "; ".join(found) + "\n" + out.describe()
