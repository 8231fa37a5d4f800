"""A worker's ``/metrics``: events processed and dead-lettered, and its consumer's lag.

The meter provider is the process's (installed once); counters only grow, so the test
compares each sample before and after its own messages.
"""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families

from engram_cli.stack.nats_server import free_port
from engram_core.bus import publish_event
from engram_core.events import STREAM_NAME, TurnPersisted
from engram_core.metrics import prometheus_exposition, setup_metrics

pytestmark = pytest.mark.integration

LABELS = {"engram_worker": "ingest", "messaging_destination_name": TurnPersisted.subject}


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                return found.value
    return None


def value(text: str, name: str, **labels: str) -> float:
    """A counter's value; one that has not counted yet is not exported at all."""
    return sample(text, name, **labels) or 0.0


def scrape(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return reply.headers["Content-Type"], reply.read().decode()


async def test_metrics_count_handled_and_dead_lettered_events(
    ingest, publisher, eventually
) -> None:
    setup_metrics(Resource.create({"service.name": "engram-ingest-test"}))
    before = prometheus_exposition()[0].decode()
    port = free_port()
    await ingest.start(health_port=port, health_host="127.0.0.1")

    await publish_event(
        publisher,
        TurnPersisted(
            tenant="acme", conversation_id="c1", turn_id="t-m", role="user", text="I like tea."
        ),
    )
    await publisher.publish(b"{not json", subject=TurnPersisted.subject, stream=STREAM_NAME)
    await ingest.dead_letters(1)
    await eventually(ingest.settled, what="the ack and the dead letter")

    content_type, text = await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}/metrics")
    assert content_type.startswith("text/plain")
    for name in ("engram_events_processed_total", "engram_events_dead_lettered_total"):
        assert value(text, name, **LABELS) - value(before, name, **LABELS) == 1, name
    assert value(text, "engram_events_redelivered_total", **LABELS) == value(
        before, "engram_events_redelivered_total", **LABELS
    )
    # read from JetStream at scrape time: everything was delivered
    assert sample(text, "engram_consumer_pending", engram_worker="ingest") == 0
    # the dead letter is stored until someone replays or drops it
    assert sample(text, "engram_dead_letters", engram_worker="ingest") == 1
