"""Changes of one memory sent together, through two gateways (two pods) on one real
retrieval service and one real nats-server: every change is applied whole and in one
order (:mod:`engram_core.memory_ops`), so a DELETE that answered 200 leaves nothing
behind and no PATCH that answered 200 is lost; ``ETag`` / ``If-Match`` let a client
make its own change conditional (412 when the memory changed meanwhile)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from engram_gateway.keys import entry_for
from engram_testing.worker_stack import RealRetrieval, running_retrieval

from .conftest import JetStreamReader, StartGateway

KEY = "key-of-the-racing-tenant"
AUTH = {"Authorization": f"Bearer {KEY}"}
MEM = "/v1/memories"


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


@pytest.fixture
async def pods(start_gateway: StartGateway, retrieval: RealRetrieval) -> list[httpx2.AsyncClient]:
    """Clients of two gateways sharing the retrieval service and NATS."""
    keys = entry_for(KEY, "racing")
    first = await start_gateway(retrieval_address=retrieval.address, api_keys=keys)
    second = await start_gateway(retrieval_address=retrieval.address, api_keys=keys)
    return [first.client(), second.client()]


async def _create(http: httpx2.AsyncClient, text: str, conversation: str) -> str:
    response = await http.post(MEM, json={"text": text, "conversation": conversation}, headers=AUTH)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


async def _everything(http: httpx2.AsyncClient, conversation: str) -> list[dict[str, Any]]:
    listed = await http.get(
        MEM,
        params={"conversation": conversation, "include_superseded": "true", "limit": 500},
        headers=AUTH,
    )
    assert listed.status_code == 200, listed.text
    return list(listed.json()["data"])


def _last_change_by_id(changes: list[dict[str, Any]]) -> dict[str, str]:
    last: dict[str, str] = {}
    for change in changes:
        last[change["memory"]["id"]] = change["op"]
    return last


async def _changes(jetstream: JetStreamReader) -> list[dict[str, Any]]:
    events = await jetstream.events(await jetstream.count())
    return [e.data for e in events if e.subject.startswith("engram.memory.changed")]


async def test_a_delete_that_answered_200_leaves_nothing_behind_whatever_the_interleaving(
    pods: list[httpx2.AsyncClient], jetstream: JetStreamReader
) -> None:
    """One DELETE and four PATCHes of one memory at once, through both pods, several
    rounds: whenever the DELETE answered 200 the memory is gone — GET 404, not listed
    (history included), not found by search, no version left that names it — and the
    last announcement of each of its versions (what the mirror follows) is a deletion."""
    deleted_rounds = 0
    for round_no in range(8):
        conversation = f"race-{round_no}"
        memory_id = await _create(pods[0], f"User's locker code is {round_no}00.", conversation)
        requests = [
            pods[i % 2].patch(
                f"{MEM}/{memory_id}",
                json={"text": f"User's locker code is {round_no}0{i + 1}."},
                headers=AUTH,
            )
            for i in range(4)
        ]
        requests.insert(round_no % 5, pods[round_no % 2].delete(f"{MEM}/{memory_id}", headers=AUTH))
        answers = await asyncio.gather(*requests)
        deletion = answers[round_no % 5]
        assert deletion.status_code in (200, 404), deletion.text
        for patch in answers[: round_no % 5] + answers[round_no % 5 + 1 :]:
            assert patch.status_code in (200, 404), patch.text
        if deletion.status_code != 200:
            continue
        deleted_rounds += 1
        for pod in pods:
            assert (await pod.get(f"{MEM}/{memory_id}", headers=AUTH)).status_code == 404
            assert (await pod.get(f"{MEM}/{memory_id}/history", headers=AUTH)).status_code == 404
        left = await _everything(pods[0], conversation)
        assert left == [], f"round {round_no}: {[(m['id'], m['text']) for m in left]}"
        found = await pods[1].post(
            f"{MEM}/search",
            json={"query": "locker code", "conversation": conversation, "include_superseded": True},
            headers=AUTH,
        )
        assert found.status_code == 200, found.text
        assert found.json()["hits"] == []
    assert deleted_rounds == 8  # a DELETE of an existing memory always succeeds

    last = _last_change_by_id(await _changes(jetstream))
    alive = {memory_id for memory_id, op in last.items() if op not in ("deleted", "evicted")}
    assert alive == set(), "the mirror would keep live files beside the tombstones"


async def test_twenty_patches_at_once_each_end_current_or_in_history(
    pods: list[httpx2.AsyncClient], jetstream: JetStreamReader
) -> None:
    """20 PATCHes of one memory at once, through both pods: every text that answered 200
    is the current text or a history version (none lost), and the announcements leave
    the mirror with exactly the index's current text and versions."""
    memory_id = await _create(pods[0], "User's favourite number is 0.", "twenty")
    texts = [f"User's favourite number is {n}." for n in range(1, 21)]
    answers = await asyncio.gather(
        *(
            pods[n % 2].patch(f"{MEM}/{memory_id}", json={"text": text}, headers=AUTH)
            for n, text in enumerate(texts)
        )
    )
    accepted = {
        text for text, answer in zip(texts, answers, strict=True) if answer.status_code == 200
    }
    for answer in answers:
        assert answer.status_code == 200, answer.text
    current = (await pods[1].get(f"{MEM}/{memory_id}", headers=AUTH)).json()
    history = (await pods[0].get(f"{MEM}/{memory_id}/history", headers=AUTH)).json()["data"]
    kept = {current["text"], *(v["text"] for v in history)}
    assert accepted <= kept, f"lost: {sorted(accepted - kept)}"
    assert len(history) == 20  # the original and 19 of the 20 edits; the last is current

    # The mirror's view: the last announced state of every id is what the index holds.
    index = {m["id"]: m for m in await _everything(pods[0], "twenty")}
    announced: dict[str, dict[str, Any]] = {}
    for change in await _changes(jetstream):
        announced[change["memory"]["id"]] = change["memory"]
    assert set(announced) == set(index)
    for version_id, memory in index.items():
        assert announced[version_id]["text"] == memory["text"]
        assert announced[version_id]["superseded_by"] == memory["superseded_by"]


async def test_etag_and_if_match_make_a_change_conditional(
    pods: list[httpx2.AsyncClient],
) -> None:
    memory_id = await _create(pods[0], "User's desk is by the window.", "etag")
    fetched = await pods[0].get(f"{MEM}/{memory_id}", headers=AUTH)
    etag = fetched.headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"') and not etag.startswith("W/")
    assert (await pods[1].get(f"{MEM}/{memory_id}", headers=AUTH)).headers["ETag"] == etag

    edited = await pods[1].patch(
        f"{MEM}/{memory_id}",
        json={"text": "User's desk is by the door."},
        headers={**AUTH, "If-Match": etag},
    )
    assert edited.status_code == 200, edited.text
    new_etag = edited.headers["ETag"]
    assert new_etag != etag
    assert (await pods[0].get(f"{MEM}/{memory_id}", headers=AUTH)).headers["ETag"] == new_etag

    # The first version's tag no longer matches: neither an edit nor a delete happens.
    for stale in (
        pods[0].patch(
            f"{MEM}/{memory_id}", json={"text": "lost"}, headers={**AUTH, "If-Match": etag}
        ),
        pods[0].delete(f"{MEM}/{memory_id}", headers={**AUTH, "If-Match": etag}),
        pods[0].delete(f"{MEM}/{memory_id}", headers={**AUTH, "If-Match": f"W/{new_etag}"}),
    ):
        refused = await stale
        assert refused.status_code == 412, refused.text
        assert refused.json()["error"]["code"] == "precondition_failed"
        assert refused.json()["error"]["type"] == "invalid_request_error"
    malformed = await pods[0].delete(f"{MEM}/{memory_id}", headers={**AUTH, "If-Match": "abc"})
    assert (malformed.status_code, malformed.json()["error"]["code"]) == (400, "invalid_if_match")
    current = (await pods[0].get(f"{MEM}/{memory_id}", headers=AUTH)).json()
    assert current["text"] == "User's desk is by the door."

    # A list of tags matches when any does; "*" matches any existing memory.
    listed = await pods[0].patch(
        f"{MEM}/{memory_id}",
        json={"tags": ["office"]},
        headers={**AUTH, "If-Match": f'"nope", {new_etag}'},
    )
    assert listed.status_code == 200, listed.text
    gone = await pods[1].delete(f"{MEM}/{memory_id}", headers={**AUTH, "If-Match": "*"})
    assert gone.status_code == 200, gone.text
    missing = await pods[1].delete(f"{MEM}/{memory_id}", headers={**AUTH, "If-Match": "*"})
    assert missing.status_code == 404


async def test_only_one_of_two_conditional_edits_of_one_version_wins(
    pods: list[httpx2.AsyncClient],
) -> None:
    memory_id = await _create(pods[0], "User parks on level 2.", "lost-update")
    etag = (await pods[0].get(f"{MEM}/{memory_id}", headers=AUTH)).headers["ETag"]
    answers = await asyncio.gather(
        *(
            pods[n % 2].patch(
                f"{MEM}/{memory_id}",
                json={"text": f"User parks on level {n + 3}."},
                headers={**AUTH, "If-Match": etag},
            )
            for n in range(6)
        )
    )
    assert sorted(a.status_code for a in answers) == [200] + [412] * 5
