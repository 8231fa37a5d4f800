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


# -- categories of a person's life ----------------------------------------------------
#
# "What pets do I have?" shares no word with "User's cat is called Miso", and MiniLM puts
# the two at cosine ≈ 0.2: a question about a category names the category, a memory names
# its members. A question that names a category (a cue, as a whole word) gets the
# category's common members appended, so the embedding and BM25 see them too. The cues
# are the words people use for their own lives; the members are the words memories use.
_CATEGORIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("pet", "pets", "animal", "animals"),
        "cat dog kitten puppy parrot hamster rabbit fish vet",
    ),
    (
        ("eat", "diet", "dietary", "allergy", "allergies", "allergic", "food", "foods"),
        "allergic vegetarian vegan dairy milk gluten peanuts meat",
    ),
    (
        ("family", "relatives", "siblings", "kids", "children", "married", "partner"),
        "wife husband daughter son sister brother mother father mom dad parents",
    ),
    (
        ("work", "job", "career", "living", "profession", "colleagues"),
        "works job engineer manager team company office promoted",
    ),
    (
        ("hobby", "hobbies", "free time", "fun", "pastime", "pastimes"),
        "plays playing learning reading runs guitar volunteers weekend",
    ),
    (
        ("health", "medical", "conditions", "injury", "injuries", "illness"),
        "hurting pain asthma allergic doctor sleeping knee",
    ),
    (
        ("travel", "travelling", "traveling", "trip", "trips", "holiday", "holidays", "vacation"),
        "flying visited visit flight abroad",
    ),
    (
        ("home", "house", "apartment", "flat", "live", "neighbourhood", "neighborhood"),
        "lives flat apartment floor balcony garden city",
    ),
    (
        ("own", "belongings", "possessions", "things I have"),
        "drives car bike phone bought",
    ),
    (
        ("money", "finances", "financial", "savings", "budget"),
        "saving save salary account deposit",
    ),
)
_CUES = tuple(
    (re.compile(r"\b(" + "|".join(re.escape(c) for c in cues) + r")\b", re.IGNORECASE), members)
    for cues, members in _CATEGORIES
)


def category_members(query: str) -> list[str]:
    """The member words of every category ``query`` names, in the table's order."""
    return [members for cue, members in _CUES if cue.search(query)]


def expand_categories(query: str) -> str:
    """``query`` plus the members of the categories it names: ``"What pets do I have?"``
    → ``"What pets do I have? cat dog kitten …"``."""
    members = category_members(query)
    return " ".join([query, *members]) if members else query


# -- questions about the user ----------------------------------------------------------
#
# A person asking about their own life ("do I have kids?", "what's our budget?") is
# asking memory, so the recall-or-nothing decision may be less strict for them than for
# "what's the capital of Australia?". "me" alone is no cue: "tell me a joke" asks nothing
# of memory.
_ABOUT_THE_USER = re.compile(
    r"\b(i|my|mine|myself|i'm|i've|i'd|i'll|we|our|ours|ourselves|we're|we've)\b",
    re.IGNORECASE,
)


def is_about_the_user(query: str) -> bool:
    return bool(_ABOUT_THE_USER.search(query))
