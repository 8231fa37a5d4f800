"""Whether an event someone asked to follow has been applied: a JetStream key-value
bucket, ``ENGRAM_EVENTS``, shared by the gateway and the write-path workers.

The gateway registers the turns it publishes for ``POST /v1/memories/add`` (status
``pending``) and marks their events ``followed``; ingest and reconcile update only
records that exist, and do not even look for the events marked unfollowed (chat
turns), so those cost nothing here. A turn is applied when ingest indexed it and found
nothing to propose, or when reconcile applied the facts ingest proposed from it
(``follow_up``).

Keys hash the tenant with the event id: another tenant asking for the same id reads
a different key, and finds nothing.

A task that took its documented fallback (the model's answers unusable, no model, the
model down until the retry horizon) says so in ``fallback``, with the reason: a turn
whose extraction fell back is ``skipped``, one whose reconcile fell back is ``applied``
(its facts added as they were). Records without one are stored exactly as before the
field existed, so a reader that predates it still reads them.

The workers' updates are best effort (:func:`record_status`): retried while the bucket
is unreachable for a bounded time, then given up with an error line. A status store
that is down must never hold back or drop the facts themselves; a followed event whose
update was given up on stays ``pending``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Literal

from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field

from engram_core.bus import key_value_bucket
from engram_core.events import utcnow
from engram_core.logging import get_logger
from engram_core.retry import retry_transient

log = get_logger(__name__)

EVENTS_BUCKET = "ENGRAM_EVENTS"
#: Records expire after this long; a client polls for minutes, not weeks.
EVENTS_TTL_S = 7 * 24 * 3600.0

EventState = Literal["pending", "applied", "skipped"]
EventStage = Literal["ingest", "reconcile"]


class EventStatus(BaseModel):
    """One followed event. ``stage``: the worker it waits for while pending."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: EventState
    stage: EventStage | None = None
    accepted_at: datetime | None = None
    applied_at: datetime | None = None
    follow_up: str = Field(default="", description="The event this one now waits for.")
    reason: str = Field(default="", description="Why nothing was learned (status skipped).")
    fallback: str = Field(
        default="",
        description="Set when a task took its documented fallback instead of the model's "
        "answer: which task, and why.",
    )

    def applied(self, fallback: str = "") -> EventStatus:
        return self.model_copy(
            update={
                "status": "applied",
                "stage": None,
                "applied_at": utcnow(),
                "fallback": fallback,
            }
        )

    def skipped(self, reason: str, fallback: str = "") -> EventStatus:
        return self.model_copy(
            update={
                "status": "skipped",
                "stage": None,
                "applied_at": utcnow(),
                "reason": reason,
                "fallback": fallback,
            }
        )

    def stored(self) -> bytes:
        """The record as JSON; without ``fallback`` when there is none (as before it)."""
        return self.model_dump_json(exclude=None if self.fallback else {"fallback"}).encode()

    def waiting_for(self, event_id: str) -> EventStatus:
        return self.model_copy(update={"stage": "reconcile", "follow_up": event_id})


def status_key(tenant: str, event_id: str) -> str:
    return hashlib.sha256(f"{tenant}\x1f{event_id}".encode()).hexdigest()


class EventStatusStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    @asynccontextmanager
    async def connect(cls, nats_url: str, *, replicas: int = 1) -> AsyncIterator[EventStatusStore]:
        async with key_value_bucket(
            nats_url, EVENTS_BUCKET, ttl_s=EVENTS_TTL_S, replicas=replicas
        ) as (_, kv):
            yield cls(kv)

    async def get(self, tenant: str, event_id: str) -> EventStatus | None:
        try:
            entry = await self._kv.get(status_key(tenant, event_id))
        except NotFoundError:  # KeyNotFoundError and a deleted key alike
            return None
        if not entry.value:  # a delete marker
            return None
        return EventStatus.model_validate_json(entry.value)

    async def put(self, tenant: str, event_id: str, status: EventStatus) -> None:
        await self._kv.put(status_key(tenant, event_id), status.stored())

    async def register(self, tenant: str, event_id: str) -> None:
        """Follow an event about to be published (the gateway's side)."""
        await self.put(
            tenant, event_id, EventStatus(status="pending", stage="ingest", accepted_at=utcnow())
        )

    async def update_if_followed(
        self,
        tenant: str,
        event_id: str,
        *,
        follow_up: str = "",
        skipped: str = "",
        fallback: str = "",
    ) -> None:
        """The workers' side: a followed event is applied, skipped (``skipped``: why no
        facts were learned), or (``follow_up``) now waits for the event it causes, which
        becomes followed too — call this *before* publishing that event, or its worker
        could finish before it is followed. ``fallback``: the task took its fallback, and
        why. Unfollowed events: no-op."""
        current = await self.get(tenant, event_id)
        # Done, or already waiting for its follow-up (a redelivery): nothing to add,
        # and re-writing the follow-up could undo reconcile's "applied".
        if current is None or current.status != "pending" or current.follow_up:
            return
        if skipped:
            await self.put(tenant, event_id, current.skipped(skipped, fallback))
        elif follow_up:
            await self.put(
                tenant,
                follow_up,
                EventStatus(status="pending", stage="reconcile", accepted_at=current.accepted_at),
            )
            await self.put(tenant, event_id, current.waiting_for(follow_up))
        else:
            await self.put(tenant, event_id, current.applied(fallback))


async def record_status(
    statuses: EventStatusStore,
    tenant: str,
    event_id: str,
    *,
    followed: bool | None,
    follow_up: str = "",
    skipped: str = "",
    fallback: str = "",
    budget_s: float,
) -> bool:
    """:meth:`EventStatusStore.update_if_followed`, retried for ``budget_s`` while the
    store says "try again"; False (and an error line) when it was given up on.
    ``followed``: the event's own flag; False (nobody registered it, a chat turn) reads
    nothing, None (an event from before the flag) reads the store to find out."""
    if followed is False:
        return True
    try:
        await retry_transient(
            lambda: statuses.update_if_followed(
                tenant, event_id, follow_up=follow_up, skipped=skipped, fallback=fallback
            ),
            budget_s=budget_s,
        )
    except Exception as exc:
        log.error(
            "event_status.not_recorded",
            status_event_id=event_id,
            follow_up=follow_up,
            error=f"{type(exc).__name__}: {exc}",
        )
        return False
    return True
