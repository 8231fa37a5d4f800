"""Ingest worker: every persisted turn becomes an indexed ``turn`` memory, and every
user turn is mined for facts.

Consumes ``engram.turn.persisted.v1`` (durable consumer ``ingest``) and upserts the
turn through the retrieval port. The memory id derives from the turn's identity (which
the gateway derives from what the turn is), so a redelivered, re-published or repeated
turn lands on the same point. A turn that is already stored with the same text is a
repeat (a retried request after JetStream's de-duplication window, a re-import): it is
neither written nor extracted again, unless the event asks for a re-extraction
(``engram reextract``). A new turn is announced on ``engram.memory.changed.v1``.

User turns (never assistant ones) then go through one ``extract_facts`` LLM call
(:mod:`engram_workers.extraction`); when it finds facts or profile facts, they are
published as ``engram.fact.proposed.v1`` for the reconcile worker. Both follow-up
events have ids derived from the turn, so a retry publishes nothing twice.

What was learned is never silent: a followed event (``POST /v1/memories/add``) ends
``applied`` (facts proposed, or nothing to learn) or ``skipped`` with the reason
(no model configured, extraction disabled, the model's answer unusable).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Literal

from opentelemetry import trace
from pydantic import Field

from engram_core import semconv
from engram_core.event_status import EventStatusStore
from engram_core.event_status import record_status as record_event_status
from engram_core.events import MemoryChanged, TurnPersisted
from engram_core.ids import turn_memory_id
from engram_core.logging import get_logger
from engram_core.memory import MemoryRecord
from engram_core.memory_writes import Change, apply
from engram_core.retry import is_transient
from engram_core.worker_catalog import worker_entry
from engram_workers import extraction
from engram_workers.llm import AskLlm, FellBack, LlmClient, LlmSettingsMixin
from engram_workers.runtime import (
    BatchItem,
    Delivery,
    Outcome,
    Worker,
    WorkerSettings,
    WorkerSpec,
    run_worker,
)

log = get_logger(__name__)
_tracer = trace.get_tracer("engram.ingest")

#: Appended to the reason a followed turn was skipped for: nothing is lost.
REEXTRACT_HINT = "the turn is stored; `engram reextract` learns from it later"
EXTRACTION_DISABLED = "extraction is disabled (ENGRAM_EXTRACTION_ENABLED=false)"


class IngestSettings(WorkerSettings, LlmSettingsMixin):
    health_port: int = Field(
        default=worker_entry("ingest").health_port,
        ge=0,
        le=65535,
        description="Port of /healthz and /readyz; 0 disables.",
    )
    extraction_enabled: bool = Field(
        default=True, description="Extract facts from user turns (one LLM call per turn)."
    )
    extraction_model: str = Field(
        default="",
        description="Model for fact extraction; empty: ENGRAM_LLM_MODEL, then the turn's "
        "chat model.",
    )
    extraction_context_turns: int = Field(
        default=4,
        ge=0,
        le=20,
        description="Earlier turns shown to the extraction model to resolve references.",
    )


@dataclass(frozen=True)
class IngestResources:
    settings: IngestSettings
    llm: LlmClient | None  # None when extraction is disabled
    statuses: EventStatusStore | None = None  # followed events (POST /v1/memories/add)


IngestDelivery = Delivery[IngestSettings, IngestResources]
IngestItem = BatchItem[TurnPersisted, IngestSettings, IngestResources]


@asynccontextmanager
async def ingest_resources(
    worker: Worker[TurnPersisted, IngestSettings, IngestResources],
) -> AsyncIterator[IngestResources]:
    settings = worker.settings
    llm = LlmClient(settings) if settings.extraction_enabled else None
    try:
        async with EventStatusStore.connect(
            settings.nats_url, replicas=settings.stream_replicas
        ) as statuses:
            yield IngestResources(settings=settings, llm=llm, statuses=statuses)
    finally:
        if llm is not None:
            await llm.close()


def turn_memory(event: TurnPersisted) -> MemoryRecord:
    metadata = {"turn_id": event.turn_id, "event_id": event.event_id}
    if event.model:
        metadata["model"] = event.model
    if event.request_id:
        metadata["request_id"] = event.request_id
    return MemoryRecord(
        id=event.memory_id or turn_memory_id(event.tenant, event.conversation_id, event.turn_id),
        kind="turn",
        role=event.role,
        text=event.text,
        user_id=event.user_id,
        conversation_id=event.conversation_id,
        created_at=event.created_at,
        source_id=event.source_id,
        turn_index=event.turn_index,
        metadata=metadata,
    )


def is_repeat(event: TurnPersisted, stored: MemoryRecord | None, delivery: IngestDelivery) -> bool:
    """A turn already stored as it is now, seen again in a new message: nothing to do.
    A redelivery of the same message is not a repeat (the first delivery may have
    stopped half-way), nor is a re-extraction, nor a replay of its dead letter (the
    worker gave up half-way: ``engram dlq replay``)."""
    again = delivery.attempt > 1 or delivery.replayed or event.reextract
    return stored is not None and stored.text == event.text and not again


#: What a turn's stored state says to do: nothing (a repeat), learn again without a
#: write (a re-extraction of the turn as stored), or write this record.
Repeat = Literal["repeat"]
REPEAT: Repeat = "repeat"
ToWrite = MemoryRecord | Repeat | None


def write_for(
    event: TurnPersisted,
    memory: MemoryRecord,
    stored: MemoryRecord | None,
    delivery: IngestDelivery,
) -> ToWrite:
    """What to write for a turn whose stored state is ``stored``."""
    if is_repeat(event, stored, delivery):
        return REPEAT
    if stored is not None and stored.text == event.text:
        if event.reextract:
            return None
        return stored  # a redelivery: the turn as the first delivery stored it
    return memory


async def index_turn(event: TurnPersisted, delivery: IngestDelivery) -> None:
    """One turn on its own: what :func:`index_turns` does for a batch."""
    if not event.text.strip():
        # Nothing to search for; a tool-call-only assistant turn, for example.
        log.info("turn.skipped", reason="empty text", turn_id=event.turn_id, role=event.role)
        await record_status(event, delivery.resources, skipped="the text is empty")
        return
    memory = turn_memory(event)
    stored = await delivery.memories.get_one(event.tenant, memory.id)
    write = write_for(event, memory, stored, delivery)
    announcement = None
    if isinstance(write, MemoryRecord):
        (announcement,) = await apply(
            delivery.memories, event.tenant, [Change(write, "created", "ingest")]
        )
    await follow_up(event, memory.id, write, announcement, delivery)


async def follow_up(
    event: TurnPersisted,
    memory_id: str,
    write: ToWrite,
    announcement: MemoryChanged | None,
    delivery: IngestDelivery,
) -> None:
    """After the turn's write (or none): announce it, then learn from it."""
    resources = delivery.resources
    if write == REPEAT:
        log.info("turn.repeated", memory_id=memory_id, turn_id=event.turn_id, role=event.role)
        await record_status(event, resources)
        return
    if announcement is None:
        log.info("turn.reextract", memory_id=memory_id, turn_id=event.turn_id)
    else:
        log.info(
            "turn.indexed",
            memory_id=memory_id,
            turn_id=event.turn_id,
            role=event.role,
            op=announcement.op,
        )
        await delivery.worker.publish(announcement)
    if event.role != "user":
        await record_status(event, resources)
    elif resources.llm is None:
        await record_status(event, resources, skipped=EXTRACTION_DISABLED)
    else:
        await extract_and_propose(event, memory_id, delivery, resources)


@dataclass(frozen=True)
class Indexed:
    """A turn of a batch after the shared write."""

    memory_id: str
    write: ToWrite
    announcement: MemoryChanged | None


async def index_turns(items: Sequence[IngestItem]) -> list[Outcome]:
    """The batch hook: per tenant, one Get and one Upsert (one embedding run) for the
    turns of the batch, then per message what follows (announce, extract), in order per
    conversation.

    When the shared write fails with what says "try again" (retrieval down), every turn
    of it fails with that, each retried on its own schedule. When it fails otherwise
    (retrieval refuses one of the turns), the turns are handled one by one
    (:func:`index_turn`), so the poison one fails alone. An empty turn and a second
    message for a turn already in the batch are handled one by one too."""
    indexed: dict[int, Indexed] = {}
    failed: dict[int, Exception] = {}
    for tenant, group in _shared_groups(items).items():
        try:
            with _batch_span(group):
                indexed.update(await _index_together(tenant, group))
        except Exception as exc:
            log.warning(
                "turns.batch_write_failed",
                tenant=tenant,
                turns=len(group),
                error=f"{type(exc).__name__}: {exc}",
            )
            if is_transient(exc) or len(group) == 1:
                failed.update((id(item), exc) for item in group)

    async def finish(item: IngestItem) -> None:
        if (exc := failed.get(id(item))) is not None:
            raise exc
        done = indexed.get(id(item))
        if done is None:
            await index_turn(item.event, item.delivery)
        else:
            await follow_up(
                item.event, done.memory_id, done.write, done.announcement, item.delivery
            )

    worker = items[0].delivery.worker
    return [
        outcome if isinstance(outcome, Exception) else None
        for outcome in await worker.each(items, finish)
    ]


def _shared_groups(items: Sequence[IngestItem]) -> dict[str, list[IngestItem]]:
    """The items that take part in the shared write, by tenant."""
    groups: dict[str, list[IngestItem]] = {}
    seen: set[tuple[str, str]] = set()
    for item in items:
        event = item.event
        key = (event.tenant, turn_memory(event).id)
        if not event.text.strip() or key in seen:
            continue
        seen.add(key)
        groups.setdefault(event.tenant, []).append(item)
    return groups


@contextmanager
def _batch_span(group: Sequence[IngestItem]) -> Iterator[None]:
    """The shared RPCs in the trace of the batch's first turn, linked to the others'."""
    first, *others = group
    with _tracer.start_as_current_span(
        "ingest batch",
        context=trace.set_span_in_context(first.span),
        links=[trace.Link(item.span.get_span_context()) for item in others],
        attributes={semconv.MESSAGING_BATCH_MESSAGE_COUNT: len(group)},
    ):
        yield


async def _index_together(tenant: str, group: Sequence[IngestItem]) -> dict[int, Indexed]:
    memories = group[0].delivery.memories
    records = [turn_memory(item.event) for item in group]
    found = await memories.get(tenant, [record.id for record in records])
    writes: list[ToWrite] = [
        write_for(item.event, record, found.get(record.id), item.delivery)
        for item, record in zip(group, records, strict=True)
    ]
    changes = [Change(w, "created", "ingest") for w in writes if isinstance(w, MemoryRecord)]
    announcements = iter(await apply(memories, tenant, changes) if changes else [])
    return {
        id(item): Indexed(
            record.id, write, next(announcements) if isinstance(write, MemoryRecord) else None
        )
        for item, record, write in zip(group, records, writes, strict=True)
    }


async def record_status(
    event: TurnPersisted,
    resources: IngestResources,
    *,
    follow_up: str = "",
    skipped: str = "",
    fallback: str = "",
) -> None:
    """A followed turn (``POST /v1/memories/add``) is applied, skipped, or waits for
    ``follow_up``. Unfollowed turns (chats) cost nothing. Best effort: a status
    store that stays unreachable (retried for ``ENGRAM_PUBLISH_RETRY_S``) never holds
    back or drops the facts; the followed turn then stays pending."""
    statuses = resources.statuses
    if statuses is None:
        return
    await record_event_status(
        statuses,
        event.tenant,
        event.event_id,
        followed=event.followed,
        follow_up=follow_up,
        skipped=skipped,
        fallback=fallback,
        budget_s=resources.settings.retry_policy.publish_retry_s,
    )


async def extract_and_propose(
    event: TurnPersisted, memory_id: str, delivery: IngestDelivery, resources: IngestResources
) -> None:
    """Extract facts from a user turn and publish them for reconcile; the turn is
    indexed already, so a retry (LLM unavailable) only repeats this part in effect."""
    llm = resources.llm
    assert llm is not None
    settings = resources.settings
    context = await extraction.recent_context(
        delivery.memories, event, memory_id, settings.extraction_context_turns
    )
    ask = AskLlm(
        llm,
        task_model=settings.extraction_model,
        chat_models=(event.model,),
        last_chance=delivery.last_chance,
    )
    extracted = await extraction.extract(
        ask, message=event.text, date=event.created_at, context=context
    )
    if isinstance(extracted, FellBack):
        await record_status(
            event,
            resources,
            skipped=f"{extracted.reason}; {REEXTRACT_HINT}",
            fallback=extracted.reason,
        )
        return
    facts, profile = extracted.facts, extracted.profile
    log.info("extraction.done", memory_id=memory_id, facts=len(facts), profile=len(profile))
    if not facts and not profile:
        await record_status(event, resources)
        return
    proposal = extraction.fact_proposed(event, memory_id, facts, profile)
    # Followed before it is published, so reconcile never finishes an unfollowed one.
    # Best effort (record_status never raises): the facts matter more than the report.
    await record_status(event, resources, follow_up=proposal.event_id)
    await delivery.worker.publish(proposal)


INGEST = WorkerSpec(
    name="ingest",
    event=TurnPersisted,
    handle=index_turn,
    handle_batch=index_turns,
    resources=ingest_resources,
)


def main() -> None:
    run_worker(INGEST, IngestSettings)


if __name__ == "__main__":
    main()
