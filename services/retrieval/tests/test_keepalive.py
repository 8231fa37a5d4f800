"""gRPC keepalive: the retrieval server accepts the pings its clients send, idle or busy,
because both sides take their policy from one setting (``ENGRAM_GRPC_KEEPALIVE_S``,
engram_core.retrieval_client). A server that refuses them answers with GOAWAY
``too_many_pings`` and every caller reconnects (issue 29.8)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from engram_core.codec import pb
from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.embedder import Embedder
from engram_retrieval.server import build_server
from engram_retrieval.settings import RetrievalSettings

#: Short, so that an idle period spans many pings; gRPC paces idle pings to about one a
#: second whatever is asked, and the server's default policy (one per 5 minutes) sends
#: GOAWAY at the third early one.
KEEPALIVE_S = 0.2
IDLE_S = 5.0


async def states_while_idle(
    client: RetrievalClient, seconds: float
) -> set[grpc.ChannelConnectivity]:
    seen = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.add(client.connectivity())
        await asyncio.sleep(0.02)
    return seen


async def busy(client: RetrievalClient, round_: int) -> None:
    memories = [
        pb.Memory(kind=pb.MEMORY_KIND_FACT, text=f"Fact {round_}.{i} about tea.", user_id="u1")
        for i in range(8)
    ]
    await client.upsert(pb.UpsertRequest(tenant="acme", memories=memories))
    await asyncio.gather(
        *(
            client.search(pb.SearchRequest(tenant="acme", query=f"tea {i}", user_id="u1"))
            for i in range(16)
        )
    )


@pytest.mark.integration
async def test_a_client_that_idles_between_bursts_keeps_its_connection(
    tmp_path: Path, embedder: Embedder, capfd: pytest.CaptureFixture[str]
) -> None:
    settings = RetrievalSettings(
        data_dir=tmp_path / "data", retrieval_listen="127.0.0.1:0", grpc_keepalive_s=KEEPALIVE_S
    )
    server = await build_server(settings, embedder=embedder)
    client = RetrievalClient(server.address, keepalive_s=settings.grpc_keepalive_s)
    seen: set[grpc.ChannelConnectivity] = set()
    try:
        for round_ in range(3):
            await busy(client, round_)
            seen |= await states_while_idle(client, IDLE_S)
    finally:
        await client.close()
        await server.stop(grace_s=0)
    assert seen == {grpc.ChannelConnectivity.READY}, "the connection was dropped and re-made"
    # gRPC core logs the GOAWAY it receives (at ERROR, on stderr) when it happens.
    assert "too_many_pings" not in capfd.readouterr().err
