"""First person to third person, for the scripted brain's extracted facts.

"I moved to Lisbon" → "User moved to Lisbon"; "I love hiking" → "User loves hiking";
"I study law" → "User studies law"; "I don't eat meat" → "User doesn't eat meat";
"My wife's name is Anne and I love hiking" → two clauses, each its own fact.

A handful of English rules, not a parser: enough for tests, demos and benchmarks to
read naturally. The verb right after a clause-initial "I" (past adverbs) is put in
the third person: past tense and modals stay, ``have/do/go`` are irregular, and the
usual spelling rules apply (``-ies``, ``-es``).
"""

from __future__ import annotations

import re

SUBJECT = "User"

#: "and I ...", "but my ...": where one statement holds two facts.
_CLAUSE_BREAK = re.compile(
    r"\s*[;]\s*|,?\s+(?:and|but|so|while|although)\s+(?=(?:i|i'm|i've|i'll|i'd|my)\b)",
    re.IGNORECASE,
)
_CONTRACTIONS = [
    (re.compile(r"\bI'm\b|\bI am\b"), f"{SUBJECT} is"),
    (re.compile(r"\bI've\b"), f"{SUBJECT} has"),
    (re.compile(r"\bI'll\b"), f"{SUBJECT} will"),
    (re.compile(r"\bI'd\b"), f"{SUBJECT} would"),
]
_NEGATIONS = {"don't": "doesn't", "haven't": "hasn't", "do": "does", "have": "has"}
_UNCHANGED = {
    "can", "could", "will", "would", "shall", "should", "may", "might", "must",
    "can't", "couldn't", "won't", "wouldn't", "shouldn't", "didn't", "wasn't", "was",
    "did", "had", "hadn't",
}  # fmt: skip
_IRREGULAR = {"have": "has", "do": "does", "go": "goes", "be": "is"}
_PAST = {
    "ate", "became", "began", "bought", "broke", "brought", "built", "came", "caught",
    "chose", "drank", "drove", "fell", "felt", "flew", "forgot", "found", "gave", "got",
    "grew", "heard", "held", "kept", "knew", "left", "lent", "lost", "made", "meant",
    "met", "paid", "put", "ran", "read", "rode", "sang", "sat", "saw", "said", "sent",
    "sold", "spent", "spoke", "stood", "swam", "taught", "thought", "told", "took",
    "understood", "went", "woke", "won", "wore", "wrote",
}  # fmt: skip
_ADVERBS = {
    "also", "always", "never", "often", "still", "usually", "sometimes", "just", "only",
    "even", "really", "actually", "rarely", "recently", "now", "already", "mostly",
}  # fmt: skip
# Not after "and"/"or": "my wife and I live" keeps its plural verb.
_ADVERB = r"\s+(?:\w+ly|no longer|" + "|".join(sorted(_ADVERBS)) + r")"
_I_VERB = re.compile(r"(?<!and )(?<!or )\bI((?:" + _ADVERB + r")*)\s+([\w']+)")


def split_clauses(sentence: str) -> list[str]:
    """A sentence's first-person clauses, each a statement of its own."""
    return [part.strip() for part in _CLAUSE_BREAK.split(sentence) if part and part.strip()]


def third_person_verb(verb: str) -> str:
    lower = verb.lower()
    if lower in _NEGATIONS:
        return _NEGATIONS[lower]
    if lower in _UNCHANGED or lower in _PAST:
        return verb
    if lower.endswith("ed") and not lower.endswith("eed"):
        return verb  # past tense: moved, lived, started (need, feed are present)
    if lower in _IRREGULAR:
        return _IRREGULAR[lower]
    if re.search(r"[^aeiou]y$", lower):
        return verb[:-1] + "ies"
    if re.search(r"(s|sh|ch|x|z|o)$", lower):
        return verb + "es"
    return verb + "s"


def third_person(clause: str) -> str:
    """One first-person clause in the third person, without its final punctuation."""
    text = clause.strip().rstrip(".!")
    for pattern, replacement in _CONTRACTIONS:
        text = pattern.sub(replacement, text)
    text = _I_VERB.sub(lambda m: f"{SUBJECT}{m.group(1)} {third_person_verb(m.group(2))}", text)
    text = re.sub(r"\bI\b", SUBJECT, text)
    text = re.sub(r"\b(?:my|mine)\b", f"{SUBJECT}'s", text, flags=re.IGNORECASE)
    text = re.sub(r"\b(?:me|myself)\b", SUBJECT, text)
    return text[0].upper() + text[1:] if text else text
