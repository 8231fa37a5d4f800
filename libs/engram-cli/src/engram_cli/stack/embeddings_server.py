"""``engram serve-embeddings``: an OpenAI-compatible embeddings server over a local ONNX
bi-encoder (by default the packaged MiniLM, as retrieval runs it).

``POST /v1/embeddings`` takes ``{"model", "input": str | [str], "encoding_format"?}``
and answers ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
"model", "usage"}``; ``GET /v1/models`` lists the one model. A request for another model
name is a 404 ``model_not_found``, a malformed body a 400, both OpenAI-shaped.

It exists so that the remote embedder (``ENGRAM_EMBED_URL``) can be run and measured
against the very model the local embedder runs: same vectors, so retrieval quality is
unchanged and what a benchmark shows is the cost of the HTTP hop (docs/benchmarks.md).
The tests use it as the embeddings server of a whole stack.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

# Before numpy: the package gives numpy's BLAS one thread, as in retrieval (its threads
# spin between calls and take the core the model runs on).
import engram_retrieval  # noqa: F401  # isort: skip
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

#: The model name the server answers to unless told otherwise.
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
#: Most texts one request may carry (OpenAI's own limit is 2048).
MAX_INPUTS = 2048


class TextEmbedder(Protocol):
    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": code}},
        status_code=status,
    )


def _inputs(body: Any) -> list[str] | str:
    """The texts of a request, or why it is malformed."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return "input must be a string or a non-empty list of strings"
    if len(texts) > MAX_INPUTS:
        return f"at most {MAX_INPUTS} inputs per request"
    return texts


@dataclass
class EmbeddingsServer:
    """Serves ``embedder`` as ``model_name`` on 127.0.0.1:``port`` (0: a free port) in a
    background thread; the model runs in a worker thread, off the event loop."""

    embedder: TextEmbedder
    model_name: str = DEFAULT_MODEL_NAME
    port: int = 0
    host: str = "127.0.0.1"
    requests: int = 0
    _server: uvicorn.Server | None = field(default=None, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def _embeddings(self, request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON", "invalid_json")
        texts = _inputs(body)
        if isinstance(texts, str):
            return _error(400, texts, "invalid_input")
        if body.get("model") != self.model_name:
            return _error(
                404,
                f"model {body.get('model')!r} not found (serving {self.model_name!r})",
                "model_not_found",
            )
        self.requests += 1
        vectors = await asyncio.to_thread(self.embedder.embed, texts)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": vector.tolist()}
                    for i, vector in enumerate(vectors)
                ],
                "model": self.model_name,
                "usage": {"prompt_tokens": 0, "total_tokens": 0},
            }
        )

    async def _models(self, request: Request) -> JSONResponse:
        model = {"id": self.model_name, "object": "model", "owned_by": "engram"}
        return JSONResponse({"object": "list", "data": [model]})

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    def start(self) -> EmbeddingsServer:
        config = uvicorn.Config(
            self.app(), host=self.host, port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"embeddings server did not start on port {self.port}")
            time.sleep(0.02)
        if self.port == 0:
            (listener,) = self._server.servers[0].sockets
            self.port = int(listener.getsockname()[1])
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


def packaged_embedder(model_path: Path | None = None, *, threads: int = 1) -> TextEmbedder:
    """The bi-encoder retrieval runs by default (the packaged MiniLM, quantized), or the
    one in ``model_path`` (model.onnx + tokenizer.json)."""
    from engram_retrieval.embedder import Embedder, model_files_at

    if model_path is None:
        return Embedder.default(threads=threads)
    return Embedder(model_files_at(model_path), threads=threads, quantization="dynamic-int8")


def serve_embeddings_command(args: argparse.Namespace) -> int:
    server = EmbeddingsServer(
        packaged_embedder(args.model_path, threads=args.threads),
        model_name=args.model_name,
        port=args.port,
    ).start()
    print(
        f"engram: embeddings at {server.base_url} (model {server.model_name!r}); "
        f"ENGRAM_EMBED_URL={server.base_url} ENGRAM_EMBED_MODEL={server.model_name} "
        "(Ctrl-C stops)",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


def add_serve_embeddings_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "serve-embeddings",
        help="an OpenAI-compatible /v1/embeddings server over the packaged MiniLM",
        description="Serves the bi-encoder retrieval runs by default (or --model-path) as an "
        "OpenAI-compatible embeddings API, so the remote embedder (ENGRAM_EMBED_URL) can be "
        "run and measured against the same model.",
    )
    parser.add_argument("--port", type=int, default=8090, help="port on 127.0.0.1")
    parser.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="the name it answers to")
    parser.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="a directory with model.onnx and tokenizer.json (default: the packaged MiniLM)",
    )
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime threads")
    parser.set_defaults(func=handler)
