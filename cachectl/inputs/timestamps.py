"""The one reader of request timestamps, for every command: ISO 8601 with a zone, or a number of seconds,
milliseconds or microseconds since the epoch, recognized by its magnitude (or stated: ``--time-unit``).

A number below 10^10 is seconds: epoch seconds up to the year 2286, or seconds from the start of the log
(traces often count from 0). Epoch milliseconds of 1973-2286 lie in [10^11, 10^13), microseconds in
[10^14, 10^16); a number between those bands, or above them, fits no unit of a plausible date, and is refused
with the unit to state. A stated unit applies to every number.
"""

from __future__ import annotations

import math
from datetime import datetime
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


def read_timestamp(value: Any, unit: str | None = None) -> tuple[float, str] | None:
    """``(seconds, how it was read)`` of a timestamp, ``how`` one of ``iso``, ``s``, ``ms``, ``us``; None for
    None. ``unit``: the unit of numbers (``s``, ``ms``, ``us``), else recognized by magnitude."""
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
                raise TimestampError(f"timestamp {value!r:.60} has no time zone, so its instant depends on the "
                                     "machine: add Z (UTC) or an offset such as +01:00")
            return when.timestamp(), "iso"
    raise TimestampError("expected a time: ISO 8601 with a zone (2026-11-30T10:00:00Z) or a number of seconds, "
                         f"milliseconds or microseconds since the epoch, got {value!r:.60}")


def parse_timestamp(value: Any, unit: str | None = None) -> float | None:
    """Seconds of a timestamp (see :func:`read_timestamp`); :class:`TimestampError` (a ``ValueError``) otherwise."""
    read = read_timestamp(value, unit)
    return None if read is None else read[0]


class TimestampReader:
    """The timestamps of one run, read with one unit rule; it remembers the units it recognized by magnitude,
    so that the command can say which (:meth:`note`). Picklable: a forked reader reads the same way."""

    def __init__(self, unit: str | None = None) -> None:
        if unit is not None and unit not in TIME_UNITS:
            raise ValueError(f"unknown time unit {unit!r}")
        self.unit = unit
        self.recognized: dict[str, int] = {}

    def __call__(self, value: Any) -> float | None:
        read = read_timestamp(value, self.unit)
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
