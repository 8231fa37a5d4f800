"""Fixtures of the retrieval service's tests: the real embedder (loaded once per
session), a tiny cross-encoder built on the fly, an in-memory span exporter, and a
client of the module's ``server`` fixture."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.embedder import Embedder
from engram_retrieval.server import RunningServer

VOCAB = {
    "[PAD]": 0,
    "[UNK]": 1,
    "[CLS]": 2,
    "[SEP]": 3,
    "the": 4,
    "cat": 5,
    "dog": 6,
    "sat": 7,
    "mat": 8,
}
SCALE, BIAS = 0.1, -1.0


def build_tiny_cross_encoder(directory: Path) -> Path:
    """logits[b, 0] = SCALE * sum_s(input_ids * attention_mask * token_type_ids) + BIAS.

    Only the second segment (token type 1) counts, so the scores prove that pairs are
    encoded as pairs with token_type_ids and that padding is masked.
    """
    directory.mkdir(parents=True, exist_ok=True)
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
        helper.make_node("Mul", ["masked", "token_type_ids"], ["second"]),
        helper.make_node("Cast", ["second"], ["second_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["second_f", "axes"], ["summed"], keepdims=1),
        helper.make_node("Mul", ["summed", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["logits"]),
    ]
    initializers = [
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        helper.make_tensor("scale", TensorProto.FLOAT, [], [SCALE]),
        helper.make_tensor("bias", TensorProto.FLOAT, [], [BIAS]),
    ]
    graph = helper.make_graph(nodes, "tiny_cross_encoder", inputs, [output], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, directory / "model.onnx")

    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@dataclass(frozen=True)
class TinyReranker:
    path: Path

    @staticmethod
    def logit(text: str) -> float:
        """What the tiny model computes for (any query, text): the second segment is the
        text's token ids plus the closing [SEP]."""
        ids = [VOCAB.get(word, VOCAB["[UNK]"]) for word in text.split()]
        return (sum(ids) + VOCAB["[SEP]"]) * SCALE + BIAS


@pytest.fixture
def tiny_reranker(tmp_path: Path) -> TinyReranker:
    return TinyReranker(build_tiny_cross_encoder(tmp_path / "reranker"))


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return Embedder.default(threads=1)


@pytest.fixture
def span_exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.clear()


@pytest.fixture
def tracer_provider(span_exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
async def client(server: RunningServer) -> AsyncIterator[RetrievalClient]:
    retrieval = RetrievalClient(server.address, timeout_s=30)
    try:
        yield retrieval
    finally:
        await retrieval.close()
