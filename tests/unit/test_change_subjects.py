"""Which subject a memory change is published on, from what the stream's consumers say
(engram_core.bus.ChangeSubjects); against a real server in
services/workers/tests/test_stream_and_consumer.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import cast

from faststream.nats import NatsBroker
from nats.js.api import ConsumerConfig

from engram_core.bus import ChangeSubjects
from engram_core.events import MemoryChanged, TurnPersisted
from engram_core.memory import MemoryRecord

CHANGE = MemoryChanged(
    tenant="t", op="created", memory=MemoryRecord(id="m1", kind="fact", text="User has a cat.")
)
OWN = "engram.memory.changed.v1.fact.created"
BARE = "engram.memory.changed.v1"


@dataclass
class Consumer:
    name: str
    config: ConsumerConfig


@dataclass
class Stream:
    """What ``consumers_info`` answers: these consumers, or an error while NATS is away."""

    consumers: list[Consumer] = field(default_factory=list)
    away: bool = False
    reads: int = 0
    gate: asyncio.Event | None = None

    async def consumers_info(self, stream: str) -> list[Consumer]:
        self.reads += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.away:
            raise ConnectionError("nats: no servers available")
        return self.consumers

    def jetstream(self, timeout: float) -> Stream:
        return self

    @property
    def connection(self) -> Stream:
        return self


def broker(stream: Stream) -> NatsBroker:
    return cast(NatsBroker, stream)


async def test_changes_go_on_their_own_subject_once_no_consumer_filters_on_the_bare_one() -> None:
    new = Consumer("mirror", ConsumerConfig(filter_subjects=[BARE, f"{BARE}.>"]))
    old = Consumer("evict", ConsumerConfig(filter_subject=BARE))
    stream = Stream([new, old])
    subjects = ChangeSubjects(recheck_s=0)
    assert await subjects.subject(broker(stream), CHANGE) == BARE
    stream.consumers = [new, Consumer("other", ConsumerConfig(filter_subject="engram.>"))]
    assert await subjects.subject(broker(stream), CHANGE) == OWN
    # an event of one subject never asks
    turn = TurnPersisted(tenant="t", turn_id="1", role="user", text="hi")
    reads = stream.reads
    assert await subjects.subject(broker(stream), turn) == TurnPersisted.subject
    assert stream.reads == reads


async def test_until_the_consumers_could_be_read_changes_go_on_the_bare_subject() -> None:
    stream = Stream(away=True)
    subjects = ChangeSubjects(recheck_s=60)
    assert await subjects.subject(broker(stream), CHANGE) == BARE
    stream.away = False  # back: read at the next publish, not 60 s later
    assert await subjects.subject(broker(stream), CHANGE) == OWN
    assert stream.reads == 2
    assert await subjects.subject(broker(stream), CHANGE) == OWN
    assert stream.reads == 2  # read again only after recheck_s


async def test_publishes_during_a_read_do_not_read_again() -> None:
    gate = asyncio.Event()
    stream = Stream(gate=gate)
    subjects = ChangeSubjects(recheck_s=60)
    first = asyncio.create_task(subjects.subject(broker(stream), CHANGE))
    await asyncio.sleep(0)
    others = await asyncio.gather(*(subjects.subject(broker(stream), CHANGE) for _ in range(20)))
    assert set(others) == {BARE}  # what is known while the read is under way
    gate.set()
    assert await first == OWN
    assert stream.reads == 1
