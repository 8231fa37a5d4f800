"""Timestamps that survive every hop: the range Engram stores, and one text form.

Every stored time is a protobuf ``Timestamp`` (0001-01-01T00:00:00Z to
9999-12-31T23:59:59.999999999Z, UTC). A time given with an offset is accepted when its
UTC instant is inside that range: ``9999-12-31T23:59:59-14:00`` is not (it is in the
year 10000 in UTC) and neither is ``0001-01-01T00:00:00+01:00``. Every entry point
(the memory API, the mirror's files, ``engram import``) checks with
:func:`storable_utc`, so a bad date is a clear 400 or a "malformed file", never an
overflow deep in the write path.

:func:`format_utc` writes the year with four digits: ``strftime("%Y")`` writes year
999 as ``999``, which neither sorts as text nor parses back.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, AwareDatetime

EARLIEST = datetime(1, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
RANGE_TEXT = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z (in UTC)"


def storable_utc(value: datetime) -> datetime:
    """``value`` in UTC (a naive one is taken as UTC); ``ValueError`` naming the range
    when its UTC instant cannot be stored."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"out of range: times must be {RANGE_TEXT}") from None
    if not EARLIEST <= utc <= LATEST:
        raise ValueError(f"out of range: times must be {RANGE_TEXT}")
    return utc


#: An aware datetime whose UTC instant Engram can store (for request models).
StorableDatetime = Annotated[AwareDatetime, AfterValidator(storable_utc)]


def format_utc(value: datetime, *, micros: bool = True) -> str:
    """``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``, four-digit year: sorts as text and as time,
    and ``datetime.fromisoformat`` reads it back."""
    utc = storable_utc(value)
    text = (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}T"
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
    )
    return f"{text}.{utc.microsecond:06d}Z" if micros else f"{text}Z"


def compact_utc(value: datetime) -> str:
    """``YYYYMMDDTHHMMSSZ`` with a four-digit year (the mirror's file names)."""
    utc = storable_utc(value)
    return (
        f"{utc.year:04d}{utc.month:02d}{utc.day:02d}T"
        f"{utc.hour:02d}{utc.minute:02d}{utc.second:02d}Z"
    )


def spoken_day(value: datetime) -> str:
    """The day as people write it, ``8 May 2023`` (in UTC; a naive time taken as UTC):
    how a turn's index key and the memory message the model reads both name a day."""
    utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return f"{utc.day} {utc:%B %Y}"
