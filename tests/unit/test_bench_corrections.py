"""The corrections benchmark's measures, on hand-made rows."""

from __future__ import annotations

from typing import Any

from engram_cli.bench.corrections import summarize


def test_the_old_turn_counts_against_a_correction_when_above_the_fact_or_alone() -> None:
    rows: list[dict[str, Any]] = [
        {"fact_rank": 1, "old_turn_rank": 3, "old_above_fact": False},
        {"fact_rank": 2, "old_turn_rank": 1, "old_above_fact": True},
        {"fact_rank": None, "old_turn_rank": 2, "old_above_fact": True},  # the old one alone
        {"fact_rank": None, "old_turn_rank": None, "old_above_fact": False},
    ]
    assert summarize(rows) == {
        "questions": 4,
        "fact_first_pct": 25.0,
        "fact_recalled_pct": 50.0,
        "fact_mean_rank": 1.5,
        "old_turn_recalled_pct": 75.0,
        "old_above_fact_pct": 50.0,
    }
