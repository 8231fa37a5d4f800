"""Summarize's rules, as pure functions: what to fold, what the next summary or episode
is, and the rule-based fallbacks. No I/O: :mod:`engram_workers.summarize.app` reads the
store and asks the model, then hands the answers to these.

- The **rolling summary** is one ``summary`` memory per user's conversation (a
  deterministic id), revised by folding new current facts into it; its metadata lists
  the fact ids it already includes, so a fact is never folded twice.
- An **episode** covers ``episode_turns`` consecutive turns of a user's conversation
  (numbered after the newest episode, whatever eviction removed since), once a later
  turn exists; its id derives from the turns it covers.
- The model writes both (:func:`write_summary`, :func:`write_episode`, through the
  :class:`~engram_workers.llm.Ask` they are given). When it fails (the workers' one
  policy) or answers nothing, the summary appends the facts verbatim and the episode
  is an extractive summary of the user's salient sentences, each marked as such.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from engram_core.ids import episode_memory_id, summary_memory_id
from engram_core.memory import MemoryRecord
from engram_workers import prompts
from engram_workers.llm import Ask, FellBack

#: How many of the most recently folded fact ids the summary remembers. A redelivery
#: comes within minutes (retries with backoff), far fewer folds than this.
FOLDED_IDS_KEPT = 100
#: Other not-yet-folded current facts folded along with the one that triggered.
FOLD_BATCH = 20
#: Windows built for one turn event; a backlog (a late start) drains over later turns.
MAX_WINDOWS_PER_EVENT = 5

SUMMARIZER_LLM = "llm"
SUMMARIZER_RULES = "rule-based"

_EPOCH = datetime.min.replace(tzinfo=UTC)


__all__ = ["episode_memory_id", "summary_memory_id"]  # re-exported: ids are domain rules

# --- text helpers -----------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(" ".join(text.split())) if s.strip()]


def normalised_sentence(sentence: str) -> str:
    return " ".join(sentence.lower().split()).rstrip(".!?")


def bounded(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars``, at a sentence end when there is one."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    head = text[: max_chars - 1]
    cut = max(head.rfind(". "), head.rfind("! "), head.rfind("? "))
    return head[: cut + 1] if cut > max_chars // 2 else head.rstrip() + "…"


def age_key(memory: MemoryRecord) -> tuple[datetime, int, str]:
    """Conversation order: created_at, then the turn index when set, then id."""
    return (memory.created_at or _EPOCH, memory.turn_index, memory.id)


# --- the rolling summary ------------------------------------------------------------------


def folded_ids(summary: MemoryRecord | None) -> list[str]:
    if summary is None:
        return []
    return summary.metadata.get("folded_fact_ids", "").split()


def facts_to_fold(
    trigger: MemoryRecord | None, others: Iterable[MemoryRecord], folded: set[str]
) -> list[MemoryRecord]:
    """The triggering fact (if still current) and other current facts not folded yet,
    oldest first. A fact superseded before we got to it is left out: folding it after
    its successor would bring stale information back."""
    pending: dict[str, MemoryRecord] = {}
    if trigger is not None and trigger.is_current:
        pending[trigger.id] = trigger
    for other in others:
        if other.id not in folded and other.id not in pending and other.is_current:
            pending[other.id] = other
    return sorted(pending.values(), key=age_key)


def rule_based_summary(previous: str, new_facts: Sequence[str], max_chars: int) -> str:
    """The previous summary with the new facts appended as sentences. Over the bound,
    the oldest sentences go first (the facts themselves stay in the index); the next
    successful model fold rewrites the whole summary."""
    kept = sentences(previous)
    for fact in new_facts:
        sentence = " ".join(fact.split())
        if sentence and sentence[-1] not in ".!?":
            sentence += "."
        if sentence and sentence not in kept:
            kept.append(sentence)
    while len(kept) > 1 and len(" ".join(kept)) > max_chars:
        kept.pop(0)
    return bounded(" ".join(kept), max_chars)


def fold_metadata(
    previous: MemoryRecord | None, facts: Sequence[MemoryRecord], summarizer: dict[str, str]
) -> dict[str, str]:
    """The next summary's bookkeeping: how it was written and which facts it holds."""
    total = int(previous.metadata.get("facts_folded", "0")) if previous else 0
    folded = folded_ids(previous)
    return {
        **summarizer,
        "facts_folded": str(total + len(facts)),
        "folded_fact_ids": " ".join([*folded, *(f.id for f in facts)][-FOLDED_IDS_KEPT:]),
    }


def next_summary(
    tenant: str,
    user_id: str,
    conversation_id: str,
    previous: MemoryRecord | None,
    text: str,
    metadata: dict[str, str],
) -> MemoryRecord:
    """The next revision of a conversation's summary."""
    revision = int(previous.metadata.get("revision", "0")) + 1 if previous is not None else 1
    return MemoryRecord(
        id=summary_memory_id(tenant, user_id, conversation_id),
        kind="summary",
        text=text,
        user_id=previous.user_id if previous is not None else user_id,
        conversation_id=conversation_id,
        created_at=previous.created_at if previous is not None else None,
        metadata={**metadata, "revision": str(revision)},
    )


def without_sentences(summary: MemoryRecord, gone_text: str) -> list[str] | None:
    """The summary's sentences minus those of a fact that no longer holds (where the
    summary holds them word for word, as the rule-based fallback writes them), or None
    when it holds none of them."""
    gone = {normalised_sentence(s) for s in sentences(gone_text)}
    current = sentences(summary.text)
    kept = [s for s in current if normalised_sentence(s) not in gone]
    return None if len(kept) == len(current) else kept


# --- episodes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Anchor:
    """Where numbering continues: the newest episode (None before the first one)."""

    last_turn: int = 0
    boundary: datetime | None = None  # created_at of its newest covered turn
    covered: frozenset[str] = frozenset()


def anchor_of(episodes: Sequence[MemoryRecord]) -> Anchor:
    """Numbering continues after the episode with the highest ``last_turn``: the count
    of turns covered by earlier episodes, which eviction of those turns cannot change."""
    ranged = [e for e in episodes if e.turn_range is not None]
    if not ranged:
        return Anchor()
    newest = max(ranged, key=lambda e: (e.turn_range[1] if e.turn_range else 0, age_key(e)))
    assert newest.turn_range is not None
    return Anchor(
        last_turn=int(newest.turn_range[1]),
        boundary=newest.created_at,
        covered=frozenset(newest.source_turn_ids),
    )


def uncovered(turns_newest_first: Iterable[MemoryRecord], anchor: Anchor) -> list[MemoryRecord]:
    """Turns after the anchor's newest covered turn and not covered by it, oldest first.
    A turn that arrives older than an episode already built stays out of episodes (it
    is still a searchable turn)."""
    found = []
    for turn in turns_newest_first:
        if anchor.boundary is not None and turn.created_at and turn.created_at < anchor.boundary:
            break
        if turn.id not in anchor.covered:
            found.append(turn)
    return sorted(found, key=age_key)


def closed_windows(
    turns: list[MemoryRecord], anchor: Anchor, size: int
) -> list[tuple[int, list[MemoryRecord]]]:
    """(first turn number, window) for each window that is complete and closed: a
    window closes once a later turn exists, so a turn indexed a moment late (the turns
    of one exchange are handled concurrently) still lands in its window."""
    windows: list[tuple[int, list[MemoryRecord]]] = []
    while len(turns) > size and len(windows) < MAX_WINDOWS_PER_EVENT:
        window, turns = turns[:size], turns[size:]
        windows.append((anchor.last_turn + len(windows) * size + 1, window))
    return windows


def numbered_turns(window: Sequence[MemoryRecord], first: int) -> list[prompts.EpisodeTurn]:
    return [
        prompts.EpisodeTurn(n=first + i, role=turn.role or "user", text=turn.text)
        for i, turn in enumerate(window)
    ]


def episode_record(
    tenant: str,
    conversation_id: str,
    user_id: str,
    window: Sequence[MemoryRecord],
    first: int,
    text: str,
    metadata: dict[str, str],
) -> MemoryRecord:
    turn_ids = [t.id for t in window]
    newest = window[-1]
    return MemoryRecord(
        id=episode_memory_id(tenant, conversation_id, turn_ids),
        kind="episode",
        text=text,
        user_id=newest.user_id or user_id,
        conversation_id=conversation_id,
        source_turn_ids=turn_ids,
        turn_range=(first, first + len(window) - 1),
        # The episode is as old as its newest turn: numbering and eviction rely on it.
        created_at=newest.created_at,
        metadata=metadata,
    )


# --- the rule-based episode --------------------------------------------------------------

_CHIT_CHAT = re.compile(
    r"^(hi|hello|hey|thanks|thank you|ok|okay|sure|bye|goodbye|good (morning|night|evening)|"
    r"how are you|nice|cool|great|lol|yes|no|noted)\b[\s\w]{0,12}[!.?]*$",
    re.IGNORECASE,
)
_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|my|me|we|our)\b", re.IGNORECASE)
_DURABLE = re.compile(
    r"\b(name|live|lives|moved|work|works|job|like|love|hate|prefer|allergic|plan|"
    r"planning|need|want|always|never|remember|birthday|born|married|wife|husband|"
    r"son|daughter|kids?|visit|visited|bought|started|decided)\b",
    re.IGNORECASE,
)
_PROPER_NOUN = re.compile(r"(?<!^)(?<![.!?]\s)\b[A-Z][a-z]+")


def _salience(sentence: str) -> float:
    words = sentence.split()
    score = min(len(words), 20) / 20
    if _FIRST_PERSON.search(sentence):
        score += 2
    if _DURABLE.search(sentence):
        score += 1
    if any(ch.isdigit() for ch in sentence):
        score += 1
    if _PROPER_NOUN.search(sentence):
        score += 1
    return score


def rule_based_episode(turns: Sequence[prompts.EpisodeTurn], max_chars: int) -> str:
    """An extractive summary: the user's most salient sentences and the question/answer
    pairs, in conversation order, under a header that says how it was made."""
    header = f"Turns {turns[0].n}-{turns[-1].n} (rule-based summary, extracted without the model):"
    # (position in the window, score, text)
    items: list[tuple[tuple[int, int], float, str]] = []
    for i, turn in enumerate(turns):
        if turn.role != "user":
            continue
        said = [s for s in sentences(turn.text) if not _CHIT_CHAT.match(s)]
        questions = [s for s in said if s.endswith("?")]
        answer = turns[i + 1] if i + 1 < len(turns) and turns[i + 1].role == "assistant" else None
        if questions and answer is not None:
            reply = " ".join(sentences(answer.text)[:2])
            if reply:
                items.append(((i, 0), 3.5, f"Q: {questions[-1]} A: {reply}"))
        for j, sentence in enumerate(s for s in said if not s.endswith("?")):
            if len(sentence.split()) >= 3:
                items.append(((i, j + 1), _salience(sentence), f"User: {sentence}"))
    budget = max_chars - len(header) - 1
    chosen: list[tuple[tuple[int, int], float, str]] = []
    used = 0
    for item in sorted(items, key=lambda it: (-it[1], it[0])):
        cost = len(item[2]) + 1
        if used + cost <= budget:
            chosen.append(item)
            used += cost
    if not chosen:
        return bounded(f"{header} (no salient statements)", max_chars)
    body = " ".join(text for _, _, text in sorted(chosen))
    return bounded(f"{header} {body}", max_chars)


# --- asking the model, with the fallbacks --------------------------------------------------


@dataclass(frozen=True)
class Written:
    """A summary or episode text, and how it was written (its metadata: ``summarizer``
    and ``model``, or ``fallback_reason``)."""

    text: str
    how: dict[str, str] = field(default_factory=dict)

    @property
    def fell_back(self) -> bool:
        return self.how.get("summarizer") == SUMMARIZER_RULES


def _by_rules(text: str, reason: str) -> Written:
    return Written(text, {"summarizer": SUMMARIZER_RULES, "fallback_reason": reason[:300]})


async def write_summary(
    previous: str, new_facts: Sequence[str], ask: Ask, max_chars: int
) -> Written:
    """The previous summary with ``new_facts`` folded in, by the model or by the rules."""
    payload = prompts.SummarizeInput(previous_summary=previous, new_facts=list(new_facts))
    answer = await ask(prompts.SUMMARIZE, payload, max_chars=max_chars)
    if isinstance(answer, FellBack):
        return _by_rules(rule_based_summary(previous, new_facts, max_chars), answer.reason)
    text = answer.output.summary.strip()
    if not text:
        return _by_rules(
            rule_based_summary(previous, new_facts, max_chars),
            f"{prompts.SUMMARIZE.name}: the model returned an empty summary",
        )
    return Written(bounded(text, max_chars), {"summarizer": SUMMARIZER_LLM, "model": answer.model})


async def write_episode(turns: Sequence[prompts.EpisodeTurn], ask: Ask, max_chars: int) -> Written:
    """One episode's text for the numbered ``turns``, by the model or by the rules."""
    first, last = turns[0].n, turns[-1].n
    payload = prompts.EpisodeInput(first_turn=first, last_turn=last, turns=list(turns))
    answer = await ask(
        prompts.EPISODE, payload, first_turn=first, last_turn=last, max_chars=max_chars
    )
    if isinstance(answer, FellBack):
        return _by_rules(rule_based_episode(turns, max_chars), answer.reason)
    text = answer.output.summary.strip()
    if not text:
        return _by_rules(
            rule_based_episode(turns, max_chars),
            f"{prompts.EPISODE.name}: the model returned an empty summary",
        )
    return Written(bounded(text, max_chars), {"summarizer": SUMMARIZER_LLM, "model": answer.model})
