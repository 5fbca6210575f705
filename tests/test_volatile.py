"""The shared volatile-value detector: each documented form is found, ordinary prose is not."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cachectl.volatile import classify_change, find_volatile


@pytest.mark.parametrize("text, kind, value", [
    ("Now: 2025-03-14T09:12:00Z.", "iso_datetime", "2025-03-14T09:12:00Z"),
    ("at 2025-03-14 09:12:00.123+01:00 sharp", "iso_datetime", "2025-03-14 09:12:00.123+01:00"),
    ("Date: Fri, 14 Mar 2025 09:12:00 GMT", "rfc_datetime", "Fri, 14 Mar 2025 09:12:00 GMT"),
    ("It is Friday, March 14, 2025, 9:12 AM UTC.", "written_date", "Friday, March 14, 2025, 9:12 AM UTC"),
    ("on 14th of March 2025 at 10:00", "written_date", "14th of March 2025 at 10:00"),
    ("due 03/14/2025", "numeric_date", "03/14/2025"),
    ("the time is 14:03", "clock_time", "14:03"),
    ("ts=1741943520", "unix_epoch", "1741943520"),
    ("ms=1741943520123", "unix_epoch", "1741943520123"),
    ("id 3f2a1c9e-1b2c-4d5e-8f90-0123456789ab", "uuid", "3f2a1c9e-1b2c-4d5e-8f90-0123456789ab"),
    ("request req_8f3a9b2c1d", "request_id", "req_8f3a9b2c1d"),
    ("toolu_01A09q90qw90lq917835lq9 done", "request_id", "toolu_01A09q90qw90lq917835lq9"),
    ("sha 9f86d081884c7d659a2feaa0c55ad015", "hex_id", "9f86d081884c7d659a2feaa0c55ad015"),
])
def test_finds_each_form(text, kind, value):
    found = find_volatile(text)
    assert [(v.kind, v.text) for v in found] == [(kind, value)]
    assert text[found[0].start:found[0].end] == value


@pytest.mark.parametrize("text", [
    "You are a helpful assistant.", "run_forever_loop", "version 3.2.1", "Call me on Friday.",
    "deadbeefdeadbeefdeadbeef",  # hex letters only: a word, not an id
    "There are 1024 tokens in 16 blocks.",
])
def test_prose_is_not_volatile(text):
    assert find_volatile(text) == []


def test_weekday_only_when_asked():
    assert [v.kind for v in find_volatile("Today is Friday.", weekdays=True)] == ["weekday"]


def test_change_classification():
    a, b = classify_change("Request #41 of the day", "Request #42 of the day")
    assert (a.kind, a.text, b.text) == ("counter", "41", "42")
    a, b = classify_change("t=2025-03-14T09:12:00Z x", "t=2025-03-14T09:13:05Z x")
    assert a.kind == "iso_datetime" and b.text == "2025-03-14T09:13:05Z"
    assert classify_change("id req_aaa111bbb", "id req_aaa222bbb")[0].kind == "request_id"
    assert classify_change("Today is Friday.", "Today is Monday.")[0].kind == "weekday"
    assert classify_change("Be verbose.", "Be brief.") is None
    assert classify_change("same", "same") is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_matches_are_ordered_disjoint_slices(text):
    found = find_volatile(text, weekdays=True)
    last = 0
    for v in found:
        assert v.start >= last and text[v.start:v.end] == v.text and v.text
        last = v.end


@settings(max_examples=200, deadline=None)
@given(st.datetimes(), st.datetimes())
def test_two_iso_times_are_a_shown_change(t1, t2):
    a, b = f"Now: {t1.isoformat(timespec='seconds')}. Be brief.", f"Now: {t2.isoformat(timespec='seconds')}. Be brief."
    got = classify_change(a, b)
    if t1 == t2:
        assert got is None
    else:
        assert got is not None and got[0].is_date_time and got[1].is_date_time


def test_memoized_matches_are_the_matches_and_a_fresh_list_each_time():
    from cachectl.volatile import _MEMO_CHARS, _find

    short = "Today is 2025-03-14, request req_8f3a9b2c1d, Friday."
    long = short + " " * _MEMO_CHARS + "at 09:12 UTC"
    for text in (short, long):
        for weekdays in (False, True):
            first = find_volatile(text, weekdays=weekdays)
            assert first == _find(text, weekdays)
            first.clear()   # a caller's list is its own
            assert find_volatile(text, weekdays=weekdays) == _find(text, weekdays)


def _one_by_one(text):
    """The kinds found by the plain scan the grouped alternation stands for: at each position the patterns are tried
    in their order, the first that matches wins, and the scan goes on after its match."""
    import re

    from cachectl.volatile import _PATTERNS

    compiled = [(kind, re.compile(p)) for kind, p in _PATTERNS]
    out, at = [], 0
    while at < len(text):
        found = next(((kind, m) for kind, m in ((k, p.match(text, at)) for k, p in compiled) if m is not None), None)
        if found is None:
            at += 1
            continue
        kind, m = found
        out.append((kind, m.group(0), m.start()))
        at = m.end()
    return out


_PIECES = ["2025-03-14", "T09:12:00Z", " ", "\n", "-", "Fri, ", "14 Mar 2025", "March 14th, 2025", "03/14/2025",
           "12:30", " PM", "1741943520", "3f2a1c9e-1b2c-4d5e-8f90-0123456789ab", "deadbeef-dead-beef-dead-beefdeadbeef",
           "req_8f3a9b2c1d", "chatcmpl-", "9f86d081884c7d659a2feaa0c55ad015", "abc", "abcdef", "x", "7", "٣", ".", ":", "_",
           # (a match starts with a digit, any script's, or an ASCII letter at a word boundary: what the one
           # lookahead in front of the alternation lets through)
           "é", "２", "٣٠:٤٥", "Mon", "Jan", "Sept ", "ß", "Ｆ"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=12) | st.text(max_size=80).map(lambda t: [t]))
@example(["1741943520", "abcdef", "abcdef"])  # an epoch and a hex id at one place: the epoch's pattern comes first
@example(["Fri, ", "14 Mar 2025", " ", "12:30"])
def test_the_grouped_alternation_finds_what_each_pattern_in_order_finds(pieces):
    from cachectl.volatile import _find

    text = "".join(pieces)
    assert [(v.kind, v.text, v.start) for v in _find(text, False)] == _one_by_one(text)
