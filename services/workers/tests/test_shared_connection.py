"""Workers run together share one NATS connection (``engram-workers``, ``engram up
--light``), and nothing about delivery changes: each still has its own durable consumer
and gets every message of its subjects. Against a real nats-server."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from engram_core.settings import ConfigError
from engram_testing.worker_stack import consumer_settled
from engram_workers.all_in_one import Selected, serve_together, shared_connection
from engram_workers.runtime import Worker

from .test_batches import Probe, probe_settings, publish_all, turn

pytestmark = pytest.mark.integration


async def test_workers_of_one_process_share_one_connection_and_each_gets_every_message(
    nats_url: str, publisher: Any, eventually: Any
) -> None:
    first, second = Probe(), Probe()
    specs = [
        replace(first.spec(batch_hook=False), name="shared-a"),
        replace(second.spec(batch_hook=False), name="shared-b"),
    ]
    selected = [Selected(spec, probe_settings(nats_url)) for spec in specs]
    connection = shared_connection(selected, "engram-workers-test")
    workers = [Worker(s.spec, s.settings, connection=connection) for s in selected]
    stop = asyncio.Event()
    serving = asyncio.create_task(serve_together(workers, stop, connection))
    try:
        await eventually(lambda: all(w.consuming for w in workers), what="both consuming")
        # one connection under both, the one the shared broker opened
        assert workers[0].broker is workers[1].broker is connection.broker
        assert connection.broker.connection.is_connected
        events = [turn(f"shared {i}") for i in range(6)]
        await publish_all(publisher, nats_url, events)
        for name in ("shared-a", "shared-b"):
            await eventually(lambda n=name: consumer_settled(nats_url, n), what=f"{name} acks")
        await eventually(
            lambda: len(first.handled) == len(second.handled) == len(events),
            what="every message to each",
        )
        # publishing goes through the shared connection too
        await workers[0].publish(turn("from a worker"))
        await eventually(lambda: len(second.handled) == len(events) + 1, what="the follow-up")
    finally:
        stop.set()
        await asyncio.wait_for(serving, 30)
    assert sorted(e.text for e in first.handled) == sorted(e.text for e in second.handled)
    # drained once every worker had stopped
    assert not any(w.consuming for w in workers)
    assert connection.broker._connection is None


def test_workers_naming_different_nats_servers_cannot_share_one(nats_url: str) -> None:
    spec = Probe().spec(batch_hook=False)
    selected = [
        Selected(spec, probe_settings(nats_url)),
        Selected(spec, probe_settings("nats://127.0.0.1:1")),
    ]
    with pytest.raises(ConfigError, match="several NATS URLs"):
        shared_connection(selected, "x")
