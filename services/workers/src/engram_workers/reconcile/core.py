"""Reconcile's decisions, as pure functions: a proposal and its neighbourhood in, a plan out.

No I/O here: the wiring (:mod:`engram_workers.reconcile.app`) gathers what these need
(similar current facts, the model's decisions, stored records), calls them, and writes
the plan through :mod:`engram_core.memory_writes`. Every rule of the worker lives here
and is unit-tested without NATS, retrieval or a model:

- **decisions** (:func:`decide`, the one step that asks the model, through the
  :class:`~engram_workers.llm.Ask` it is given): the model sees existing facts under
  short integer ids; decisions naming an id that was not shown, or a fact that was not
  proposed, are rejected; a fact left without a valid decision is added (nothing is
  lost); ``NONE`` keeps what is stored. A model that fails: every fact is added.
- **facts**: a new fact gets a deterministic id (tenant, user, conversation, text) and is
  not stored again when a current fact is a near-duplicate (the same text, or cosine ≥
  the setting and the same names and numbers: :mod:`engram_core.near_duplicates`);
  UPDATE/DELETE targets are superseded by it (kept as history, their source turns
  marked corrected); a statement that was true, was replaced, and is
  true again gets a new version (its id includes the turn).
- **profile**: one active value per (user, category, key); a less confident value never
  replaces a more confident one; the same value said more surely raises the confidence.
- **replay**: a proposal applied by an earlier delivery is announced again, unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from engram_core import lifecycle
from engram_core.events import FactProposed
from engram_core.ids import fact_memory_id, profile_memory_id
from engram_core.memory import MemoryRecord, ProposedProfileFact
from engram_core.memory_writes import Change
from engram_core.near_duplicates import is_near_duplicate, normalise_text
from engram_workers import prompts
from engram_workers.extraction import normalise_key
from engram_workers.llm import Ask, FellBack

Action = Literal["ADD", "UPDATE", "DELETE", "NONE", "FALLBACK"]
PROFILE_CAUSE = "reconcile:profile"

# --- what counts as the same statement: engram_core.near_duplicates ---------------------


def confidence(value: float) -> float:
    # Stored as float32: 0.9 comes back as 0.8999999761581421.
    return round(float(value), 4)


# --- the plan of one proposal ---------------------------------------------------------------


@dataclass(frozen=True)
class Correction:
    """A memory that no longer holds, and the one that replaced it."""

    outdated: MemoryRecord
    by: str


@dataclass
class Plan:
    """Everything one proposal changes: written in one Upsert, then announced."""

    changes: list[Change] = field(default_factory=list)
    corrections: list[Correction] = field(default_factory=list)
    superseded: set[str] = field(default_factory=set)
    created_texts: dict[str, str] = field(default_factory=dict)  # normalised text -> id

    def create(self, memory: MemoryRecord, cause: str, related: Iterable[str] = ()) -> None:
        if memory.kind == "fact":
            self.created_texts[normalise_text(memory.text)] = memory.id
        self.changes.append(Change(memory, "created", cause, tuple(related)))

    def supersede(self, old: MemoryRecord, new_id: str, at: datetime, cause: str) -> None:
        self.superseded.add(old.id)
        self.changes.append(
            Change(lifecycle.superseded(old, by=new_id, at=at), "superseded", cause, (new_id,))
        )
        self.corrections.append(Correction(old, new_id))

    def update(self, memory: MemoryRecord, cause: str) -> None:
        self.changes.append(Change(memory, "updated", cause))

    def count(self, op: str) -> int:
        return sum(c.op == op for c in self.changes)


@dataclass(frozen=True)
class FactDecision:
    """What to do with one new fact, after validation of the model's decisions."""

    action: Action
    text: str
    targets: tuple[str, ...] = ()  # memory ids (UPDATE / DELETE)


# --- the neighbourhood and the model's decisions -------------------------------------------


def numbered_neighbourhood(
    similar: Iterable[Mapping[str, float]], neighbours: Mapping[str, MemoryRecord]
) -> dict[int, MemoryRecord]:
    """The existing facts to show the model, most similar first, under ids 1, 2, ...
    (a model that reads top-down sees the likely targets first)."""
    best: dict[str, float] = {}
    for found in similar:
        for memory_id, cosine in found.items():
            best[memory_id] = max(cosine, best.get(memory_id, -1.0))
    ranked = sorted(best, key=lambda i: -best[i])
    return {n: neighbours[memory_id] for n, memory_id in enumerate(ranked, start=1)}


def reconcile_input(facts: list[str], shown: Mapping[int, MemoryRecord]) -> prompts.ReconcileInput:
    return prompts.ReconcileInput(
        existing=[prompts.ExistingMemory(id=n, text=m.text) for n, m in shown.items()],
        new_facts=facts,
    )


@dataclass(frozen=True)
class Rejected:
    """A decision of the model that was not applied, and why."""

    reason: str
    fact: int
    event: str = ""
    target: int | None = None


def resolve_decisions(
    facts: list[str], shown: Mapping[int, MemoryRecord], output: prompts.ReconcileOutput
) -> tuple[list[FactDecision], list[Rejected]]:
    """The model's decisions, checked: unknown facts and targets are rejected, and a fact
    left without a valid decision is added (nothing is lost)."""
    rejected: list[Rejected] = []
    by_fact: dict[int, list[prompts.Decision]] = {}
    for decision in output.decisions:
        if decision.fact >= len(facts):
            rejected.append(Rejected("unknown fact", decision.fact))
            continue
        if decision.event in ("UPDATE", "DELETE") and decision.target not in shown:
            rejected.append(
                Rejected("unknown target", decision.fact, decision.event, decision.target)
            )
            continue
        by_fact.setdefault(decision.fact, []).append(decision)
    resolved = []
    for index, fact in enumerate(facts):
        valid = by_fact.get(index, [])
        events = {d.event for d in valid}
        if events == {"NONE"}:
            resolved.append(FactDecision("NONE", fact))
            continue
        action: Action = (
            "UPDATE" if "UPDATE" in events else "DELETE" if "DELETE" in events else "ADD"
        )
        text = next(
            (
                " ".join(d.text.split())
                for d in valid
                if d.event in ("ADD", "UPDATE") and d.text and d.text.strip()
            ),
            fact,
        )
        targets = tuple(
            dict.fromkeys(
                shown[d.target].id
                for d in valid
                if d.event in ("UPDATE", "DELETE") and d.target is not None
            )
        )
        resolved.append(FactDecision(action, text, targets))
    return resolved, rejected


@dataclass(frozen=True)
class Decided:
    """The decisions for a proposal's facts, what was rejected, and why the fallback
    applied (empty when the model decided)."""

    decisions: list[FactDecision]
    rejected: list[Rejected] = field(default_factory=list)
    fallback: str = ""


async def decide(facts: list[str], shown: Mapping[int, MemoryRecord], ask: Ask) -> Decided:
    """Ask the model what each new fact does to the facts ``shown``; nothing shown is
    all ADD (no call). The fallback adds every fact, subject to the near-duplicate
    check of :func:`plan_facts`, so a model that fails loses nothing."""
    if not shown:
        return Decided([FactDecision("ADD", fact) for fact in facts])
    answer = await ask(prompts.RECONCILE, reconcile_input(facts, shown))
    if isinstance(answer, FellBack):
        return Decided([FactDecision("FALLBACK", fact) for fact in facts], fallback=answer.reason)
    decisions, rejected = resolve_decisions(facts, shown, answer.output)
    return Decided(decisions, rejected)


def proposed_facts(proposal: FactProposed) -> list[str]:
    """The proposal's facts, each once (by normalised text), trimmed."""
    return list({normalise_text(f): f.strip() for f in proposal.facts}.values())


# --- facts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FactContext:
    """What planning the facts reads, gathered beforehand."""

    proposal: FactProposed
    #: normalised text -> {current fact id: cosine}, for every proposed and decided text
    similar: Mapping[str, Mapping[str, float]]
    #: every current fact that appeared in a similarity search, by id
    neighbours: Mapping[str, MemoryRecord]
    #: stored records of the decisions' targets and of the candidate ids of new facts
    stored: Mapping[str, MemoryRecord]
    near_duplicate_cosine: float


def base_fact_id(proposal: FactProposed, text: str) -> str:
    return fact_memory_id(proposal.tenant, proposal.user_id, proposal.conversation_id, text)


def candidate_ids(proposal: FactProposed, decisions: Iterable[FactDecision]) -> set[str]:
    """The stored records planning needs: targets, and the ids new facts would take."""
    ids: set[str] = set()
    for decision in decisions:
        ids.update(decision.targets)
        if decision.action != "NONE":
            ids.add(base_fact_id(proposal, decision.text))
    return ids


def plan_facts(plan: Plan, decisions: Iterable[FactDecision], ctx: FactContext) -> None:
    for decision in decisions:
        if decision.action != "NONE":
            _apply_fact(plan, decision, ctx)


def _apply_fact(plan: Plan, decision: FactDecision, ctx: FactContext) -> None:
    proposal, text = ctx.proposal, decision.text
    base_id = base_fact_id(proposal, text)
    targets: list[MemoryRecord] = []
    for target_id in decision.targets:
        target = ctx.stored.get(target_id)
        if target is None or target.superseded_by or target_id in plan.superseded:
            continue  # gone, or replaced meanwhile
        if target_id == base_id or normalise_text(target.text) == normalise_text(text):
            continue  # the "new" fact is this very memory: nothing changes
        targets.append(target)
    cause = f"reconcile:{decision.action}"
    new_id = duplicate_of(text, plan, ctx, exclude={t.id for t in targets})
    if new_id is None:
        stored = ctx.stored.get(base_id)
        if stored is not None and stored.superseded_by:
            # True once, replaced, true again: a new version; the old one keeps its history.
            new_id = fact_memory_id(
                proposal.tenant,
                proposal.user_id,
                proposal.conversation_id,
                text,
                proposal.source_turn_id,
            )
        else:
            new_id = base_id
        record = fact_record(new_id, text, decision, targets, proposal)
        plan.create(record, cause, (t.id for t in targets))
    for target in targets:
        plan.supersede(target, new_id, proposal.turn_created_at, cause)


def duplicate_of(text: str, plan: Plan, ctx: FactContext, exclude: set[str]) -> str | None:
    """A current fact (or one this plan creates) that already says ``text``."""
    key = normalise_text(text)
    if key in plan.created_texts:
        return plan.created_texts[key]
    candidates = [
        (cosine, memory_id)
        for memory_id, cosine in ctx.similar.get(key, {}).items()
        if memory_id not in exclude
        and memory_id not in plan.superseded
        and is_near_duplicate(
            text, ctx.neighbours[memory_id].text, cosine, ctx.near_duplicate_cosine
        )
    ]
    return max(candidates)[1] if candidates else None


def learned_record(
    proposal: FactProposed,
    memory_id: str,
    decision: str,
    replaces: Iterable[MemoryRecord],
    **content: object,
) -> MemoryRecord:
    """A memory learned from the proposal's turn: owned by its user and conversation,
    dated when the turn was said, naming the turn it came from and what it replaces."""
    metadata = {"decision": decision, "proposal": proposal.event_id}
    if proposal.model:
        # the turn's chat model, as ingest records it on the turn: summarize asks it when
        # no task model is set, without reading the source turns again
        metadata["model"] = proposal.model
    replaced = [m.id for m in replaces]
    if replaced:
        metadata["supersedes"] = ",".join(replaced)
    return MemoryRecord.model_validate(
        {
            "id": memory_id,
            "user_id": proposal.user_id,
            "conversation_id": proposal.conversation_id,
            "source_id": proposal.source_id,
            "source_turn_ids": [proposal.source_turn_id],
            "created_at": proposal.turn_created_at,
            "valid_from": proposal.turn_created_at,
            "metadata": metadata,
            **content,
        }
    )


def fact_record(
    memory_id: str,
    text: str,
    decision: FactDecision,
    targets: list[MemoryRecord],
    proposal: FactProposed,
) -> MemoryRecord:
    return learned_record(proposal, memory_id, decision.action, targets, kind="fact", text=text)


# --- profile --------------------------------------------------------------------------------


def profile_slots(active: Iterable[MemoryRecord]) -> dict[tuple[str, str], list[MemoryRecord]]:
    slots: dict[tuple[str, str], list[MemoryRecord]] = {}
    for memory in active:
        if memory.profile is not None:
            slots.setdefault((memory.profile.category, memory.profile.key), []).append(memory)
    return slots


def profile_candidate_ids(proposal: FactProposed) -> set[str]:
    """The ids new profile entries would take (stored ones may be superseded)."""
    return {
        profile_memory_id(
            proposal.tenant,
            proposal.user_id,
            entry.category,
            normalise_key(entry.key),
            entry.value,
        )
        for entry in proposal.profile
        if normalise_key(entry.key)
    }


def plan_profile(
    plan: Plan,
    proposal: FactProposed,
    active: Iterable[MemoryRecord],
    stored: Mapping[str, MemoryRecord],
) -> list[str]:
    """Plan the proposal's profile entries; returns why entries were kept as they were."""
    kept: list[str] = []
    slots = profile_slots(active)
    for entry in proposal.profile:
        key = normalise_key(entry.key)
        if not key:
            continue
        entry = entry.model_copy(update={"key": key})
        slot = (entry.category, key)
        held = slots.get(slot, [])
        same = [
            m
            for m in held
            if m.profile is not None
            and normalise_text(m.profile.value) == normalise_text(entry.value)
        ]
        if same:
            confirmed = confirmed_profile(same[0], entry)
            if confirmed is not None:
                plan.update(confirmed, PROFILE_CAUSE)
            continue
        strongest = max(
            (confidence(m.profile.confidence) for m in held if m.profile is not None),
            default=None,
        )
        if strongest is not None and confidence(entry.confidence) < strongest:
            kept.append(f"{entry.category}/{key}: the active value has a higher confidence")
            continue
        memory = profile_record(proposal, entry, held, stored)
        plan.create(memory, PROFILE_CAUSE, (m.id for m in held))
        for old in held:
            plan.supersede(old, memory.id, proposal.turn_created_at, PROFILE_CAUSE)
        slots[slot] = [memory]
    return kept


def confirmed_profile(memory: MemoryRecord, entry: ProposedProfileFact) -> MemoryRecord | None:
    """The active value said again: its confidence raised if this time was surer."""
    assert memory.profile is not None
    if confidence(entry.confidence) <= confidence(memory.profile.confidence):
        return None
    profile = memory.profile.model_copy(
        update={
            "confidence": entry.confidence,
            "importance": max(memory.profile.importance, entry.importance),
        }
    )
    return memory.model_copy(update={"profile": profile, "updated_at": None})


def profile_record(
    proposal: FactProposed,
    entry: ProposedProfileFact,
    replaces: list[MemoryRecord],
    stored: Mapping[str, MemoryRecord],
) -> MemoryRecord:
    args = (proposal.tenant, proposal.user_id, entry.category, entry.key, entry.value)
    memory_id = profile_memory_id(*args)
    previous = stored.get(memory_id)
    if previous is not None and previous.superseded_by:
        memory_id = profile_memory_id(*args, proposal.source_turn_id)
    return learned_record(
        proposal,
        memory_id,
        "UPDATE" if replaces else "ADD",
        replaces,
        kind="profile",
        text=f"{entry.category}/{entry.key}: {entry.value}",
        profile=entry,
    )


# --- replay ---------------------------------------------------------------------------------


def replay_ids(proposal: FactProposed) -> list[str]:
    """Every id this proposal could have created (for the replay check)."""
    turn = proposal.source_turn_id
    ids: list[str] = []
    for fact in proposal.facts:
        ids += [
            base_fact_id(proposal, fact),
            fact_memory_id(proposal.tenant, proposal.user_id, proposal.conversation_id, fact, turn),
        ]
    for entry in proposal.profile:
        key = normalise_key(entry.key)
        args = (proposal.tenant, proposal.user_id, entry.category, key, entry.value)
        ids += [profile_memory_id(*args), profile_memory_id(*args, turn)]
    return ids


def applied_by(proposal: FactProposed, stored: Iterable[MemoryRecord]) -> list[MemoryRecord]:
    """The stored memories an earlier delivery of this proposal created."""
    return [m for m in stored if proposal.source_turn_id in m.source_turn_ids]


def superseded_ids(applied: Iterable[MemoryRecord]) -> dict[str, str]:
    """old id -> the applied memory that superseded it."""
    return {
        old_id: memory.id
        for memory in applied
        for old_id in filter(None, memory.metadata.get("supersedes", "").split(","))
    }


def replay_plan(applied: list[MemoryRecord], olds: Mapping[str, MemoryRecord]) -> Plan:
    """The announcements of an earlier delivery, rebuilt from what it stored."""
    plan = Plan()
    replaced = superseded_ids(applied)
    for memory in applied:
        related = sorted(i for i, new in replaced.items() if new == memory.id)
        plan.changes.append(Change(memory, "created", change_cause(memory), tuple(related)))
    for old_id, new_id in replaced.items():
        old = olds.get(old_id)
        if old is not None and old.superseded_by == new_id:
            cause = change_cause(next(m for m in applied if m.id == new_id))
            plan.changes.append(Change(old, "superseded", cause, (new_id,)))
    return plan


def change_cause(memory: MemoryRecord) -> str:
    if memory.kind == "profile":
        return PROFILE_CAUSE
    return f"reconcile:{memory.metadata.get('decision', 'ADD')}"
