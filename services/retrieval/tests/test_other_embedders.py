"""Embedders other than the packaged MiniLM: an OpenAI-compatible embeddings API
(``ENGRAM_EMBED_URL``, here ``engram serve-embeddings`` over the packaged model or a
scripted transport) and a local ONNX bi-encoder from a path (a tiny model built here),
and the start-up check of the embedder's dimension against the store."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from pydantic import ValidationError
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from engram_cli.stack.embeddings_server import EmbeddingsServer
from engram_core.codec import pb
from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.embedder import Embedder, ModelFilesError, model_files_at
from engram_retrieval.remote_embedder import (
    EmbedderRequestError,
    EmbedderUnavailable,
    RemoteEmbedder,
)
from engram_retrieval.server import build_server, load_embedder
from engram_retrieval.settings import RetrievalSettings
from engram_retrieval.store import StoreError

TEXTS = ["The cat sits on the mat.", "I moved to Lisbon last year.", "a", "b c", "dogs?"]
WORDS = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "the": 4, "cat": 5, "dog": 6, "sat": 7}
TABLE = np.random.default_rng(7).normal(size=(len(WORDS), 6)).astype(np.float32)
PROJECTION = np.random.default_rng(8).normal(size=(6, 5)).astype(np.float32)


def build_tiny_bi_encoder(directory: Path) -> Path:
    """hidden[b, s] = TABLE[input_ids[b, s]] @ PROJECTION: a 5-d bi-encoder with one
    MatMul (so the dynamic quantizer has something to quantize)."""
    directory.mkdir(parents=True, exist_ok=True)
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
        for name in ("input_ids", "attention_mask")
    ]
    output = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", "seq", 5]
    )
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["looked_up"]),
        helper.make_node("MatMul", ["looked_up", "projection"], ["last_hidden_state"]),
    ]
    initializers = [
        helper.make_tensor("table", TensorProto.FLOAT, TABLE.shape, TABLE.flatten().tolist()),
        helper.make_tensor(
            "projection", TensorProto.FLOAT, PROJECTION.shape, PROJECTION.flatten().tolist()
        ),
    ]
    graph = helper.make_graph(nodes, "tiny_bi_encoder", inputs, [output], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, directory / "model.onnx")
    tokenizer = Tokenizer(models.WordLevel(WORDS, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def tiny_vector(text: str) -> np.ndarray:
    ids = [2, *(WORDS.get(w, 1) for w in text.split()), 3]
    pooled = (TABLE[ids] @ PROJECTION).mean(axis=0)
    return pooled / np.linalg.norm(pooled)


@pytest.fixture(scope="module")
def minilm_server(embedder: Embedder) -> Iterator[EmbeddingsServer]:
    server = EmbeddingsServer(embedder).start()
    yield server
    server.stop()


def scripted(
    answer: Callable[[httpx2.Request], httpx2.Response], seen: list[httpx2.Request]
) -> httpx2.MockTransport:
    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return answer(request)

    return httpx2.MockTransport(handle)


def vectors_answer(dim: int) -> Callable[[httpx2.Request], httpx2.Response]:
    def answer(request: httpx2.Request) -> httpx2.Response:
        texts = json.loads(request.content)["input"]
        data = [
            {"index": i, "embedding": [float(len(t) + 1)] + [1.0] * (dim - 1)}
            for i, t in reversed(list(enumerate(texts)))  # order is the index's, not the list's
        ]
        return httpx2.Response(200, json={"data": data})

    return answer


# --- an OpenAI-compatible embeddings API -------------------------------------------


def test_the_same_model_over_http_gives_the_local_vectors_in_batches(
    minilm_server: EmbeddingsServer, embedder: Embedder
) -> None:
    before = minilm_server.requests
    remote = RemoteEmbedder(
        minilm_server.base_url, minilm_server.model_name, batch_size=2, token_model=embedder
    )
    assert remote.dim == 384
    assert remote.model_id == f"remote:all-MiniLM-L6-v2+tokens:{embedder.model_id}"
    np.testing.assert_allclose(remote.embed(TEXTS), embedder.embed(TEXTS), atol=1e-6)
    # the probe, then 5 texts in batches of at most 2
    assert minilm_server.requests - before == 1 + 3
    # token vectors (MaxSim) come from the local token model, as before
    (encoded,) = remote.encode([TEXTS[1]])
    np.testing.assert_array_equal(encoded.tokens, embedder.token_vectors(TEXTS[1]))
    assert remote.embed([]).shape == (0, 384)
    remote.close()


def test_vectors_are_normalised_ordered_by_index_and_sent_with_the_key() -> None:
    seen: list[httpx2.Request] = []
    remote = RemoteEmbedder(
        "http://embed.test/v1",
        "nomic-embed-text",
        api_key="sk-embed",
        transport=scripted(vectors_answer(3), seen),
    )
    vectors = remote.embed(["a", "abc"])
    expected = np.array([[2.0, 1, 1], [4.0, 1, 1]])
    np.testing.assert_allclose(vectors, expected / np.linalg.norm(expected, axis=1)[:, None])
    assert seen[-1].url == "http://embed.test/v1/embeddings"
    assert seen[-1].headers["authorization"] == "Bearer sk-embed"
    body = json.loads(seen[-1].content)
    assert body == {"model": "nomic-embed-text", "input": ["a", "abc"], "encoding_format": "float"}


def test_another_dimension_than_the_token_models_keeps_no_token_vectors(
    embedder: Embedder,
) -> None:
    remote = RemoteEmbedder(
        "http://embed.test/v1",
        "bge-m3",
        token_model=embedder,
        transport=scripted(vectors_answer(8), []),
    )
    assert (remote.dim, remote.model_id, remote.token_vectors_kept) == (8, "remote:bge-m3", False)
    (encoded,) = remote.encode(["hello"])
    assert encoded.dense.shape == (8,) and encoded.tokens.shape == (0, 8)


def test_a_transient_failure_is_retried_and_a_refusal_is_not() -> None:
    answers = iter([httpx2.Response(503), httpx2.Response(429)])
    seen: list[httpx2.Request] = []

    def flaky(request: httpx2.Request) -> httpx2.Response:
        return next(answers, None) or vectors_answer(3)(request)

    remote = RemoteEmbedder("http://embed.test/v1", "m", transport=scripted(flaky, seen))
    assert remote.dim == 3 and len(seen) == 3

    refused: list[httpx2.Request] = []
    with pytest.raises(EmbedderRequestError, match="HTTP 404"):
        RemoteEmbedder(
            "http://embed.test/v1",
            "no-such-model",
            transport=scripted(lambda r: httpx2.Response(404, text="model not found"), refused),
        )
    assert len(refused) == 1


def test_a_server_down_past_the_retry_budget_is_unavailable() -> None:
    def down(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("connection refused", request=request)

    with pytest.raises(EmbedderUnavailable, match="connection refused") as caught:
        RemoteEmbedder(
            "http://bob:s3cret@embed.test/v1?key=k3y",
            "m",
            retry_s=0.3,
            transport=scripted(down, []),
        )
    # the URL is named, its credentials never
    assert "embed.test" in str(caught.value)
    assert not {"bob", "s3cret", "k3y"} & set(re.split(r"\W+", str(caught.value)))


def test_settings_need_a_model_with_the_url_and_one_embedder(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="ENGRAM_EMBED_MODEL"):
        RetrievalSettings(embed_url="http://localhost:11434/v1")
    with pytest.raises(ValidationError, match="not both"):
        RetrievalSettings(
            embed_url="http://localhost:11434/v1",
            embed_model="m",
            embed_model_path=build_tiny_bi_encoder(tmp_path / "tiny"),
        )
    with pytest.raises(ValidationError, match="http"):
        RetrievalSettings(embed_url="localhost:11434", embed_model="m")
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "model.onnx").write_bytes(b"")
    with pytest.raises(ValidationError, match=r"lacks tokenizer\.json"):
        RetrievalSettings(embed_model_path=tmp_path / "half")


def test_the_service_loads_the_remote_embedder_its_settings_name(
    minilm_server: EmbeddingsServer, tmp_path: Path
) -> None:
    remote = load_embedder(
        RetrievalSettings(
            data_dir=tmp_path,
            embed_url=minilm_server.base_url,
            embed_model=minilm_server.model_name,
        )
    )
    assert isinstance(remote, RemoteEmbedder) and remote.token_vectors_kept
    remote.close()


async def test_search_through_the_remote_embedder_and_unavailable_when_it_is_down(
    minilm_server: EmbeddingsServer, embedder: Embedder, tmp_path: Path
) -> None:
    settings = RetrievalSettings(data_dir=tmp_path, retrieval_listen="127.0.0.1:0")
    up = True
    relayed_on: list[int] = []  # the thread of each HTTP call: never the event loop's

    def relay(request: httpx2.Request) -> httpx2.Response:
        relayed_on.append(threading.get_ident())
        if not up:
            raise httpx2.ConnectError("connection refused", request=request)
        with httpx2.Client() as client:
            answer = client.post(str(request.url), content=request.content)
            return httpx2.Response(answer.status_code, content=answer.content)

    remote = RemoteEmbedder(
        minilm_server.base_url,
        minilm_server.model_name,
        retry_s=0.3,
        token_model=embedder,
        transport=scripted(relay, []),
    )
    running = await build_server(settings, embedder=remote)
    client = RetrievalClient(running.address, timeout_s=30)
    try:
        memories = [
            pb.Memory(kind=pb.MEMORY_KIND_FACT, text=t, user_id="u1", conversation_id="c1")
            for t in ("My dog is called Biscuit.", "I moved to Lisbon last year.")
        ]
        await client.upsert(pb.UpsertRequest(tenant="acme", memories=memories))
        query = pb.SearchRequest(
            tenant="acme", user_id="u1", conversation_id="c1", query="Where do I live?"
        )
        relayed_on.clear()
        found = await client.search(query)
        assert found.hits[0].memory.text == "I moved to Lisbon last year."
        assert relayed_on and threading.get_ident() not in relayed_on
        up = False
        query.query = "What is my dog called?"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.search(query)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # callers retry it
        assert caught.value.details() == "embedding model unavailable"
    finally:
        await client.close()
        await running.stop(grace_s=0)
        remote.close()


async def test_another_dimension_than_the_stores_fails_start_up_naming_reembed(
    tmp_path: Path, embedder: Embedder
) -> None:
    settings = RetrievalSettings(data_dir=tmp_path, retrieval_listen="127.0.0.1:0")
    running = await build_server(settings, embedder=embedder)
    await running.stop(grace_s=0)
    other = RemoteEmbedder(
        "http://embed.test/v1", "bge-m3", transport=scripted(vectors_answer(8), [])
    )
    with pytest.raises(StoreError) as caught:
        await build_server(settings, embedder=other)
    message = str(caught.value)
    assert "holds 384-d vectors but the embedder produces 8-d ones" in message
    assert "`engram reembed`" in message and "`engram rebuild`" in message


# --- a local ONNX bi-encoder from a path --------------------------------------------


def test_a_bi_encoder_from_a_path_pools_and_normalises(tmp_path: Path) -> None:
    files = model_files_at(build_tiny_bi_encoder(tmp_path / "tiny"))
    assert files.model_id.startswith("onnx:tiny@")
    tiny = Embedder(files, threads=1, quantization="none")
    assert tiny.dim == 5
    texts = ["the cat sat", "dog", "the unknown dog sat down"]
    np.testing.assert_allclose(tiny.embed(texts), [tiny_vector(t) for t in texts], atol=1e-5)
    # token vectors are its own (late interaction works with it)
    assert tiny.token_vectors("the cat sat").shape == (3, 5)


def test_the_service_loads_a_bi_encoder_from_its_path_quantized(tmp_path: Path) -> None:
    directory = build_tiny_bi_encoder(tmp_path / "tiny")
    loaded = load_embedder(RetrievalSettings(data_dir=tmp_path, embed_model_path=directory))
    assert loaded.model_id.endswith("+dynamic-int8") and loaded.model_id.startswith("onnx:tiny@")
    vectors = loaded.embed(["the cat sat", "dog"])
    expected = np.stack([tiny_vector("the cat sat"), tiny_vector("dog")])
    assert np.sum(vectors * expected, axis=1) == pytest.approx([1.0, 1.0], abs=0.02)


def test_a_path_without_a_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFilesError, match=r"model\.onnx is missing"):
        model_files_at(tmp_path)
