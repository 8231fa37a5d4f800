"""The read-only admin endpoints against the real nats-server, with two tenants: queue
numbers of the workers' durable consumers, and each tenant's own dead letters only."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx2
import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from engram_core.bus import ensure_consumer
from engram_core.events import (
    STREAM_NAME,
    DeadLetter,
    FactProposed,
    TurnPersisted,
    dlq_subject,
)
from engram_gateway.keys import entry_for

from .conftest import RunningGateway, StartGateway

KEY_A, KEY_B = "key-of-tenant-a", "key-of-tenant-b"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
KEYS = f"{entry_for(KEY_A, 'tenant-a')},{entry_for(KEY_B, 'tenant-b')}"
FAILED_AT = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def keyed(start_gateway: StartGateway) -> RunningGateway:
    return await start_gateway(api_keys=KEYS)


@pytest.fixture
async def http(keyed: RunningGateway) -> httpx2.AsyncClient:
    return keyed.client()


def turn(tenant: str, conversation: str = "c1") -> TurnPersisted:
    return TurnPersisted(
        tenant=tenant, conversation_id=conversation, turn_id=f"t-{tenant}", role="user", text="hi"
    )


async def dead_letter(nats_url: str, worker: str, event: TurnPersisted | None, reason: str) -> int:
    """Store a dead letter the way the runtime writes one; its stream sequence."""
    body = event.model_dump_json() if event is not None else "{not json"
    letter = DeadLetter(
        worker=worker,
        subject=TurnPersisted.subject,
        reason=reason,
        deliveries=3,
        original_headers={"Nats-Msg-Id": event.event_id} if event is not None else {},
        original_body=body,
        failed_at=FAILED_AT,
    )
    nc = await nats.connect(nats_url)
    try:
        ack = await nc.jetstream().publish(
            dlq_subject(worker), letter.model_dump_json().encode(), stream=STREAM_NAME
        )
        return int(ack.seq)
    finally:
        await nc.close()


async def test_dead_letters_are_shown_to_their_tenant_only(
    http: httpx2.AsyncClient, nats_url: str
) -> None:
    event_a = turn("tenant-a", "trip")
    seq_a = await dead_letter(nats_url, "ingest", event_a, "retrieval Upsert failed: INVALID")
    await dead_letter(nats_url, "ingest", turn("tenant-b"), "b's failure")
    await dead_letter(nats_url, "reconcile", turn("tenant-b"), "b's other failure")
    await dead_letter(nats_url, "ingest", None, "malformed event: body: Invalid JSON")

    response = await http.get("/v1/admin/dead-letters", headers=A)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "object": "list",
        "data": [
            {
                "id": seq_a,
                "worker": "ingest",
                "subject": TurnPersisted.subject,
                "reason": "retrieval Upsert failed: INVALID",
                "deliveries": 3,
                "failed_at": "2026-05-01T12:00:00Z",
                "event_id": event_a.event_id,
                "conversation_id": "trip",
            }
        ],
    }

    seen_by_b = (await http.get("/v1/admin/dead-letters", headers=B)).json()["data"]
    assert sorted(letter["reason"] for letter in seen_by_b) == ["b's failure", "b's other failure"]
    only_reconcile = await http.get("/v1/admin/dead-letters?worker=reconcile&limit=5", headers=B)
    assert [d["worker"] for d in only_reconcile.json()["data"]] == ["reconcile"]
    first = await http.get("/v1/admin/dead-letters?limit=1", headers=B)
    assert [d["reason"] for d in first.json()["data"]] == ["b's failure"]  # oldest first


async def test_consumers_report_queue_numbers_and_the_callers_dead_letters(
    http: httpx2.AsyncClient, nats_url: str
) -> None:
    for name, subject in (("ingest", TurnPersisted.subject), ("reconcile", FactProposed.subject)):
        await ensure_consumer(
            nats_url,
            ConsumerConfig(
                name=name,
                durable_name=name,
                filter_subject=subject,
                ack_policy=AckPolicy.EXPLICIT,
            ),
        )
    nc = await nats.connect(nats_url)
    try:
        for _ in range(2):  # two turns nobody consumed yet: ingest's lag
            event = turn("tenant-a")
            await nc.jetstream().publish(
                event.subject,
                event.model_dump_json().encode(),
                headers={"Nats-Msg-Id": event.event_id},
            )
    finally:
        await nc.close()
    await dead_letter(nats_url, "ingest", turn("tenant-a"), "a")
    await dead_letter(nats_url, "ingest", turn("tenant-b"), "b")
    await dead_letter(nats_url, "reconcile", turn("tenant-b"), "b")

    for headers, ingest_letters, reconcile_letters in ((A, 1, 0), (B, 1, 1)):
        response = await http.get("/v1/admin/consumers", headers=headers)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "list"
        by_worker = {c["worker"]: c for c in body["data"]}
        assert set(by_worker) == {"ingest", "reconcile"}
        assert by_worker["ingest"] == {
            "worker": "ingest",
            "subject": TurnPersisted.subject,
            "pending": 2,
            "ack_pending": 0,
            "redelivered": 0,
            "dead_letters": ingest_letters,
        }
        assert by_worker["reconcile"]["subject"] == FactProposed.subject
        assert by_worker["reconcile"]["dead_letters"] == reconcile_letters


async def test_admin_views_need_a_key_and_valid_parameters(http: httpx2.AsyncClient) -> None:
    assert (await http.get("/v1/admin/consumers")).status_code == 401
    for query in ("limit=0", "limit=abc", "worker=../x", "colour=red"):
        response = await http.get(f"/v1/admin/dead-letters?{query}", headers=A)
        assert response.status_code == 400, (query, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    empty = await http.get("/v1/admin/dead-letters", headers=A)
    assert empty.json() == {"object": "list", "data": []}
