"""Nothing is learned silently or lost silently: a text that taught nothing says why,
every write path ends in the Markdown mirror, a hand edit keeps history, and a listing
cursor keeps the filters it was issued for."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from engram_core.codec import pb
from engram_core.mirror_format import memory_files
from engram_testing.worker_stack import running_retrieval

from .conftest import Engram, wait_for

pytestmark = pytest.mark.e2e


async def event_status(engram: Engram, event_id: str) -> dict:
    async with engram.http() as http:
        return (await http.get(f"/events/{event_id}")).json()


async def test_with_no_model_configured_added_text_says_skipped_and_reextract_learns_it(
    engram: Engram, tmp_path: Path
) -> None:
    # no ENGRAM_LLM_MODEL on the workers, and no `model` in the request
    async with engram.http() as http:
        added = await http.post("/memories/add", json={"text": "I am vegetarian.", "user": "mona"})
    [event_id] = added.json()["event_ids"]

    async def done() -> dict | None:
        status = await event_status(engram, event_id)
        return status if status["status"] != "pending" else None

    status = await wait_for(done, 30, what="the added text to be handled")
    assert status["status"] == "skipped"
    assert "no model configured" in status["reason"] and "ENGRAM_LLM_MODEL" in status["reason"]
    assert await engram.facts("mona") == []

    # the CLI says so too, instead of "accepted"
    chats = tmp_path / "mona.jsonl"
    chats.write_text(
        json.dumps(
            {
                "user_id": "mona",
                "conversation_id": "imported",
                "messages": [{"role": "user", "content": "I live in Ghent."}],
            }
        )
        + "\n"
    )
    code, output = engram.cli("import", str(chats))
    assert code == 0, output
    assert "nothing was learned from them: no model configured" in output

    # once a model is named, the stored turns are learned from: no re-import needed
    code, output = engram.cli("reextract", "--user", "mona", "--model", "scripted")
    assert code == 0, output
    assert "sent 2 to be learned from" in output
    await engram.until_facts("mona", ["vegetarian", "Ghent"])
    code, output = engram.cli("reextract", "--user", "mona", "--model", "scripted")
    assert "sent 0 to be learned from, 2 sent before" in output  # resumable, not repeated


async def test_a_grpc_import_is_mirrored_and_a_rebuild_restores_it(
    engram: Engram, tmp_path: Path
) -> None:
    chats = tmp_path / "history.jsonl"
    chats.write_text(
        json.dumps(
            {
                "user_id": "nora",
                "conversation_id": "old-chats",
                "messages": [
                    {"role": "user", "content": "My daughter Lia turns seven in June."},
                    {"role": "assistant", "content": "Happy early birthday to Lia!"},
                ],
            }
        )
        + "\n"
    )
    code, output = engram.cli("import", str(chats), "--via", "grpc")
    assert code == 0, output
    mirror = engram.data_dir / "mirror"

    def mirrored() -> list[str]:
        texts = []
        for rel in memory_files(mirror):
            text = (mirror / rel).read_text(encoding="utf-8")
            if "Lia" in text and "/deleted/" not in f"/{rel}":
                texts.append(rel)
        return texts if len(texts) == 2 else []

    await wait_for(mirrored, 30, what="both imported turns in the mirror")

    # the index rebuilt from the mirror alone holds them
    async with running_retrieval(tmp_path / "fresh-index") as fresh:
        # in a thread: the fresh index serves from this test's event loop
        code, output = await asyncio.to_thread(engram.cli, "rebuild", "--retrieval", fresh.address)
        assert code == 0, output
        result = await fresh.client.search(
            pb.SearchRequest(
                tenant="default", query="Lia birthday", user_id="nora", conversation_id="old-chats"
            )
        )
        assert {h.memory.text for h in result.hits} >= {"My daughter Lia turns seven in June."}


async def test_a_hand_edit_of_a_mirror_file_keeps_a_history_version(engram: Engram) -> None:
    async with engram.http() as http:
        created = (
            await http.post("/memories", json={"text": "User drives a red Fiat.", "user": "omar"})
        ).json()
    mirror = engram.data_dir / "mirror"

    def the_file() -> Path | None:
        for rel in memory_files(mirror):
            if created["id"] in rel and "deleted" not in rel:
                return mirror / rel
        return None

    path = await wait_for(the_file, 30, what="the mirror file of the new fact")
    path.write_text(path.read_text().replace("red Fiat", "green Volvo"), encoding="utf-8")

    async def edited() -> dict | None:
        async with engram.http() as http:
            history = (await http.get(f"/memories/{created['id']}/history")).json()
        return history if history["data"] else None

    history = await wait_for(edited, 30, what="the hand edit's history version")
    assert [v["text"] for v in history["data"]] == ["User drives a red Fiat."]
    async with engram.http() as http:
        current = (await http.get(f"/memories/{created['id']}")).json()
    assert current["text"] == "User drives a green Volvo."
    # the file keeps its place, rewritten canonically; the old text is a tombstone
    front = yaml.safe_load(path.read_text().split("---")[1])
    assert front["id"] == created["id"]


async def test_a_list_cursor_keeps_the_filters_of_its_first_page(engram: Engram) -> None:
    async with engram.http() as http:
        for n in range(3):
            for user in ("pia", "quin"):
                await http.post("/memories", json={"text": f"Note {n} of {user}.", "user": user})
        first = (
            await http.get("/memories", params={"user": "pia", "kind": "fact", "limit": 1})
        ).json()
        texts = [m["text"] for m in first["data"]]
        cursor = first["next_cursor"]
        while cursor:  # the loop docs/api.md shows: only the cursor after the first page
            page = (await http.get("/memories", params={"cursor": cursor, "limit": 1})).json()
            texts += [m["text"] for m in page["data"]]
            cursor = page["next_cursor"]
        assert sorted(texts) == [f"Note {n} of pia." for n in range(3)]
        mixed = await http.get("/memories", params={"user": "quin", "cursor": first["next_cursor"]})
        assert mixed.status_code == 400
        assert mixed.json()["error"]["code"] == "cursor_filters_mismatch"
