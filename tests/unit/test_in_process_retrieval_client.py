"""The retrieval client of a servicer in the same process (``engram up``'s light layout):
what a caller relies on of a channel holds without one. The contract of every port
method against the real service is in ``test_memory_port_contract.py`` (its
``in-process`` case); here, what that contract cannot show: deadlines and the metadata a
call carries to the servicer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

from engram_core import retrieval_client
from engram_core.codec import pb, pb_grpc
from engram_core.memory import MemoryFilter
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.retrieval_client import InProcessRetrievalClient


class SlowCounter(pb_grpc.MemoryServiceServicer):
    """Counts after ``delay_s``; remembers the metadata of each call."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.metadata: list[dict[str, Any]] = []

    async def Count(self, request: pb.CountRequest, context: Any) -> pb.CountResponse:
        self.metadata.append(dict(context.invocation_metadata()))
        await asyncio.sleep(self.delay_s)
        if not request.tenant:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "tenant is required")
        return pb.CountResponse(count=7)


async def test_a_call_past_its_deadline_fails_as_a_channel_call_would() -> None:
    port = MemoryPort(InProcessRetrievalClient(SlowCounter(delay_s=1.0), timeout_s=0.05))
    with pytest.raises(RetrievalError) as late:
        await port.count("acme", MemoryFilter())
    assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_an_abort_reaches_the_caller_and_the_trace_context_reaches_the_servicer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @contextmanager
    def traced_call(service: str, method: str) -> Iterator[tuple[tuple[str, str], ...]]:
        yield (("traceparent", f"00-{'1' * 32}-{'2' * 16}-01"),)

    monkeypatch.setattr(retrieval_client, "client_call", traced_call)
    servicer = SlowCounter(delay_s=0)
    port = MemoryPort(InProcessRetrievalClient(servicer))
    assert (await port.count("acme", MemoryFilter())).total == 7
    with pytest.raises(RetrievalError) as refused:
        await port.count("", MemoryFilter())
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "tenant is required" in str(refused.value)
    # the CLIENT span's context travels as over gRPC, so the SERVER span continues it
    assert [m["traceparent"] for m in servicer.metadata] == [f"00-{'1' * 32}-{'2' * 16}-01"] * 2
