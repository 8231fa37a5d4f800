"""Recording turns: ``TurnPersisted`` events on JetStream.

A chat's user turn is published (and acknowledged) once the upstream has accepted the
request and before any of the reply reaches the caller: a request whose upstream call
failed leaves nothing behind, and a reply is never relayed for a turn that was not
recorded (no acknowledgement: 503). The assistant turn is published once the reply is
complete, in a task that outlives the request. Both are retried with the same
``Nats-Msg-Id`` for ``ENGRAM_PUBLISH_RETRY_S`` when JetStream does not acknowledge them
for a reason that says "try again" (a leader election, a node restart); a client that
is not even reconnecting fails at once.

A turn's identity comes from what it is, not from the request that carried it: (tenant,
user, conversation, its position in the client's history, the user's text). A retried
or repeated request (the openai SDK retries by itself) therefore records the same turn:
the same ``event_id`` (= ``Nats-Msg-Id``, de-duplicated by JetStream) and the same
memory id (idempotent in the index after the window). The reply to a given user turn has
one identity too, so a regenerated reply replaces the earlier one. Texts added through
``POST /v1/memories/add`` are keyed by the request id instead (a retry with the same
``X-Request-Id`` is the same text; the same sentence added twice is two statements).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from faststream.nats import NatsBroker

from engram_core.bus import publish_event
from engram_core.events import TurnPersisted, utcnow
from engram_core.ids import turn_event_id, turn_id
from engram_core.logging import get_logger

log = get_logger(__name__)

Role = Literal["user", "assistant"]


class TurnNotPersisted(RuntimeError):
    """JetStream did not acknowledge the turn (NATS down, no stream, timeout)."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def chat_turn_key(turn_index: int, prompt: str) -> str:
    """A chat exchange's identity: where the user turn sits in the client's history and
    what it says."""
    return f"chat/{turn_index}/{_digest(prompt)}"


def chained_turn_key(previous_response_id: str, turn_index: int, prompt: str) -> str:
    """A turn sent on top of history the upstream keeps (Responses'
    ``previous_response_id``): the client's request does not show where the turn sits
    in the conversation, the response it follows does."""
    return f"chain/{_digest(previous_response_id)}/{turn_index}/{_digest(prompt)}"


@dataclass(frozen=True)
class TurnScope:
    """Who a request's turns belong to, and what identifies them (``key``)."""

    tenant: str
    user_id: str
    conversation_id: str
    request_id: str
    model: str
    key: str
    # The user turn's position among the conversation's user/assistant messages in the
    # request (the client's history); the reply is the next one.
    turn_index: int = 0

    @classmethod
    def chat(
        cls,
        *,
        tenant: str,
        user_id: str,
        conversation_id: str,
        request_id: str,
        model: str,
        turn_index: int,
        prompt: str,
        key: str | None = None,
    ) -> TurnScope:
        """``key``: the turn's identity when it is not its position and text
        (:func:`chained_turn_key`)."""
        return cls(
            tenant=tenant,
            user_id=user_id,
            conversation_id=conversation_id,
            request_id=request_id,
            model=model,
            key=key or chat_turn_key(turn_index, prompt),
            turn_index=turn_index,
        )

    def event(
        self,
        role: Role,
        text: str,
        *,
        created_at: datetime | None = None,
        followed: bool = False,
    ) -> TurnPersisted:
        """The turn's event; ``followed``: its status was registered (memories/add)."""
        tid = turn_id(self.tenant, self.user_id, self.conversation_id, self.key, role)
        return TurnPersisted(
            event_id=turn_event_id(tid, text),
            tenant=self.tenant,
            user_id=self.user_id,
            conversation_id=self.conversation_id,
            turn_id=tid,
            role=role,
            text=text,
            created_at=created_at or utcnow(),
            model=self.model,
            request_id=self.request_id,
            turn_index=self.turn_index + (role == "assistant"),
            followed=followed,
        )


class TurnPublisher:
    """Publishes turns and keeps track of the ones still in flight at shutdown."""

    def __init__(
        self, broker: NatsBroker, *, retry_s: float = 0.0, max_text_bytes: int | None = None
    ) -> None:
        self._broker = broker
        self.retry_s = retry_s
        self.max_text_bytes = max_text_bytes
        self._pending: set[asyncio.Task[Any]] = set()

    def is_connected(self) -> bool:
        try:
            return bool(self._broker.connection.is_connected)
        except Exception:  # not connected yet, or already stopped
            return False

    def may_reconnect(self) -> bool:
        """Connected, or reconnecting (a publish may still land within the retries).
        A reconnect that has reached a server is CONNECTING while it shakes hands (and
        back to RECONNECTING if that server fails too): a chat arriving then was refused
        a 503 in the cluster failover test."""
        try:
            connection = self._broker.connection
            return bool(
                connection.is_connected or connection.is_reconnecting or connection.is_connecting
            )
        except Exception:
            return False

    async def wait_connected(self) -> bool:
        """Connected now, or within the publish retries while the client reconnects (a
        NATS node lost: another one takes over in a second or two); False otherwise."""
        if self.is_connected():
            return True
        deadline = asyncio.get_running_loop().time() + self.retry_s
        while self.may_reconnect() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
            if self.is_connected():
                return True
        return False

    async def publish(self, event: TurnPersisted) -> None:
        """Wait for the JetStream ack (retried for ``retry_s``); raise
        :class:`TurnNotPersisted` otherwise."""
        if self.max_text_bytes is not None and len(event.text.encode()) > self.max_text_bytes:
            # An assistant reply this large (the user's text is refused with a 413 before)
            # cannot travel in one event: recorded as not persisted, never half-written.
            raise TurnNotPersisted(f"text larger than {self.max_text_bytes} bytes")
        # A client that is not even trying to reconnect would only wait out the retries.
        if not self.may_reconnect():
            raise TurnNotPersisted("not connected to NATS")
        try:
            ack = await publish_event(self._broker, event, retry_s=self.retry_s)
        except Exception as exc:
            raise TurnNotPersisted(f"{type(exc).__name__}: {exc}") from exc
        log.debug(
            "turn.persisted",
            event_id=event.event_id,
            role=event.role,
            seq=getattr(ack, "seq", None),
            duplicate=getattr(ack, "duplicate", None),
        )

    def publish_detached(self, event: TurnPersisted) -> asyncio.Task[bool]:
        """Publish in a task that outlives the request (a client that hangs up right
        after the last chunk must not cancel the assistant turn). Failures are logged."""
        task = asyncio.create_task(self._publish_logged(event))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task

    async def _publish_logged(self, event: TurnPersisted) -> bool:
        try:
            await self.publish(event)
        except TurnNotPersisted as exc:
            log.error(
                "turn.assistant_not_persisted",
                event_id=event.event_id,
                turn_id=event.turn_id,
                error=str(exc),
            )
            return False
        return True

    async def drain(self, timeout_s: float) -> None:
        if not self._pending:
            return
        pending = set(self._pending)
        _, still = await asyncio.wait(pending, timeout=timeout_s)
        for task in still:
            task.cancel()
        if still:
            log.error("turn.assistant_not_persisted_at_shutdown", count=len(still))
