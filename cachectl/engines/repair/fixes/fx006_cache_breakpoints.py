"""``FX006 cache_breakpoints`` (safe: cache_control is no content): Anthropic requests get a breakpoint on the
last position the next request of the conversation repeats (so its write can be read), markers whose position the
next request changes are removed, at most 4 in all, and only where the prefix up to it reaches the model's minimum
cacheable length (price table)."""

from __future__ import annotations

import copy
import json
from typing import Any

from ....inputs import Request
from .body import apply_carry, body_of, get_at, messages_of, path_prefix, put_body, set_at, steps, with_messages
from .rewriter import FixCode, Rewriter


def apply(rw: Rewriter) -> None:
    from ...provider.cache import tokenizer_counter

    counter = rw.counter or (tokenizer_counter(rw.tok) if rw.tok is not None else None)
    noted = False
    for members in rw.members():
        reqs = [rw.current(i) for i in members]
        for k, i in enumerate(members):
            ln = reqs[k]
            req = ln.request
            if req is None or req.provider != "anthropic" or req.auto_ttl is not None:
                continue
            if len(members) < 2:
                continue
            if counter is None:
                if not noted:
                    rw.notes.append("Anthropic breakpoints (FX006) need token counts to check the model's "
                                      "minimum: pass a tokenizer")
                    noted = True
                break
            model = req.model or rw.model
            if model is None or rw.table is None:
                continue
            try:
                price = rw.table.lookup(model)
            except Exception:  # an unknown model: no minimum to check against
                continue
            nxt = reqs[k + 1].request if k + 1 < len(members) else None
            if nxt is not None:
                stable = _common_positions(req, nxt)
            else:
                prev = reqs[k - 1].request
                # the last request of a conversation: its predecessor's pattern (append-only: all of it)
                stable = len(req.positions) if prev is not None and _common_positions(prev, req) == \
                    len(prev.positions) else 0
            if stable == 0:
                continue
            cum, total = [], 0
            for p in req.positions:
                total += counter.count(p.text)
                cum.append(total)
            t = stable - 1
            if cum[t] < price.min_cacheable_tokens:
                continue  # below the minimum at the last stable position: nothing earlier is longer
            have = [j for j, p in enumerate(req.positions) if p.ttl is not None]
            unread = [j for j in have if j >= stable]
            keep = [j for j in have if j < stable]
            if t in keep and not unread:
                continue
            ttl = "5m"
            if unread:
                ttl = req.positions[unread[-1]].ttl or "5m"
            new = sorted(set(keep) | {t})
            while sum(req.positions[j].markers or 1 for j in new) > price.max_breakpoints and len(new) > 1:
                new.remove(max(j for j in new if j != t))
            body, _ = body_of(rw.values[i])
            new_body = copy.deepcopy(body)
            for j in have:
                if j not in new:
                    _drop_marker(new_body, req.positions[j])
            msg_carry = None
            if t not in have:
                msg_carry = _add_marker(new_body, req.positions[t], ttl, price)
            desc = f"breakpoint on {req.positions[t].path}, the last position the next request repeats"
            if unread:
                desc += f"; {len(unread)} marker(s) on positions the next request changes removed"
            if rw.record(FX006, ln, path_prefix(rw.values[i]) + (req.positions[t].last_path or req.positions[t].path),
                         desc + f" ({cum[t]:,} tokens, minimum {price.min_cacheable_tokens:,})",
                         [req.positions[j].path for j in have], [req.positions[j].path for j in new]):
                rw.values[i] = put_body(rw.values[i], new_body, body_of(rw.values[i])[1])
                if msg_carry is not None:  # a string turned into a block: the same in later requests
                    for later in members[k + 1:]:
                        msgs = messages_of(rw.values[later])
                        if msgs is not None:
                            rw.values[later] = with_messages(rw.values[later], apply_carry(msgs, [msg_carry]))
                    reqs = [rw.current(x) for x in members]



def _common_positions(a: Request, b: Request) -> int:
    n = 0
    for x, y in zip(a.positions, b.positions):
        if x.identity != y.identity:
            break
        n += 1
    # the invalidation hierarchy: a scope change invalidates its level and everything after it
    if a.scope_system != b.scope_system:
        n = min(n, sum(1 for p in a.positions if p.segment == "tools"))
    if a.scope_messages != b.scope_messages:
        n = min(n, sum(1 for p in a.positions if p.segment != "messages"))
    return n


def _drop_marker(body: dict, p: Any) -> None:
    if p.cache_path:
        holder = body
        for s in steps(p.cache_path)[:-1]:
            holder = holder[s]
        if isinstance(holder, dict):
            holder.pop("cache_control", None)


def _add_marker(body: dict, p: Any, ttl: str, price: Any) -> tuple[int, str, Any] | None:
    """Mark position ``p``; a string message content becomes one text block (carried into later requests)."""
    cc: dict = {"type": "ephemeral"}
    if ttl == "1h":
        cc["ttl"] = "1h"
    path = p.last_path or p.path
    target = get_at(body, path)
    if isinstance(target, dict):
        target["cache_control"] = cc
        return None
    if isinstance(target, str) and path.endswith(".content"):
        mpath = path[: -len(".content")]
        msg = get_at(body, mpath)
        idx = int(steps(mpath)[-1])
        original = json.dumps(msg, sort_keys=True)
        plain = {**msg, "content": [{"type": "text", "text": target}]}
        set_at(body, path, [{"type": "text", "text": target, "cache_control": cc}])
        return (idx, original, [plain])
    if isinstance(target, str) and path == "system":
        body["system"] = [{"type": "text", "text": target, "cache_control": cc}]
        return None
    return None



FX006 = FixCode("FX006", "cache_breakpoints", safe=True,
                description="place Anthropic breakpoints where the next request reads them", causes=(), apply=apply)
