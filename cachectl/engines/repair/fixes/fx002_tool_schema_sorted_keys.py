"""``FX002 tool_schema_sorted_keys`` (safe): a tool definition seen with its keys in another order is serialized
with sorted keys everywhere it occurs (the same JSON value: a JSON parser reads the same schema)."""

from __future__ import annotations

import json
from typing import Any

from ....inputs import compact
from .body import path_prefix, tool_name, tools_of
from .rewriter import FixCode, Rewriter


def apply(rw: Rewriter) -> None:
    texts: dict[str, tuple[str, str]] = {}   # a tool's exact JSON -> (its JSON with sorted keys, its JSON)

    def forms(t: Any) -> tuple[str, str]:
        # (a log repeats a few tool definitions: each distinct one serialized twice by json, not every time)
        exact = compact(t)
        got = texts.get(exact)
        if got is None:
            got = texts[exact] = (json.dumps(t, sort_keys=True), json.dumps(t))
        return got

    seen: dict[str, set[str]] = {}
    for i in range(len(rw.lines)):
        got = tools_of(rw.values[i])
        for t in got[1] if got else ():
            canon, plain = forms(t)
            seen.setdefault(canon, set()).add(plain)
    unstable = {k for k, v in seen.items() if len(v) > 1}
    if not unstable:
        return
    for i in range(len(rw.lines)):
        value = rw.values[i]
        got = tools_of(value)
        if got is None:
            continue
        body, tools = got
        changed = False
        for j, t in enumerate(tools):
            canon, plain = forms(t)
            if canon in unstable and plain != canon:
                if rw.record(FX002, rw.number(i), path_prefix(value) + f"tools[{j}]",
                             f"tool {tool_name(t)!r} is sent with its keys in another order elsewhere: keys "
                             "sorted", plain[:60], canon[:60]):
                    tools[j] = json.loads(canon)
                    changed = True
        if changed:
            rw.values[i] = value


FX002 = FixCode("FX002", "tool_schema_sorted_keys", safe=True, description="serialize tool definitions with sorted keys",
                causes=("tool_schema_key_order",), apply=apply,
                across=("tool_schema_key_order",))
