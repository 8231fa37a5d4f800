"""A BERT encoder's graph rebuilt with onnxruntime's fused operators, before quantizing.

The packaged MiniLM was exported by a tracer that spells each layer's attention as some
forty small nodes (reshapes, transposes, slices, a NaN guard after the softmax), and
onnxruntime's own fusions do not recognise that spelling. Each node costs its kernel
launch whatever the tensor's size, and a query is a dozen tokens: the model's run was
mostly launches. The same weights in onnxruntime's fused operators (``Attention``,
``BiasGelu``, ``EmbedLayerNormalization``) are nine nodes a layer, and the quantizer
turns ``Attention`` into its integer ``QAttention``. Each residual stays ``Add`` +
``Add`` + ``LayerNormalization``: onnxruntime's ``SkipLayerNormalization`` CPU kernel
takes about 20 µs more than those three whatever the size (a model run 15-29% slower
with it), so the session leaves them unfused (``create_session``; docs/retrieval.md).

:func:`fused_bert` reads the weights by the names a Hugging Face BERT export gives them
(``…encoder.layer.N.attention.self.query`` and so on), whatever its prefix, and raises
:class:`NotFusable` for any other graph; the caller compares the rebuilt graph's output
with the original's and keeps the original where they differ (embedder.py). Pure: ONNX
protobufs in, one out, no session and no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The six dense layers of a BERT layer, in the order the rebuilt graph uses them.
ROLES = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
_LAYER_BIAS = re.compile(
    r"(?P<prefix>.*)encoder\.layer\.(?P<layer>\d+)\.(?P<role>"
    + "|".join(re.escape(r) for r in ROLES)
    + r")\.bias$"
)
#: What the embedder feeds and reads (encodings_to_inputs; the output it pools).
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT = "last_hidden_state"


class NotFusable(ValueError):
    """The graph is not a BERT encoder this module knows how to rebuild."""


@dataclass(frozen=True)
class _Dense:
    weight: np.ndarray  # (in, out): the MatMul's right operand
    bias: np.ndarray


def _dense_layers(graph: onnx.GraphProto) -> tuple[str, dict[tuple[int, str], _Dense]]:
    """Every ``MatMul(x, W)`` followed by ``Add(·, b)`` whose bias is named as a BERT
    layer's: (the names' prefix, {(layer, role): weights})."""
    initializers = {i.name: i for i in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found: dict[tuple[int, str], _Dense] = {}
    prefixes: set[str] = set()
    for node in graph.node:
        if node.op_type != "MatMul" or len(node.input) != 2:
            continue
        if node.input[1] not in initializers or node.input[0] in initializers:
            continue
        adds = [n for n in consumers.get(node.output[0], []) if n.op_type == "Add"]
        biases = [name for add in adds for name in add.input if name in initializers]
        match = _LAYER_BIAS.match(biases[0]) if len(adds) == 1 and len(biases) == 1 else None
        if match is None:
            raise NotFusable(f"{node.name}: a MatMul that is not one of a BERT layer's")
        key = (int(match["layer"]), match["role"])
        if key in found:
            raise NotFusable(f"layer {key[0]}'s {key[1]} appears twice")
        prefixes.add(match["prefix"])
        found[key] = _Dense(
            numpy_helper.to_array(initializers[node.input[1]]),
            numpy_helper.to_array(initializers[biases[0]]),
        )
    if not found:
        raise NotFusable("no encoder layers")
    if len(prefixes) != 1:
        raise NotFusable(f"weights under several prefixes: {sorted(prefixes)}")
    layers = 1 + max(layer for layer, _ in found)
    missing = [(i, r) for i in range(layers) for r in ROLES if (i, r) not in found]
    if missing:
        raise NotFusable(f"layer {missing[0][0]} lacks {missing[0][1]}")
    return prefixes.pop(), found


def _epsilon(graph: onnx.GraphProto) -> float:
    for node in graph.node:
        if node.op_type == "LayerNormalization":
            for attribute in node.attribute:
                if attribute.name == "epsilon":
                    return float(attribute.f)
            return 1e-5  # the operator's default
    raise NotFusable("no LayerNormalization")


def fused_bert(folded: onnx.ModelProto, heads: int) -> onnx.ModelProto:
    """``folded`` (a BERT encoder whose weights are plain initializers) as onnxruntime's
    fused operators with ``heads`` attention heads: the same inputs (int64
    ``input_ids``, ``attention_mask``, ``token_type_ids``) and output
    (``last_hidden_state``)."""
    graph = folded.graph
    if {i.name for i in graph.input} != set(INPUTS) or [o.name for o in graph.output] != [OUTPUT]:
        raise NotFusable("inputs or outputs are not a BERT encoder's")
    prefix, dense = _dense_layers(graph)
    initializers = {i.name: i for i in graph.initializer}
    eps = _epsilon(graph)

    def named(suffix: str) -> np.ndarray:
        if prefix + suffix not in initializers:
            raise NotFusable(f"no {prefix + suffix}")
        return numpy_helper.to_array(initializers[prefix + suffix])

    word = named("embeddings.word_embeddings.weight")
    hidden = int(word.shape[1])
    if heads < 1 or hidden % heads:
        raise NotFusable(f"{heads} heads do not divide a hidden size of {hidden}")
    tensors: list[onnx.TensorProto] = []

    def tensor(name: str, value: np.ndarray) -> str:
        tensors.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def skip_layer_norm(
        x: str, bias: np.ndarray, skip: str, norm: str, out: str
    ) -> list[onnx.NodeProto]:
        """``out`` = LayerNorm(x + bias + skip), the residual that ends each half of a BERT
        layer, with the weights of the export's LayerNorm ``norm``."""
        return [
            helper.make_node("Add", [x, tensor(f"{x}.bias", bias)], [f"{x}.biased"]),
            helper.make_node("Add", [f"{x}.biased", skip], [f"{x}.residual"]),
            helper.make_node(
                "LayerNormalization",
                [
                    f"{x}.residual",
                    tensor(f"{x}.norm.gamma", named(norm + ".weight")),
                    tensor(f"{x}.norm.beta", named(norm + ".bias")),
                ],
                [out],
                axis=-1,
                epsilon=eps,
            ),
        ]

    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids"], to=TensorProto.INT32),
        helper.make_node("Cast", ["token_type_ids"], ["segments"], to=TensorProto.INT32),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.INT32),
        helper.make_node(
            "EmbedLayerNormalization",
            [
                "ids",
                "segments",
                tensor("word_embeddings", word),
                tensor("position_embeddings", named("embeddings.position_embeddings.weight")),
                tensor("segment_embeddings", named("embeddings.token_type_embeddings.weight")),
                tensor("embeddings_gamma", named("embeddings.LayerNorm.weight")),
                tensor("embeddings_beta", named("embeddings.LayerNorm.bias")),
                "mask",
            ],
            ["hidden_0", "mask_index"],
            domain="com.microsoft",
            epsilon=eps,
        ),
    ]
    layers = 1 + max(layer for layer, _ in dense)
    x = "hidden_0"
    for i in range(layers):
        weights = {role: dense[(i, role)] for role in ROLES}
        names = f"encoder.layer.{i}."
        qkv = [weights[r] for r in ROLES[:3]]
        out = OUTPUT if i == layers - 1 else f"hidden_{i + 1}"
        nodes += [
            helper.make_node(
                "Attention",
                [
                    x,
                    tensor(f"l{i}.qkv.weight", np.concatenate([d.weight for d in qkv], axis=1)),
                    tensor(f"l{i}.qkv.bias", np.concatenate([d.bias for d in qkv])),
                    "mask",
                ],
                [f"l{i}.attention"],
                domain="com.microsoft",
                num_heads=heads,
            ),
            helper.make_node(
                "MatMul",
                [f"l{i}.attention", tensor(f"l{i}.o.weight", weights[ROLES[3]].weight)],
                [f"l{i}.o"],
            ),
            *skip_layer_norm(
                f"l{i}.o",
                weights[ROLES[3]].bias,
                x,
                names + "attention.output.LayerNorm",
                f"l{i}.h",
            ),
            helper.make_node(
                "MatMul",
                [f"l{i}.h", tensor(f"l{i}.up.weight", weights[ROLES[4]].weight)],
                [f"l{i}.up"],
            ),
            helper.make_node(
                "BiasGelu",
                [f"l{i}.up", tensor(f"l{i}.up.bias", weights[ROLES[4]].bias)],
                [f"l{i}.gelu"],
                domain="com.microsoft",
            ),
            helper.make_node(
                "MatMul",
                [f"l{i}.gelu", tensor(f"l{i}.down.weight", weights[ROLES[5]].weight)],
                [f"l{i}.down"],
            ),
            *skip_layer_norm(
                f"l{i}.down", weights[ROLES[5]].bias, f"l{i}.h", names + "output.LayerNorm", out
            ),
        ]
        x = out
    rebuilt = helper.make_graph(
        nodes,
        "bert-fused",
        [
            helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
            for n in INPUTS
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", "sequence", hidden])],
        tensors,
    )
    return helper.make_model(
        rebuilt,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=folded.ir_version,
    )


def head_counts(hidden: int) -> list[int]:
    """The head counts to try, most common first: BERT's heads are 64 wide (base, large)
    or 32 (MiniLM)."""
    return [hidden // width for width in (64, 32) if hidden % width == 0]


def embedding_shape(folded: onnx.ModelProto) -> tuple[int, int]:
    """(vocabulary, hidden size) of a BERT encoder's word embeddings."""
    for initializer in folded.graph.initializer:
        if initializer.name.endswith("embeddings.word_embeddings.weight"):
            vocabulary, hidden = initializer.dims
            return int(vocabulary), int(hidden)
    raise NotFusable("no word embeddings")
