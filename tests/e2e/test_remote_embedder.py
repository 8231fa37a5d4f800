"""The whole stack with its sentence vectors from an OpenAI-compatible embeddings API
(``ENGRAM_EMBED_URL``: ``engram serve-embeddings``' server over the packaged MiniLM, in
this process): a first chat teaches Engram something, a later chat recalls it, and the
embeddings server is what retrieval asked; a store written by a model of another
dimension then refuses to start, naming the way out."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx2
import numpy as np
import openai
import pytest

from engram_cli.stack.embeddings_server import EmbeddingsServer, packaged_embedder
from engram_cli.stack.nats_server import free_port
from engram_cli.stack.scripted_llm import RuleBasedBrain
from engram_cli.stack.up import Stack

from .conftest import wait_for
from .test_learning import start_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def embeddings() -> Iterator[EmbeddingsServer]:
    server = EmbeddingsServer(packaged_embedder()).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("remote-embedder") / "data"


@pytest.fixture(scope="module")
def remote_stack(embeddings: EmbeddingsServer, data_dir: Path) -> Iterator[Stack]:
    stack, upstream = start_stack(
        data_dir,
        replies=[RuleBasedBrain("Noted!", "You are allergic to peanuts.")],
        ENGRAM_EMBED_URL=embeddings.base_url,
        ENGRAM_EMBED_MODEL=embeddings.model_name,
    )
    try:
        yield stack
    finally:
        stack.stop()
        upstream.stop()


async def test_a_chat_recalls_what_an_earlier_one_taught_through_the_remote_embedder(
    remote_stack: Stack, embeddings: EmbeddingsServer
) -> None:
    settings = remote_stack.settings
    base = f"http://{settings.gateway_host}:{settings.gateway_port}"
    asked_before = embeddings.requests
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test")
    await client.chat.completions.create(
        model="scripted-model",
        messages=[{"role": "user", "content": "I am allergic to peanuts."}],
        user="alice",
    )

    async def learned() -> bool:
        async with httpx2.AsyncClient(base_url=base, timeout=10) as http:
            listed = await http.get("/v1/memories", params={"user": "alice", "kind": "fact"})
        return any("peanut" in m["text"].lower() for m in listed.json()["data"])

    await wait_for(learned, 60, what="the fact learned")
    second = await client.chat.completions.create(
        model="scripted-model",
        messages=[{"role": "user", "content": "What am I allergic to?"}],
        user="alice",
        extra_body={"memory_id": "another-conversation"},
    )
    await client.close()
    hits = second.to_dict()["memory_hits"]
    assert isinstance(hits, list), hits
    assert any("peanut" in hit["text"].lower() for hit in hits), hits
    # the turns and the facts were embedded, and the question too, by the remote model
    assert embeddings.requests - asked_before >= 3


def test_a_store_of_another_dimension_fails_start_up_naming_reembed(
    remote_stack: Stack, data_dir: Path, tmp_path: Path
) -> None:
    """A copy of the stack's store (384-d) under a 5-d model: retrieval exits at once
    with one line that says why and what to do."""
    shutil.copytree(data_dir / "qdrant", tmp_path / "qdrant")
    tiny = EmbeddingsServer(FiveDimensions(), model_name="tiny").start()
    try:
        done = subprocess.run(
            [str(Path(sys.executable).with_name("engram-retrieval"))],
            env={
                "PATH": "/usr/bin:/bin",
                "ENGRAM_DATA_DIR": str(tmp_path),
                "ENGRAM_RETRIEVAL_LISTEN": f"127.0.0.1:{free_port()}",
                "ENGRAM_EMBED_URL": tiny.base_url,
                "ENGRAM_EMBED_MODEL": "tiny",
            },
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        tiny.stop()
    assert done.returncode == 1, done.stderr
    said = done.stdout + done.stderr
    assert "holds 384-d vectors but the embedder produces 5-d ones" in said
    assert "`engram reembed`" in said and "`engram rebuild`" in said


class FiveDimensions:
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.ones((len(texts), 5), dtype=np.float32)
