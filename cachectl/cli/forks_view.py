"""The forks of a log's shared prefix as text, for ``report``, ``fix`` and ``diff-tokens --log`` (one table)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import stdout


def where(f: Any) -> str:
    if f.path is None:
        return "token IDs"
    return f.path + (f" char {f.char}" if f.char is not None else "")


def print_forks(forks: Sequence[Any], *, top: int = 5, title: str | None = None) -> None:
    """The top ``top`` forks (``Fork`` records, sorted by tokens lost), and up to ``top`` more that have a fix (the
    forks a headline counts as fixable are listed, whatever they lose): where, cause, values, requests, tokens lost
    (no eviction, and at capacity where measured), the fix."""
    from rich.table import Table

    shown = list(forks[:top]) + [f for f in forks[top:] if f.fixable][:top]
    if not shown:
        return
    cap = any(f.tokens_lost_at_capacity is not None for f in shown)
    t = Table(title=title, header_style="bold", box=None, pad_edge=False)
    cols = ["at", "cause", "values", "requests", "tokens lost"] + (["at capacity"] if cap else []) + ["fix"]
    for col in cols:
        t.add_column(col, justify="right" if col in ("values", "requests", "tokens lost", "at capacity") else "left",
                     overflow="fold")
    for f in shown:
        row = [where(f), f.cause + (f" ({f.predicted_by})" if f.predicted_by else ""), f"{f.distinct_values:,}",
               f"{f.requests:,}", f"{f.tokens_lost:,}"]
        if cap:
            row.append("" if f.tokens_lost_at_capacity is None else f"{f.tokens_lost_at_capacity:,}")
        row.append(f.fixable or "-")
        t.add_row(*row)
    stdout.print(t)
    rest = len(forks) - len(shown)
    if rest:
        stdout.print(f"({rest} more fork{'s' if rest != 1 else ''}: --format json lists them)",
                     soft_wrap=True, markup=False)
