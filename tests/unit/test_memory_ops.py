"""The memory operations in-process: on the retrieval port in memory, with locks held in
this process and the announced events recorded (no nats-server, no retrieval service).
What the memory API and the mirror's edits rely on: an edit keeps the id and a history,
a delete takes the history with it, a stale precondition or a superseded version changes
nothing, edits of one memory never interleave, a fact is not created twice."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import pytest

from engram_core.events import MemoryChanged
from engram_core.memory import MemoryRecord
from engram_core.memory_ops import (
    MemoryOps,
    MemorySuperseded,
    Precondition,
    PreconditionFailed,
    history,
    version,
)
from engram_testing.memory_store import InMemoryPort

TENANT = "acme"
FACT_ID = "00000000-0000-4000-8000-000000000001"


class ProcessLocks:
    """:class:`engram_core.memory_ops.Locks` within one process, recording what was held."""

    def __init__(self) -> None:
        self._locks: defaultdict[tuple[str, ...], asyncio.Lock] = defaultdict(asyncio.Lock)
        self.held: list[tuple[str, ...]] = []

    @asynccontextmanager
    async def hold(self, *parts: str) -> AsyncIterator[None]:
        async with self._locks[parts]:
            self.held.append(parts)
            yield


class Announced:
    def __init__(self) -> None:
        self.events: list[MemoryChanged] = []

    async def __call__(self, events: Sequence[MemoryChanged]) -> bool:
        self.events.extend(events)
        return True


@pytest.fixture
def memories() -> InMemoryPort:
    return InMemoryPort()


@pytest.fixture
def announced() -> Announced:
    return Announced()


@pytest.fixture
def ops(memories: InMemoryPort, announced: Announced) -> MemoryOps:
    return MemoryOps(memories, ProcessLocks(), announced)


async def stored(memories: InMemoryPort) -> MemoryRecord:
    memory = await memories.get_one(TENANT, FACT_ID)
    assert memory is not None
    return memory


def fact(text: str, **fields: object) -> MemoryRecord:
    values: dict[str, object] = {
        "id": FACT_ID,
        "kind": "fact",
        "text": text,
        "user_id": "u1",
        "conversation_id": "c1",
        "created_at": datetime(2026, 2, 1, tzinfo=UTC),
        **fields,
    }
    return MemoryRecord.model_validate(values)


async def test_an_edit_keeps_the_id_and_the_state_before_as_history(
    ops: MemoryOps, memories: InMemoryPort, announced: Announced
) -> None:
    await ops.create(TENANT, fact("The user lives in Porto."), cause="api")
    edited = await ops.edit(TENANT, FACT_ID, cause="api", text="The user lives in Lisbon.")

    assert (edited.memory.id, edited.memory.text) == (FACT_ID, "The user lives in Lisbon.")
    [before] = await history(memories, TENANT, edited.memory)
    assert (before.text, before.superseded_by) == ("The user lives in Porto.", FACT_ID)
    assert [(e.op, e.memory.id) for e in announced.events] == [
        ("created", FACT_ID),
        ("superseded", before.id),
        ("updated", FACT_ID),
    ]


async def test_a_delete_takes_the_history_with_it(
    ops: MemoryOps, memories: InMemoryPort, announced: Announced
) -> None:
    await ops.create(TENANT, fact("Likes tea."), cause="api")
    await ops.edit(TENANT, FACT_ID, cause="api", text="Likes green tea.")
    [before] = await history(
        memories, TENANT, (await memories.get_one(TENANT, FACT_ID)) or fact("")
    )

    deleted = await ops.delete(TENANT, FACT_ID, cause="api")

    assert sorted(deleted.deleted_ids) == sorted([FACT_ID, before.id])
    assert memories.records(TENANT) == []
    assert {(e.op, e.memory.id) for e in deleted.events} == {
        ("deleted", FACT_ID),
        ("deleted", before.id),
    }


async def test_a_stale_precondition_or_a_superseded_version_changes_nothing(
    ops: MemoryOps, memories: InMemoryPort
) -> None:
    created = await ops.create(TENANT, fact("Has a cat."), cause="api")
    stale = Precondition(frozenset({version(created.memory)}))
    await ops.edit(TENANT, FACT_ID, cause="api", text="Has two cats.")
    with pytest.raises(PreconditionFailed):
        await ops.edit(TENANT, FACT_ID, cause="api", text="Has a dog.", precondition=stale)
    [before] = await history(
        memories, TENANT, (await memories.get_one(TENANT, FACT_ID)) or fact("")
    )
    with pytest.raises(MemorySuperseded):
        await ops.edit(TENANT, before.id, cause="api", text="Has a hamster.")
    assert (await stored(memories)).text == "Has two cats."


async def test_edits_of_one_memory_never_interleave(ops: MemoryOps, memories: InMemoryPort) -> None:
    await ops.create(TENANT, fact("Version 0."), cause="api")
    memories.upsert_delay_s = 0.01  # every write yields: unserialised edits would interleave
    await asyncio.gather(
        *(ops.edit(TENANT, FACT_ID, cause="api", text=f"Version {n}.") for n in range(1, 6))
    )
    current = await stored(memories)
    versions = await history(memories, TENANT, current)
    # each edit saw the one before it: five history versions, each text once
    assert len(versions) == 5
    texts = [v.text for v in versions] + [current.text]
    assert sorted(texts) == [f"Version {n}." for n in range(6)]


async def test_a_fact_said_twice_is_created_once(
    ops: MemoryOps, memories: InMemoryPort, announced: Announced
) -> None:
    first = await ops.create(TENANT, fact("The user is vegetarian."), cause="api")
    again = await ops.create(
        TENANT,
        fact("The user is vegetarian.", id="00000000-0000-4000-8000-000000000002"),
        cause="api",
    )
    assert again.duplicate_of == first.memory.id
    assert [r.id for r in memories.records(TENANT)] == [FACT_ID]
    assert len(announced.events) == 1
