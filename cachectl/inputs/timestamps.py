"""The one reader of request timestamps, for every command: ISO 8601 with a zone, or a number of seconds,
milliseconds or microseconds since the epoch, recognized by its magnitude (or stated: ``--time-unit``).
An ISO time without a zone is refused unless the run names the zone such times are in (``--time-zone``).

A number below 10^10 is seconds: epoch seconds up to the year 2286, or seconds from the start of the log
(traces often count from 0). Epoch milliseconds of 1973-2286 lie in [10^11, 10^13), microseconds in
[10^14, 10^16); a number between those bands, or above them, fits no unit of a plausible date, and is refused
with the unit to state. A stated unit applies to every number.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any

#: the units ``--time-unit`` states, and the seconds one of them is
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds"}
#: ``(unit, low, high)``: the magnitudes read as that unit when none is stated
_BANDS = (("s", 0.0, 1e10), ("ms", 1e11, 1e13), ("us", 1e14, 1e16))


class TimestampError(ValueError):
    """A timestamp that cannot be read: the message says what to give instead."""


def unit_of(number: float) -> str:
    """The unit a number of that magnitude is read in (no unit stated); :class:`TimestampError` when none fits."""
    size = abs(number)
    for unit, low, high in _BANDS:
        if low <= size < high:
            return unit
    raise TimestampError(f"timestamp {number:g} is not seconds (below 1e10), nor epoch milliseconds (1e11 to 1e13) "
                         "or microseconds (1e14 to 1e16) of a date from 1973 to 2286: state its unit with "
                         "--time-unit s|ms|us")


_OFFSET = re.compile(r"^([+-])(\d{2}):?(\d{2})?$")


def time_zone(name: str) -> tzinfo:
    """The zone ``--time-zone`` names: ``UTC`` (or ``Z``), a fixed offset (``+01:00``, ``-0530``, ``+09``), or an
    IANA name (``Europe/Berlin``, read from the machine's time zone database, or the ``tzdata`` package's);
    :class:`TimestampError` otherwise."""
    text = name.strip()
    if text.upper() in ("UTC", "Z"):
        return UTC
    m = _OFFSET.match(text)
    if m:
        hours, minutes = int(m.group(2)), int(m.group(3) or 0)
        if hours > 23 or minutes > 59:
            raise TimestampError(f"time zone {name!r:.60}: an offset is at most -23:59 to +23:59")
        delta = timedelta(hours=hours, minutes=minutes)
        return timezone(-delta if m.group(1) == "-" else delta)
    import zoneinfo

    try:
        return zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        pass
    hint = "" if zoneinfo.available_timezones() else (" (this machine has no time zone database: `pip install "
                                                      "tzdata`, or give the offset)")
    raise TimestampError(f"unknown time zone {name!r:.60}: give an IANA name such as Europe/Berlin, UTC, or an "
                         f"offset such as +01:00{hint}")


def read_timestamp(value: Any, unit: str | None = None, zone: tzinfo | None = None) -> tuple[float, str] | None:
    """``(seconds, how it was read)`` of a timestamp, ``how`` one of ``iso``, ``s``, ``ms``, ``us``; None for
    None. ``unit``: the unit of numbers (``s``, ``ms``, ``us``), else recognized by magnitude. ``zone``: the zone of
    an ISO time that names none (:func:`time_zone`; a local time a clock change makes ambiguous is read as the
    first of the two instants); without it such a time is refused."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TimestampError(f"expected a time (ISO 8601, or a number of seconds), got {str(value).lower()}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise TimestampError(f"expected a finite number of seconds, got {value!r}")
        how = unit if unit is not None else unit_of(value)
        return float(value) * TIME_UNITS[how], how
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            pass
        else:
            if when.tzinfo is None:
                if zone is None:
                    raise TimestampError(f"timestamp {value!r:.60} has no time zone, so its instant depends on the "
                                         "machine: add Z (UTC) or an offset such as +01:00, or name the zone such "
                                         "times are in with --time-zone")
                when = when.replace(tzinfo=zone)
            return when.timestamp(), "iso"
    raise TimestampError("expected a time: ISO 8601 with a zone (2026-11-30T10:00:00Z) or a number of seconds, "
                         f"milliseconds or microseconds since the epoch, got {value!r:.60}")


def parse_timestamp(value: Any, unit: str | None = None) -> float | None:
    """Seconds of a timestamp (see :func:`read_timestamp`); :class:`TimestampError` (a ``ValueError``) otherwise."""
    read = read_timestamp(value, unit)
    return None if read is None else read[0]


def no_time(value: Any) -> None:
    """A reader of times for a command that uses none (``lint``): every time reads as absent, so a body is never
    refused for its wrapper's time."""
    return None


class TimestampReader:
    """The timestamps of one run, read with one unit rule; it remembers the units it recognized by magnitude,
    so that the command can say which (:meth:`note`). Picklable: a forked reader reads the same way."""

    def __init__(self, unit: str | None = None, zone: str | None = None) -> None:
        if unit is not None and unit not in TIME_UNITS:
            raise ValueError(f"unknown time unit {unit!r}")
        self.unit = unit
        #: the zone of ISO times that name none (``--time-zone``; :func:`time_zone` reads it)
        self.zone = None if zone is None else time_zone(zone)
        self.recognized: dict[str, int] = {}

    def __call__(self, value: Any) -> float | None:
        read = read_timestamp(value, self.unit, self.zone)
        if read is None:
            return None
        seconds, how = read
        if self.unit is None and how in ("ms", "us"):
            self.recognized[how] = self.recognized.get(how, 0) + 1
        return seconds

    def note(self) -> str | None:
        """One sentence naming the units recognized by magnitude other than seconds; None when there are none."""
        if not self.recognized:
            return None
        units = " and ".join(f"epoch {UNIT_NAMES[u]}" for u in self.recognized)
        return f"timestamps read as {units}, by their magnitude (--time-unit states the unit)"
