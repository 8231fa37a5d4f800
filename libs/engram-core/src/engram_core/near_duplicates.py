"""When two facts say the same thing: the one near-duplicate rule of every writer.

Reconcile does not store a proposed fact that a current fact already states, and the
memory API (``POST /v1/memories``, MCP ``remember_fact``) returns the existing fact
instead of creating a second one. Both decide with :func:`is_near_duplicate`: the same
text (case, spacing and a final full stop aside), or a cosine of at least
``ENGRAM_NEAR_DUPLICATE_COSINE`` (0.90) with the same names and numbers. The cosine is
the dense score of a plain similarity search (:func:`similar_facts_query`). Pure, no I/O.
"""

from __future__ import annotations

import re
from datetime import datetime

from pydantic import BaseModel, Field

from engram_core.memory import SearchQuery

NEAR_DUPLICATE_COSINE = 0.90


class NearDuplicateSettingsMixin(BaseModel):
    """The near-duplicate threshold, for every service that applies the rule."""

    near_duplicate_cosine: float = Field(
        default=NEAR_DUPLICATE_COSINE,
        gt=0.0,
        le=1.0,
        description="A new fact this similar to a current fact (and naming the same names "
        "and numbers) is not stored again.",
    )


def normalise_text(text: str) -> str:
    """What makes two statements "the same text": case, spacing, final full stop."""
    return " ".join(text.split()).rstrip(" .!").casefold()


_WORD = re.compile(r"[^\W_][\w'-]*")
_GENERIC = frozenset({"user", "user's", "i", "i'm"})


def specifics(text: str) -> frozenset[str]:
    """Numbers and names (capitalised words after the first) in a statement.

    Sentence embeddings barely see them: "User loves painting number 1" and "... number 2"
    have a cosine above 0.9. Two statements are only near-duplicates when these agree.
    """
    found = set()
    for position, word in enumerate(_WORD.findall(text.replace("\u2019", "'"))):
        lowered = word.lower()
        if any(ch.isdigit() for ch in word):
            found.add(lowered)
        elif position > 0 and word[0].isupper() and lowered not in _GENERIC:
            found.add(lowered.removesuffix("'s"))
    return frozenset(found)


def is_near_duplicate(text: str, existing: str, cosine: float, threshold: float) -> bool:
    """Whether a new ``text`` says what the ``existing`` fact (at ``cosine``) says."""
    if normalise_text(text) == normalise_text(existing):
        return True
    return cosine >= threshold and specifics(existing) == specifics(text)


def similar_facts_query(
    tenant: str,
    text: str,
    *,
    user_id: str,
    conversation_id: str,
    top_k: int,
    now: datetime | None = None,
) -> SearchQuery:
    """The user's current facts most similar to ``text`` (this conversation, their other
    conversations, the tenant-wide bucket): plain similarity, no threshold, no recency,
    no diversity, so every hit's dense score is its cosine."""
    return SearchQuery(
        tenant=tenant,
        text=text,
        user_id=user_id,
        conversation_id=conversation_id,
        kinds=("fact",),
        top_k=top_k,
        score_threshold=0.0,
        recency_weight=0.0,
        mmr_lambda=1.0,
        now=now,
        attachments=False,
    )
