"""``FX006 cache_breakpoints`` (safe: a breakpoint is no content).

Anthropic requests get a ``cache_control`` breakpoint on the last position the next request of the conversation
repeats (so its write can be read), markers whose position the next request changes are removed, at most 4 in all,
and only where the prefix up to it reaches the model's minimum cacheable length (price table).

OpenAI GPT-5.6+ requests (the ``breakpoints`` cache rule) get an explicit ``prompt_cache_breakpoint: {"mode":
"explicit"}`` the same way: on the content block that ends the last position the next request repeats, never on an
assistant message (the API takes no marker on assistant output blocks: a repeated assistant turn moves the
breakpoint back to the last earlier message that can carry one), not where the implicit breakpoint already sits,
and only from the model's minimum cacheable length on. Explicit markers on positions the next request changes are
removed (their writes are never read and cost 1.25x), and a request keeps at most four writes (the implicit one and
the latest three explicit ones; four explicit ones in explicit mode): the earliest markers go first, as the API
leaves them unwritten. "The next request" is the next one of the conversation; a request that has none (each
request its own conversation, as independent single-turn requests are grouped) takes the next request of the log
with the same model that starts with the same position (what a shared stable prefix, say a long developer message,
looks like), and the last one of such a run the previous one's (so that every request carries the same form). A
string message content that gets a marker becomes one text block, the same in every request of the log that sends
that message (the simulated cache keys on exact content).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ....inputs import Request
from ..groups import line_facts
from .body import apply_carry, body_of, get_at, messages_of, path_prefix, put_body, set_at, steps, with_messages
from .rewriter import FixCode, Rewriter


def apply(rw: Rewriter) -> None:
    from ...provider.cache import tokenizer_counter

    counter = rw.counter or (tokenizer_counter(rw.tok) if rw.tok is not None else None)
    noted = False
    for members in rw.members():
        if len(members) < 2 or not any(line_facts(rw.lines, i)[1] == "anthropic" for i in members):
            continue  # (no line of it would be looked at: nothing to parse)
        reqs = [rw.current(i) for i in members]
        # (each request as its model holds it: a model that keeps only the last turn's thinking has the earlier
        # thinking blocks stripped, which no marker is on)
        seen = [_as_seen(rw, x.request) for x in reqs]
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
            price = rw.price_of(req.model)
            if price is None:  # no table, or an unknown model: no minimum to check against
                continue
            req = seen[k]
            assert req is not None
            nxt = seen[k + 1] if k + 1 < len(members) else None
            if nxt is not None:
                stable = _common_positions(req, nxt)
            else:
                prev = seen[k - 1]
                # the last request of a conversation: its predecessor's pattern (append-only: all of it)
                stable = len(req.positions) if prev is not None and _common_positions(prev, req) == \
                    len(prev.positions) else 0
            if stable == 0:
                continue
            cum = _cumulative(req, counter)
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
                    seen = [_as_seen(rw, x.request) for x in reqs]
    _apply_openai(rw, counter)


def _as_seen(rw: Rewriter, req: Request | None) -> Request | None:
    """``req`` as its model holds it (:func:`cachectl.engines.provider.cache.as_the_model_sees_it`); as sent
    where the table does not know its model."""
    from ...provider.cache import as_the_model_sees_it

    price = None if req is None else rw.price_of(req.model)
    return req if req is None or price is None else as_the_model_sees_it(req, price)


def _cumulative(req: Request, counter: Any) -> list[int]:
    """Tokens of the prefix up to and including each position."""
    cum, total = [], 0
    for p in req.positions:
        total += counter.count(p.text)
        cum.append(total)
    return cum


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


def _drop_marker(body: dict, p: Any, key: str = "cache_control") -> None:
    """Remove position ``p``'s marker (``key``: Anthropic's ``cache_control``, OpenAI's ``prompt_cache_breakpoint``)."""
    if p.cache_path:
        holder = body
        for s in steps(p.cache_path)[:-1]:
            holder = holder[s]
        if isinstance(holder, dict):
            holder.pop(key, None)


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



# ---------------------------------------------------------------------------------------- OpenAI GPT-5.6+

#: the block a string message content becomes when it gets a marker, per API
_TEXT_BLOCK = {"chat": "text", "responses": "input_text"}


def _apply_openai(rw: Rewriter, counter: Any) -> None:
    """FX006 on OpenAI requests of models with the GPT-5.6+ breakpoint rule (see the module docstring)."""
    from ....inputs.request import BREAKPOINT_PARTS

    prices: dict[int, Any] = {}
    for i in range(len(rw.lines)):
        _, provider, model = line_facts(rw.lines, i)
        price = _breakpoint_price(rw, provider, model)
        if price is not None:
            prices[i] = price
    if not prices:
        return
    if counter is None:
        rw.notes.append("OpenAI GPT-5.6+ breakpoints (FX006) need token counts to check the model's minimum: "
                        "pass a tokenizer")
        return
    # requests of one model that start with the same position: where a request without a next one in its
    # conversation finds the next (and previous) request that can read what it writes
    runs: dict[tuple[str, str], list[int]] = {}
    for i, price in prices.items():
        req = rw.lines[i].request
        assert req is not None
        if req.positions:
            runs.setdefault((price.model, req.positions[0].identity), []).append(i)
    run_of = {i: (run, r) for run in runs.values() for r, i in enumerate(run)}
    conv = {i: (members, k) for members in rw.members() for k, i in enumerate(members)}
    for i in sorted(prices):
        price = prices[i]
        ln = rw.current(i)
        req = ln.request
        if req is None or not req.positions:
            continue
        members, k = conv[i]
        run, r = run_of.get(i, ([i], 0))
        nxt = members[k + 1] if k + 1 < len(members) else (run[r + 1] if r + 1 < len(run) else None)
        if nxt is not None:
            partner = rw.current(nxt).request
            if partner is None:
                continue
            stable = _common_positions(req, partner)
            unread = [j for j in req.openai_breakpoints if j >= stable]
        else:
            # the last request: its predecessor's pattern (the previous request of the conversation, else of the
            # run): append-only, all of it (as for Anthropic), else the prefix it shares with it; nothing removed
            before = members[k - 1] if k > 0 else (run[r - 1] if r > 0 else None)
            prev = rw.current(before).request if before is not None else None
            stable = 0
            if prev is not None:
                stable = _common_positions(prev, req)
                if stable == len(prev.positions):
                    stable = len(req.positions)
            unread = []
        if stable == 0:
            continue
        cum = _cumulative(req, counter)
        body, body_path = body_of(rw.values[i])
        t = next((j for j in range(stable - 1, -1, -1) if _markable(body, req, j, BREAKPOINT_PARTS)), None)
        if t is None or cum[t] < price.min_cacheable_tokens:
            continue  # nothing markable, or below the minimum there: nothing earlier is longer
        have = list(req.openai_breakpoints)
        implicit = req.implicit_at if (req.cache_mode or "implicit") == "implicit" else None
        add = t not in have and t != implicit
        if not add and not unread:
            continue  # the breakpoint is already there (explicit, or the implicit one)
        new = sorted({j for j in have if j not in unread} | ({t} if add else set()))
        slots = price.max_breakpoints - (1 if implicit is not None and implicit not in new else 0)
        limited = []
        while len(new) > max(slots, 1) and len(new) > 1:
            first = min(j for j in new if j != t)
            new.remove(first)
            limited.append(first)
        new_body = copy.deepcopy(body)
        for j in have:
            if j not in new:
                _drop_marker(new_body, req.positions[j], "prompt_cache_breakpoint")
        carry = None
        if add:
            ttl = req.positions[unread[-1]].cache_breakpoint if unread else None
            carry = _add_breakpoint(new_body, req, t, ttl or None)
        value = put_body(rw.values[i], new_body, body_path)
        if not _keeps_prefix(req, _reparsed(rw, i, value), t, add, carry is not None):
            continue  # a marker removed inside a message would cut the prefix elsewhere: left as it is
        where = req.positions[t]
        target = _target_path(body, req, t)
        if nxt is not None and nxt not in members:
            why = f"the last position line {rw.number(nxt)} repeats (the next request that starts the same)"
        elif nxt is None and stable < len(req.positions):
            assert before is not None
            why = f"the prefix it shares with line {rw.number(before)}, as the requests before it"
        else:
            why = "the last position the next request repeats"
        desc = f"prompt_cache_breakpoint on {where.path}, {why}" if add else \
            f"the breakpoint on {where.path} ({why}) is already there"
        if unread:
            desc += f"; {len(unread)} marker(s) on positions the next request changes removed"
        if limited:
            desc += (f"; {len(limited)} earlier marker(s) removed: a request writes at most "
                     f"{price.max_breakpoints} (the implicit one and the latest explicit ones)")
        if rw.record(FX006, ln, path_prefix(rw.values[i]) + (target if add else where.path),
                     desc + f" ({cum[t]:,} tokens, minimum {price.min_cacheable_tokens:,})",
                     [req.positions[j].path for j in have], [req.positions[j].path for j in new]):
            rw.values[i] = value
            if carry is not None:  # a string turned into a block: the same wherever the log sends that message
                idx, original, plain = carry
                for x in run:
                    if x == i:
                        continue
                    msgs = messages_of(rw.values[x])
                    if msgs is not None and idx < len(msgs) and json.dumps(msgs[idx], sort_keys=True) == original:
                        rw.values[x] = with_messages(rw.values[x], msgs[:idx] + [copy.deepcopy(plain)] + msgs[idx + 1:])


def _breakpoint_price(rw: Rewriter, provider: str | None, model: str | None) -> Any:
    """The price entry of an OpenAI request (``provider``, ``model``: a line's facts) whose model caches at
    breakpoints (GPT-5.6+), else None."""
    price = rw.price_of(model) if provider == "openai" else None  # (None: an unknown model has no rule)
    return price if price is not None and price.cache_mode == "breakpoints" else None


def _reparsed(rw: Rewriter, i: int, value: Any) -> Request | None:
    from ..groups import reparse_at

    return reparse_at(rw.lines, i, value).request


def _keeps_prefix(req: Request, fixed: Request | None, t: int, added: bool, converted: bool) -> bool:
    """Whether the rewritten request still has every position up to ``t`` as it was (markers are no content; a
    string content turned into a block changes position ``t`` itself) and the new marker at ``t``."""
    if fixed is None or len(fixed.positions) <= t:
        return False
    if _common_positions(req, fixed) < (t if converted else t + 1):
        return False
    return fixed.positions[t].path == req.positions[t].path and \
        (not added or fixed.positions[t].cache_breakpoint is not None)


def _markable(body: dict, req: Request, j: int, parts: dict) -> bool:
    """Whether position ``j`` ends with a content block that can carry a ``prompt_cache_breakpoint`` (or a string
    content that becomes one): a message that is not the assistant's."""
    p = req.positions[j]
    if p.segment != "messages" or p.kind != "message" or p.role == "assistant" or p.last_path is None:
        return False
    try:
        target = get_at(body, p.last_path)
    except (KeyError, IndexError, TypeError):
        return False
    if isinstance(target, dict) and "role" in target:  # the whole message: its last block
        content = target.get("content")
        if isinstance(content, str):
            return bool(content)
        if not isinstance(content, list) or not content:
            return False
        target = content[-1]
    return isinstance(target, dict) and target.get("type", "text") in parts[req.api]


def _target_path(body: dict, req: Request, j: int) -> str:
    """The JSON path of the block position ``j``'s marker goes on (a string content: the block it becomes)."""
    p = req.positions[j]
    assert p.last_path is not None
    target = get_at(body, p.last_path)
    if isinstance(target, dict) and "role" in target:
        content = target["content"]
        return f"{p.last_path}.content[{len(content) - 1 if isinstance(content, list) else 0}]"
    return p.last_path


def _add_breakpoint(body: dict, req: Request, j: int, ttl: str | None) -> tuple[int, str, Any] | None:
    """Mark position ``j``'s last block; a string content becomes one text block (returned as a carry: the message
    index, the original message, the message with the block and no marker)."""
    mark: dict = {"mode": "explicit"}
    if ttl:
        mark["ttl"] = ttl
    p = req.positions[j]
    assert p.last_path is not None
    target = get_at(body, p.last_path)
    if isinstance(target, dict) and "role" in target:
        content = target["content"]
        if isinstance(content, str):
            mpath = p.last_path
            original = json.dumps(target, sort_keys=True)
            block = {"type": _TEXT_BLOCK[req.api], "text": content}
            plain = {**target, "content": [block]}
            set_at(body, f"{mpath}.content", [{**block, "prompt_cache_breakpoint": mark}])
            return int(steps(mpath)[-1]), original, plain
        target = content[-1]
    target["prompt_cache_breakpoint"] = mark
    return None


FX006 = FixCode("FX006", "cache_breakpoints", safe=True,
                description="place Anthropic and OpenAI GPT-5.6+ breakpoints where the next request reads them", causes=(), apply=apply)
