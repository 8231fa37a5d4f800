"""``engram import / export / search / reembed / status`` against the real retrieval
service (in-process, real embedder, embedded store), a real nats-server and a real
gateway where the command goes through HTTP."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import ConsumerConfig
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engram_cli.cli_common import CliSettings
from engram_cli.main import main
from engram_cli.memory.importer import run_import
from engram_cli.records import new_memory
from engram_cli.stack.nats_server import free_port
from engram_core.codec import from_timestamp, pb, to_timestamp
from engram_core.events import STREAM_NAME, MemoryChanged
from engram_core.memory import MemoryRecord
from engram_core.mirror_format import Tombstone, live_path, render, tombstone_path
from engram_gateway.app import create_app
from engram_gateway.settings import GatewaySettings
from engram_retrieval.server import build_server
from engram_retrieval.settings import RetrievalSettings
from engram_testing.asgi import serving
from engram_testing.upstream import ScriptedUpstream
from engram_testing.worker_stack import (
    RealRetrieval,
    published,
    running_retrieval,
    shared_embedder,
)

pytestmark = pytest.mark.integration

CHATS = [
    {
        "conversation_id": "trip",
        "user_id": "alice",
        "created_at": "2025-03-01T10:00:00Z",
        "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "My dog is called Biscuit."},
            {"role": "assistant", "content": "What a lovely name for a dog!"},
            {"role": "user", "content": [{"type": "text", "text": "I live in Lisbon."}]},
        ],
    },
    {
        "conversation_id": "cooking",
        "user_id": "alice",
        "messages": [
            {"role": "user", "content": "I am allergic to peanuts."},
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "user", "content": "ok"},
        ],
    },
]


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def locomo_file(path: Path) -> Path:
    sample = {
        "sample_id": "conv-1",
        "conversation": {
            "speaker_a": "Caroline",
            "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Caroline", "dia_id": "D1:1", "text": "I went to a support group."},
                {"speaker": "Melanie", "dia_id": "D1:2", "text": "That sounds brave."},
            ],
            "session_2_date_time": "7:00 pm on 9 May, 2023",
            "session_2": [
                {"speaker": "Caroline", "dia_id": "D2:1", "text": "I adopted a cat named Luna."},
            ],
        },
        "qa": [],
    }
    path.write_text(json.dumps([sample]), encoding="utf-8")
    return path


def printed_json(out: str) -> Any:
    """The indented JSON document a command printed (in-process services log to stdout too)."""
    lines = out.splitlines()
    start = lines.index("{")
    return json.loads("\n".join(lines[start : lines.index("}", start) + 1]))


async def cli(*args: str) -> int:
    # The command runs its own event loop, as it does from a shell.
    return await asyncio.to_thread(main, list(args))


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_url: str) -> Path:
    data = tmp_path / "data"
    monkeypatch.setenv("ENGRAM_DATA_DIR", str(data))
    monkeypatch.setenv("ENGRAM_NATS_URL", nats_url)
    for name in ("ENGRAM_API_KEY", "ENGRAM_GATEWAY_URL", "ENGRAM_MIRROR_ROOT"):
        monkeypatch.delenv(name, raising=False)
    return data


async def list_all(retrieval: RealRetrieval, tenant: str, **flt: Any) -> list[pb.Memory]:
    reply = await retrieval.client.list(
        pb.ListRequest(tenant=tenant, filter=pb.MemoryFilter(**flt), page_size=500)
    )
    return list(reply.memories)


# --- import through gRPC, export, search ----------------------------------------------------


async def test_a_grpc_import_without_nats_refuses_before_writing(
    tmp_path: Path,
    env: Path,
    retrieval: RealRetrieval,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ENGRAM_NATS_URL", f"nats://127.0.0.1:{free_port()}")
    source = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    code = await cli("import", str(source), "--via", "grpc", "--retrieval", retrieval.address)
    assert code == 2
    assert "the Markdown mirror keeps it; NATS at" in capsys.readouterr().err
    assert await list_all(retrieval, "default") == []  # nothing half-written


async def test_import_grpc_then_export_and_search(
    tmp_path: Path,
    env: Path,
    nats_url: str,
    retrieval: RealRetrieval,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    grpc_args = ("--via", "grpc", "--retrieval", retrieval.address, "--tenant", "acme")
    assert await cli("import", str(source), *grpc_args) == 0
    out, err = capsys.readouterr()
    # user + assistant turns with text: 3 + 1 (the tool-call message has none, system skipped)
    assert "imported 5 messages" in out and "(openai, via grpc)" in out
    assert "created 5" in out
    assert "not sent: 2 system/tool or empty messages" in out
    assert "import" in err and "5/5" in err  # the progress bar

    turns = await list_all(retrieval, "acme")
    assert len(turns) == 5
    by_text = {m.text: m for m in turns}
    dog = by_text["My dog is called Biscuit."]
    assert (dog.kind, dog.role, dog.user_id, dog.conversation_id) == (
        pb.MEMORY_KIND_TURN,
        "user",
        "alice",
        "trip",
    )
    dog_created_at = from_timestamp(dog.created_at)
    assert dog_created_at is not None
    assert dog_created_at.isoformat() == "2025-03-01T10:00:00+00:00"
    assert by_text["I live in Lisbon."].turn_index == 3  # content parts joined
    assert not await list_all(retrieval, "default")  # only the tenant named
    # every memory written is announced, so the mirror (and summarize, evict) keep it
    announced = await published(nats_url, MemoryChanged)
    assert sorted(e.memory.id for e in announced) == sorted(m.id for m in turns)
    assert {(e.op, e.cause, e.tenant) for e in announced} == {("created", "import", "acme")}

    # Re-run: everything recorded as done; nothing is sent again.
    assert await cli("import", str(source), *grpc_args) == 0
    out, _ = capsys.readouterr()
    assert "imported 0 messages" in out and "skipped 2 requests already sent" in out
    # Without the state file: sent again, and the deterministic ids make it a no-op.
    for state in (env / "imports").iterdir():
        state.unlink()
    assert await cli("import", str(source), *grpc_args) == 0
    out, _ = capsys.readouterr()
    assert "unchanged 5" in out
    assert len(await list_all(retrieval, "acme")) == 5

    # export: JSON lines of every memory, newest first, with the tenant
    exported = tmp_path / "acme.jsonl"
    assert (
        await cli(
            "export", "--tenant", "acme", "-o", str(exported), "--retrieval", retrieval.address
        )
        == 0
    )
    _, err = capsys.readouterr()
    assert "exported 5 memories of tenant 'acme'" in err
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(lines) == 5
    assert {line["tenant"] for line in lines} == {"acme"}
    assert {line["kind"] for line in lines} == {"turn"}
    assert "My dog is called Biscuit." in {line["text"] for line in lines}
    assert lines[0]["created_at"] >= lines[-1]["created_at"]
    assert not exported.with_name("acme.jsonl.partial").exists()
    assert all(line["embedding_model"] for line in lines)  # the service's, per memory
    # --user narrows to that user; --user "" to the memories with no user (none here)
    for user, count in (("alice", 5), ("", 0)):
        args = ("export", "--tenant", "acme", "--user", user, "-o", str(exported))
        assert await cli(*args, "--retrieval", retrieval.address) == 0
        capsys.readouterr()
        assert len(exported.read_text().splitlines()) == count

    # search through gRPC: hits with scores, as a table and as JSON
    search = (
        "search",
        "what is my dog called?",
        "--via",
        "grpc",
        "--tenant",
        "acme",
        "--user",
        "alice",
        "--conversation",
        "trip",
        "--retrieval",
        retrieval.address,
    )
    assert await cli(*search) == 0
    out, _ = capsys.readouterr()
    assert "outcome: small_store  hits: 5" in out  # five memories in scope: all of them
    assert "My dog is called Biscuit." in out and "turn/user" in out
    assert await cli(*search, "--json") == 0
    result = printed_json(capsys.readouterr().out)
    dog = next(h for h in result["hits"] if h["text"] == "My dog is called Biscuit.")
    assert (dog["scope"], dog["conversation_id"], dog["kind"]) == ("conversation", "trip", "turn")
    assert 0 < dog["score"] <= 1 and dog["scores"]["relevance"] > 0


@pytest.mark.parametrize("source_id", ["chat-1:0", ""])
async def test_the_cli_names_a_memory_as_retrieval_names_one_sent_without_an_id(
    retrieval: RealRetrieval, source_id: str
) -> None:
    """What an import or a bench wrote before the CLI named its memories (retrieval named
    them) is the same memory now: writing it again rewrites it, never copies it."""
    said_at = datetime(2025, 3, 1, 10, tzinfo=UTC)
    fields: dict[str, Any] = {"role": "user", "text": "My dog is called Biscuit."}
    fields |= {"user_id": "alice", "conversation_id": "trip", "source_id": source_id}
    unnamed = pb.Memory(kind=pb.MEMORY_KIND_TURN, created_at=to_timestamp(said_at), **fields)
    reply = await retrieval.client.upsert(pb.UpsertRequest(tenant="acme", memories=[unnamed]))
    assert reply.results[0].id == new_memory("acme", kind="turn", created_at=said_at, **fields).id


async def test_import_locomo_is_detected(
    tmp_path: Path, env: Path, retrieval: RealRetrieval, capsys: pytest.CaptureFixture[str]
) -> None:
    source = locomo_file(tmp_path / "locomo.json")
    args = ("--via", "grpc", "--retrieval", retrieval.address, "--user", "caroline")
    assert await cli("import", str(source), *args) == 0
    out, _ = capsys.readouterr()
    assert "imported 3 messages" in out and "(locomo, via grpc)" in out
    turns = {m.source_id: m for m in await list_all(retrieval, "default")}
    assert set(turns) == {"D1:1", "D1:2", "D2:1"}
    assert turns["D1:1"].text == "Caroline: I went to a support group."
    assert (turns["D1:2"].role, turns["D1:2"].conversation_id) == ("assistant", "conv-1")
    assert turns["D2:1"].user_id == "caroline"
    d2_created_at = from_timestamp(turns["D2:1"].created_at)
    assert d2_created_at is not None
    assert d2_created_at.isoformat() == "2023-05-09T19:00:00+00:00"


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            json.dumps(CHATS[0]) + "\n{not json\n",
            "bad.jsonl:2: not JSON",
        ),
        ('[{"messages": []', "bad.jsonl:1: not JSON"),
        ('{"conversation": {}, "hello": 1}', "unknown format: record 1 has no 'messages'"),
        ("42", "unknown format"),
        ("", "the file is empty"),
        (
            json.dumps(CHATS[0]) + "\n" + json.dumps({"messages": [{"role": "user"}]}) + "\n",
            "line 2: messages[0]: missing 'content'",
        ),
        (
            json.dumps([CHATS[0], {"messages": [{"role": "robot", "content": "x"}]}]),
            "record 2: messages[0].role: expected one of",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}], "conversation_id": "a/b"}),
            "conversation_id must not contain '/'",
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": "x", "created_at": "May 5"}]}),
            "messages[0].created_at: not an ISO 8601 time",
        ),
        (
            json.dumps(
                {
                    "messages": [{"role": "user", "content": "x"}],
                    "created_at": "9999-12-31T23:59:59-14:00",
                }
            ),
            "created_at: '9999-12-31T23:59:59-14:00' is out of range: times must be",
        ),
        (
            json.dumps([{"sample_id": "s", "conversation": {"session_1": "nope"}}]),
            "sample[0] (s).conversation.session_1: expected a list of turns",
        ),
    ],
)
async def test_bad_input_is_refused_before_anything_is_sent(
    tmp_path: Path,
    env: Path,
    retrieval: RealRetrieval,
    capsys: pytest.CaptureFixture[str],
    content: str,
    message: str,
) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text(content, encoding="utf-8")
    code = await cli("import", str(source), "--via", "grpc", "--retrieval", retrieval.address)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert (await retrieval.client.count(pb.CountRequest(tenant="default"))).count == 0
    assert not (env / "imports").exists()  # no state either


async def test_unknown_format_flag_and_missing_file(
    tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await cli("import", str(tmp_path / "nope.json")) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        await cli("import", "x.json", "--format", "csv")
    assert "invalid choice: 'csv'" in capsys.readouterr().err


# --- import through the gateway: resumable --------------------------------------------------


@dataclass
class FlakyGateway(ScriptedUpstream):
    """``POST /v1/memories/add`` that accepts ``fail_after`` requests, then answers 503
    (NATS gone, say); records what it accepted."""

    fail_after: int = 1_000_000

    def __post_init__(self) -> None:
        super().__post_init__()
        self.accepted: list[tuple[str, dict[str, Any]]] = []

    async def _add(self, request: Request) -> Response:
        body = await request.json()
        if len(self.accepted) >= self.fail_after:
            return JSONResponse(
                {
                    "error": {
                        "message": "The event bus did not accept the text.",
                        "type": "service_unavailable",
                        "param": None,
                        "code": "turn_not_persisted",
                    }
                },
                status_code=503,
            )
        self.accepted.append((request.headers["x-request-id"], body))
        ids = [f"e{len(self.accepted)}-{i}" for i in range(len(body["text"]))]
        return JSONResponse({"object": "memory.add", "status": "pending", "event_ids": ids}, 202)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/memories/add", self._add, methods=["POST"])])


@pytest.fixture
def flaky() -> Iterator[FlakyGateway]:
    gateway = FlakyGateway().start()
    assert isinstance(gateway, FlakyGateway)
    try:
        yield gateway
    finally:
        gateway.stop()


async def test_interrupted_import_resumes_and_sends_each_unit_once(
    tmp_path: Path, env: Path, flaky: FlakyGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    # Five conversations, one user message each at its own time: five requests.
    records = [
        {
            "conversation_id": f"c{i}",
            "created_at": f"2025-01-0{i + 1}T00:00:00Z",
            "messages": [{"role": "user", "content": f"fact number {i}"}],
        }
        for i in range(5)
    ]
    source = write_jsonl(tmp_path / "history.jsonl", records)
    gateway = flaky.base_url.removesuffix("/v1")
    flaky.fail_after = 2
    assert await cli("import", str(source), "--gateway", gateway) == 2
    err = capsys.readouterr().err
    assert "line 3, messages 0-0: the gateway refused it" in err
    assert "503 turn_not_persisted" in err and "re-run to resume" in err

    flaky.fail_after = 1_000_000
    assert await cli("import", str(source), "--gateway", gateway, "--api-key", "k") == 0
    out, _ = capsys.readouterr()
    assert "imported 3 messages" in out and "skipped 2 requests already sent" in out
    texts = [body["text"] for _, body in flaky.accepted]
    assert texts == [[f"fact number {i}"] for i in range(5)]  # each once, in order
    request_ids = [rid for rid, _ in flaky.accepted]
    assert len(set(request_ids)) == 5 and all(r.startswith("import-") for r in request_ids)
    sent_at = datetime.fromisoformat(flaky.accepted[0][1]["created_at"])
    assert sent_at == datetime(2025, 1, 1, tzinfo=UTC)
    assert flaky.accepted[0][1]["conversation"] == "c0"

    assert await cli("import", str(source), "--gateway", gateway) == 0
    assert "imported 0 messages" in capsys.readouterr().out
    assert len(flaky.accepted) == 5


async def test_limit_then_resume_through_the_api(
    tmp_path: Path, env: Path, retrieval: RealRetrieval
) -> None:
    """The same through run_import: stop after one unit, resume, nothing sent twice."""
    source = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    settings = CliSettings(retrieval_address=retrieval.address, data_dir=env)
    first = await run_import(source, settings, via="grpc", limit_units=1)
    assert (first.sent_messages, first.counts) == (3, {"created": 3})
    second = await run_import(source, settings, via="grpc")
    assert (second.skipped_units, second.sent_messages, second.counts) == (1, 2, {"created": 2})


# --- the real gateway: import over HTTP, search over HTTP, status ----------------------------


@asynccontextmanager
async def running_gateway(nats_url: str, retrieval: RealRetrieval) -> AsyncIterator[str]:
    settings = GatewaySettings(
        nats_url=nats_url,
        retrieval_address=retrieval.address,
        llm_base_url=f"http://127.0.0.1:{free_port()}/v1",
        gateway_port=free_port(),
    )
    async with serving(create_app(settings), settings.gateway_port) as url:
        yield url


async def test_import_search_and_status_through_the_gateway(
    tmp_path: Path,
    env: Path,
    retrieval: RealRetrieval,
    nats_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    async with AsyncExitStack() as stack:
        gateway = await stack.enter_async_context(running_gateway(nats_url, retrieval))
        # An ingest consumer exists (as the worker would create it) but no worker runs.
        nc = await nats.connect(nats_url)
        stack.push_async_callback(nc.close)
        js = nc.jetstream()
        await js.add_consumer(
            STREAM_NAME,
            ConsumerConfig(durable_name="ingest", filter_subject="engram.turn.persisted.v1"),
        )
        assert await cli("import", str(source), "--gateway", gateway) == 0
        out, _ = capsys.readouterr()
        # user messages with text: 2 + 2, in 3 requests (trip's share a time, cooking's too)
        assert "imported 4 messages" in out and "(openai, via http)" in out
        assert "accepted 4" in out
        assert (await js.stream_info(STREAM_NAME)).state.messages == 4

        # Without the state file the same request ids go out: JetStream drops them.
        for state in (env / "imports").iterdir():
            state.unlink()
        assert await cli("import", str(source), "--gateway", gateway) == 0
        capsys.readouterr()
        assert (await js.stream_info(STREAM_NAME)).state.messages == 4

        # search over HTTP (what the gateway's memory API answers): a memory created there
        created = await asyncio.to_thread(
            __import__("httpx").post,
            f"{gateway}/v1/memories",
            json={"text": "User's cat is called Miso.", "user": "alice"},
        )
        assert created.status_code == 201
        assert (
            await cli(
                "search",
                "what is my cat called?",
                "--user",
                "alice",
                "--gateway",
                gateway,
                "--json",
            )
            == 0
        )
        result = printed_json(capsys.readouterr().out)
        assert result["outcome"] == "small_store"
        assert result["hits"][0]["text"] == "User's cat is called Miso."

        status_args = (
            "status",
            "--gateway",
            gateway,
            "--retrieval",
            retrieval.address,
            "--nats",
            # a cluster's URL list, its first node down: status still reads the others
            f"nats://127.0.0.1:{free_port()}, {nats_url}",
            "--health-port-base",
            str(free_port()),
        )
        assert await cli(*status_args, "--json") == 1  # no workers are running
        status = printed_json(capsys.readouterr().out)
        assert status["services"]["gateway"]["status"] == "ready"
        assert status["services"]["retrieval"]["status"] == "serving"
        assert status["services"]["ingest"]["status"] == "unreachable"
        assert status["jetstream"]["consumers"]["ingest"] == {
            "num_pending": 4,
            "num_ack_pending": 0,
            "redelivered": 0,
            "waiting_pulls": 0,
        }
        assert status["jetstream"]["consumers"]["reconcile"] is None
        assert status["memories"]["by_kind"]["fact"] == 1
        assert await cli(*status_args) == 1
        out = capsys.readouterr().out
        rows = [line.split() for line in out.splitlines()]
        assert ["gateway", "ready", f"{gateway}/readyz"] in rows  # the services table
        assert ["ingest", "4", "0", "0"] in rows  # the consumers table: 4 pending
        assert ["reconcile", "-", "-", "-", "no", "consumer", "yet"] in rows
        assert "memories of tenant 'default': 1 current (fact 1), 0 superseded" in out


async def test_status_when_nothing_runs(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    args = (
        "status",
        "--gateway",
        f"http://127.0.0.1:{port}",
        "--retrieval",
        f"127.0.0.1:{port}",
        "--nats",
        f"nats://127.0.0.1:{port}",
        "--json",
    )
    assert await cli(*args) == 1
    status = printed_json(capsys.readouterr().out)
    assert status["services"]["gateway"]["status"] == "unreachable"
    assert status["services"]["retrieval"]["status"] == "unreachable"
    assert "unreachable" in status["jetstream"]["error"]
    assert status["memories"] == {"error": "retrieval down"}
    assert status["model_tasks"] == {"error": "no /metrics from ingest, reconcile, summarize"}


# --- export --mirror ------------------------------------------------------------------------


async def test_export_mirror_copies_the_tenant_directory(
    tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "mirror"
    (root / "acme" / "c1" / "facts").mkdir(parents=True)
    (root / "acme" / "c1" / "facts" / "a.md").write_text("---\nid: x\n---\nhello\n")
    (root / "other" / "c1").mkdir(parents=True)
    target = tmp_path / "copy"
    args = ("export", "--tenant", "acme", "--mirror", str(target), "--mirror-root", str(root))
    assert await cli(*args) == 0
    assert "copied 1 memory files of tenant 'acme'" in capsys.readouterr().out
    assert (target / "c1" / "facts" / "a.md").read_text().endswith("hello\n")
    assert await cli(*args) == 2  # never over an existing copy
    assert "exists and is not empty" in capsys.readouterr().err
    assert (
        await cli(
            "export",
            "--tenant",
            "nobody",
            "--mirror",
            str(tmp_path / "n"),
            "--mirror-root",
            str(root),
        )
        == 2
    )
    assert "no mirror for tenant 'nobody'" in capsys.readouterr().err


def user_tree(root: Path, *, migrated: bool) -> None:
    """acme: alice's and bob's conversation "default" (a fact and a tombstone each, and
    alice's summary) plus a tenant-wide fact; in the user layout, or as a mirror from
    before it left them (everything under <tenant>/<conversation>/)."""
    at = datetime(2026, 3, 1, 12, tzinfo=UTC)
    memories = [
        (
            MemoryRecord(
                id=str(uuid.uuid4()),
                kind=kind,
                text=f"{user or 'all'}: {kind}",
                user_id=user,
                conversation_id=conversation,
                created_at=at,
            ),
            deleted,
        )
        for user, conversation, kind, deleted in (
            ("alice", "default", "fact", False),
            ("alice", "default", "fact", True),
            ("alice", "default", "summary", False),
            ("bob", "default", "fact", False),
            ("bob", "default", "fact", True),
            ("", "global", "fact", False),
        )
    ]
    for record, deleted in memories:
        tomb = Tombstone(reason="deleted", at=at, cause="api") if deleted else None
        rel = str((tombstone_path if deleted else live_path)("acme", record))
        if not migrated:
            rel = "/".join(part for part in rel.split("/") if not part.startswith("@"))
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(render(record, "acme", tomb), encoding="utf-8")


@pytest.mark.parametrize("migrated", [True, False], ids=["user-layout", "not-migrated"])
async def test_export_mirror_of_one_user_copies_only_their_files(
    tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str], migrated: bool
) -> None:
    root = tmp_path / "mirror"
    user_tree(root, migrated=migrated)
    target = tmp_path / "alice"
    args = ("export", "--tenant", "acme", "--mirror", str(target), "--mirror-root", str(root))
    assert await cli(*args, "--user", "alice") == 0
    assert "copied 3 memory files of user 'alice' of tenant 'acme'" in capsys.readouterr().out
    copied = sorted(p for p in target.rglob("*.md"))
    texts = sorted(p.read_text().rsplit("\n", 2)[-2] for p in copied)
    assert texts == ["alice: fact", "alice: fact", "alice: summary"]
    prefix = "@alice/default" if migrated else "default"
    assert all(str(p.relative_to(target)).startswith(prefix) for p in copied)
    # The whole tenant, without --user: both users and the tenant-wide fact.
    assert await cli(*args[:4], str(tmp_path / "all"), *args[5:]) == 0
    assert "copied 6 memory files of tenant 'acme'" in capsys.readouterr().out
    # A user with no files is an error, not an empty copy.
    assert await cli(*args[:4], str(tmp_path / "nobody"), *args[5:], "--user", "carol") == 2
    assert "no memory files of user 'carol'" in capsys.readouterr().err
    # --kind and --conversation filter JSON lines only: said, not ignored.
    assert await cli(*args[:4], str(tmp_path / "k"), *args[5:], "--kind", "fact") == 2
    assert "--mirror copies files" in capsys.readouterr().err


# --- reembed --------------------------------------------------------------------------------


class RenamedEmbedder:
    """The real embedder under another model id: what a model change looks like to the
    service. Counts the texts it embeds."""

    def __init__(self, model_id: str) -> None:
        self._inner = shared_embedder()
        self.model_id = model_id
        self.embedded = 0

    def encode(self, texts: list[str]) -> Any:
        self.embedded += len(texts)
        return self._inner.encode(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@asynccontextmanager
async def retrieval_with(data_dir: Path, embedder: Any) -> AsyncIterator[str]:
    settings = RetrievalSettings(data_dir=data_dir, retrieval_listen="127.0.0.1:0")
    server = await build_server(settings, embedder=embedder)
    try:
        yield server.address
    finally:
        await server.stop(grace_s=0)


async def test_reembed_after_a_model_change(
    tmp_path: Path, env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    source = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    async with retrieval_with(store, RenamedEmbedder("model-a")) as address:
        assert await cli("import", str(source), "--via", "grpc", "--retrieval", address) == 0
        assert (
            await cli(
                "import",
                str(source),
                "--via",
                "grpc",
                "--retrieval",
                address,
                "--tenant",
                "acme",
                "--state-file",
                str(tmp_path / "s"),
            )
            == 0
        )
    capsys.readouterr()

    new_model = RenamedEmbedder("model-b")
    async with retrieval_with(store, new_model) as address:
        from engram_core.retrieval_client import RetrievalClient

        client = RetrievalClient(address)
        listed = await client.list(pb.ListRequest(tenant="default", page_size=10))
        assert {m.embedding_model for m in listed.memories} == {"model-a"}
        args = (
            "reembed",
            "--tenant",
            "default",
            "--tenant",
            "acme",
            "--retrieval",
            address,
            "--page-size",
            "2",
        )
        assert await cli(*args) == 0
        out, err = capsys.readouterr()
        assert "tenant 'default': 5 memories, re-embedded 5, unchanged 0" in out
        assert "tenant 'acme': 5 memories, re-embedded 5, unchanged 0" in out
        assert "reembed default" in err and "5/5" in err
        # The two tenants hold the same five texts: the model runs once per text (the
        # service keeps recently embedded texts' vectors).
        assert new_model.embedded == 5
        listed = await client.list(pb.ListRequest(tenant="default", page_size=10))
        assert {m.embedding_model for m in listed.memories} == {"model-b"}
        found = await client.search(
            pb.SearchRequest(
                tenant="default",
                query="peanut allergy",
                user_id="alice",
                conversation_id="cooking",
                top_k=1,
            )
        )
        assert found.hits[0].memory.text == "I am allergic to peanuts."

        embedded = new_model.embedded  # the search's query went through the model too
        assert await cli(*args) == 0  # again: nothing to do
        out, _ = capsys.readouterr()
        assert "re-embedded 0, unchanged 5" in out
        assert new_model.embedded == embedded
        await client.close()


async def test_reembed_all_tenants_reads_them_from_the_mirror(
    tmp_path: Path, env: Path, retrieval: RealRetrieval, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "mirror"
    for tenant in ("acme", "globex"):
        (root / tenant).mkdir(parents=True)
    args = (
        "reembed",
        "--all-tenants",
        "--mirror-root",
        str(root),
        "--retrieval",
        retrieval.address,
    )
    assert await cli(*args) == 0
    out = capsys.readouterr().out
    assert "tenant 'acme': 0 memories" in out and "tenant 'globex': 0 memories" in out
    assert await cli("reembed", "--all-tenants", "--mirror-root", str(tmp_path / "x")) == 2
    assert "reads the tenants from the mirror" in capsys.readouterr().err


async def test_reembed_all_tenants_on_the_user_layout(
    tmp_path: Path, env: Path, retrieval: RealRetrieval, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "mirror"
    user_tree(root, migrated=True)
    # A tenant id too long for a directory name: the directory is shortened, and the
    # tenant is read from the front matter of a file in it.
    long_tenant = "t" * 200
    record = MemoryRecord(id=str(uuid.uuid4()), kind="fact", text="x", user_id="alice")
    rel = root / str(live_path(long_tenant, record))
    rel.parent.mkdir(parents=True)
    rel.write_text(render(record, long_tenant), encoding="utf-8")
    args = (
        "reembed",
        "--all-tenants",
        "--mirror-root",
        str(root),
        "--retrieval",
        retrieval.address,
    )
    assert await cli(*args) == 0
    out = capsys.readouterr().out
    assert "tenant 'acme': 0 memories" in out
    assert f"tenant '{long_tenant}': 0 memories" in out
    assert "'@alice'" not in out and "'default'" not in out  # users are not tenants
