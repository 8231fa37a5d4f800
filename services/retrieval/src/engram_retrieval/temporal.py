"""Dates named in a query, as a ``created_at`` window (pure; no I/O).

"What did Maria donate in December 2023?", "… on May 3, 2023?", "… last weekend?":
the window is when a memory about it was most likely *said*. Absolute dates get a
week of slack after them (people tell of things days later) and a day before (time
zones); relative ones ("last year", "3 weeks ago") count back from the search's
``now``. A month without a year is its last occurrence up to ``now``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

_MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_MONTH = "(" + "|".join(_MONTHS) + ")"
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
SLACK_AFTER = timedelta(days=7)
SLACK_BEFORE = timedelta(days=1)

_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH},?\s+(\d{{4}})\b")
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b")
_MONTH_YEAR = re.compile(rf"\b{_MONTH},?\s+(\d{{4}})\b")
_IN_MONTH = re.compile(rf"\b(?:in|during|this|last)\s+{_MONTH}\b")
_IN_YEAR = re.compile(r"\b(?:in|during|of)\s+((?:19|20)\d\d)\b")
_LAST = re.compile(r"\blast\s+(week|weekend|month|year)\b")
_AGO = re.compile(r"\b(\d+|an?|one|two|three|four|five|six)\s+(day|week|month|year)s?\s+ago\b")


@dataclass(frozen=True)
class DateWindow:
    start: datetime  # inclusive
    end: datetime  # exclusive

    def __contains__(self, moment: datetime) -> bool:
        return self.start <= moment < self.end


def _month_window(year: int, month: int) -> DateWindow:
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return DateWindow(start - SLACK_BEFORE, end + SLACK_AFTER)


def _day_window(year: int, month: int, day: int) -> DateWindow | None:
    try:
        moment = datetime(year, month, day, tzinfo=UTC)
    except ValueError:  # "February 30"
        return None
    return DateWindow(moment - SLACK_BEFORE, moment + timedelta(days=1) + SLACK_AFTER)


def query_window(query: str, now: datetime) -> DateWindow | None:
    """The window the first date expression in ``query`` names, or None."""
    text = query.lower()
    if match := _DAY_MONTH_YEAR.search(text):
        return _day_window(int(match[3]), _MONTHS.index(match[2]) + 1, int(match[1]))
    if match := _MONTH_DAY_YEAR.search(text):
        return _day_window(int(match[3]), _MONTHS.index(match[1]) + 1, int(match[2]))
    if match := _MONTH_YEAR.search(text):
        return _month_window(int(match[2]), _MONTHS.index(match[1]) + 1)
    if match := _IN_MONTH.search(text):
        month = _MONTHS.index(match[1]) + 1
        return _month_window(now.year if month <= now.month else now.year - 1, month)
    if match := _IN_YEAR.search(text):
        year = int(match[1])
        start = datetime(year, 1, 1, tzinfo=UTC)
        return DateWindow(start - SLACK_BEFORE, datetime(year + 1, 1, 1, tzinfo=UTC) + SLACK_AFTER)
    if "yesterday" in text:
        return DateWindow(now - timedelta(days=2), now + SLACK_BEFORE)
    if match := _LAST.search(text):
        span = timedelta(days=_UNIT_DAYS[match[1].removesuffix("end")] * 2)
        return DateWindow(now - span, now + SLACK_BEFORE)
    if match := _AGO.search(text):
        count = _NUMBERS.get(match[1]) or int(match[1])
        days = _UNIT_DAYS[match[2]] * count
        centre, half = now - timedelta(days=days), timedelta(days=max(3, days // 4))
        return DateWindow(centre - half, centre + half)
    return None
