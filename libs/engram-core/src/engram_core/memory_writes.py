"""Applying lifecycle changes: write them through the port, then say what to announce.

The rules are :mod:`engram_core.lifecycle` (pure); this is the little I/O every writer
repeats around them: one Upsert for a batch of changed records, the stored states back
(timestamps included) for the ``memory.changed`` events, and the correction of the turns
a superseded, deleted or rewritten fact came from. Callers publish the returned events
on their own bus connection (a worker's broker, the gateway's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from engram_core import lifecycle
from engram_core.events import MemoryChanged, MemoryChangeOp
from engram_core.memory import MemoryRecord, UpsertStatus
from engram_core.memory_port import MemoryPort


@dataclass(frozen=True)
class Change:
    """One planned write: the new state of a memory and how to announce it."""

    record: MemoryRecord
    op: MemoryChangeOp
    cause: str
    related: tuple[str, ...] = ()


async def apply(port: MemoryPort, tenant: str, changes: Sequence[Change]) -> list[MemoryChanged]:
    """Write every change in one Upsert; the announcements of what was written, in order.

    A change the store reports as unchanged is announced all the same: a writer that
    repeats itself (a redelivery after a crash) re-publishes the same event id, which
    JetStream drops if the first one went out.
    """
    stored = await port.upsert(tenant, [c.record for c in changes])
    return [
        lifecycle.change(tenant, s.record, _op(c.op, s.status), cause=c.cause, related=c.related)
        for c, s in zip(changes, stored, strict=True)
    ]


def _op(planned: MemoryChangeOp, status: UpsertStatus) -> MemoryChangeOp:
    # "created" for a memory that already existed (the same fact stated again through
    # another path) is an update of it.
    if planned == "created" and status is UpsertStatus.UPDATED:
        return "updated"
    return planned


async def correct_turns(
    port: MemoryPort,
    tenant: str,
    outdated: Sequence[MemoryRecord],
    *,
    by: str,
    at: datetime,
    cause: str,
) -> list[MemoryChanged]:
    """Mark the source turns of ``outdated`` facts as corrected (by the memory ``by``,
    "" when the information was retracted) and return their announcements. A turn marked
    by this same correction before (a writer repeating itself) is announced again as it
    stands; turns gone, of another kind, or corrected by something else are left alone."""
    turn_ids = lifecycle.source_turn_ids(outdated)
    if not turn_ids:
        return []
    turns = await port.get(tenant, turn_ids)
    marked: list[MemoryRecord] = []
    for turn_id in turn_ids:
        turn = turns.get(turn_id)
        if turn is None or turn.kind != "turn":
            continue
        record = lifecycle.corrected(turn, by=by, at=at)
        if record is not None:
            marked.append(record)
        elif turn.metadata.get(lifecycle.CORRECTED_BY) == by and by:
            marked.append(turn)
    related = (by,) if by else ()
    return await apply(port, tenant, [Change(r, "updated", cause, related) for r in marked])
