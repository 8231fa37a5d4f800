"""First-person query expansion (off by default; measured in docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from engram_retrieval.expansion import (
    category_members,
    expand_categories,
    expand_first_person,
    is_about_the_user,
    is_first_person,
)
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


@pytest.mark.parametrize(
    ("query", "member"),
    [
        ("what pets do I have?", "cat"),
        ("Do I have any animals?", "dog"),
        ("anything I can't eat?", "vegetarian"),
        ("who's in my family?", "daughter"),
        ("what did I say about work?", "job"),
        ("What do I do in my free time?", "guitar"),
    ],
)
def test_a_question_naming_a_category_gets_its_members(query: str, member: str) -> None:
    """'What pets do I have?' shares no word with 'User's cat is called Miso': the
    category's members are appended for the embedding and BM25."""
    expanded = expand_categories(query)
    assert expanded.startswith(query + " ") and member in expanded.split()


def test_questions_naming_no_category_are_left_alone() -> None:
    for query in ("What did Caroline research?", "Who painted the Mona Lisa?", "Carpet?"):
        assert expand_categories(query) == query
    assert category_members("petrol prices") == []  # cues are whole words


def test_questions_about_the_user_are_told_from_others() -> None:
    for query in ("Do I have kids?", "what's our budget", "Is my knee ok?", "We're moving"):
        assert is_about_the_user(query)
    for query in ("Tell me a joke", "Give me a synonym for happy", "Who is Ana?"):
        assert not is_about_the_user(query)


def test_category_expansion_and_the_personal_threshold_are_on_by_default() -> None:
    settings = RetrievalSettings()
    assert settings.search_category_expansion is True
    assert settings.search_personal_score_threshold < settings.search_score_threshold
