"""The one detector of values that change from request to request: dates and times, clock times, unix
epochs, uuids, long hex ids, prefixed request ids, counters.

Shared by ``lint`` (volatile content in a template or a body), ``diff-tokens`` (the cause of a divergence)
and ``prompt-cost`` (notes on what broke a prefix). Two questions, two functions:

- :func:`find_volatile` - which values in ONE text look volatile. Nothing shows that they change (a
  "Knowledge cutoff: 2024-06-01" line is constant), so callers report them as warnings.
- :func:`classify_change` - where TWO texts (two renders, two logged requests) diverge, is the differing
  span a volatile value on both sides? That one is shown to change, so callers report it as an error.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["KINDS", "VolatileMatch", "classify_change", "find_volatile"]

_MONTH = (r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
          r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?")
_WEEKDAY = r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday|Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)"
_TZ = r"(?:\s?(?:UTC|GMT|Z|[A-Z]{2,4}T|[+-]\d{2}:?\d{2}))?"
_CLOCK = rf"\d{{1,2}}:\d{{2}}(?::\d{{2}}(?:\.\d+)?)?(?:\s?[AaPp]\.?[Mm]\.?)?{_TZ}"
_ORD = r"(?:st|nd|rd|th)?"

# Ordered: the first kind that matches at a position wins (longest forms first).
_PATTERNS: tuple[tuple[str, str], ...] = (
    # 2025-03-14, 2025-03-14T09:12:00Z, 2025-03-14 09:12:00.123+01:00
    ("iso_datetime", r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\d-])"),
    # RFC 2822 / 7231: Fri, 14 Mar 2025 09:12:00 GMT
    ("rfc_datetime", rf"\b{_WEEKDAY},\s\d{{1,2}}\s{_MONTH}\s\d{{4}}(?:\s{_CLOCK})?"),
    # Friday, March 14, 2025, 9:12 AM UTC / March 14th 2025 / 14 March 2025 / Friday 14 March 2025
    ("written_date", rf"\b(?:{_WEEKDAY},?\s)?{_MONTH}\s\d{{1,2}}{_ORD},?\s\d{{4}}(?:,?\s(?:at\s)?{_CLOCK})?"),
    ("written_date", rf"\b(?:{_WEEKDAY},?\s)?\d{{1,2}}{_ORD}\s(?:of\s)?{_MONTH},?\s\d{{4}}(?:,?\s(?:at\s)?{_CLOCK})?"),
    # 03/14/2025, 14.03.2025
    ("numeric_date", r"\b\d{1,2}[/.]\d{1,2}[/.](?:\d{4}|\d{2})\b(?:\s" + _CLOCK + ")?"),
    ("uuid", r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"),
    # req_8f3a..., chatcmpl-..., toolu_..., msg_..., trace-... (with at least one digit in the id)
    ("request_id", r"\b(?:req|request|trace|span|msg|run|chatcmpl|call|toolu|sess|session|conv|evt|resp|"
                   r"txn|order|job|task)[_-](?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{6,}\b"),
    # Unix time in seconds or milliseconds between 2017-07 and 2033-05
    ("unix_epoch", r"(?<![\d.])1[5-9]\d{8}(?:\d{3})?(?:\.\d+)?(?![\d])"),
    ("clock_time", rf"(?<![\d:]){_CLOCK}(?![\d:])"),
    # long hex ids (digests, object ids): 16+ hex digits with at least one digit and one letter
    ("hex_id", r"\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{16,}\b"),
)

#: every kind this module can report
KINDS = tuple(dict.fromkeys(k for k, _ in _PATTERNS)) + ("weekday", "counter")


@dataclass(frozen=True)
class VolatileMatch:
    kind: str
    text: str
    start: int
    end: int

    @property
    def is_date_time(self) -> bool:
        return self.kind in ("iso_datetime", "rfc_datetime", "written_date", "numeric_date", "unix_epoch",
                             "clock_time", "weekday")


@functools.cache
def _compiled() -> re.Pattern:
    """One alternation with a named group per pattern, compiled on first use (the CLI imports stay fast). The patterns
    that start at a word boundary, one after another, are tried under one ``\\b``: at a position inside a word one
    check fails them all (the order of the alternatives, which decides the kind, is kept). Every match starts with a
    digit, or with an ASCII letter at a word boundary (the names of days and months, an id's prefix, a hex digit): one
    lookahead says so first, and a position that starts neither fails there, before any alternative is tried (45% of
    the scan's time on the bench log's messages: 206 against 114 ns a character)."""
    parts: list[str] = []
    bounded: list[str] = []
    for i, (_, p) in enumerate(_PATTERNS):
        assert re.compile(p).groups == 0  # (the match's one named group is its kind: ``Match.lastgroup``)
        if p.startswith(r"\b"):
            bounded.append(f"(?P<k{i}>{p[2:]})")
            continue
        if bounded:
            parts.append(r"\b(?:" + "|".join(bounded) + ")")
            bounded = []
        parts.append(f"(?P<k{i}>{p})")
    if bounded:
        parts.append(r"\b(?:" + "|".join(bounded) + ")")
    return re.compile(r"(?=\d|\b[A-Za-z])(?:" + "|".join(parts) + ")")


#: every pattern's match holds a digit or a hyphen (a uuid may be all letters): a text with neither holds none
_ANY = re.compile(r"[\d-]")


@functools.cache
def _weekday() -> re.Pattern:
    return re.compile(rf"\b{_WEEKDAY}\b")


#: texts up to this long have their matches memoized (a whole-log command reads a conversation's history again on
#: every turn, and a system prompt on every request)
_MEMO_CHARS = 4096


def find_volatile(text: str, *, weekdays: bool = False) -> list[VolatileMatch]:
    """Values in ``text`` that look like they change per request, in order, not overlapping.

    A lone weekday name ("Friday") is reported only with ``weekdays=True``: in one text it is ordinary prose,
    but where two texts diverge on it, it is a date.
    """
    if len(text) <= _MEMO_CHARS:
        return list(_memo(text, weekdays))
    return _find(text, weekdays)


@functools.lru_cache(maxsize=2048)  # (at most 2,048 texts of up to 4,096 characters: 8 MB of ASCII text)
def _memo(text: str, weekdays: bool) -> tuple[VolatileMatch, ...]:
    return tuple(_find(text, weekdays))


def _find(text: str, weekdays: bool) -> list[VolatileMatch]:
    out: list[VolatileMatch] = []
    if _ANY.search(text) is not None:
        for m in _compiled().finditer(text):
            out.append(VolatileMatch(_PATTERNS[int(m.lastgroup[1:])][0], m.group(0), m.start(), m.end()))  # type: ignore[index]
    if weekdays:
        taken = [(v.start, v.end) for v in out]
        for m in _weekday().finditer(text):
            if not any(s <= m.start() < e for s, e in taken):
                out.append(VolatileMatch("weekday", m.group(0), m.start(), m.end()))
        out.sort(key=lambda v: v.start)
    return out


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n
    while lo < hi:  # binary search on slice equality: C-speed comparisons
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _covering(text: str, at: int) -> VolatileMatch | None:
    lo = max(0, at - 64)
    window = text[lo:at + 64]
    for v in find_volatile(window, weekdays=True):
        if v.start <= at - lo <= v.end and (v.start < at - lo or v.end > at - lo):
            return VolatileMatch(v.kind, v.text, v.start + lo, v.end + lo)
    return None


_DIGITS = re.compile(r"\d+")


def _number_at(text: str, at: int) -> VolatileMatch | None:
    lo = max(0, at - 24)
    for m in _DIGITS.finditer(text, lo, min(len(text), at + 24)):
        if m.start() <= at <= m.end() and m.end() > m.start():
            return VolatileMatch("counter", m.group(0), m.start(), m.end())
    return None


def classify_change(a: str, b: str, at: int | None = None) -> tuple[VolatileMatch, VolatileMatch] | None:
    """If ``a`` and ``b`` diverge inside a volatile value on both sides, that value in each.

    ``at`` is the character offset where they diverge (computed when not given). Both sides must hold a
    value of the same family (a date-time on both, an id of the same kind, a number on both): a number on
    both sides that is no date or id is a ``counter``.
    """
    if at is None:
        at = _common_prefix(a, b)
        if at == len(a) == len(b):
            return None
    va, vb = _covering(a, at), _covering(b, at)
    if va is not None and vb is not None and (va.kind == vb.kind or (va.is_date_time and vb.is_date_time)):
        return va, vb
    na, nb = _number_at(a, at), _number_at(b, at)
    if na is not None and nb is not None and na.text != nb.text:
        return na, nb
    return None
