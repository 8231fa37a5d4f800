"""Reconcile worker: proposed facts become current facts, without ever destroying one.

Consumes ``engram.fact.proposed.v1`` (durable consumer ``reconcile``). Per proposal,
under a per-conversation lock (so two replicas never decide on the same conversation
at once):

1. **Replay check.** If a memory this proposal would create already exists and names
   the proposal's turn among its sources, the proposal was applied by an earlier
   delivery: its ``memory.changed`` events are published again (same event ids, so
   JetStream drops copies) and nothing else happens.
2. **Neighbourhood.** For every new fact, a retrieval Search over the current facts of
   the conversation, the user's other conversations and the tenant's ``global`` bucket
   (no threshold, no recency, no diversity: plain similarity).
3. **Decision.** One ``reconcile`` LLM call shows the neighbourhood under short integer
   ids (never uuids) and gets ADD / UPDATE / DELETE / NONE per new fact. Decisions naming
   an id that was not shown are rejected. No neighbourhood: everything is ADD, no call.
4. **Apply**, in one Upsert: new facts get deterministic ids and are skipped when a
   current fact is a near-duplicate (cosine ≥ 0.90); replaced facts keep their text and
   get ``superseded_by`` + ``valid_to``. Profile facts keep one active value per
   (user, category, key); a less confident value never replaces a more confident one.
5. ``memory.changed`` for every applied change, with deterministic event ids.

LLM failures never lose a fact: unusable output → the new facts are added (with the
near-duplicate check); LLM unavailable → retried with backoff, and on the last allowed
delivery the same ADD fallback instead of a dead letter.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc
from pydantic import Field

from engram_core.event_status import EventStatusStore
from engram_core.events import FactProposed, MemoryChanged, MemoryChangeOp, deterministic_event_id
from engram_core.logging import get_logger
from engram_core.memory import DEFAULT_CONVERSATION, ProposedProfileFact
from engram_core.memory_record import record_from_pb
from engram_core.proto import pb, to_timestamp
from engram_workers import tasks
from engram_workers.extraction import normalise_key
from engram_workers.llm import (
    LlmClient,
    LlmOutputError,
    LlmRequestError,
    LlmSettingsMixin,
    LlmUnavailable,
)
from engram_workers.locks import KeyLocks, LockSettingsMixin, LockTimeout
from engram_workers.runtime import (
    Delivery,
    RetryableError,
    Worker,
    WorkerSettings,
    WorkerSpec,
    rpc_failure,
    run_worker,
)

log = get_logger(__name__)

#: Fixed forever: changing it would give every stored fact a new id.
FACT_ID_NAMESPACE = uuid.UUID("0b7e3a56-5c2d-4f1e-8f43-7265636f6e63")

SEARCH_SCOPES = (pb.SCOPE_CONVERSATION, pb.SCOPE_USER, pb.SCOPE_GLOBAL)
LIST_PAGE_SIZE = 500

Action = Literal["ADD", "UPDATE", "DELETE", "NONE", "FALLBACK"]

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


class ReconcileSettings(WorkerSettings, LlmSettingsMixin, LockSettingsMixin):
    health_port: int = Field(
        default=8202, ge=0, le=65535, description="Port of /healthz and /readyz; 0 disables."
    )
    reconcile_model: str = Field(
        default="",
        description="Model for reconcile decisions; empty: the turn's chat model, then "
        "ENGRAM_LLM_MODEL.",
    )
    reconcile_neighbours: int = Field(
        default=10, ge=1, le=50, description="Existing facts fetched per new fact (top_k)."
    )
    near_duplicate_cosine: float = Field(
        default=0.90,
        gt=0.0,
        le=1.0,
        description="A new fact this similar to a current fact is not stored again.",
    )


@dataclass(frozen=True)
class ReconcileResources:
    settings: ReconcileSettings
    llm: LlmClient
    locks: KeyLocks
    statuses: EventStatusStore | None = None  # followed events (POST /v1/memories/add)


@asynccontextmanager
async def reconcile_resources(worker: Worker[Any]) -> AsyncIterator[ReconcileResources]:
    settings: ReconcileSettings = worker.settings  # type: ignore[assignment]
    llm = LlmClient(settings)
    try:
        async with (
            KeyLocks.from_settings(settings, settings.nats_url) as locks,
            EventStatusStore.connect(settings.nats_url) as statuses,
        ):
            yield ReconcileResources(settings=settings, llm=llm, locks=locks, statuses=statuses)
    finally:
        await llm.close()


# --- ids ---------------------------------------------------------------------------------


def normalise_text(text: str) -> str:
    """What makes two statements "the same text": case, spacing, final full stop."""
    return " ".join(text.split()).rstrip(" .!").casefold()


_WORD = re.compile(r"[^\W_][\w'-]*")
_GENERIC = frozenset({"user", "user's", "i", "i'm"})


def specifics(text: str) -> frozenset[str]:
    """Numbers and names (capitalised words after the first) in a statement.

    Sentence embeddings barely see them: "User loves painting number 1" and "... number 2"
    have a cosine above 0.9. Two statements are only near-duplicates when these agree.
    """
    found = set()
    for position, word in enumerate(_WORD.findall(text.replace("\u2019", "'"))):
        lowered = word.lower()
        if any(ch.isdigit() for ch in word):
            found.add(lowered)
        elif position > 0 and word[0].isupper() and lowered not in _GENERIC:
            found.add(lowered.removesuffix("'s"))
    return frozenset(found)


def fact_memory_id(tenant: str, conversation_id: str, text: str, reasserted_in: str = "") -> str:
    """The id of a fact: the same statement in one conversation is one memory.

    ``reasserted_in`` (a turn memory id) gives a new version of a statement that was
    true, was superseded, and is true again; the old version keeps its history.
    """
    parts = [tenant, conversation_id or DEFAULT_CONVERSATION, "fact", normalise_text(text)]
    if reasserted_in:
        parts.append(reasserted_in)
    return str(uuid.uuid5(FACT_ID_NAMESPACE, "\x1f".join(parts)))


def profile_memory_id(
    tenant: str, user_id: str, category: str, key: str, value: str, reasserted_in: str = ""
) -> str:
    parts = [tenant, user_id, "profile", category, key, normalise_text(value)]
    if reasserted_in:
        parts.append(reasserted_in)
    return str(uuid.uuid5(FACT_ID_NAMESPACE, "\x1f".join(parts)))


# --- the plan of one proposal --------------------------------------------------------------


@dataclass
class Change:
    op: MemoryChangeOp
    memory: pb.Memory
    cause: str
    related_ids: list[str]
    event_id: str


@dataclass
class Plan:
    """Everything one proposal changes: written in one Upsert, then announced."""

    writes: dict[str, pb.Memory] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    superseded: set[str] = field(default_factory=set)
    created_texts: dict[str, str] = field(default_factory=dict)  # normalised text -> id

    def create(self, memory: pb.Memory, cause: str, related: list[str]) -> None:
        self.writes[memory.id] = memory
        if memory.kind == pb.MEMORY_KIND_FACT:
            self.created_texts[normalise_text(memory.text)] = memory.id
        event_id = deterministic_event_id(memory.id, "created")
        self.changes.append(Change("created", memory, cause, related, event_id))

    def supersede(self, old: pb.Memory, new_id: str, valid_to: Any, cause: str) -> None:
        memory = pb.Memory()
        memory.CopyFrom(old)
        memory.superseded_by = new_id
        memory.valid_to.CopyFrom(valid_to)
        memory.ClearField("updated_at")
        memory.ClearField("embedding_model")
        self.writes[memory.id] = memory
        self.superseded.add(memory.id)
        event_id = deterministic_event_id(memory.id, "superseded", new_id)
        self.changes.append(Change("superseded", memory, cause, [new_id], event_id))

    def update(self, memory: pb.Memory, cause: str, event_id: str) -> None:
        self.writes[memory.id] = memory
        self.changes.append(Change("updated", memory, cause, [], event_id))


@dataclass(frozen=True)
class FactDecision:
    """What to do with one new fact, after validation of the model's decisions."""

    action: Action
    text: str
    targets: tuple[str, ...] = ()  # memory ids (UPDATE / DELETE)


class Reconciler:
    """Reconciles one proposal; the caller holds the conversation lock."""

    def __init__(
        self, event: FactProposed, delivery: Delivery, resources: ReconcileResources
    ) -> None:
        self.event = event
        self.delivery = delivery
        self.retrieval = delivery.retrieval
        self.settings = resources.settings
        self.llm = resources.llm
        self.turn_time = to_timestamp(event.turn_created_at)
        self._similar: dict[str, dict[str, float]] = {}  # normalised text -> {id: cosine}
        self._neighbours: dict[str, pb.Memory] = {}

    # -- entry point ------------------------------------------------------------------

    async def run(self) -> list[MemoryChanged]:
        replayed = await self._replay()
        if replayed is not None:
            return replayed
        plan = Plan()
        facts = list({normalise_text(f): f.strip() for f in self.event.facts}.values())
        if facts:
            await self._plan_facts(plan, facts)
        if self.event.profile:
            await self._plan_profile(plan)
        if plan.writes:
            try:
                await self.retrieval.upsert(
                    pb.UpsertRequest(tenant=self.event.tenant, memories=list(plan.writes.values()))
                )
            except grpc.aio.AioRpcError as exc:
                raise rpc_failure("retrieval Upsert", exc) from exc
        log.info(
            "reconcile.applied",
            source_turn_id=self.event.source_turn_id,
            created=sum(c.op == "created" for c in plan.changes),
            superseded=sum(c.op == "superseded" for c in plan.changes),
            updated=sum(c.op == "updated" for c in plan.changes),
        )
        return [self._announce(change) for change in plan.changes]

    def _announce(self, change: Change) -> MemoryChanged:
        memory = change.memory
        return MemoryChanged(
            event_id=change.event_id,
            tenant=self.event.tenant,
            user_id=memory.user_id,
            conversation_id=memory.conversation_id or DEFAULT_CONVERSATION,
            op=change.op,
            memory=record_from_pb(memory),
            cause=change.cause,
            related_ids=change.related_ids,
        )

    # -- retrieval calls ----------------------------------------------------------------

    async def _get(self, ids: Iterable[str]) -> dict[str, pb.Memory]:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}
        try:
            reply = await self.retrieval.get(pb.GetRequest(tenant=self.event.tenant, ids=wanted))
        except grpc.aio.AioRpcError as exc:
            raise rpc_failure("retrieval Get", exc) from exc
        return {memory.id: memory for memory in reply.memories}

    async def _similarities(self, text: str) -> dict[str, float]:
        """Current facts near ``text`` in this user's reach: {memory id: cosine}."""
        key = normalise_text(text)
        if key in self._similar:
            return self._similar[key]
        event = self.event
        try:
            reply = await self.retrieval.search(
                pb.SearchRequest(
                    tenant=event.tenant,
                    query=text,
                    user_id=event.user_id,
                    conversation_id=event.conversation_id,
                    kinds=[pb.MEMORY_KIND_FACT],
                    scopes=list(SEARCH_SCOPES),
                    top_k=self.settings.reconcile_neighbours,
                    score_threshold=0.0,
                    recency_weight=0.0,
                    mmr_lambda=1.0,
                    now=self.turn_time,
                )
            )
        except grpc.aio.AioRpcError as exc:
            raise rpc_failure("retrieval Search", exc) from exc
        found: dict[str, float] = {}
        for hit in reply.hits:
            found[hit.memory.id] = float(hit.scores.dense)
            self._neighbours.setdefault(hit.memory.id, hit.memory)
        self._similar[key] = found
        return found

    # -- replay -------------------------------------------------------------------------

    async def _replay(self) -> list[MemoryChanged] | None:
        """The announcements of an earlier delivery that applied this proposal, or None."""
        event = self.event
        turn = event.source_turn_id
        ids: list[str] = []
        for fact in event.facts:
            ids += [
                fact_memory_id(event.tenant, event.conversation_id, fact),
                fact_memory_id(event.tenant, event.conversation_id, fact, turn),
            ]
        for entry in event.profile:
            key = normalise_key(entry.key)
            ids += [
                profile_memory_id(event.tenant, event.user_id, entry.category, key, entry.value),
                profile_memory_id(
                    event.tenant, event.user_id, entry.category, key, entry.value, turn
                ),
            ]
        applied = [m for m in (await self._get(ids)).values() if turn in m.source_turn_ids]
        if not applied:
            return None
        plan = Plan()
        superseded_ids = {
            old_id: memory.id
            for memory in applied
            for old_id in filter(None, memory.metadata.get("supersedes", "").split(","))
        }
        olds = await self._get(superseded_ids)
        for memory in applied:
            plan.changes.append(
                Change(
                    "created",
                    memory,
                    _cause(memory),
                    sorted(i for i, new in superseded_ids.items() if new == memory.id),
                    deterministic_event_id(memory.id, "created"),
                )
            )
        for old_id, new_id in superseded_ids.items():
            old = olds.get(old_id)
            if old is not None and old.superseded_by == new_id:
                cause = _cause(next(m for m in applied if m.id == new_id))
                event_id = deterministic_event_id(old_id, "superseded", new_id)
                plan.changes.append(Change("superseded", old, cause, [new_id], event_id))
        log.info("reconcile.replayed", source_turn_id=turn, changes=len(plan.changes))
        return [self._announce(change) for change in plan.changes]

    # -- facts --------------------------------------------------------------------------

    async def _plan_facts(self, plan: Plan, facts: list[str]) -> None:
        similar = await asyncio.gather(*(self._similarities(fact) for fact in facts))
        best: dict[str, float] = {}
        for found in similar:
            for memory_id, cosine in found.items():
                best[memory_id] = max(cosine, best.get(memory_id, -1.0))
        # Most similar first, so a model that reads top-down sees the likely targets.
        shown = {
            n: self._neighbours[memory_id]
            for n, memory_id in enumerate(sorted(best, key=lambda i: -best[i]), start=1)
        }
        decisions = await self._decide(facts, shown)
        targets = {t for d in decisions for t in d.targets}
        current = await self._get(targets)
        for decision in decisions:
            await self._apply_fact(plan, decision, current)

    async def _decide(self, facts: list[str], shown: dict[int, pb.Memory]) -> list[FactDecision]:
        if not shown:
            return [FactDecision("ADD", fact) for fact in facts]
        model = self.settings.reconcile_model or self.event.model or self.llm.default_model
        if not model:
            log.warning("reconcile.llm_fallback", reason="no model configured")
            return [FactDecision("FALLBACK", fact) for fact in facts]
        payload = tasks.ReconcileInput(
            existing=[tasks.ExistingMemory(id=n, text=m.text) for n, m in shown.items()],
            new_facts=facts,
        )
        try:
            output = await self.llm.structured(
                task=tasks.RECONCILE,
                model=model,
                instructions=RECONCILE_INSTRUCTIONS,
                payload=payload.model_dump(),
                schema=tasks.ReconcileOutput,
            )
        except LlmUnavailable as exc:
            if self.delivery.attempt < self.settings.max_deliver:
                raise RetryableError(f"reconcile: {exc}") from exc
            # Last allowed delivery: a dead letter would strand the facts; add them.
            log.warning("reconcile.llm_fallback", reason=str(exc), final_delivery=True)
            return [FactDecision("FALLBACK", fact) for fact in facts]
        except (LlmOutputError, LlmRequestError) as exc:
            log.warning("reconcile.llm_fallback", reason=str(exc))
            return [FactDecision("FALLBACK", fact) for fact in facts]
        return resolve_decisions(facts, shown, output)

    async def _apply_fact(
        self, plan: Plan, decision: FactDecision, current: dict[str, pb.Memory]
    ) -> None:
        if decision.action == "NONE":
            log.info("reconcile.none", reason="already known")
            return
        text = decision.text
        base_id = fact_memory_id(self.event.tenant, self.event.conversation_id, text)
        targets: list[pb.Memory] = []
        for target_id in decision.targets:
            target = current.get(target_id)
            if target is None or target.superseded_by or target_id in plan.superseded:
                log.info("reconcile.target_gone", target_id=target_id)
            elif target_id == base_id or normalise_text(target.text) == normalise_text(text):
                pass  # the "new" fact is this very memory: nothing changes
            else:
                targets.append(target)
        cause = f"reconcile:{decision.action}"
        new_id = await self._duplicate_of(text, plan, exclude={t.id for t in targets})
        if new_id is not None:
            log.info("reconcile.near_duplicate", duplicate_of=new_id, action=decision.action)
        else:
            new_id = await self._fresh_fact_id(text, base_id)
            plan.create(
                self._fact_memory(new_id, text, decision, targets), cause, [t.id for t in targets]
            )
        for target in targets:
            plan.supersede(target, new_id, self.turn_time, cause)

    async def _duplicate_of(self, text: str, plan: Plan, exclude: set[str]) -> str | None:
        """A current fact (or one created by this plan) that already says ``text``."""
        key = normalise_text(text)
        if key in plan.created_texts:
            return plan.created_texts[key]
        found = await self._similarities(text)
        candidates = [
            (cosine, memory_id)
            for memory_id, cosine in found.items()
            if memory_id not in exclude
            and memory_id not in plan.superseded
            and cosine >= self.settings.near_duplicate_cosine
            and specifics(self._neighbours[memory_id].text) == specifics(text)
        ]
        return max(candidates)[1] if candidates else None

    async def _fresh_fact_id(self, text: str, base_id: str) -> str:
        stored = (await self._get([base_id])).get(base_id)
        if stored is not None and stored.superseded_by:
            # True once, replaced, true again: a new version; the old one keeps its history.
            return fact_memory_id(
                self.event.tenant, self.event.conversation_id, text, self.event.source_turn_id
            )
        return base_id

    def _fact_memory(
        self, memory_id: str, text: str, decision: FactDecision, targets: list[pb.Memory]
    ) -> pb.Memory:
        event = self.event
        metadata = {"decision": decision.action, "proposal": event.event_id}
        if targets:
            metadata["supersedes"] = ",".join(t.id for t in targets)
        return pb.Memory(
            id=memory_id,
            tenant=event.tenant,
            user_id=event.user_id,
            conversation_id=event.conversation_id,
            kind=pb.MEMORY_KIND_FACT,
            text=text,
            source_id=event.source_id,
            source_turn_ids=[event.source_turn_id],
            created_at=self.turn_time,
            valid_from=self.turn_time,
            metadata=metadata,
        )

    # -- profile ------------------------------------------------------------------------

    async def _active_profile(self) -> list[pb.Memory]:
        event = self.event
        entries: list[pb.Memory] = []
        token = ""
        while True:
            try:
                reply = await self.retrieval.list(
                    pb.ListRequest(
                        tenant=event.tenant,
                        filter=pb.MemoryFilter(
                            user_id=event.user_id, kinds=[pb.MEMORY_KIND_PROFILE]
                        ),
                        page_size=LIST_PAGE_SIZE,
                        page_token=token,
                    )
                )
            except grpc.aio.AioRpcError as exc:
                raise rpc_failure("retrieval List", exc) from exc
            # An empty user_id filters nothing; anonymous profiles are their own user.
            entries += [
                m
                for m in reply.memories
                if m.user_id == event.user_id and not m.superseded_by and m.profile.key
            ]
            token = reply.next_page_token
            if not token:
                return entries

    async def _plan_profile(self, plan: Plan) -> None:
        event = self.event
        active: dict[tuple[str, str], list[pb.Memory]] = {}
        for memory in await self._active_profile():
            active.setdefault((memory.profile.category, memory.profile.key), []).append(memory)
        for entry in event.profile:
            key = normalise_key(entry.key)
            if not key:
                continue
            entry = entry.model_copy(update={"key": key})
            slot = (entry.category, key)
            held = active.get(slot, [])
            same = [
                m for m in held if normalise_text(m.profile.value) == normalise_text(entry.value)
            ]
            if same:
                self._confirm_profile(plan, same[0], entry)
                continue
            strongest = max((_confidence(m.profile.confidence) for m in held), default=None)
            if strongest is not None and _confidence(entry.confidence) < strongest:
                log.info(
                    "profile.kept",
                    category=entry.category,
                    key=key,
                    reason="the active value has a higher confidence",
                )
                continue
            memory = await self._profile_memory(entry, held)
            plan.create(memory, "reconcile:profile", [m.id for m in held])
            for old in held:
                plan.supersede(old, memory.id, self.turn_time, "reconcile:profile")
            active[slot] = [memory]

    def _confirm_profile(self, plan: Plan, memory: pb.Memory, entry: ProposedProfileFact) -> None:
        """The active value was said again: raise its confidence if this time was surer."""
        if _confidence(entry.confidence) <= _confidence(memory.profile.confidence):
            return
        updated = pb.Memory()
        updated.CopyFrom(memory)
        updated.profile.confidence = entry.confidence
        updated.profile.importance = max(memory.profile.importance, entry.importance)
        updated.ClearField("updated_at")
        updated.ClearField("embedding_model")
        event_id = deterministic_event_id(memory.id, "updated", self.event.event_id)
        plan.update(updated, "reconcile:profile", event_id)

    async def _profile_memory(
        self, entry: ProposedProfileFact, replaces: list[pb.Memory]
    ) -> pb.Memory:
        event = self.event
        memory_id = profile_memory_id(
            event.tenant, event.user_id, entry.category, entry.key, entry.value
        )
        stored = (await self._get([memory_id])).get(memory_id)
        if stored is not None and stored.superseded_by:
            memory_id = profile_memory_id(
                event.tenant,
                event.user_id,
                entry.category,
                entry.key,
                entry.value,
                event.source_turn_id,
            )
        metadata = {"decision": "UPDATE" if replaces else "ADD", "proposal": event.event_id}
        if replaces:
            metadata["supersedes"] = ",".join(m.id for m in replaces)
        return pb.Memory(
            id=memory_id,
            tenant=event.tenant,
            user_id=event.user_id,
            conversation_id=event.conversation_id,
            kind=pb.MEMORY_KIND_PROFILE,
            text=f"{entry.category}/{entry.key}: {entry.value}",
            profile=pb.ProfileEntry(**entry.model_dump()),
            source_id=event.source_id,
            source_turn_ids=[event.source_turn_id],
            created_at=self.turn_time,
            valid_from=self.turn_time,
            metadata=metadata,
        )


def resolve_decisions(
    facts: list[str], shown: dict[int, pb.Memory], output: tasks.ReconcileOutput
) -> list[FactDecision]:
    """The model's decisions, checked: unknown facts and targets are rejected (logged),
    and a fact left without a valid decision is added (nothing is lost)."""
    by_fact: dict[int, list[tasks.Decision]] = {}
    for decision in output.decisions:
        if decision.fact >= len(facts):
            log.warning("reconcile.rejected_decision", reason="unknown fact", fact=decision.fact)
            continue
        if decision.event in ("UPDATE", "DELETE") and decision.target not in shown:
            log.warning(
                "reconcile.rejected_decision",
                reason="unknown target",
                fact=decision.fact,
                decision=decision.event,
                target=decision.target,
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
    return resolved


def _confidence(value: float) -> float:
    # Stored as float32: 0.9 comes back as 0.8999999761581421.
    return round(float(value), 4)


def _cause(memory: pb.Memory) -> str:
    if memory.kind == pb.MEMORY_KIND_PROFILE:
        return "reconcile:profile"
    return f"reconcile:{memory.metadata.get('decision', 'ADD')}"


async def reconcile_facts(event: FactProposed, delivery: Delivery) -> None:
    resources: ReconcileResources = delivery.resources
    locks = resources.locks
    try:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(locks.hold(event.tenant, event.conversation_id))
            if event.profile:
                # Profiles span the user's conversations: one more lock, always taken
                # second, so two holders can never wait on each other.
                await stack.enter_async_context(locks.hold(event.tenant, "profile", event.user_id))
            changes = await Reconciler(event, delivery, resources).run()
            # Still under the lock, so one conversation's announcements stay in order.
            for change in changes:
                await delivery.worker.publish(change)
    except LockTimeout as exc:
        raise RetryableError(f"conversation lock: {exc}") from exc
    statuses = getattr(resources, "statuses", None)
    if statuses is not None:
        try:
            await statuses.update_if_followed(event.tenant, event.event_id)
        except Exception as exc:
            raise RetryableError(f"event status: {type(exc).__name__}: {exc}") from exc


RECONCILE = WorkerSpec(
    name="reconcile", event=FactProposed, handle=reconcile_facts, resources=reconcile_resources
)


def main() -> None:
    run_worker(RECONCILE, ReconcileSettings)


if __name__ == "__main__":
    main()
