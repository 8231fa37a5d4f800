"""Fact extraction: one user turn → 0-3 atomic facts and structured profile facts.

Called by the ingest worker after the turn is indexed. One ``extract_facts`` LLM call
(:mod:`engram_workers.prompts`, asked under the workers' one policy); the
answer is cleaned and, when anything was found, becomes one ``FactProposed`` event
whose id derives from the turn, so a re-extracted turn is de-duplicated by JetStream.
Assistant turns are never extracted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from engram_core import ids
from engram_core.events import FactProposed, TurnPersisted
from engram_core.logging import get_logger
from engram_core.memory import MemoryFilter, ProposedProfileFact
from engram_core.memory_port import MemoryPort
from engram_workers import prompts
from engram_workers.llm import Ask, FellBack

log = get_logger(__name__)

#: Longest earlier message (characters) shown to the model as context.
CONTEXT_CHARS = 500


def normalise_key(key: str) -> str:
    """snake_case: "Favorite Food" → "favorite_food"."""
    return re.sub(r"[^0-9a-z]+", "_", key.strip().lower()).strip("_")


def clean_output(output: prompts.ExtractOutput) -> tuple[list[str], list[ProposedProfileFact]]:
    """Trim, drop empties and repeats, keep at most 3 facts; one profile entry per
    (category, key), the most confident."""
    facts: list[str] = []
    seen: set[str] = set()
    for fact in output.facts:
        text = " ".join(fact.split())
        if text and text.casefold() not in seen:
            seen.add(text.casefold())
            facts.append(text)
    profile: dict[tuple[str, str], ProposedProfileFact] = {}
    for entry in output.profile:
        key = normalise_key(entry.key)
        value = " ".join(entry.value.split())
        if not key or not value:
            continue
        cleaned = entry.model_copy(update={"key": key, "value": value})
        held = profile.get((entry.category, key))
        if held is None or cleaned.confidence > held.confidence:
            profile[(entry.category, key)] = cleaned
    return facts[:3], list(profile.values())


async def recent_context(
    memories: MemoryPort, event: TurnPersisted, memory_id: str, limit: int
) -> list[str]:
    """Up to ``limit`` earlier turns of this user's conversation, oldest first."""
    if limit <= 0:
        return []
    page = await memories.list_page(
        event.tenant,
        MemoryFilter(user_id=event.user_id, conversation_id=event.conversation_id, kinds=("turn",)),
        page_size=limit + 5,  # room for this turn and later ones
    )
    earlier: list[str] = []
    for memory in page.records:  # newest first
        if memory.id == memory_id or (
            memory.created_at is not None and memory.created_at > event.created_at
        ):
            continue
        text = memory.text if len(memory.text) <= CONTEXT_CHARS else memory.text[:CONTEXT_CHARS]
        earlier.append(f"{memory.role or 'user'}: {text}")
        if len(earlier) == limit:
            break
    return earlier[::-1]


@dataclass(frozen=True)
class Extraction:
    facts: list[str]
    profile: list[ProposedProfileFact]
    model: str


async def extract(
    ask: Ask, *, message: str, date: datetime, context: list[str]
) -> Extraction | FellBack:
    """One ``extract_facts`` call, its answer cleaned; or the policy's fallback (the
    turn stays searchable and nothing is learned from it)."""
    payload = prompts.ExtractInput(message=message, date=date.isoformat(), recent_context=context)
    answer = await ask(prompts.EXTRACT_FACTS, payload)
    if isinstance(answer, FellBack):
        return answer
    facts, profile = clean_output(answer.output)
    return Extraction(facts, profile, answer.model)


def fact_proposed(
    event: TurnPersisted,
    memory_id: str,
    facts: list[str],
    profile: list[ProposedProfileFact],
) -> FactProposed:
    """The proposal for reconcile; its id derives from the turn's memory id (and, for a
    re-extraction, from the run's event, so a new run is not taken for a duplicate)."""
    parts = (
        (memory_id, "fact.proposed", event.event_id)
        if event.reextract
        else (memory_id, "fact.proposed")
    )
    return FactProposed(
        event_id=ids.event_id(*parts),
        tenant=event.tenant,
        user_id=event.user_id,
        conversation_id=event.conversation_id,
        source_turn_id=memory_id,
        source_id=event.source_id,
        turn_created_at=event.created_at,
        facts=facts,
        profile=profile,
        model=event.model,
        followed=event.followed,
    )
