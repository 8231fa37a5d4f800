"""A scripted OpenAI-compatible upstream server that records every request.

It speaks the Chat Completions wire format (JSON and SSE streaming) with
deterministic replies, so the gateway's production code path — the ``openai``
package over HTTP — is exercised unchanged.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engram_cli.nats_server import free_port


@dataclass(frozen=True)
class UpstreamError:
    """A scripted failure: the upstream answers with this status and message."""

    status: int
    message: str = "scripted failure"


Reply = str | UpstreamError | Callable[[dict[str, Any]], "str | UpstreamError"]


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ScriptedUpstream:
    """Replies with ``replies`` in order (the last one repeats); records requests."""

    replies: list[Reply] = field(default_factory=lambda: ["OK."])
    model: str = "scripted-model"
    requests: list[RecordedRequest] = field(default_factory=list)
    fail_with: int | None = None  # respond with this HTTP status instead
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        self.port = free_port()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    def _next_reply(self, body: dict[str, Any]) -> str | UpstreamError:
        index = len(self.chat_requests()) - 1
        reply = self.replies[min(index, len(self.replies) - 1)]
        return reply(body) if callable(reply) else reply

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(RecordedRequest(request.url.path, dict(request.headers), body))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            return JSONResponse(
                {"error": {"message": "scripted failure", "type": "server_error", "code": None}},
                status_code=self.fail_with,
            )
        text = self._next_reply(body)
        if isinstance(text, UpstreamError):
            return JSONResponse(
                {"error": {"message": text.message, "type": "scripted_error", "code": None}},
                status_code=text.status,
            )
        created = int(time.time())
        completion_id = f"chatcmpl-{len(self.requests)}"
        if body.get("stream"):
            return StreamingResponse(
                self._stream(completion_id, created, text), media_type="text/event-stream"
            )
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": body.get("model", self.model),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": text},
                    }
                ],
                "usage": {
                    "prompt_tokens": 10,
                    "completion_tokens": len(text.split()),
                    "total_tokens": 10 + len(text.split()),
                },
            }
        )

    async def _stream(self, completion_id: str, created: int, text: str):  # type: ignore[no-untyped-def]
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            payload = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(payload)}\n\n"

        yield chunk({"role": "assistant", "content": ""})
        for word in text.split(" "):
            yield chunk(
                {"content": word + " "} if word != text.split(" ")[-1] else {"content": word}
            )
        yield chunk({}, "stop")
        yield "data: [DONE]\n\n"

    async def _models(self, request: Request) -> Response:
        self.requests.append(RecordedRequest(request.url.path, dict(request.headers), {}))
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "created": 0, "owned_by": "scripted"}
                ],
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    def start(self) -> ScriptedUpstream:
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted upstream did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
