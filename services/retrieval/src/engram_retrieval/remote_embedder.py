"""Sentence vectors from any OpenAI-compatible embeddings API (``ENGRAM_EMBED_URL``).

``POST <url>/embeddings`` with ``{"model", "input": [texts], "encoding_format": "float"}``
(OpenAI, Ollama, vLLM, llama.cpp, LM Studio, text-embeddings-inference all answer it),
at most ``batch_size`` texts a request, each request bounded by a timeout and retried
while it fails transiently (refused connection, timeout, 429, 5xx) for up to
``retry_s`` by the policy every Engram process shares (engram_core.retry); a failure
that outlasts it is :class:`EmbedderUnavailable`, which the service answers with
``UNAVAILABLE`` so its callers retry in turn. A 4xx other than 429 (a wrong model name,
a bad key) is :class:`EmbedderRequestError`, never retried.

The dimension is read from the first answer (a probe at start-up) and every vector is
L2-normalised here, whatever the server does. Such APIs give pooled vectors only, so
token vectors for late interaction (MaxSim) come from the local token model (the
packaged MiniLM) when its dimension is the remote model's, as the store keeps one
dimension for both; otherwise texts get none and search ranks without MaxSim. BM25 is
computed in the service as always (docs/retrieval.md, Embedders).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx2
import numpy as np

from engram_core.logging import get_logger
from engram_core.retry import TransientError, retry_transient_sync
from engram_core.urls import without_credentials
from engram_retrieval.embedder import Encoded, SentenceEncoder

log = get_logger(__name__)

#: A remote model's id in each point's ``embedding_model``.
REMOTE_PREFIX = "remote:"


class EmbedderUnavailable(TransientError):
    """The embeddings API did not answer usably within the retry budget."""


class EmbedderRequestError(RuntimeError):
    """The embeddings API refused the request (4xx): configuration, not load."""


class RemoteEmbedder:
    """:class:`~engram_retrieval.embedder.SentenceEncoder` over an embeddings API.

    Blocking and thread-safe (one pooled HTTP client); run it off the event loop.
    """

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retry_s: float = 10.0,
        batch_size: int = 32,
        token_model: SentenceEncoder | None = None,
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx2.Client(
            base_url=url, headers=headers, timeout=timeout_s, transport=transport
        )
        #: How the API is named in logs and errors: never with its credentials.
        self.url = without_credentials(url)
        self.model = model
        self.retry_s = retry_s
        self.batch_size = batch_size
        self.runs_inline = False  # network I/O: never on the event loop
        self.dim = 0
        self.dim = int(self.embed(["dimension probe"]).shape[1])
        self._token_model = token_model if token_model and token_model.dim == self.dim else None
        tokens_by = f"+tokens:{self._token_model.model_id}" if self._token_model else ""
        self.model_id = f"{REMOTE_PREFIX}{model}{tokens_by}"
        if token_model is not None and self._token_model is None:
            log.warning(
                "embedder.no_token_vectors",
                embedding_model=model,
                dim=self.dim,
                token_model_dim=token_model.dim,
                detail="the remote model's dimension differs from the token model's: "
                "search ranks without late interaction (MaxSim)",
            )

    @property
    def token_vectors_kept(self) -> bool:
        return self._token_model is not None

    def close(self) -> None:
        self._client.close()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """One unit vector per text, shape ``(len(texts), dim)``, in input order."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        chunks = [
            self._embed_batch(list(texts[start : start + self.batch_size]))
            for start in range(0, len(texts), self.batch_size)
        ]
        return np.concatenate(chunks)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def encode(self, texts: Sequence[str]) -> list[Encoded]:
        """Remote sentence vectors, with the token model's token vectors when kept."""
        dense = self.embed(texts)
        if self._token_model is None:
            empty = np.zeros((0, self.dim), dtype=np.float16)
            return [Encoded(dense=vector, tokens=empty) for vector in dense]
        local = self._token_model.encode(texts)
        return [
            Encoded(dense=vector, tokens=encoded.tokens)
            for vector, encoded in zip(dense, local, strict=True)
        ]

    def encode_one(self, text: str) -> Encoded:
        return self.encode([text])[0]

    def token_vectors(self, text: str) -> np.ndarray:
        return self.encode_one(text).tokens

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        def attempt() -> np.ndarray:
            return self._post(texts)

        def note(exc: BaseException, pause: float) -> None:
            log.warning("embedder.retry", url=self.url, error=str(exc), pause_s=round(pause, 2))

        try:
            return retry_transient_sync(attempt, budget_s=self.retry_s, on_retry=note)
        except EmbedderRequestError:
            raise
        except TransientError as exc:
            raise EmbedderUnavailable(f"embeddings API {self.url}: {exc}") from exc

    def _post(self, texts: list[str]) -> np.ndarray:
        body = {"model": self.model, "input": texts, "encoding_format": "float"}
        try:
            response = self._client.post("/embeddings", json=body)
        except httpx2.TransportError as exc:  # refused, reset, timed out
            raise TransientError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code == 429 or response.status_code >= 500:
            raise TransientError(f"HTTP {response.status_code}: {response.text[:200]}")
        if response.status_code >= 400:
            raise EmbedderRequestError(
                f"embeddings API {self.url} refused model {self.model!r}: "
                f"HTTP {response.status_code}: {response.text[:300]}"
            )
        return self._vectors(response, len(texts))

    def _vectors(self, response: httpx2.Response, count: int) -> np.ndarray:
        try:
            data: list[dict[str, Any]] = response.json()["data"]
            ordered = sorted(data, key=lambda item: int(item["index"]))
            vectors = np.asarray([item["embedding"] for item in ordered], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            # a proxy's error page, a half answer: worth another try
            raise TransientError(f"not an embeddings answer: {response.text[:200]!r}") from exc
        if vectors.ndim != 2 or len(vectors) != count:
            raise TransientError(f"{len(vectors)} vectors for {count} texts")
        if self.dim and vectors.shape[1] != self.dim:
            raise EmbedderRequestError(
                f"embeddings API {self.url} answered {vectors.shape[1]}-d vectors for "
                f"{self.model!r}, {self.dim}-d at start-up: the model behind it changed"
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
