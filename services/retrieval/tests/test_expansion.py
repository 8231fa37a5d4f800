"""First-person query expansion (off by default; measured in docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from engram_retrieval.expansion import expand_first_person, is_first_person
from engram_retrieval.settings import RetrievalSettings


@pytest.mark.parametrize(
    ("query", "expanded"),
    [
        ("How tall am I?", "How tall am I? how tall is the user?"),
        ("What is my dog's name?", "What is my dog's name? what is the user's dog's name?"),
        ("I'm allergic to what?", "I'm allergic to what? the user is allergic to what?"),
        (
            "Remind me where I parked",
            "Remind me where I parked remind the user where the user parked",
        ),
    ],
)
def test_first_person_questions_get_a_third_person_rewrite(query: str, expanded: str) -> None:
    assert is_first_person(query)
    assert expand_first_person(query) == expanded


def test_other_questions_are_left_alone() -> None:
    for query in ("What did Caroline research?", "Did Iris visit Maine?", "Iris said hi"):
        assert not is_first_person(query)
        assert expand_first_person(query) == query


def test_it_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RetrievalSettings().search_first_person_expansion is False
    monkeypatch.setenv("ENGRAM_SEARCH_FIRST_PERSON_EXPANSION", "true")
    assert RetrievalSettings().search_first_person_expansion is True
