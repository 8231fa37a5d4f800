"""How much of the memory message a chat can afford: a token estimate and the number of
hits to ask retrieval for, so a budget (``memory_max_tokens``) can be spent.

The estimate needs no model and no tokenizer file: one token per run of punctuation
mark and per word of up to six characters, longer words counted as six-character
pieces. On LoCoMo's turns, rendered as quoted notes, it reads 1.10 times the MiniLM
WordPiece count (median; 0.85 to 1.33 per text), so a budget is rarely overspent
under a real tokenizer and never by much.
"""

from __future__ import annotations

import math
import re

_PIECE = re.compile(r"\w+|[^\w\s]")
_CHARS_PER_WORD_TOKEN = 6
#: Tokens a memory note is counted at when asking retrieval for hits: a date, a label and
#: a short sentence (LoCoMo's recalled notes average ≈ 60). Retrieval's cost grows with
#: the hits asked for (its candidate pools are top_k * 5, capped): 25 at the default 1000
#: tokens, not the 50 that the shortest notes would fit (docs/retrieval.md, Token budget).
MIN_NOTE_TOKENS = 40
#: The fewest hits asked for under a budget, and retrieval's cap on top_k.
MIN_BUDGET_HITS = 5
MAX_HITS = 100


def estimate_tokens(text: str) -> int:
    """Tokens a BPE or WordPiece tokenizer would make of ``text``, approximately."""
    return sum(
        math.ceil(len(piece) / _CHARS_PER_WORD_TOKEN)
        if piece[0].isalnum() or piece[0] == "_"
        else 1
        for piece in _PIECE.findall(text)
    )


def hits_for_budget(max_tokens: int, cap: int | None) -> int:
    """How many ranked hits to ask for so ``max_tokens`` can be spent; ``cap``
    (``memory_top_k``) bounds it when set."""
    wanted = max(MIN_BUDGET_HITS, math.ceil(max_tokens / MIN_NOTE_TOKENS))
    return min(wanted, cap or MAX_HITS, MAX_HITS)
