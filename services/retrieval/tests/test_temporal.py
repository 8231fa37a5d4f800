"""Date expressions in queries → created_at windows (hand-made cases)."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from engram_retrieval.ranking import window_boosted
from engram_retrieval.temporal import DateWindow, query_window

NOW = datetime(2023, 10, 20, 15, 0, tzinfo=UTC)


def day(y: int, m: int, d: int) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        # a day: one day before (time zones), a week after (told days later)
        ("Who did Maria have dinner with on May 3, 2023?", day(2023, 5, 2), day(2023, 5, 11)),
        ("What did Gina find on 1 February, 2023?", day(2023, 1, 31), day(2023, 2, 9)),
        ("the 23rd May 2023 event", day(2023, 5, 22), day(2023, 5, 31)),
        # a month, with or without its year (without: the last one up to now)
        ("What did Maria donate in December 2023?", day(2023, 11, 30), day(2024, 1, 8)),
        ("When did Melanie go camping in June?", day(2023, 5, 31), day(2023, 7, 8)),
        ("What happened in November?", day(2022, 10, 31), day(2022, 12, 8)),
        (
            "How many times has Melanie gone to the beach in 2023?",
            day(2022, 12, 31),
            day(2024, 1, 8),
        ),
        # relative to now
        ("What did I do yesterday?", day(2023, 10, 18), day(2023, 10, 21)),
        ("What event did John volunteer at last weekend?", day(2023, 10, 6), day(2023, 10, 21)),
    ],
)
def test_query_windows(query: str, start: datetime, end: datetime) -> None:
    window = query_window(query, NOW)
    assert window is not None
    assert (window.start.date(), window.end.date()) == (start.date(), end.date())


def test_no_date_no_window() -> None:
    assert query_window("What is my dog's name?", NOW) is None
    assert query_window("May I ask you something?", NOW) is None  # "may" is not a month here
    assert query_window("on February 30, 2023", NOW) is None  # no such day


def test_ago_is_centred_on_the_moment_it_names() -> None:
    window = query_window("Where did Caroline move from 4 years ago?", NOW)
    assert window is not None and day(2019, 10, 21) in window
    assert NOW not in window


def test_window_membership_is_half_open() -> None:
    window = DateWindow(day(2023, 5, 1), day(2023, 6, 1))
    assert day(2023, 5, 1) in window and day(2023, 5, 31) in window
    assert day(2023, 6, 1) not in window


def test_window_boosted_hand_computed() -> None:
    # s = 0.6 / 0.2 / 0.4 → n = 1 / 0 / 0.5; only the second is in the window
    boosted = window_boosted([0.6, 0.2, 0.4], np.array([False, True, False]), 0.25)
    # n' = (n + 0.25·[in]) / 1.25 → 0.8, 0.2, 0.4 → 0.2 + 0.4 n'
    np.testing.assert_allclose(boosted, [0.52, 0.28, 0.36])
    unchanged = window_boosted([0.6, 0.2], np.array([False, False]), 0.5)
    np.testing.assert_allclose(unchanged, [0.6, 0.2])
    np.testing.assert_allclose(window_boosted([0.6, 0.2], np.array([True, False]), 0.0), [0.6, 0.2])
