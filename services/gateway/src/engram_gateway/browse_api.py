"""Who and what a tenant's memory is about: ``GET /v1/users`` (the tenant's users) and
``GET /v1/conversations?user=`` (one user's conversations), each with how many
memories it holds, most first. From retrieval's ``ListScopes`` (through the memory
port), so tenant-scoped like every call; for browsing (the memory browser, agents), not
for exact accounting. A user carries the display name its chat client forwarded, where
the gateway recorded one (:mod:`engram_gateway.user_names`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from engram_core.api_models import ErrorResponse, UserId
from engram_core.memory import ScopeList
from engram_gateway.deps import AppState, Tenant
from engram_gateway.state import GatewayState

router = APIRouter(
    prefix="/v1",
    tags=["memories"],
    responses={
        400: {"model": ErrorResponse, "description": "Unknown or invalid query parameter"},
        401: {"model": ErrorResponse, "description": "Missing or invalid API key"},
        503: {"model": ErrorResponse, "description": "Retrieval is unavailable"},
    },
)


class _ScopeQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=100, ge=1, le=1000)
    include_superseded: bool = Field(
        default=False, description="Count superseded versions too (and scopes holding only those)."
    )


class ConversationsQuery(_ScopeQuery):
    user: UserId = Field(
        default="", description="Whose conversations; empty: the memories without a user."
    )


class UserOut(BaseModel):
    object: Literal["user"] = "user"
    id: str = Field(description="The user id; empty for memories that have no user.")
    name: str | None = Field(
        default=None,
        description="The display name the user's chat client last forwarded "
        "(ENGRAM_GATEWAY_USER_NAME_HEADER), when there is one: a label, not identity.",
    )
    memories: int


class ConversationOut(BaseModel):
    object: Literal["conversation"] = "conversation"
    id: str
    user_id: str
    memories: int


class UserList(BaseModel):
    object: Literal["list"] = "list"
    data: list[UserOut]
    has_more: bool = Field(description="More exist than limit (the ones with most memories shown).")


class ConversationList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ConversationOut]
    has_more: bool


async def _scopes(
    state: GatewayState, tenant: str, query: _ScopeQuery, user: str | None
) -> ScopeList:
    return await state.memories.list_scopes(
        tenant, user_id=user, limit=query.limit, include_superseded=query.include_superseded
    )


@router.get("/users", response_model=UserList, summary="The tenant's users, most memories first")
async def list_users(
    state: AppState, tenant: Tenant, query: Annotated[_ScopeQuery, Query()]
) -> JSONResponse:
    reply = await _scopes(state, tenant, query, None)
    names = await state.user_names.names(tenant, (s.user_id for s in reply.scopes))
    users = UserList(
        data=[
            UserOut(id=s.user_id, name=names.get(s.user_id), memories=s.memories)
            for s in reply.scopes
        ],
        has_more=reply.truncated,
    )
    return JSONResponse(users.model_dump(mode="json", exclude_none=True))


@router.get(
    "/conversations",
    response_model=ConversationList,
    summary="One user's conversations, most memories first",
)
async def list_conversations(
    state: AppState, tenant: Tenant, query: Annotated[ConversationsQuery, Query()]
) -> JSONResponse:
    reply = await _scopes(state, tenant, query, query.user)
    conversations = ConversationList(
        data=[
            ConversationOut(id=s.conversation_id, user_id=s.user_id, memories=s.memories)
            for s in reply.scopes
        ],
        has_more=reply.truncated,
    )
    return JSONResponse(conversations.model_dump(mode="json"))
