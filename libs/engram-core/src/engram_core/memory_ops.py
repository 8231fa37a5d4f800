"""Memory operations: create, edit, save (a whole record, as the mirror states it),
delete, and :func:`history` — one implementation for every caller (the memory API in any gateway
pod, MCP through it, the mirror's edits worker), each applied whole and in one order.

**Serialised per memory.** A change holds a lock (:mod:`engram_core.locks`, shared by
every process on one NATS) named after the memory's lineage: the id of its current
version. An edit keeps the edited id current (the state before becomes a history version
under a derived id, superseded by it; :mod:`engram_core.lifecycle`), so the name survives
edits; a superseded version is resolved to the current version it leads to by following
``superseded_by``. Inside the lock the operation reads the memory again and decides on
what it reads (gone: :class:`MemoryNotFound`; replaced: :class:`MemorySuperseded`; not the
version the caller expected: :class:`PreconditionFailed`), writes, and announces its
``memory.changed`` events before letting go, so the stream (and the Markdown mirror)
sees the changes of one memory in the order they were made. A lock still busy after the
wait raises :class:`~engram_core.locks.LockTimeout` (retryable).

**Delete** removes the memory and every earlier version of it (its history) from the
index, and announces a deletion of each (the mirror keeps their tombstones). Deleting the
current version therefore deletes the whole lineage — nothing of a deleted memory is left
to search, list or history. A deleted fact's source turns are marked corrected.

**Create** refuses to store a second copy of a current fact: under a lock on the scope
(tenant, user, conversation), a fact that :mod:`engram_core.near_duplicates` calls the
same statement in that scope is returned instead (:attr:`Outcome.duplicate_of`).

**Versions.** :func:`version` is a digest of everything a stored memory says (the
gateway's strong ``ETag``); a :class:`Precondition` (``If-Match``) is checked on the state
read inside the lock, so a conditional change never applies to a version it did not name.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

from engram_core import lifecycle
from engram_core.events import MemoryChanged, MemoryChangeOp, utcnow
from engram_core.locks import LockTimeout
from engram_core.memory import MemoryFilter, MemoryRecord
from engram_core.memory_port import MemoryPort
from engram_core.memory_writes import Change, apply, correct_turns
from engram_core.near_duplicates import (
    NEAR_DUPLICATE_COSINE,
    is_near_duplicate,
    similar_facts_query,
)

#: Publishes a change's events on the caller's bus; False when they could not be
#: published but the change stands (the caller reports it), raises to fail the change.
Announce = Callable[[Sequence[MemoryChanged]], Awaitable[bool]]

#: Longest ``superseded_by`` chain followed to a current version (a cycle stops sooner).
MAX_LINEAGE = 64
#: Similar facts a creation compares itself with.
DUPLICATE_CANDIDATES = 5
#: Times the lineage is resolved again when its current version changed under the lock.
_LOCK_ATTEMPTS = 5


class Locks(Protocol):
    """Named mutual exclusion across processes (:class:`engram_core.locks.KeyLocks`)."""

    def hold(self, *parts: str) -> AbstractAsyncContextManager[None]: ...


class MemoryNotFound(LookupError):
    def __init__(self, memory_id: str) -> None:
        super().__init__(f"no memory {memory_id}")
        self.memory_id = memory_id


class MemorySuperseded(Exception):
    """Only a current version can be edited."""

    def __init__(self, memory: MemoryRecord) -> None:
        super().__init__(f"memory {memory.id} is superseded by {memory.superseded_by}")
        self.memory = memory


class PreconditionFailed(Exception):
    """The memory is not at a version the caller named."""

    def __init__(self, memory: MemoryRecord) -> None:
        super().__init__(f"memory {memory.id} is at another version")
        self.memory = memory


def version(memory: MemoryRecord) -> str:
    """A strong validator of a stored memory: changes whenever anything it says does."""
    return lifecycle.state_digest(memory)[:32]


@dataclass(frozen=True)
class Precondition:
    """The versions a change may apply to: any existing one (``If-Match: *``) or one of
    ``versions``."""

    versions: frozenset[str] = frozenset()
    any_version: bool = False

    def check(self, memory: MemoryRecord) -> None:
        if not (self.any_version or version(memory) in self.versions):
            raise PreconditionFailed(memory)


@dataclass(frozen=True)
class Outcome:
    """What an operation did: the memory as it stands after (a deletion: as it was),
    the events announced, whether announcing them worked."""

    memory: MemoryRecord
    events: list[MemoryChanged] = field(default_factory=list)
    announced: bool = True
    #: create: the id of the existing fact returned instead of a new one ("" otherwise)
    duplicate_of: str = ""
    #: delete: every id removed from the index (the memory and its history)
    deleted_ids: list[str] = field(default_factory=list)


class MemoryOps:
    """The operations on one store (``port``), serialised by ``locks``, announced with
    ``announce`` under the lock."""

    def __init__(
        self,
        port: MemoryPort,
        locks: Locks,
        announce: Announce,
        *,
        near_duplicate_cosine: float = NEAR_DUPLICATE_COSINE,
    ) -> None:
        self.port = port
        self.locks = locks
        self.announce = announce
        self.near_duplicate_cosine = near_duplicate_cosine

    # -- create ------------------------------------------------------------------------

    async def create(self, tenant: str, record: MemoryRecord, *, cause: str) -> Outcome:
        """Store a new memory, unless it is a fact already stated in its scope (then
        that fact, with ``duplicate_of``)."""
        scope = ("create", tenant, record.user_id, record.conversation_id)
        async with self.locks.hold(*scope):
            duplicate = await self.duplicate_of(tenant, record)
            if duplicate is not None:
                return Outcome(duplicate, duplicate_of=duplicate.id)
            events = await apply(self.port, tenant, [Change(record, "created", cause)])
            return Outcome(events[0].memory, events, await self._announce(events))

    async def duplicate_of(self, tenant: str, record: MemoryRecord) -> MemoryRecord | None:
        """The current fact of ``record``'s scope that says what it says, if any."""
        if record.kind != "fact":
            return None
        result = await self.port.search(
            similar_facts_query(
                tenant,
                record.text,
                user_id=record.user_id,
                conversation_id=record.conversation_id,
                top_k=DUPLICATE_CANDIDATES,
            )
        )
        same = [
            (hit.scores.dense, hit.memory)
            for hit in result.hits
            if hit.memory.is_current
            and hit.memory.kind == "fact"
            and hit.memory.id != record.id
            and (hit.memory.user_id, hit.memory.conversation_id)
            == (record.user_id, record.conversation_id)
            and is_near_duplicate(
                record.text, hit.memory.text, hit.scores.dense, self.near_duplicate_cosine
            )
        ]
        return max(same, key=lambda pair: pair[0])[1] if same else None

    # -- edit --------------------------------------------------------------------------

    async def edit(
        self,
        tenant: str,
        memory_id: str,
        *,
        cause: str,
        text: str | None = None,
        tags: Sequence[str] | None = None,
        precondition: Precondition | None = None,
    ) -> Outcome:
        """New text and/or tags for a current memory; the state before is kept as a
        history version. Nothing to change: the memory as it is, no events."""
        async with self._serialised(tenant, memory_id) as current:
            if current is None:
                raise MemoryNotFound(memory_id)
            # As HTTP orders them: a request that would fail anyway fails for that reason.
            if current.superseded_by:
                raise MemorySuperseded(current)
            if precondition is not None:
                precondition.check(current)
            at = utcnow()
            new = lifecycle.edited(current, at=at, cause=cause, text=text, tags=tags)
            if (new.text, new.tags) == (current.text, current.tags):
                return Outcome(current)
            events = await self._replace(tenant, current, new, cause=cause)
            return Outcome(events[1].memory, events, await self._announce(events))

    async def save(self, tenant: str, record: MemoryRecord, *, cause: str) -> Outcome:
        """Write ``record`` as a whole (a hand-edited mirror file). A new text or tags of a
        current memory keeps the state before as history, as :meth:`edit` does."""
        async with self._serialised(tenant, record.id) as stored:
            saved = record.model_copy(update={"updated_at": None})
            at = utcnow()
            if (
                stored is not None
                and stored.is_current
                and saved.is_current
                and _content_changed(stored, saved)
            ):
                new = saved.model_copy(
                    update={
                        "valid_from": at,
                        "valid_to": None,
                        "metadata": {**saved.metadata, "edited_by": cause},
                    }
                )
                events = await self._replace(tenant, stored, new, cause=cause)
                return Outcome(events[1].memory, events, await self._announce(events))
            op: MemoryChangeOp = (
                "superseded" if saved.superseded_by else "updated" if stored else "created"
            )
            events = await apply(self.port, tenant, [Change(saved, op, cause)])
            if stored is not None and lifecycle.corrects_its_turns(stored, saved):
                events += await correct_turns(
                    self.port, tenant, [stored], by=saved.id, at=at, cause=cause
                )
            return Outcome(events[0].memory, events, await self._announce(events))

    async def _replace(
        self, tenant: str, stored: MemoryRecord, new: MemoryRecord, *, cause: str
    ) -> list[MemoryChanged]:
        """``stored`` becomes ``new`` (same id); the state before, a history version."""
        now = new.valid_from or utcnow()
        old = lifecycle.history_version(tenant, stored, at=now)
        events = await apply(
            self.port,
            tenant,
            [
                Change(old, "superseded", cause, (new.id,)),
                Change(new, "updated", cause, (old.id,)),
            ],
        )
        if lifecycle.corrects_its_turns(stored, new):
            events += await correct_turns(
                self.port, tenant, [stored], by=new.id, at=now, cause=cause
            )
        return events

    # -- delete ------------------------------------------------------------------------

    async def delete(
        self,
        tenant: str,
        memory_id: str,
        *,
        cause: str,
        precondition: Precondition | None = None,
        last_known: MemoryRecord | None = None,
    ) -> Outcome:
        """Remove the memory and its history from the index. Already gone: with
        ``last_known`` (the mirror's file) its deletion is announced all the same, so the
        mirror tombstones it; without, :class:`MemoryNotFound`."""
        async with self._serialised(tenant, memory_id) as memory:
            if memory is None:
                if last_known is None:
                    raise MemoryNotFound(memory_id)
                events = [lifecycle.change(tenant, last_known, "deleted", cause=cause)]
                events += await self._correct_deleted(tenant, last_known, cause)
                return Outcome(last_known, events, await self._announce(events))
            if precondition is not None:
                precondition.check(memory)
            doomed = [memory, *await history(self.port, tenant, memory)]
            gone = set(await self.port.delete(tenant, [m.id for m in doomed]))
            events = [
                lifecycle.change(tenant, m, "deleted", cause=cause) for m in doomed if m.id in gone
            ]
            events += await self._correct_deleted(tenant, memory, cause)
            return Outcome(
                memory,
                events,
                await self._announce(events),
                deleted_ids=[m.id for m in doomed if m.id in gone],
            )

    async def _correct_deleted(
        self, tenant: str, memory: MemoryRecord, cause: str
    ) -> list[MemoryChanged]:
        if not (memory.is_current and lifecycle.corrects_its_turns(memory, None)):
            return []
        return await correct_turns(self.port, tenant, [memory], by="", at=utcnow(), cause=cause)

    # -- serialisation -----------------------------------------------------------------

    @asynccontextmanager
    async def _serialised(self, tenant: str, memory_id: str) -> AsyncIterator[MemoryRecord | None]:
        """Hold the lock of ``memory_id``'s lineage; yields the memory as it is now (None
        when it is gone). A current memory is its own lineage's key (one read); for a
        superseded one the lock moves to the current version found under the first."""
        key = memory_id
        for _ in range(_LOCK_ATTEMPTS):
            async with self.locks.hold("memory", tenant, key):
                lineage = await self._lineage(tenant, memory_id)
                current_id = lineage[-1].id if lineage else memory_id
                if current_id == key:
                    yield lineage[0] if lineage else None
                    return
            key = current_id
        raise LockTimeout(f"memory {memory_id} kept being replaced while waiting for it")

    async def _lineage(self, tenant: str, memory_id: str) -> list[MemoryRecord]:
        """``memory_id``'s stored state, then each version that replaced it, up to the
        current one ([] when it does not exist)."""
        memory = await self.port.get_one(tenant, memory_id)
        chain = [memory] if memory is not None else []
        seen = {memory_id}
        while chain and chain[-1].superseded_by and len(chain) < MAX_LINEAGE:
            successor_id = chain[-1].superseded_by
            if successor_id in seen:
                break
            seen.add(successor_id)
            successor = await self.port.get_one(tenant, successor_id)
            if successor is None:
                break
            chain.append(successor)
        return chain

    async def _announce(self, events: Sequence[MemoryChanged]) -> bool:
        return await self.announce(events) if events else True


async def history(port: MemoryPort, tenant: str, memory: MemoryRecord) -> list[MemoryRecord]:
    """Every superseded version that leads to ``memory`` (``superseded_by`` chains),
    oldest first. Candidates: the superseded memories of its kind of its user, in any of
    the user's conversations (where reconcile and the API put them). A read: no lock."""
    flt = MemoryFilter(user_id=memory.user_id, kinds=(memory.kind,), include_superseded=True)
    by_successor: dict[str, list[MemoryRecord]] = defaultdict(list)
    async for candidate in port.iter_list(tenant, flt):
        if candidate.superseded_by:
            by_successor[candidate.superseded_by].append(candidate)
    versions: list[MemoryRecord] = []
    frontier, visited = [memory.id], {memory.id}
    while frontier:
        for older in by_successor.get(frontier.pop(), []):
            if older.id not in visited:
                visited.add(older.id)
                versions.append(older)
                frontier.append(older.id)
    return sorted(versions, key=_version_order)


def _content_changed(stored: MemoryRecord, edited: MemoryRecord) -> bool:
    return lifecycle.text_changed(stored, edited) or sorted(stored.tags) != sorted(edited.tags)


def _version_order(memory: MemoryRecord) -> tuple[str, str]:
    end = memory.valid_to or memory.updated_at
    start = memory.valid_from or memory.created_at
    return (end.isoformat() if end else "", start.isoformat() if start else "")
