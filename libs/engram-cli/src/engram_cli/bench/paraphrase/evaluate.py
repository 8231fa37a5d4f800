"""The paraphrase set (``paraphrases.json``, Engram's own, public): one person's stored
facts and turns, natural questions that should recall them ("what pets do I have?",
"anything I can't eat?") and questions that must recall nothing ("What's the capital of
Australia?"), scored as a chat delivers recall.

Storing: every memory through ``Upsert`` for one user in four conversations, dated
``days_ago`` before a fixed now. Asking: every question through the gateway's recall
(``search_query`` + ``recall``, product defaults unless a threshold is given) from a
fifth, new conversation of the same user, so the memories come from the user's other
conversations, as in a person's next chat.

Recall-or-nothing, per question: *recalled* when the memory message holds hits; a hit
is *right* when it is one of the question's expected memories.

- precision: of the questions that recalled something, those whose hits hold an
  expected memory (a question of the "nothing" list that recalls anything counts
  against it);
- recall: of the questions with expected memories, those whose hits hold one;
- coverage: the mean fraction of a question's expected memories among its hits (a
  category question, "who's in my family?", wants them all);
- nothing rate: of the "nothing" questions, those answered with no hit.

The set's ``holdout_questions`` and ``holdout_nothing`` were written after the decision
was calibrated on the others: :func:`scores` of the answers whose ``holdout`` is true is
the held-out check.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

from engram_cli.records import new_memory
from engram_core.memory_port import MemoryPort
from engram_gateway.controls import MemoryControls
from engram_gateway.recall import recall, search_query
from engram_gateway.settings import GatewaySettings

TENANT = "paraphrase"
USER = "sam"
ASKED_FROM = "c-new"
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class ParaphraseSet:
    memories: list[dict[str, Any]]
    questions: list[dict[str, Any]]
    nothing: list[str]
    holdout_questions: list[dict[str, Any]] = field(default_factory=list)
    holdout_nothing: list[str] = field(default_factory=list)


def load_set() -> ParaphraseSet:
    raw = json.loads(
        resources.files("engram_cli.bench.paraphrase")
        .joinpath("paraphrases.json")
        .read_text("utf-8")
    )
    return ParaphraseSet(
        raw["memories"],
        raw["questions"],
        raw["nothing"],
        raw.get("holdout_questions", []),
        raw.get("holdout_nothing", []),
    )


async def store(memories: MemoryPort, data: ParaphraseSet) -> dict[str, str]:
    """Upsert the memories; returns memory id → key."""
    records = [
        new_memory(
            TENANT,
            kind=m["kind"],
            role=m.get("role", ""),
            text=m["text"],
            user_id=USER,
            conversation_id=m["conversation"],
            source_id=f"paraphrase-{m['key']}",
            turn_index=i,
            created_at=NOW - timedelta(days=m["days_ago"]),
        )
        for i, m in enumerate(data.memories)
    ]
    stored = await memories.upsert(TENANT, records)
    return {s.record.id: m["key"] for s, m in zip(stored, data.memories, strict=True)}


@dataclass(frozen=True)
class Answer:
    question: str
    expected: frozenset[str]
    recalled: frozenset[str]  # keys of the injected hits
    outcome: str
    holdout: bool = False


async def ask(
    memories: MemoryPort, question: str, key_of: dict[str, str], threshold: float | None
) -> tuple[frozenset[str], str]:
    controls = MemoryControls(memory_id=ASKED_FROM).with_defaults(GatewaySettings())
    if threshold is not None:
        controls = controls.model_copy(update={"memory_score_threshold": threshold})
    query = search_query(tenant=TENANT, query=question, user_id=USER, controls=controls)
    query = replace(query, now=NOW)
    messages = [{"role": "user", "content": question}]
    memory = await recall(memories, query, messages=messages, now=NOW)
    if memory.status.value == "unavailable":
        raise RuntimeError("retrieval failed while asking the paraphrase set")
    return frozenset(key_of.get(h["id"], "?") for h in memory.hits), memory.outcome


async def answer_all(
    memories: MemoryPort,
    data: ParaphraseSet,
    key_of: dict[str, str],
    threshold: float | None = None,
) -> list[Answer]:
    answers = []
    asked = [(q["q"], frozenset(q["expect"]), False) for q in data.questions]
    asked += [(q, frozenset(), False) for q in data.nothing]
    asked += [(q["q"], frozenset(q["expect"]), True) for q in data.holdout_questions]
    asked += [(q, frozenset(), True) for q in data.holdout_nothing]
    for question, expected, holdout in asked:
        recalled, outcome = await ask(memories, question, key_of, threshold)
        answers.append(Answer(question, expected, recalled, outcome, holdout))
    return answers


def scores(answers: list[Answer]) -> dict[str, float]:
    positives = [a for a in answers if a.expected]
    negatives = [a for a in answers if not a.expected]
    recalled = [a for a in answers if a.recalled]
    right = [a for a in positives if a.recalled & a.expected]
    return {
        "questions": len(positives),
        "nothing_questions": len(negatives),
        "precision": round(len(right) / len(recalled), 4) if recalled else 0.0,
        "recall": round(len(right) / len(positives), 4) if positives else 0.0,
        "coverage": round(
            statistics.fmean(len(a.recalled & a.expected) / len(a.expected) for a in positives),
            4,
        )
        if positives
        else 0.0,
        "nothing_rate": round(sum(not a.recalled for a in negatives) / len(negatives), 4)
        if negatives
        else 0.0,
        "hits_p50": float(statistics.median(len(a.recalled) for a in answers)) if answers else 0.0,
    }
