"""The LLM tasks of the write path: their names and their input/output schemas.

Each task is one ``LlmClient.structured`` call: the system message is
``engram-task: <TASK>`` plus the task's instructions, the user message is the input
model as JSON, and the answer must validate against the output model. Keeping the
schemas here, apart from the prompts' wording, lets tests script a model by task.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engram_core.memory import ProposedProfileFact

EXTRACT_FACTS = "extract_facts"
RECONCILE = "reconcile"
SUMMARIZE = "summarize"
EPISODE = "episode"


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
    facts: list[str] = Field(default_factory=list, max_length=3)
    profile: list[ProposedProfileFact] = Field(default_factory=list)


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


# --- summarize: rolling conversation summary -------------------------------------------


class SummarizeInput(_Model):
    previous_summary: str
    new_facts: list[str]


class SummaryOutput(_Model):
    summary: str


# --- episode: a window of turns -> one episode summary ----------------------------------


class EpisodeTurn(_Model):
    n: int
    role: str
    text: str


class EpisodeInput(_Model):
    first_turn: int
    last_turn: int
    turns: list[EpisodeTurn]
