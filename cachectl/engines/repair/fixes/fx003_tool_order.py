"""``FX003 tool_order`` (unsafe): the same tools listed in another order are put in the order they were first seen
in the log (the model sees them in another order, so this is labelled unsafe)."""

from __future__ import annotations

from typing import Any

from ....inputs.request import dumps_alike
from .body import path_prefix, tool_name, tools_of
from .rewriter import FixCode, Rewriter


def apply(rw: Rewriter) -> None:
    first: dict[str, int] = {}
    orders: dict[tuple, set[tuple]] = {}
    for i in range(len(rw.lines)):
        got = tools_of(rw.values[i])
        if got is None:
            continue
        names = tuple(_tool_ident(t) for t in got[1])
        for n in names:
            first.setdefault(n, len(first))
        orders.setdefault(tuple(sorted(names)), set()).add(names)
    unstable = {k for k, v in orders.items() if len(v) > 1}
    if not unstable:  # (every set of tools is listed in one order: no line to read again)
        return
    for i in range(len(rw.lines)):
        value = rw.values[i]
        got = tools_of(value)
        if got is None:
            continue
        body, tools = got
        idents = [_tool_ident(t) for t in tools]
        if tuple(sorted(idents)) not in unstable:
            continue
        want = sorted(range(len(tools)), key=lambda j: first[idents[j]])
        if want == list(range(len(tools))):
            continue
        if rw.record(FX003, rw.number(i), path_prefix(value) + "tools",
                     "the same tools are listed in another order elsewhere: put in the order first seen",
                     [tool_name(t) for t in tools], [tool_name(tools[j]) for j in want]):
            body["tools"] = [tools[j] for j in want]
            rw.values[i] = value


def _tool_ident(t: Any) -> str:
    return dumps_alike(t, sort_keys=True)


FX003 = FixCode("FX003", "tool_order", safe=False, description="list the same tools in one order",
                causes=("tool_order",), apply=apply,
                across=("tool_order",))
