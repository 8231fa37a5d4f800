"""First-person query expansion (pure; no I/O), off by default.

Facts are stored in the third person ("User's dog is called Biscuit"); questions come
in the first ("What is my dog's name?"). Expansion appends the question rewritten in
the third person, so both forms reach the embedder and BM25:
``"How tall am I?"`` → ``"How tall am I? how tall is the user?"``.

Measured before shipping, it changed nothing: LoCoMo's development half has no
first-person question, and on 15 personal questions against their third-person facts
among 25 (docs/benchmarks.md) MiniLM ranks the answer first 14 times with or without
it (MRR 0.967 both ways). So ``ENGRAM_SEARCH_FIRST_PERSON_EXPANSION`` defaults to off.
"""

from __future__ import annotations

import re

_FIRST_PERSON = re.compile(r"\b(i|me|my|mine|myself|i'm|i've|i'd)\b", re.IGNORECASE)
# Order matters: "am I" / "I am" before the lone "I".
_RULES = (
    (re.compile(r"\bam i\b"), "is the user"),
    (re.compile(r"\bi am\b|\bi'm\b"), "the user is"),
    (re.compile(r"\bi've\b"), "the user has"),
    (re.compile(r"\bi'd\b"), "the user would"),
    (re.compile(r"\bmy\b|\bmine\b"), "the user's"),
    (re.compile(r"\bme\b|\bmyself\b"), "the user"),
    (re.compile(r"\bi\b"), "the user"),
)


def is_first_person(query: str) -> bool:
    return bool(_FIRST_PERSON.search(query))


def expand_first_person(query: str) -> str:
    """``query`` plus its third-person rewrite when it speaks in the first person."""
    if not is_first_person(query):
        return query
    rewritten = query.lower()
    for pattern, replacement in _RULES:
        rewritten = pattern.sub(replacement, rewritten)
    return f"{query} {rewritten}"
