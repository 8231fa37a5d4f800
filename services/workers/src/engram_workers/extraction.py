"""Fact extraction: one user turn → 0-3 atomic facts and structured profile facts.

Called by the ingest worker after the turn is indexed. One ``extract_facts`` LLM call
(JSON schema output, tolerant parsing and a re-ask inside :class:`LlmClient`); the
answer is cleaned and, when anything was found, becomes one ``FactProposed`` event
whose id derives from the turn, so a re-extracted turn is de-duplicated by JetStream.
Assistant turns are never extracted.
"""

from __future__ import annotations

import re
from datetime import datetime

from engram_core.events import FactProposed, TurnPersisted, deterministic_event_id
from engram_core.logging import get_logger
from engram_core.memory import MemoryFilter, ProposedProfileFact
from engram_core.memory_port import MemoryPort
from engram_workers import tasks
from engram_workers.llm import LlmClient

log = get_logger(__name__)

#: Longest earlier message (characters) shown to the model as context.
CONTEXT_CHARS = 500

EXTRACT_INSTRUCTIONS = """\
You extract durable facts about the user from ONE message the user just sent.

Input (JSON): "message" is the user's message; "date" is when it was sent (ISO 8601);
"recent_context" holds a few earlier messages of the conversation, oldest first, each
prefixed with its role. Use recent_context ONLY to resolve references such as "she",
"it" or "that city"; never extract anything that only the context or the assistant says.

Answer with one JSON object: {"facts": [...], "profile": [...]}.

"facts": 0 to 3 short, atomic, standalone statements about the user, each understandable
on its own, months later, without the conversation.
- Third person, starting from "User": "I love pizza" -> "User loves pizza";
  "my wife is Anne" -> "User's wife is named Anne".
- One piece of information per fact; split compound sentences; if there are more than
  3, keep the 3 most durable and specific.
- Resolve pronouns and references; turn relative dates into absolute ones using "date"
  ("last year", said in 2026 -> "in 2025").
- Keep names, numbers and values exactly as the user gave them; do not guess, generalise
  or add anything that was not said.
- A correction ("sorry, her name is Anne, not Jane") is stated as the corrected fact
  ("User's wife is named Anne").
- No facts from greetings, thanks, small talk, questions, requests for help,
  hypotheticals, or statements about the assistant or the world in general.
  If the message holds nothing durable about the user, "facts" is [].

"profile": stable attributes of the user the message states, each
{"category", "key", "value", "confidence", "importance"}:
- "category": "identity" (name, age, home, job, family, pets), "preference" (likes,
  dislikes, favourites, style), "constraint" (allergies, diet, budget, health,
  availability), or "instruction" (how the user wants to be answered: language, tone,
  format, length).
- "key": short snake_case, reusable so that a later value replaces an earlier one:
  "name", "home_city", "occupation", "wife_name", "diet", "allergy", "favorite_food",
  "response_language".
- "value": the value alone ("Anne", "vegetarian", "Portuguese").
- "confidence" 0-1: 0.9 or more when stated plainly, about 0.5 when hedged ("I think",
  "maybe"), lower when only implied.
- "importance" 0-1: how much it should shape future answers (allergies and instructions
  high, trivia low).
- [] when the message states no such attribute.

Examples:
"Hi there!" -> {"facts": [], "profile": []}
"Can you recommend a book?" -> {"facts": [], "profile": []}
"My wife Anne and I just moved to Lisbon." -> {"facts": ["User's wife is named Anne",
"User moved to Lisbon"], "profile": [{"category": "identity", "key": "wife_name",
"value": "Anne", "confidence": 0.95, "importance": 0.7}, {"category": "identity",
"key": "home_city", "value": "Lisbon", "confidence": 0.9, "importance": 0.6}]}
"""


def normalise_key(key: str) -> str:
    """snake_case: "Favorite Food" → "favorite_food"."""
    return re.sub(r"[^0-9a-z]+", "_", key.strip().lower()).strip("_")


def clean_output(output: tasks.ExtractOutput) -> tuple[list[str], list[ProposedProfileFact]]:
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


async def extract(
    llm: LlmClient,
    *,
    model: str,
    message: str,
    date: datetime,
    context: list[str],
) -> tuple[list[str], list[ProposedProfileFact]]:
    """One ``extract_facts`` call. Raises the client's errors unchanged."""
    payload = tasks.ExtractInput(message=message, date=date.isoformat(), recent_context=context)
    output = await llm.structured(
        task=tasks.EXTRACT_FACTS,
        model=model,
        instructions=EXTRACT_INSTRUCTIONS,
        payload=payload.model_dump(),
        schema=tasks.ExtractOutput,
    )
    return clean_output(output)


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
        event_id=deterministic_event_id(*parts),
        tenant=event.tenant,
        user_id=event.user_id,
        conversation_id=event.conversation_id,
        source_turn_id=memory_id,
        source_id=event.source_id,
        turn_created_at=event.created_at,
        facts=facts,
        profile=profile,
        model=event.model,
    )
