"""The learning write path end to end, through the gateway, the real nats-server and
every worker process, with the deterministic rule-based scripted LLM.

The seed scenarios of issue 3: a corrected name, a reversed preference, an
unrelated fact, a repeated fact, the profile confidence rule, episodes, eviction,
and the Markdown mirror of it all.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from engram_cli.stack.up import Stack
from engram_core.codec import pb
from engram_core.retrieval_client import RetrievalClient
from engram_testing.stack import start_stack
from engram_testing.upstream import ScriptedUpstream

from .conftest import wait_for

pytestmark = pytest.mark.e2e

TENANT = "default"


@pytest.fixture(scope="module")
def learning(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack as `engram up` runs it: every worker in one process."""
    stack, upstream = start_stack(tmp_path_factory.mktemp("learning") / "data")
    try:
        yield stack
    finally:
        stack.stop()
        upstream.stop()


@pytest.fixture(scope="module")
def per_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A process per worker (the chart's layout), so one worker can be killed alone."""
    stack, upstream = start_stack(
        tmp_path_factory.mktemp("per-process") / "data", process_per_worker=True
    )
    try:
        yield stack
    finally:
        stack.stop()
        upstream.stop()


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`engram up --light` (what `make run` runs): retrieval and every worker in one
    process, the workers calling retrieval without gRPC."""
    stack, upstream = start_stack(tmp_path_factory.mktemp("light") / "data", light=True)
    UPSTREAMS[id(stack)] = upstream
    try:
        yield stack
    finally:
        stack.stop()
        upstream.stop()


#: The scripted upstream of a stack a fixture started, to read what a chat was sent.
UPSTREAMS: dict[int, ScriptedUpstream] = {}


def light_upstream(stack: Stack) -> ScriptedUpstream:
    return UPSTREAMS[id(stack)]


class Memory:
    """Chats through the gateway and reads the index through retrieval."""

    def __init__(self, stack: Stack, conversation: str, user: str = "") -> None:
        self.stack = stack
        self.conversation = conversation
        self.user = user
        self.base = f"http://{stack.settings.gateway_host}:{stack.settings.gateway_port}/v1"

    async def chat(self, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "scripted",
            "memory_id": self.conversation,
            "messages": [{"role": "user", "content": text}],
        }
        if self.user:
            body["user"] = self.user
        async with httpx2.AsyncClient(base_url=self.base, timeout=30) as http:
            reply = await http.post("/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        return reply.json()

    async def memories(self, kind: pb.MemoryKind, *, superseded: bool = False) -> list[pb.Memory]:
        client = RetrievalClient(self.stack.settings.retrieval_listen)
        try:
            found: list[pb.Memory] = []
            token = ""
            while True:
                page = await client.list(
                    pb.ListRequest(
                        tenant=TENANT,
                        page_size=500,
                        page_token=token,
                        filter=pb.MemoryFilter(
                            conversation_id=self.conversation,
                            kinds=[kind],
                            include_superseded=superseded,
                        ),
                    )
                )
                found.extend(page.memories)
                token = page.next_page_token
                if not token:
                    return found
        finally:
            await client.close()

    async def facts(self, *, superseded: bool = False) -> list[pb.Memory]:
        return await self.memories(pb.MEMORY_KIND_FACT, superseded=superseded)

    async def fact_texts(self) -> list[str]:
        return sorted(m.text for m in await self.facts())

    async def until_facts(self, expected: list[str], timeout_s: float = 45) -> None:
        async def settled() -> bool:
            return await self.fact_texts() == sorted(expected)

        await wait_for(settled, timeout_s, what=f"current facts == {expected}")
        await asyncio.sleep(1.0)  # nothing else may arrive late
        assert await self.fact_texts() == sorted(expected)


async def test_a_corrected_name_supersedes_the_old_one(learning: Stack) -> None:
    memory = Memory(learning, "seed-name", user="user-name")
    await memory.chat("My wife's name is Jane.")
    await memory.until_facts(["User's wife's name is Jane"])
    await memory.chat("Sorry, I misspoke: my wife's name is Anne.")
    await memory.until_facts(["User's wife's name is Anne"])

    everything = await memory.facts(superseded=True)
    jane = next(m for m in everything if "Jane" in m.text)
    anne = next(m for m in everything if "Anne" in m.text)
    assert jane.superseded_by == anne.id  # kept, with its text, as history
    assert jane.valid_to.seconds > 0 and not anne.superseded_by

    reply = await memory.chat("What's my wife's name?")
    recalled = [hit["text"] for hit in reply["memory_hits"]]
    assert "User's wife's name is Anne" in recalled
    assert "User's wife's name is Jane" not in recalled


async def test_love_then_hate_leaves_exactly_the_new_fact(learning: Stack) -> None:
    memory = Memory(learning, "seed-pizza", user="user-pizza")
    await memory.chat("I love pizza!")
    await memory.until_facts(["User loves pizza"])
    await memory.chat("I hate pizza.")
    await memory.until_facts(["User hates pizza"])
    old = next(m for m in await memory.facts(superseded=True) if m.text == "User loves pizza")
    assert old.superseded_by


async def test_an_unrelated_fact_leaves_the_others_untouched(learning: Stack) -> None:
    memory = Memory(learning, "seed-unrelated", user="user-unrelated")
    await memory.chat("I love hiking in the Alps.")
    await memory.until_facts(["User loves hiking in the Alps"])
    before = {m.id: m for m in await memory.facts()}
    await memory.chat("I work as a nurse.")
    await memory.until_facts(["User loves hiking in the Alps", "User works as a nurse"])
    after = {m.id: m for m in await memory.facts(superseded=True)}
    for memory_id, fact in before.items():
        assert after[memory_id] == fact  # same id, same text, not superseded


async def test_the_same_fact_told_twice_is_stored_once(learning: Stack) -> None:
    memory = Memory(learning, "seed-twice", user="user-twice")
    await memory.chat("I love jazz.")
    await memory.until_facts(["User loves jazz"])
    await memory.chat("I love jazz.")
    await memory.until_facts(["User loves jazz"])
    assert len(await memory.facts(superseded=True)) == 1


async def test_a_less_confident_profile_value_never_replaces_a_surer_one(learning: Stack) -> None:
    memory = Memory(learning, "seed-profile", user="bob")

    async def active_names() -> list[str]:
        return [
            m.profile.value
            for m in await memory.memories(pb.MEMORY_KIND_PROFILE)
            if m.profile.key == "name"
        ]

    await memory.chat("My name is Bob.")
    await wait_for(lambda: _equals(active_names(), ["Bob"]), 45, what="profile name Bob")
    await memory.chat("I think my name might be Rob.")
    # the fact is reconciled as usual; the profile keeps the surer value
    await memory.until_facts(["User's name is Rob"])
    assert await active_names() == ["Bob"]  # 0.4 < 0.9: kept
    await memory.chat("Actually my name is Robert, definitely.")
    await wait_for(lambda: _equals(active_names(), ["Robert"]), 45, what="profile name Robert")
    history = await memory.memories(pb.MEMORY_KIND_PROFILE, superseded=True)
    bob = next(m for m in history if m.profile.value == "Bob")
    assert bob.superseded_by  # replaced, not deleted


async def test_twenty_five_turns_make_an_episode(learning: Stack) -> None:
    memory = Memory(learning, "seed-episode", user="user-episode")
    for i in range(13):  # 13 chats = 26 turns (user + assistant)
        await memory.chat(f"Today I visited museum number {i}.")

    async def episodes() -> list[pb.Memory]:
        return await memory.memories(pb.MEMORY_KIND_EPISODE)

    found = await wait_for(episodes, 60, what="an episode")
    assert len(found) == 1
    episode = found[0]
    assert (episode.turn_range.first_turn, episode.turn_range.last_turn) == (1, 20)
    assert len(episode.source_turn_ids) == 20
    assert "museum number 0" in episode.text


async def test_the_mirror_writes_files_tombstones_and_commits(learning: Stack) -> None:
    memory = Memory(learning, "seed-mirror", user="user-mirror")
    await memory.chat("I love tea.")
    await memory.until_facts(["User loves tea"])
    await memory.chat("I hate tea.")
    await memory.until_facts(["User hates tea"])
    root = learning.data_dir / "mirror"
    conversation_dir = root / TENANT / "@user-mirror" / "seed-mirror"  # the user's folder

    def files(pattern: str) -> list[Path]:
        return sorted(conversation_dir.glob(pattern))

    async def mirrored() -> bool:
        return any("User hates tea" in p.read_text() for p in files("facts/*.md")) and any(
            "User loves tea" in p.read_text() for p in files("deleted/**/*.md")
        )

    await wait_for(mirrored, 30, what="fact files and the tombstone of the superseded fact")
    assert not any("User loves tea" in p.read_text() for p in files("facts/*.md"))
    live = next(p for p in files("facts/*.md") if "User hates tea" in p.read_text())
    assert live.read_text().startswith("---\n") and "kind: fact" in live.read_text()
    assert files("turns/user/*.md") and files("turns/assistant/*.md")

    async def committed() -> bool:
        log = await asyncio.to_thread(
            subprocess.run,
            ["git", "-C", str(root), "log", "--name-only", "--format=%s"],
            capture_output=True,
            text=True,
            check=False,
        )
        return str(live.relative_to(root)) in log.stdout

    await wait_for(committed, 30, what="a git commit containing the fact file")


async def learn_then_edit_by_hand(stack: Stack, name: str) -> Memory:
    """A turn goes through ingest and reconcile (a fact), summarize (the summary), the
    mirror (the fact's file), and a hand edit of that file through edits."""
    memory = Memory(stack, f"seed-{name}", user=f"user-{name}")
    await memory.chat("I love kayaks.")
    await memory.until_facts(["User loves kayaks"])  # ingest, then reconcile
    await wait_for(
        lambda: memory.memories(pb.MEMORY_KIND_SUMMARY), 30, what="the summary (summarize)"
    )
    facts_dir = stack.data_dir / "mirror" / TENANT / f"@user-{name}" / f"seed-{name}"

    def fact_file() -> Path | None:
        found = [p for p in facts_dir.glob("facts/*.md") if "User loves kayaks" in p.read_text()]
        return found[0] if found else None

    def edit_by_hand(path: Path) -> None:
        path.write_text(path.read_text().replace("kayaks", "canoes"), encoding="utf-8")

    path = await wait_for(fact_file, 30, what="the fact's mirror file (mirror)")
    await asyncio.to_thread(edit_by_hand, path)
    await memory.until_facts(["User loves canoes"])  # the watcher, then edits
    return memory


async def test_one_process_runs_every_worker_and_a_turn_reaches_each(learning: Stack) -> None:
    """`engram up`'s default: the six workers in one process (engram-workers), a turn
    still goes through ingest, reconcile, summarize, the mirror, and a hand edit of the
    mirror through edits (evict: the eviction test below, same layout)."""
    assert [c.name for c in learning.components] == ["retrieval", "gateway", "workers"]
    (workers,) = [c for c in learning.components if c.name == "workers"]
    assert workers.process is not None and workers.process.poll() is None
    assert Path(workers.command[0]).name == "engram-workers" and "--only" not in workers.command

    await learn_then_edit_by_hand(learning, "one-process")


async def test_the_light_layout_serves_memory_from_one_process_for_retrieval_and_workers(
    light: Stack,
) -> None:
    """Retrieval and the six workers in one process: a turn is still learned, summarised,
    mirrored, a hand edit of the mirror comes back, and the gateway recalls it over gRPC
    from that process."""
    assert [c.name for c in light.components] == ["node", "gateway"]
    (node,) = [c for c in light.components if c.name == "node"]
    assert node.command[1:3] == ["-m", "engram_cli.stack.node"]
    memory = await learn_then_edit_by_hand(light, "light")
    asked: list[Any] = []

    async def recalled() -> bool:
        # a chat is recalled with what the index holds when it arrives
        await memory.chat("What boats do I like?")
        asked[:] = light_upstream(light).conversation_requests()[-1]["messages"]
        return any("User loves canoes" in str(m.get("content")) for m in asked)

    await wait_for(recalled, 20, what="the edited fact recalled into a chat")


async def test_eviction_keeps_a_conversation_under_max_entries(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    stack, upstream = start_stack(tmp_path_factory.mktemp("evict") / "data", ENGRAM_MAX_ENTRIES="8")
    try:
        memory = Memory(stack, "seed-evict")
        hobbies = ["painting", "chess", "sailing", "baking bread", "cycling", "poetry"]
        for hobby in hobbies:  # 12 turns and 6 distinct facts, far over 8
            await memory.chat(f"I love {hobby}.")

        async def settled() -> bool:
            facts = await memory.facts(superseded=True)
            turns = await memory.memories(pb.MEMORY_KIND_TURN)
            return len(facts) == 6 and len(facts) + len(turns) <= 8

        await wait_for(settled, 60, what="six facts and eviction down to 8 entries")
        await asyncio.sleep(1.0)
        turns = await memory.memories(pb.MEMORY_KIND_TURN)
        # the oldest turns went first: every fact survives while turns remain to evict
        assert len(await memory.facts()) == 6
        assert sorted(t.text for t in turns) == ["I love poetry.", "Noted."]
        assert await memory.memories(pb.MEMORY_KIND_SUMMARY)  # exempt
    finally:
        stack.stop()
        upstream.stop()


async def _equals(awaitable, expected) -> bool:
    return (await awaitable) == expected


@pytest.mark.parametrize(
    ("layout", "worker"),
    [
        ("per_process", "ingest"),
        ("per_process", "reconcile"),
        ("learning", "workers"),
        ("light", "node"),  # retrieval and every worker, killed together
    ],
)
async def test_a_worker_killed_mid_burst_loses_and_duplicates_nothing(
    request: pytest.FixtureRequest, layout: str, worker: str
) -> None:
    # "workers": the one process every worker shares, killed with all of them in it
    learning: Stack = request.getfixturevalue(layout)
    memory = Memory(learning, f"seed-crash-{worker}", user=f"user-crash-{worker}")
    # distinct topics: facts that differ by a number alone are near-duplicates
    topics = [
        "apples",
        "violins",
        "glaciers",
        "tractors",
        "origami",
        "volcanoes",
        "opera",
        "submarines",
    ]
    expected = [f"User loves {topic}" for topic in topics]
    for i, topic in enumerate(topics):
        await memory.chat(f"I love {topic}.")
        if i == 3:
            await asyncio.to_thread(learning.restart, worker)  # SIGKILL, then start again
    await memory.until_facts(expected, timeout_s=90)
    assert len(await memory.facts(superseded=True)) == 8

    # a message the killed worker held comes back after ack_wait: wait for it, then
    # make sure nothing arrives twice
    async def all_turns() -> bool:
        return len(await memory.memories(pb.MEMORY_KIND_TURN)) >= 16

    await wait_for(all_turns, 60, what="all 16 turns indexed")
    await asyncio.sleep(1.0)
    assert len(await memory.memories(pb.MEMORY_KIND_TURN)) == 16
