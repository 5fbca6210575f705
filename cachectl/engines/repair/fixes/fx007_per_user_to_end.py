"""``FX007 per_user_to_end`` (unsafe): a line holding a per-user value (a name, an e-mail, an account or tenant
id: a value that differs between requests but repeats for the same user or tenant, found by the log's
shared-prefix tree, :mod:`cachectl.engines.prefix.forks`, as a fork of cause ``per_user_value``) inside a prefix
the requests otherwise share is moved to the end of the request, by FX001's rules (the end of the last user
turn, or a trailing system message, or a text block after the tool results; the rewritten turn carried into the
later requests of the conversation, which stays append-only). Only the request's head is rewritten (tools, and
the system and developer messages before its first turn). Unsafe: the model reads the value elsewhere."""

from __future__ import annotations

from .fx001_volatile_to_end import Heads, cross_spans, move_lines
from .rewriter import FixCode, Rewriter


def apply(rw: Rewriter) -> None:
    heads = Heads()  # the lines read: the paths of their cached prefix
    spans = cross_spans(rw, FX007.code, heads)
    if not spans:
        return
    why = _why(rw)
    move_lines(rw, FX007, {slot: set() for _, slot in spans}, spans,
               lambda moved: f"{moved} holds a per-user value inside the prefix the requests otherwise share{why}",
               heads)


def _why(rw: Rewriter) -> str:
    forks = rw.forks
    fork = next((f for f in forks.report.forks if f.fixable == FX007.code), None) if forks is not None else None
    if fork is None:
        return ""
    by = f", predicted by the log field {fork.predicted_by!r}" if fork.predicted_by else ""
    return f" ({fork.distinct_values} values over {fork.requests} requests{by})"


FX007 = FixCode("FX007", "per_user_to_end", safe=False,
                description="move a per-user value out of the prefix requests share to the end",
                causes=("per_user_value",), apply=apply,
                across=("per_user_value",))
