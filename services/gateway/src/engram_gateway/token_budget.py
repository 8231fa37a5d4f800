"""How much of the memory message a chat can afford: a token estimate and the number of
hits to ask retrieval for, so a budget (``memory_max_tokens``) can be spent.

The estimate needs no model and no tokenizer file. It reads the text as words and
punctuation marks, as a BPE or WordPiece tokenizer first splits it, and counts:

- an ASCII word: one token per seven characters, begun (``dog`` 1, ``painting`` 2);
- a Chinese, Japanese or Korean character: 1.5 tokens (tokenizers split these scripts
  into single characters or bytes, so a word-based count would be 5x too low);
- any other non-ASCII letter (accented, Greek, Cyrillic, Arabic, Devanagari …): one
  token, plus one for a word mixing it with ASCII letters;
- a punctuation mark: one token, two outside ASCII, three outside the Basic
  Multilingual Plane (an emoji is several bytes to a byte-level BPE).

Measured against a real LLM tokenizer (Anthropic's legacy 65k BPE) on the 760 memory
messages of LoCoMo's development questions, the estimate reads 1.04 x its count (median;
0.97 to 1.11), and on one sentence in each of eleven languages between 0.65 x (Spanish,
whose words an English-heavy vocabulary splits) and 1.5 x (Russian); on Chinese it read
0.21 x when it counted words alone (docs/retrieval.md, Token budget).
"""

from __future__ import annotations

import math
import re

_CHARS_PER_WORD_TOKEN = 7
_WIDE_CHAR_TOKENS = 1.5
#: A word of up to seven characters (a longer one is matched in seven-character pieces)
#: or a punctuation mark: for ASCII text, one match is one token of the estimate.
_ASCII_TOKEN = re.compile(rf"\w{{1,{_CHARS_PER_WORD_TOKEN}}}|[^\w\s]")
#: ASCII text counted without the pattern (3x faster, the same count): its marks (neither
#: word characters nor whitespace) one each, and its words, split apart at the marks,
#: one per seven characters begun.
_ASCII_WORD_CHARS = {chr(c) for c in range(128) if chr(c).isalnum() or chr(c) == "_"}
_ASCII_MARKS = (
    {chr(c) for c in range(128)}
    - _ASCII_WORD_CHARS
    - {
        chr(c)
        for c in range(128)
        if chr(c).isspace()  # what the pattern's \s matches
    }
)
_ASCII_MARKS_DROPPED = str.maketrans(dict.fromkeys(_ASCII_MARKS))
_ASCII_MARKS_AS_SPACE = str.maketrans(
    dict.fromkeys({chr(c) for c in range(128)} - _ASCII_WORD_CHARS, " ")
)
#: A word with a non-ASCII letter in it, or a non-ASCII mark: the pieces counted apart.
_NON_ASCII_PIECE = re.compile(r"\w*[^\W\x00-\x7f]\w*|[^\w\s\x00-\x7f]")
#: Tokens a memory note is counted at when asking retrieval for hits: a date, a label and
#: a short sentence (LoCoMo's recalled notes average ≈ 60). Retrieval's cost grows with
#: the hits asked for (its candidate pools are top_k * 5, capped): 27 at the default 1050
#: tokens, not the 50 that the shortest notes would fit (docs/retrieval.md, Token budget).
MIN_NOTE_TOKENS = 40
#: The fewest hits asked for under a budget, and retrieval's cap on top_k.
MIN_BUDGET_HITS = 5
MAX_HITS = 100


def cjk_character(char: str) -> bool:
    """A character of the CJK scripts (ideographs, kana, Hangul, full-width forms)."""
    code = ord(char)
    return (
        0x2E80 <= code <= 0xD7AF
        or 0xF900 <= code <= 0xFAFF
        or 0xFF00 <= code <= 0xFFEF
        or code >= 0x20000
    )


def _non_ascii_tokens(piece: str) -> int:
    if not (piece[0].isalnum() or piece[0] == "_"):
        return 3 if ord(piece) > 0xFFFF else 2  # a mark
    wide = sum(1 for char in piece if cjk_character(char))
    other = sum(1 for char in piece if not char.isascii()) - wide
    ascii_chars = len(piece) - wide - other
    mixed = 1 if ascii_chars and other else 0
    return (
        math.ceil(ascii_chars / _CHARS_PER_WORD_TOKEN)
        + math.ceil(_WIDE_CHAR_TOKENS * wide)
        + other
        + mixed
    )


def estimate_tokens(text: str) -> int:
    """Tokens a BPE or WordPiece tokenizer would make of ``text``, approximately."""
    if text.isascii():
        return _ascii_tokens(text)
    tokens = len(_ASCII_TOKEN.findall(text))
    # the pieces with a non-ASCII character, counted by their own rule instead
    for piece in _NON_ASCII_PIECE.findall(text):
        tokens += _non_ascii_tokens(piece) - len(_ASCII_TOKEN.findall(piece))
    return tokens


def _ascii_tokens(text: str) -> int:
    """``len(_ASCII_TOKEN.findall(text))`` of an ASCII text, without a string per match
    (the gateway costs every line of a memory message)."""
    marks = len(text) - len(text.translate(_ASCII_MARKS_DROPPED))
    words = text.translate(_ASCII_MARKS_AS_SPACE).split()
    return marks + sum(
        (len(word) + _CHARS_PER_WORD_TOKEN - 1) // _CHARS_PER_WORD_TOKEN for word in words
    )


def hits_for_budget(max_tokens: int, cap: int | None) -> int:
    """How many ranked hits to ask for so ``max_tokens`` can be spent; ``cap``
    (``memory_top_k``) bounds it when set."""
    wanted = max(MIN_BUDGET_HITS, math.ceil(max_tokens / MIN_NOTE_TOKENS))
    return min(wanted, cap or MAX_HITS, MAX_HITS)
