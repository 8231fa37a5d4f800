"""What the workers ask a model: each task's instructions beside its input and output
schemas, one :class:`~engram_workers.llm.LlmTask` per task.

Every task is asked the same way (:class:`~engram_workers.llm.AskLlm`): the system
message is ``engram-task: <name>`` plus the instructions, the user message is the input
model as JSON, and the answer must validate against the output model. The names are
what tests and ``engram scripted-llm`` script a model by.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engram_core.memory import ProposedProfileFact
from engram_workers.llm import LlmTask


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --- extract_facts: one user message -> 0-3 facts + profile facts ----------------------


class ExtractInput(_Model):
    message: str
    date: str = Field(description="When the message was sent (ISO 8601).")
    recent_context: list[str] = Field(
        default_factory=list, description="A few earlier messages, for pronouns only."
    )


class ExtractOutput(_Model):
    """What small models overdo costs only that part: the schema asks for 3 facts and
    the cleaning keeps 3, so a fourth does not void the answer; a profile entry that
    does not validate (an unknown category, a confidence of 95) is dropped, and its
    fields the schema does not name are ignored, so the facts beside it still count."""

    facts: list[str] = Field(default_factory=list, json_schema_extra={"maxItems": 3})
    profile: list[ProposedProfileFact] = Field(default_factory=list)

    @field_validator("profile", mode="before")
    @classmethod
    def _valid_entries(cls, entries: Any) -> Any:
        """Profile entries that validate, of those shaped like one (anything else is
        left for validation to refuse: a whole answer is no profile entry)."""
        if not isinstance(entries, list):
            return entries
        fields = ProposedProfileFact.model_fields
        kept: list[Any] = []
        for entry in entries:
            if not isinstance(entry, dict) or not {"category", "key", "value"} <= entry.keys():
                kept.append(entry)
                continue
            try:
                kept.append(
                    ProposedProfileFact.model_validate(
                        {k: v for k, v in entry.items() if k in fields}
                    )
                )
            except ValidationError:
                continue
        return kept


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


EXTRACT_FACTS = LlmTask(
    "extract_facts", EXTRACT_INSTRUCTIONS, ExtractInput, ExtractOutput, "ENGRAM_EXTRACTION_MODEL"
)


# --- reconcile: new facts vs. the existing neighbourhood -------------------------------


class ExistingMemory(_Model):
    id: int = Field(description="Short id, only meaningful inside this prompt.")
    text: str


class ReconcileInput(_Model):
    existing: list[ExistingMemory]
    new_facts: list[str]


class Decision(_Model):
    fact: int = Field(ge=0, description="Index into new_facts.")
    event: Literal["ADD", "UPDATE", "DELETE", "NONE"]
    target: int | None = Field(
        default=None, description="Existing memory id (required for UPDATE and DELETE)."
    )
    text: str | None = Field(
        default=None, description="Resulting fact text for ADD/UPDATE (default: the new fact)."
    )


class ReconcileOutput(_Model):
    decisions: list[Decision] = Field(default_factory=list)


RECONCILE_INSTRUCTIONS = """\
You keep a user's long-term memory consistent.

Input (JSON): "existing" lists facts already stored about the user, each with a short
integer "id"; "new_facts" lists facts just learned from the user's latest message.

For EACH new fact (its index in new_facts, starting at 0) return one decision:
- "ADD": new information that no existing fact covers.
- "UPDATE": the new fact corrects, refines or changes an existing fact about the same
  thing (a corrected name, a new job, a more precise detail). "target" is that fact's
  id; "text" is the complete up-to-date fact, keeping details of the old one that still
  hold.
- "DELETE": the new fact contradicts an existing fact, which is no longer true ("User
  hates pizza" against "User loves pizza"). "target" is the contradicted fact's id.
  The new fact itself is kept.
- "NONE": an existing fact already says the same thing, possibly in other words.
  "target" is that fact's id.

Rules:
- "target" must be one of the ids in "existing"; never invent an id.
- Facts about different things do not affect each other: a new job does not contradict
  a favourite food.
- A new fact that corrects or contradicts several existing facts may get one decision
  per target.
- When unsure whether something is already known, answer "ADD".

Answer with one JSON object, for example:
{"decisions": [{"fact": 0, "event": "UPDATE", "target": 2, "text": "User's wife is named
Anne"}, {"fact": 1, "event": "ADD"}]}
"""


RECONCILE = LlmTask(
    "reconcile", RECONCILE_INSTRUCTIONS, ReconcileInput, ReconcileOutput, "ENGRAM_RECONCILE_MODEL"
)


# --- summarize: rolling conversation summary -------------------------------------------


class SummarizeInput(_Model):
    previous_summary: str
    new_facts: list[str]


class SummaryOutput(_Model):
    summary: str


SUMMARY_INSTRUCTIONS = """\
You maintain the rolling summary of one conversation between a user and an assistant.
The input has `previous_summary` (may be empty) and `new_facts`: statements just learned.
Write the updated summary:
- keep durable information: who the user is, preferences, constraints, plans, decisions,
  ongoing tasks, names, dates and numbers;
- drop chit-chat, greetings and pleasantries;
- when a new fact contradicts or updates something in the previous summary, keep only the
  new information and drop the superseded one;
- never invent anything; write in the third person ("The user ...");
- stay compact: at most {max_chars} characters.
Answer with one JSON object: {{"summary": "<the updated summary>"}}."""


#: Parameters: ``max_chars``.
SUMMARIZE = LlmTask(
    "summarize", SUMMARY_INSTRUCTIONS, SummarizeInput, SummaryOutput, "ENGRAM_SUMMARIZE_MODEL"
)


# --- episode: a window of turns -> one episode summary ----------------------------------


class EpisodeTurn(_Model):
    n: int
    role: str
    text: str


class EpisodeInput(_Model):
    first_turn: int
    last_turn: int
    turns: list[EpisodeTurn]


EPISODE_INSTRUCTIONS = """\
Summarise one window of a conversation between a user and an assistant: turns
{first_turn} to {last_turn}, each with its number `n`, `role` and `text`.
Write one compact paragraph that keeps what matters later: what the user said about
themselves, asked, decided or planned; what the assistant answered or recommended; names,
dates and numbers. Skip greetings and chit-chat. Never invent anything.
At most {max_chars} characters.
Answer with one JSON object: {{"summary": "<the episode summary>"}}."""


#: Parameters: ``first_turn``, ``last_turn``, ``max_chars``.
EPISODE = LlmTask(
    "episode", EPISODE_INSTRUCTIONS, EpisodeInput, SummaryOutput, "ENGRAM_SUMMARIZE_MODEL"
)
