"""The chat routes, one per API a client speaks, each the same memory pipeline
(:mod:`engram_gateway.turn_pipeline`) with its API's adapter (:mod:`engram_gateway.apis`):

- ``POST /v1/chat/completions``: OpenAI Chat Completions;
- ``POST /v1/responses``: the OpenAI Responses API;
- ``POST /v1/messages``: the Anthropic Messages API;
- ``POST /api/chat``: Ollama's native chat.

Errors are answered in the route's API's own error shape; an upstream's 4xx is relayed
as it came.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from engram_gateway.apis.anthropic_messages import AnthropicMessages
from engram_gateway.apis.chat_completions import ChatCompletions
from engram_gateway.apis.ollama_chat import OllamaChat
from engram_gateway.apis.responses import Responses
from engram_gateway.chat_schema import chat_openapi
from engram_gateway.deps import AppState, Tenant
from engram_gateway.errors import GatewayError
from engram_gateway.turn_pipeline import ChatApi, run_turn
from engram_gateway.upstream import UpstreamRejected

router = APIRouter()

CHAT_COMPLETIONS = ChatCompletions()
RESPONSES = Responses()
ANTHROPIC_MESSAGES = AnthropicMessages()
OLLAMA_CHAT = OllamaChat()

_CHAT_RESPONSES, _CHAT_REQUEST = chat_openapi()


@router.post(
    "/v1/chat/completions",
    summary="Chat with memory (OpenAI Chat Completions)",
    responses=_CHAT_RESPONSES,
    openapi_extra=_CHAT_REQUEST,
)
async def chat_completions(request: Request, state: AppState, tenant: Tenant) -> Response:
    return await run_turn(CHAT_COMPLETIONS, request, state, tenant)


async def _in_api_shape(api: ChatApi, request: Request, state: AppState, tenant: str) -> Response:
    try:
        return await run_turn(api, request, state, tenant)
    except UpstreamRejected as rejected:
        return rejected.response()  # the upstream's own answer, in its API's shape
    except GatewayError as error:
        return api.error_response(error)


# Not in the OpenAPI schema: each API's own reference documents its body and events;
# docs/gateway.md says what Engram adds.
@router.post("/v1/responses", include_in_schema=False)
async def responses(request: Request, state: AppState, tenant: Tenant) -> Response:
    return await _in_api_shape(RESPONSES, request, state, tenant)


@router.post("/v1/messages", include_in_schema=False)
async def anthropic_messages(request: Request, state: AppState, tenant: Tenant) -> Response:
    return await _in_api_shape(ANTHROPIC_MESSAGES, request, state, tenant)


@router.post("/api/chat", include_in_schema=False)
async def ollama_chat(request: Request, state: AppState, tenant: Tenant) -> Response:
    return await _in_api_shape(OLLAMA_CHAT, request, state, tenant)
