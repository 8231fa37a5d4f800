"""The embedder's BERT graph rebuilt with onnxruntime's fused operators before quantizing
(bert_fusion.py): the packaged model is fused and gives the same hidden states, and a
graph that is not such an encoder, or a rebuild that does not match, keeps the folded
graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engram_retrieval import bert_fusion, embedder
from engram_retrieval.embedder import default_model_files, quantize_dynamic_int8


@pytest.fixture(scope="module")
def folded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged model folded as quantize_dynamic_int8 folds it."""
    path = tmp_path_factory.mktemp("folded") / "folded.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(
        str(default_model_files().model), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return path


def test_the_packaged_model_is_rebuilt_with_the_same_hidden_states(
    folded: Path, tmp_path: Path
) -> None:
    fused = embedder.fused_if_equivalent(folded, tmp_path / "fused.onnx")
    assert fused == tmp_path / "fused.onnx"
    ops = [n.op_type for n in onnx.load(str(fused)).graph.node]
    assert ops.count("Attention") == 6 and ops.count("LayerNormalization") == 12
    assert "SkipLayerNormalization" not in ops  # slower on onnxruntime's CPU kernels
    assert len(ops) < 80  # the export spelled the same model in over 400 nodes
    # a padded batch: every position the embedder pools is the folded graph's
    ids = np.array([[101, 1045, 2293, 10733, 1012, 102], [101, 7592, 102, 0, 0, 0]])
    mask = (ids != 0).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    expected, got = (
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
            ["last_hidden_state"], feeds
        )[0]
        for path in (folded, fused)
    )
    attended = mask.astype(bool)
    np.testing.assert_allclose(got[attended], expected[attended], atol=1e-4)


def test_the_quantized_model_runs_integer_attention() -> None:
    ops = {
        n.op_type
        for n in onnx.load_from_string(
            quantize_dynamic_int8(default_model_files().model)
        ).graph.node
    }
    assert "QAttention" in ops and "Attention" not in ops


def _not_a_bert(path: Path) -> Path:
    """y = x·W + b under names no BERT export uses."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "w")
    bias = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "dense.bias")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "dense.bias"], ["y"]),
        ],
        "not-bert",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [weight, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return path


def test_a_graph_that_is_no_bert_encoder_is_quantized_as_it_is(tmp_path: Path) -> None:
    model = _not_a_bert(tmp_path / "small.onnx")
    with pytest.raises(bert_fusion.NotFusable, match="inputs or outputs"):
        bert_fusion.fused_bert(onnx.load(str(model)), heads=1)
    assert embedder.fused_if_equivalent(model, tmp_path / "fused.onnx") == model
    quantized = onnx.load_from_string(quantize_dynamic_int8(model))
    assert "MatMulInteger" in {n.op_type for n in quantized.graph.node}


def test_a_rebuild_whose_output_differs_keeps_the_folded_graph(
    folded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one head of 384 is a different attention than MiniLM's twelve of 32
    monkeypatch.setattr(bert_fusion, "head_counts", lambda hidden: [1])
    assert embedder.fused_if_equivalent(folded, tmp_path / "fused.onnx") == folded


def test_the_head_counts_are_tried_until_one_matches(
    folded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    fused_bert = bert_fusion.fused_bert

    def recording(graph: onnx.ModelProto, heads: int) -> onnx.ModelProto:
        built.append(heads)
        return fused_bert(graph, heads)

    monkeypatch.setattr(bert_fusion, "fused_bert", recording)
    monkeypatch.setattr(bert_fusion, "head_counts", lambda hidden: [6, 12, 24])
    assert embedder.fused_if_equivalent(folded, tmp_path / "fused.onnx") == tmp_path / "fused.onnx"
    assert built == [6, 12]  # MiniLM's twelve heads match; 24 is never built


def test_head_counts_and_a_hidden_size_they_do_not_divide(folded: Path) -> None:
    assert bert_fusion.head_counts(384) == [6, 12]
    assert bert_fusion.head_counts(768) == [12, 24]
    assert bert_fusion.embedding_shape(onnx.load(str(folded))) == (30522, 384)
    with pytest.raises(bert_fusion.NotFusable, match="do not divide"):
        bert_fusion.fused_bert(onnx.load(str(folded)), heads=5)
