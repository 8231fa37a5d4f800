"""Stored times: the range every entry point accepts, and a text form that reads back
(years before 1000, offsets at the extremes)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from engram_core.bus import ExpectedFetchNoise
from engram_core.codec import from_timestamp, to_timestamp
from engram_core.timestamps import compact_utc, format_utc, spoken_day, storable_utc
from engram_retrieval.payload import format_ts, parse_ts

EDGES = [
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(999, 3, 1, 10, 0, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=14))),
    datetime(1, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=14))),
]


@pytest.mark.parametrize("value", EDGES, ids=str)
def test_edge_times_round_trip_through_every_form(value: datetime) -> None:
    utc = value.astimezone(UTC)
    assert parse_ts(format_ts(value)) == utc  # retrieval's payload
    assert from_timestamp(to_timestamp(value)) == utc  # protobuf
    assert datetime.fromisoformat(format_utc(value)) == utc
    assert format_utc(value)[:4] == f"{utc.year:04d}"


def test_a_decoded_timestamp_is_the_same_time_each_time_it_is_decoded() -> None:
    # decoding keeps the datetimes it made (codec._datetime_at): the same value and type
    # as protobuf's own conversion, sub-microsecond nanos rounded toward zero as it does
    for seconds, nanos in [(1, 0), (0, 1500), (-62135596800, 0), (1764633600, 999_999_999)]:
        ts = Timestamp(seconds=seconds, nanos=nanos)
        first, again = from_timestamp(ts), from_timestamp(Timestamp(seconds=seconds, nanos=nanos))
        assert first == again == ts.ToDatetime(tzinfo=UTC)
        assert first is not None and first.tzinfo is UTC
    assert from_timestamp(Timestamp()) is None  # unset


def test_text_forms_sort_as_time_and_pad_the_year() -> None:
    assert format_utc(datetime(999, 1, 2, 3, 4, 5, tzinfo=UTC)) == "0999-01-02T03:04:05.000000Z"
    assert compact_utc(datetime(5, 1, 2, tzinfo=UTC)) == "00050102T000000Z"
    texts = [format_ts(v) for v in sorted(EDGES)]
    assert texts == sorted(texts)


@pytest.mark.parametrize(
    "text", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+01:00", "0001-01-01T13:59:59+14:00"]
)
def test_instants_outside_the_range_are_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match=r"out of range: times must be 0001-01-01T00:00:00Z to"):
        storable_utc(datetime.fromisoformat(text))
    with pytest.raises(ValueError):
        to_timestamp(datetime.fromisoformat(text))


def _record(
    message: str, exc: BaseException | None, level: int = logging.ERROR
) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("faststream.nats", level, __file__, 1, message, (), exc_info)


def test_an_idle_fetch_timing_out_is_not_an_error_line() -> None:
    noise = ExpectedFetchNoise()
    assert not noise.filter(_record("Task-34 raised an exception, retrying...", TimeoutError()))
    assert not noise.filter(_record("callback for Task-3 is being executed...", None, 20))
    # anything else FastStream reports still is
    assert noise.filter(_record("Task-34 raised an exception, retrying...", KeyError("x")))
    assert noise.filter(_record("Received", None, 10))


def test_a_day_is_named_as_people_write_it_in_utc() -> None:
    # what a turn's index key and the memory message both say (3 tokens, not 5)
    assert spoken_day(datetime(2023, 5, 8, 23, 30, tzinfo=UTC)) == "8 May 2023"
    # late on 8 May in New York is 9 May in UTC; a naive time is taken as UTC
    assert spoken_day(datetime(2023, 5, 8, 22, 0, tzinfo=timezone(timedelta(hours=-4)))) == (
        "9 May 2023"
    )
    assert spoken_day(datetime(2023, 12, 31, 23, 0)) == "31 December 2023"
