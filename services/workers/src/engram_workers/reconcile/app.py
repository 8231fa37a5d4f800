"""Reconcile worker: proposed facts become current facts, without ever destroying one.

Consumes ``engram.fact.proposed.v1`` (durable consumer ``reconcile``). Per proposal,
under a lock on the user's conversation (and on the user's profile when it has profile
entries), so two replicas never decide on the same facts at once:

1. **Replay check.** If a memory this proposal would create already exists and names
   the proposal's turn among its sources, an earlier delivery applied it: its
   announcements are published again (same event ids, JetStream drops copies).
2. **Neighbourhood.** For every new fact, a retrieval Search over the user's current
   facts (this conversation, their other conversations, the tenant-wide bucket; no
   threshold, no recency, no diversity: plain similarity).
3. **Decision.** One ``reconcile`` LLM call shows the neighbourhood under short integer
   ids and gets ADD / UPDATE / DELETE / NONE per new fact. No neighbourhood: everything
   is ADD, no call.
4. **Plan** (:mod:`engram_workers.reconcile.core`, pure) and **apply** in one Upsert;
   the turns a superseded fact came from are marked corrected
   (:func:`engram_core.memory_writes.correct_turns`).
5. ``memory.changed`` for every applied change (:mod:`engram_core.lifecycle` ids).

LLM failures never lose a fact (the one policy of :mod:`engram_workers.llm`): no model or
unusable output → the new facts are added (with the near-duplicate check); LLM
unavailable → retried by time, and on the last allowed delivery the same ADD fallback
instead of a dead letter; a refused request → a dead letter, replayed once fixed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from pydantic import Field

from engram_core.event_status import EventStatusStore, record_status
from engram_core.events import FactProposed, MemoryChanged
from engram_core.logging import get_logger
from engram_core.memory import MemoryFilter, MemoryRecord
from engram_core.memory_port import MemoryPort
from engram_core.memory_writes import apply, correct_turns
from engram_core.near_duplicates import (
    NearDuplicateSettingsMixin,
    normalise_text,
    similar_facts_query,
)
from engram_core.worker_catalog import worker_entry
from engram_workers.llm import AskLlm, LlmClient, LlmSettingsMixin
from engram_workers.locks import KeyLocks, LockSettingsMixin, LockTimeout
from engram_workers.reconcile import core
from engram_workers.runtime import (
    Delivery,
    RetryableError,
    Worker,
    WorkerSettings,
    WorkerSpec,
    run_worker,
)

log = get_logger(__name__)


class ReconcileSettings(
    WorkerSettings, LlmSettingsMixin, LockSettingsMixin, NearDuplicateSettingsMixin
):
    health_port: int = Field(
        default=worker_entry("reconcile").health_port,
        ge=0,
        le=65535,
        description="Port of /healthz and /readyz; 0 disables.",
    )
    reconcile_model: str = Field(
        default="",
        description="Model for reconcile decisions; empty: ENGRAM_LLM_MODEL, then the "
        "turn's chat model.",
    )
    reconcile_neighbours: int = Field(
        default=10, ge=1, le=50, description="Existing facts fetched per new fact (top_k)."
    )


@dataclass(frozen=True)
class ReconcileResources:
    settings: ReconcileSettings
    llm: LlmClient
    locks: KeyLocks
    statuses: EventStatusStore | None = None  # followed events (POST /v1/memories/add)


ReconcileDelivery = Delivery[ReconcileSettings, ReconcileResources]


@asynccontextmanager
async def reconcile_resources(
    worker: Worker[FactProposed, ReconcileSettings, ReconcileResources],
) -> AsyncIterator[ReconcileResources]:
    settings = worker.settings
    llm = LlmClient(settings)
    try:
        async with (
            KeyLocks.from_settings(settings, settings.nats_url) as locks,
            EventStatusStore.connect(
                settings.nats_url, replicas=settings.stream_replicas
            ) as statuses,
        ):
            yield ReconcileResources(settings=settings, llm=llm, locks=locks, statuses=statuses)
    finally:
        await llm.close()


class Neighbourhood:
    """Current facts similar to a text, in this user's reach (memoised per text)."""

    def __init__(self, memories: MemoryPort, proposal: FactProposed, top_k: int) -> None:
        self.memories = memories
        self.proposal = proposal
        self.top_k = top_k
        self.similar: dict[str, dict[str, float]] = {}  # normalised text -> {id: cosine}
        self.records: dict[str, MemoryRecord] = {}

    async def search(self, text: str) -> dict[str, float]:
        key = normalise_text(text)
        if key not in self.similar:
            p = self.proposal
            result = await self.memories.search(
                similar_facts_query(
                    p.tenant,
                    text,
                    user_id=p.user_id,
                    conversation_id=p.conversation_id,
                    top_k=self.top_k,
                    now=p.turn_created_at,
                )
            )
            self.similar[key] = {hit.memory.id: hit.scores.dense for hit in result.hits}
            for hit in result.hits:
                self.records.setdefault(hit.memory.id, hit.memory)
        return self.similar[key]


class Reconciler:
    """Reconciles one proposal; the caller holds the locks."""

    def __init__(
        self, proposal: FactProposed, delivery: ReconcileDelivery, resources: ReconcileResources
    ) -> None:
        self.proposal = proposal
        self.delivery = delivery
        self.memories = delivery.memories
        self.settings = resources.settings
        self.llm = resources.llm
        self.neighbourhood = Neighbourhood(
            self.memories, proposal, self.settings.reconcile_neighbours
        )
        #: Why the decisions were the fallback's (every fact added), when they were.
        self.fallback = ""

    async def run(self) -> list[MemoryChanged]:
        tenant = self.proposal.tenant
        replayed = await self._replayed_plan()
        plan = replayed if replayed is not None else await self._plan()
        events = await apply(self.memories, tenant, plan.changes) if plan.changes else []
        for correction in plan.corrections:
            events += await correct_turns(
                self.memories,
                tenant,
                [correction.outdated],
                by=correction.by,
                at=self.proposal.turn_created_at,
                cause="reconcile",
            )
        log.info(
            "reconcile.replayed" if replayed is not None else "reconcile.applied",
            source_turn_id=self.proposal.source_turn_id,
            created=plan.count("created"),
            superseded=plan.count("superseded"),
            updated=plan.count("updated"),
            turns_corrected=len(events) - len(plan.changes),
        )
        return events

    async def _replayed_plan(self) -> core.Plan | None:
        stored = await self.memories.get(self.proposal.tenant, core.replay_ids(self.proposal))
        applied = core.applied_by(self.proposal, stored.values())
        if not applied:
            return None
        olds = await self.memories.get(self.proposal.tenant, core.superseded_ids(applied))
        plan = core.replay_plan(applied, olds)
        plan.corrections = [
            core.Correction(old, old.superseded_by) for old in olds.values() if old.superseded_by
        ]
        return plan

    async def _plan(self) -> core.Plan:
        plan = core.Plan()
        facts = core.proposed_facts(self.proposal)
        if facts:
            await self._plan_facts(plan, facts)
        if self.proposal.profile:
            await self._plan_profile(plan)
        return plan

    async def _plan_facts(self, plan: core.Plan, facts: list[str]) -> None:
        similar = await asyncio.gather(*(self.neighbourhood.search(f) for f in facts))
        shown = core.numbered_neighbourhood(similar, self.neighbourhood.records)
        decisions = await self._decide(facts, shown)
        # Texts the model rewrote (UPDATE) need their own near-duplicate check.
        await asyncio.gather(*(self.neighbourhood.search(d.text) for d in decisions))
        stored = await self.memories.get(
            self.proposal.tenant, core.candidate_ids(self.proposal, decisions)
        )
        core.plan_facts(
            plan,
            decisions,
            core.FactContext(
                proposal=self.proposal,
                similar=self.neighbourhood.similar,
                neighbours=self.neighbourhood.records,
                stored=stored,
                near_duplicate_cosine=self.settings.near_duplicate_cosine,
            ),
        )

    async def _decide(
        self, facts: list[str], shown: dict[int, MemoryRecord]
    ) -> list[core.FactDecision]:
        ask = AskLlm(
            self.llm,
            task_model=self.settings.reconcile_model,
            chat_models=(self.proposal.model,),
            last_chance=self.delivery.last_chance,
        )
        decided = await core.decide(facts, shown, ask)
        self.fallback = decided.fallback
        for r in decided.rejected:
            log.warning(
                "reconcile.rejected_decision",
                reason=r.reason,
                fact=r.fact,
                decision=r.event,
                target=r.target,
            )
        return decided.decisions

    async def _plan_profile(self, plan: core.Plan) -> None:
        p = self.proposal
        active = [
            m
            async for m in self.memories.iter_list(
                p.tenant, MemoryFilter(user_id=p.user_id, kinds=("profile",))
            )
            if m.profile is not None
        ]
        stored = await self.memories.get(p.tenant, core.profile_candidate_ids(p))
        for reason in core.plan_profile(plan, p, active, stored):
            log.info("profile.kept", reason=reason)


async def reconcile_facts(event: FactProposed, delivery: ReconcileDelivery) -> None:
    resources = delivery.resources
    locks = resources.locks
    try:
        async with AsyncExitStack() as stack:
            await stack.enter_async_context(
                locks.hold(event.tenant, event.user_id, event.conversation_id)
            )
            if event.profile:
                # Profiles span the user's conversations: one more lock, always taken
                # second, so two holders can never wait on each other.
                await stack.enter_async_context(locks.hold(event.tenant, "profile", event.user_id))
            reconciler = Reconciler(event, delivery, resources)
            changes = await reconciler.run()
            # Still under the lock, so one conversation's announcements stay in order.
            for change in changes:
                await delivery.worker.publish(change)
    except LockTimeout as exc:
        raise RetryableError(f"conversation lock: {exc}") from exc
    if resources.statuses is not None:
        await record_status(
            resources.statuses,
            event.tenant,
            event.event_id,
            followed=event.followed,
            fallback=reconciler.fallback,
            budget_s=delivery.worker.retry_policy.publish_retry_s,
        )


RECONCILE = WorkerSpec(
    name="reconcile", event=FactProposed, handle=reconcile_facts, resources=reconcile_resources
)


def main() -> None:
    run_worker(RECONCILE, ReconcileSettings)
