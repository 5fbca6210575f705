"""Lint rules for request bodies, on the canonical request (:class:`cachectl.inputs.Request`).

The positions, their order (tools -> system -> messages; OpenAI: tools -> schema -> messages), their cache
markers and their line:col come from the one parser; nothing here walks a body.

Severity follows the evidence: a value shown to change (a templated body rendered twice, ``changed``) is an
error; a value that only looks volatile in one body (a date, an id) may be constant ("Knowledge cutoff:
2024-06-01"), so it is a warning. Message history is content the client sends again unchanged on the next
turn, so a date inside a past message is not volatile; only tools and system (and, for OpenAI's automatic
caching, the first 1,024 tokens) are checked for volatile-looking values in a single body.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ...inputs.request import Position, Request
from ...volatile import find_volatile
from .rules import RULES, VOLATILE_NAME, Finding, LintConfig, filter_findings

if TYPE_CHECKING:
    from ..provider.prices import ModelPrice

OPENAI_MIN = 1024
_TEMPLATE_VAR = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}|\$\{([A-Za-z_]\w*)\}")


@functools.cache
def _prices():
    from ..provider.prices import PriceTable

    return PriceTable.load()


def _price(model: str | None) -> ModelPrice | None:
    """The model's entry of the shipped price table; None for no model or an unknown one."""
    if not model:
        return None
    from ..provider.prices import UnknownModelError

    try:
        return _prices().lookup(model)
    except UnknownModelError:
        return None


def minimum_for(model: str | None) -> int | None:
    """The model's minimum cacheable prompt, from the shipped price table; None for unknown models."""
    price = _price(model)
    return None if price is None else price.min_cacheable_tokens


def cache_mode_for(model: str | None) -> str | None:
    """The model's caching rule (``cache_mode`` of the shipped price table); None for unknown models."""
    price = _price(model)
    return None if price is None else price.cache_mode


def _looks_volatile(p: Position, volatile_name: re.Pattern) -> str | None:
    """A volatile-looking value in one position's text: a date, time, id ... or an unrendered template
    variable whose name says it changes (``{{ request_id }}``)."""
    found = find_volatile(p.text)
    if found:
        return found[0].text
    for m in _TEMPLATE_VAR.finditer(p.text):
        name = m.group(1) or m.group(2)
        if volatile_name.search(name.split(".")[-1]):
            return m.group(0)
    return None


def lint_request(req: Request, *, rules: Mapping, make: Callable, min_tokens: int | None,
                 count: Callable[[str], int], changed: Mapping[str, str] | None = None,
                 at: tuple[int, int] | None = None, volatile_name: re.Pattern) -> list:
    """Findings for one request. ``make(rule, severity, (line, col), message)`` builds a finding;
    ``changed`` maps position paths to what changed there between two renders (proven volatility);
    ``at`` pins every finding to one position (the template line that rendered the body)."""
    out = []

    def add(rule: str, path: str | None, message: str, severity: str | None = None) -> None:
        pos = at or (req.locate(path) if path is not None else (1, 1))
        out.append(make(rule, severity or rules[rule].severity, pos, message))

    positions = req.positions
    counts = []
    total = 0
    for p in positions:
        total += p.tokens if p.tokens is not None else count(p.text)
        counts.append(total)
    minimum = min_tokens if min_tokens is not None else minimum_for(req.model)

    # which position first changes per request: proven (two renders) or suspected (one body)
    first: tuple[int, str, bool] | None = None
    for k, p in enumerate(positions):
        if changed is not None:
            if p.path in changed:
                first = (k, changed[p.path], True)
                break
            continue
        if p.segment == "messages" and p.role not in ("system", "developer"):
            continue  # history is resent unchanged on the next turn: a date in a past message is not volatile
        v = _looks_volatile(p, volatile_name)
        if v is not None:
            first = (k, v, False)
            break

    if req.provider in ("anthropic", "layout"):
        markers = [(k, p) for k, p in enumerate(positions) if p.ttl is not None]
        if req.marker_count > 4:
            slots = [p.cache_path for _, p in markers for _ in range(max(1, p.markers))]
            where = slots[4] if len(slots) > 4 else "cache_control"
            add("CC004", where, f"{req.marker_count} cache_control breakpoints (top-level automatic caching counts "
                "as one): at most 4 are allowed, the API rejects this request")
        bps = list(markers)
        if req.auto_ttl is not None and positions and positions[-1].ttl is None:
            bps.append((len(positions) - 1, positions[-1]))
        for k, p in bps:
            where = p.cache_path or "cache_control"
            if first is not None and first[0] == k:
                proven = first[2]
                add("CC008", where, f"{p.path} carries cache_control and its content "
                    + ("changes per request" if proven else "looks like it changes per request")
                    + f" ({first[1]!r}): " + ("the entry is written on every request and never read" if proven
                                               else "if it does, the entry is written every time and never read"),
                    None if proven else "warning")
            elif first is not None and first[0] < k:
                proven = first[2]
                src = positions[first[0]].path
                add("CC002", where, f"the breakpoint on {p.path} comes after {src}, which "
                    + ("changes per request" if proven else "holds a value that looks volatile")
                    + f" ({first[1]!r}): " + ("this breakpoint is never read" if proven else
                                              "if that value changes per request, this breakpoint is never read"),
                    None if proven else "warning")
            if minimum is not None and counts[k] < minimum:
                add("CC005", where, f"the prefix up to {p.path} is about {counts[k]:,} tokens, below "
                    f"{req.model or 'the model'}'s minimum of {minimum:,}: nothing is cached, silently")
        if req.provider == "anthropic" and not bps and total >= (minimum or 1024):
            add("CC009", None, f"about {total:,} prompt tokens and no cache_control anywhere: nothing is cached; "
                "mark the last stable block (or add top-level \"cache_control\" for automatic caching)")
    elif req.provider == "openai" and cache_mode_for(req.model) == "breakpoints":
        _openai_breakpoints(req, add, first, counts, minimum if minimum is not None else OPENAI_MIN, changed)
    elif req.provider == "openai" and first is not None:
        k = first[0]
        before = counts[k - 1] if k else 0
        if before < OPENAI_MIN and total >= OPENAI_MIN:
            p = positions[k]
            proven = first[2]
            add("CC010", p.path, f"{p.path} " + ("changes per request" if proven else "holds a value that looks "
                                                 "volatile") + f" ({first[1]!r}) about {before:,} tokens in: "
                f"OpenAI caches the token prefix from {OPENAI_MIN:,} tokens on, so "
                + ("no request is ever served from the cache" if proven else
                   "if that value changes per request, nothing is ever cached"),
                None if proven else "warning")
    return out


def _openai_breakpoints(req: Request, add: Callable, first: tuple[int, str, bool] | None, counts: list[int],
                        minimum: int, changed: Mapping[str, str] | None) -> None:
    """GPT-5.6+ bodies: breakpoints after a per-request value, more than four, TTL and retention both set,
    explicit mode without a breakpoint, a long stable prefix left to the implicit breakpoint (CC011-CC015)."""
    positions = req.positions
    marked = list(req.openai_breakpoints)
    mode = req.cache_mode or "implicit"
    implicit = req.implicit_at if mode == "implicit" else None
    if req.cache_ttl is not None and "prompt_cache_retention" in req.params:
        add("CC013", "prompt_cache_retention", "both prompt_cache_options.ttl and prompt_cache_retention are set: "
            "the API rejects this request (the TTL supersedes the retention on GPT-5.6 and later)")
    if mode == "explicit" and not marked:
        add("CC014", "prompt_cache_options.mode", "prompt_cache_options.mode is \"explicit\" and no content block "
            "carries a prompt_cache_breakpoint: nothing is cached")
    slots = len(marked) + (implicit is not None and implicit not in marked)
    if slots > 4:
        keep = 3 if implicit is not None else 4
        lost = [positions[k].path for k in marked[:len(marked) - keep]]
        add("CC012", positions[marked[0]].cache_path, f"{slots} breakpoints ({len(marked)} explicit"
            + (" and the implicit one" if implicit is not None else "") + "): a request writes at most 4, so "
            f"{', '.join(lost)} {'is' if len(lost) == 1 else 'are'} never written")
    if first is not None:
        k0, value, proven = first
        for k in marked:
            if k >= k0:
                add("CC011", positions[k].cache_path, f"the breakpoint on {positions[k].path} comes after "
                    f"{positions[k0].path}, which " + ("changes per request" if proven else
                                                       "holds a value that looks volatile")
                    + f" ({value!r}): " + ("the prefix it closes is written every time (at 1.25x) and never read"
                                           if proven else "if that value changes per request, the prefix it closes "
                                           "is written every time and never read"), None if proven else "warning")
        if implicit is not None and k0 < implicit and not any(k < k0 for k in marked):
            add("CC011", positions[k0].path, f"{positions[k0].path} " + ("changes per request" if proven else
                                                                        "holds a value that looks volatile")
                + f" ({value!r}) before the implicit breakpoint on {positions[implicit].path} and no explicit "
                "breakpoint marks the stable content before it: " + ("no request reads the prefix" if proven else
                                                                      "if it changes per request, nothing is read"),
                None if proven else "warning")
            return
    if implicit is None or marked or implicit == 0:
        return
    before = counts[implicit - 1]
    final = positions[implicit]
    proven = changed is not None and final.path in changed
    history = any(p.role == "assistant" for p in positions[:implicit])
    if before >= minimum and (proven or not history):
        add("CC015", final.path, f"about {before:,} tokens come before {final.path}, the message the implicit "
            "breakpoint closes" + (" and that changes per request" if proven else ", a first turn whose message "
                                   "changes per request") + ": no request reads that prefix, and each writes it "
            f"again at 1.25x; mark the end of {positions[implicit - 1].path} with a prompt_cache_breakpoint",
            None if proven else "warning")


# ------------------------------------------------------------------------------------- request bodies


def lint_body(path: str, req: Request, config: LintConfig, min_tokens: int | None,
              count: Callable[[str], int], volatile: dict[str, str] | None = None,
              at: tuple[int, int] | None = None) -> list[Finding]:
    """Cache rules on a canonical request (:func:`lint_request`): breakpoint count, minimum
    length (``min_tokens``, else the body's own model), volatile content before or under a breakpoint,
    no marker at all, volatile content in OpenAI's automatically cached prefix.

    ``volatile`` maps position paths to what changes in them (a templated body rendered twice); ``at``
    pins every finding to one position (the template line that rendered the body).
    """
    def make(rule: str, severity: str, pos: tuple[int, int], message: str) -> Finding:
        return Finding(rule, severity, path, pos[0], pos[1], message, RULES[rule].fix)

    found = lint_request(req, rules=RULES, make=make, min_tokens=min_tokens, count=count, changed=volatile, at=at,
                         volatile_name=VOLATILE_NAME)
    return filter_findings(found, "", config)
