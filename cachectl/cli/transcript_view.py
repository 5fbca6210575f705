"""``cachectl report`` on Claude Code transcripts: a file, or a directory of them (a project's folder under
``~/.claude/projects``, or one session's with its ``subagents/``): the cache timeline audit
(:mod:`cachectl.engines.provider.transcript`) as text or JSON. No tokenizer is needed (a transcript has no request
bodies; its usage is what was billed)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import typer

from .common import EXIT_FINDING, EXIT_OK, Format, emit_json, plural, print_note, stdout


def is_transcript_log(path: str) -> bool:
    from ..inputs.formats.claude_code import is_transcript

    return is_transcript(path)


def _usd(x: float) -> str:
    return f"${x:,.4f}" if abs(x) < 100 else f"${x:,.2f}"


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def report_transcript(path: str, *, fmt: Format, model_as: str | None = None, top: int = 5,
                      prices: str | None = None) -> None:
    """Render the audit; exit 1 when breaks other than cold starts cost money, 0 otherwise (2 on bad input, through
    the command's error handler). ``prices``: a price table file (``--prices``), else the shipped one."""
    from ..engines.provider.prices import PriceTable
    from ..engines.provider.transcript import audit_transcripts
    from ..inputs import read_json_file
    from ..inputs.files import display_name
    from ..inputs.formats.claude_code import read_path, transcript_files

    table = PriceTable.load(read_json_file(prices) if prices else None)
    files = transcript_files(path)
    audit = audit_transcripts((r for f in files for r in read_path(f)), table=table, model_as=model_as,
                              source=display_name(path))
    if fmt is Format.json:
        emit_json(asdict(audit))
    else:
        _render(audit, len(files), top)
    raise typer.Exit(EXIT_FINDING if audit.avoidable_break_cost_usd > 0 else EXIT_OK)


def _render(a: Any, files: int, top: int) -> None:
    say = lambda text: stdout.print(text, soft_wrap=True, markup=False)  # noqa: E731
    say(f"Claude Code transcript: {plural(files, 'file')}, {plural(len(a.sessions), 'session')}, "
        f"{plural(a.calls, 'API response')} (each counted once), hit rate {_rate(a.hit_rate)}, billed {_usd(a.cost_usd)}")
    say(f"cache breaks: {a.breaks} ({_usd(a.avoidable_break_cost_usd)} beyond reads, cold starts aside)")
    for c in a.by_cause:
        say(f"  {c.cause:<12} {plural(c.breaks, 'break'):>10} {c.lost_tokens:>12,} tokens {_usd(c.cost_usd):>12}")
    verdict = "would have been cheaper" if a.cheaper_with_1h else "would not have been cheaper"
    say(f"1-hour TTL what-if: {_usd(a.cost_1h_usd)} vs {_usd(a.cost_usd)}: the 1-hour TTL {verdict} "
        "(writes at 2x input instead of 1.25x; breaks after gaps of 5 to 60 minutes read instead)")
    for s in a.sessions:
        say(f"session {s.session}: {plural(len(s.calls), 'response')} in {plural(len(s.threads), 'thread')}, hit rate "
            f"{_rate(s.hit_rate)}, {_usd(s.cost_usd)} (1-hour TTL: {_usd(s.cost_1h_usd)}), "
            f"{plural(len(s.breaks), 'break')}")
        worst = sorted((b for b in s.breaks if b.cause != "cold_start"), key=lambda b: -b.cost_usd)[:top]
        for b in sorted(worst, key=lambda b: (b.timestamp or 0.0, b.line)):
            say(f"  {b.source}:{b.line} [{b.thread}] {b.cause}: {b.lost_tokens:,} tokens not read, "
                f"{_usd(b.cost_usd)} — {b.detail}")
    if a.duplicates_dropped:
        print_note(f"{plural(a.duplicates_dropped, 'response')} seen twice (a file given twice, or a subagent's "
                   "replay of its parent's) counted once")
    for note in a.notes:
        print_note(note)
