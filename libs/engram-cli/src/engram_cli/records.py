"""Memories the CLI writes itself (``engram import --via grpc`` and the benchmarks), as
domain records for :class:`~engram_core.memory_port.MemoryPort`.

Each gets the id retrieval derives for a memory written without one
(:func:`engram_core.ids.memory_id`: tenant, scope, kind, role and source id or text), so
writing the same memory again rewrites it instead of adding a copy, as when the service
named it.
"""

from __future__ import annotations

from typing import Any

from engram_core import ids
from engram_core.memory import MemoryRecord

#: The id a draft carries until its own is derived (it takes no part in the derivation).
_DRAFT = "draft"


def new_memory(tenant: str, **fields: Any) -> MemoryRecord:
    """A :class:`MemoryRecord` of ``fields`` with its content-derived id."""
    draft = MemoryRecord(id=_DRAFT, **fields)
    return draft.model_copy(update={"id": ids.memory_id(tenant, draft)})
