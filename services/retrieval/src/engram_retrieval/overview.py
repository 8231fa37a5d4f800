"""Questions about memory itself ("what do you know about me?"), recognised by rule.

Such a question shares no words with any stored fact, so similarity search finds
nothing; what answers it is the user's profile, current facts and conversation
summaries. :func:`asks_for_overview` says when a query is one (pure, no I/O); the search
pipeline then returns that overview instead of ranked hits.

The rule: a request to recall, list or summarise what is known, remembered, stored or
talked about, aimed at the user (me / my / myself / us / we) or at memory itself, in a
short message. Longer messages that merely contain the phrase ("what do you know about
me and Python decorators...") are left to ordinary search.
"""

from __future__ import annotations

import re

#: Longer than this (in words) and a message is about something else.
MAX_WORDS = 16

_ME = r"(?:me|myself|us|my\s+life|my\s+preferences|the\s+user)"
_PATTERNS = [
    # what do you know / remember / have (stored|saved|learned) about me
    rf"\bwhat\b.*\b(?:do|did|have)\s+you\s+(?:know|remember|recall|stored?|saved?|learn(?:ed|t)?|"
    rf"got|kept|noted)\b.*\babout\s+{_ME}\b",
    rf"\bwhat\b.*\bdo\s+you\s+know\s+of\s+{_ME}\b",
    # tell me (everything) (you know|what you remember) about me
    rf"\btell\s+me\b.*\b(?:know|remember|have)\b.*\babout\s+{_ME}\b",
    r"\btell\s+me\s+about\s+myself\b",
    # what have we talked / chatted / spoken about (so far)
    r"\bwhat\s+(?:have|did)\s+we\s+(?:talk(?:ed)?|chat(?:ted)?|spoken|speak|discuss(?:ed)?)\b",
    r"\bwhat\s+(?:we've|we\s+have)\s+(?:talked|chatted|spoken|discussed)\b",
    # summari[sz]e / recap / list what you remember|know
    r"\b(?:summari[sz]e|recap|list|show(?:\s+me)?|repeat)\b.*\b(?:what|everything|all)\b.*"
    r"\byou\s+(?:know|remember|recall|have\s+(?:stored|saved|learned))\b",
    r"\b(?:summari[sz]e|recap)\b.*\b(?:our|my)\s+(?:conversations?|chats?|history|memor(?:y|ies))\b",
    # what do you remember / what's in your memory (about me)
    r"^\s*what\s+do\s+you\s+remember\b",
    r"\bwhat(?:'s|\s+is)\s+in\s+your\s+memory\b",
    r"\bwhat\s+(?:memories|facts)\s+do\s+you\s+have\b",
    rf"\bdo\s+you\s+(?:know|remember)\s+anything\s+about\s+{_ME}\b",
]
_OVERVIEW = [re.compile(p, re.IGNORECASE) for p in _PATTERNS]


def asks_for_overview(query: str) -> bool:
    """Whether ``query`` asks what is remembered about the user rather than about a topic."""
    text = " ".join(query.replace("\u2019", "'").split())
    if not text or len(text.split()) > MAX_WORDS:
        return False
    return any(pattern.search(text) for pattern in _OVERVIEW)
