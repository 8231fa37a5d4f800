"""The read-only admin endpoints against the real nats-server, with two tenants and an
operator's (admin) key: queue numbers of the workers' durable consumers and every
tenant's dead letters, for the admin key only; a tenant's ordinary key gets a 403."""

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
    MemoryChanged,
    TurnPersisted,
    dlq_subject,
)
from engram_gateway.keys import entry_for

from .conftest import RunningGateway, StartGateway

KEY_A, KEY_B, KEY_OPS = "key-of-tenant-a", "key-of-tenant-b", "key-of-the-operator"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
OPS = {"Authorization": f"Bearer {KEY_OPS}"}
KEYS = ",".join(
    (
        entry_for(KEY_A, "tenant-a"),
        entry_for(KEY_B, "tenant-b"),
        entry_for(KEY_OPS, "ops", admin=True),
    )
)
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


async def test_an_admin_key_sees_every_tenants_dead_letters_and_can_select_one(
    http: httpx2.AsyncClient, nats_url: str
) -> None:
    event_a = turn("tenant-a", "trip")
    seq_a = await dead_letter(nats_url, "ingest", event_a, "retrieval Upsert failed: INVALID")
    await dead_letter(nats_url, "ingest", turn("tenant-b"), "b's failure")
    await dead_letter(nats_url, "reconcile", turn("tenant-b"), "b's other failure")
    await dead_letter(nats_url, "ingest", None, "malformed event: body: Invalid JSON")

    response = await http.get("/v1/admin/dead-letters?tenant=tenant-a", headers=OPS)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "object": "list",
        "data": [
            {
                "id": seq_a,
                "worker": "ingest",
                "tenant": "tenant-a",
                "subject": TurnPersisted.subject,
                "reason": "retrieval Upsert failed: INVALID",
                "deliveries": 3,
                "failed_at": "2026-05-01T12:00:00Z",
                "event_id": event_a.event_id,
                "conversation_id": "trip",
            }
        ],
    }

    every = (await http.get("/v1/admin/dead-letters", headers=OPS)).json()["data"]
    assert [(d["tenant"], d["reason"]) for d in every] == [
        ("tenant-a", "retrieval Upsert failed: INVALID"),
        ("tenant-b", "b's failure"),
        ("tenant-b", "b's other failure"),
        (None, "malformed event: body: Invalid JSON"),
    ]
    of_b = await http.get("/v1/admin/dead-letters?tenant=tenant-b&worker=reconcile", headers=OPS)
    assert [d["reason"] for d in of_b.json()["data"]] == ["b's other failure"]
    first = await http.get("/v1/admin/dead-letters?tenant=tenant-b&limit=1", headers=OPS)
    assert [d["reason"] for d in first.json()["data"]] == ["b's failure"]  # oldest first


async def test_consumers_report_queue_numbers_and_dead_letters_to_an_admin(
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
    # a worker of some memory changes filters on several subjects
    evict_subjects = MemoryChanged.subjects_where(lambda kind, op: op == "created")
    await ensure_consumer(
        nats_url,
        ConsumerConfig(
            name="evict",
            durable_name="evict",
            filter_subjects=list(evict_subjects),
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

    response = await http.get("/v1/admin/consumers", headers=OPS)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    by_worker = {c["worker"]: c for c in body["data"]}
    assert set(by_worker) == {"ingest", "reconcile", "evict"}
    assert by_worker["ingest"] == {
        "worker": "ingest",
        "subject": TurnPersisted.subject,
        "subjects": [TurnPersisted.subject],
        "pending": 2,
        "ack_pending": 0,
        "redelivered": 0,
        "dead_letters": 2,
    }
    assert by_worker["reconcile"]["subject"] == FactProposed.subject
    assert by_worker["reconcile"]["dead_letters"] == 1
    assert by_worker["evict"]["subject"] == MemoryChanged.subject
    assert by_worker["evict"]["subjects"] == list(evict_subjects)


async def test_a_tenants_key_is_refused_every_admin_view(
    http: httpx2.AsyncClient, nats_url: str
) -> None:
    await dead_letter(nats_url, "ingest", turn("tenant-a"), "a's failure")
    for headers in (A, B):
        for path in (
            "/v1/admin/consumers",
            "/v1/admin/dead-letters",
            "/v1/admin/dead-letters?tenant=tenant-a",
            "/v1/admin/dead-letters?limit=0",  # refused before its parameters are read
        ):
            response = await http.get(path, headers=headers)
            assert response.status_code == 403, (path, response.text)
            error = response.json()["error"]
            assert (error["type"], error["code"]) == ("permission_error", "admin_key_required")
            assert "admin key" in error["message"]
            assert "tenant-a" not in response.text and "pending" not in response.text


async def test_admin_views_need_a_key_and_valid_parameters(http: httpx2.AsyncClient) -> None:
    assert (await http.get("/v1/admin/consumers")).status_code == 401
    for query in ("limit=0", "limit=abc", "worker=../x", "tenant=../x", "colour=red"):
        response = await http.get(f"/v1/admin/dead-letters?{query}", headers=OPS)
        assert response.status_code == 400, (query, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    empty = await http.get("/v1/admin/dead-letters", headers=OPS)
    assert empty.json() == {"object": "list", "data": []}


async def test_without_keys_the_local_operator_is_the_admin(
    start_gateway: StartGateway,
) -> None:
    local = (await start_gateway()).client()
    for path in ("/v1/admin/consumers", "/v1/admin/dead-letters"):
        response = await local.get(path)
        assert response.status_code == 200, (path, response.text)
