"""The Engram MCP server: memory tools and resources for agents, as a thin adapter over
the gateway's public HTTP memory API (docs/api.md) through this Python client and
nothing else. It needs the ``mcp`` extra (``engram-client[mcp]``).

One implementation, two transports, and neither imports the other's package: the
gateway serves it at ``/mcp`` (streamable HTTP; ``engram_gateway.mcp_http``), where
each tool calls the gateway's own API in-process with the caller's ``Authorization``;
``engram mcp`` (``engram_cli.mcp_cmd``) serves it on stdio and calls a running gateway
over the network with the configured key. Either way the API key decides the tenant,
exactly as for any HTTP caller, and an API error reaches the agent as a tool error
carrying the API's message. Arguments are checked before any call: an id is a UUID (so
``get_memory("../../v1/users")`` is refused, never a request to another path) and a user
id is normalised as the API does (engram_core.api_models).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.metadata import version
from typing import Annotated, Any

import httpx2
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from engram_client.async_client import AsyncEngramClient
from engram_client.errors import EngramError, EventTimeout
from engram_core.api_models import EventOut, MemoryId, UserId
from engram_core.kinds import KINDS
from engram_core.memory import MemoryKindName

SERVER_NAME = "engram"
INSTRUCTIONS = (
    "Engram is the user's long-term memory. Call search_memory before answering anything "
    "that may depend on what the user said before (preferences, people, plans, facts); "
    "call add_memory with what the user tells you that is worth remembering (Engram "
    "extracts and reconciles the facts itself), or remember_fact to store one exact "
    "statement. Scope every call with the same `user` (and `conversation`) the chat uses. "
    "Memory ids are UUIDs returned by search_memory and list_memories."
)
#: Longest an add_memory call may wait for its facts to be applied.
MAX_WAIT_S = 60.0
POLL_INTERVAL_S = 0.5
PROFILE_PAGE = 500

LIST_MEMORIES = (
    "List stored memories, newest first, with filters. Kinds: "
    + ", ".join(f"`{k.name}` ({k.description})" for k in KINDS)
    + ". Returns `data` (memories), `has_more` and `next_cursor`."
)
UserArg = Annotated[
    UserId,
    Field(
        description="The user the memory belongs to (the chat's `user` field). Empty: "
        "memories that belong to no user (tenant-wide).",
    ),
]
ConversationArg = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        description="The conversation scope (the chat's `memory_id`); 'default' if the chat "
        "sets none.",
    ),
]
NewConversationArg = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=200,
        description="The conversation it belongs to (the chat's `memory_id`). Unset: "
        "'default' for a user; without a user, 'global', the tenant-wide memory every "
        "user's chats recall.",
    ),
]
TagsArg = Annotated[
    list[str] | None,
    Field(max_length=32, description="Labels to file the memory under (1-64 characters each)."),
]


@dataclass
class GatewayApi:
    """Calls the gateway's HTTP API through ``client`` (based at the gateway's root) with
    the Python client.

    ``forward_authorization``: send the MCP request's own ``Authorization`` with each
    call (the gateway's ``/mcp``, where the client is in-process); otherwise the
    client's default headers carry the key (``engram mcp``).
    """

    client: httpx2.AsyncClient
    forward_authorization: bool = False

    def __post_init__(self) -> None:
        self._engram = AsyncEngramClient.over(self.client)

    def engram(self, ctx: Context | None) -> AsyncEngramClient:
        """The client for one tool call: with the caller's ``Authorization`` when
        forwarding it."""
        if not self.forward_authorization or ctx is None:
            return self._engram
        incoming = _request_headers(ctx)
        authorization = incoming.get("authorization") if incoming else None
        return self._engram.with_headers({"Authorization": authorization} if authorization else {})


def _request_headers(ctx: Context) -> Mapping[str, str] | None:
    try:
        return ctx.headers
    except ValueError:  # outside a request
        return None


def _json(model: BaseModel) -> dict[str, Any]:
    """An answer as the API sent it (the fields it set, nothing the client added)."""
    return model.model_dump(mode="json", exclude_unset=True)


def build_mcp_server(api: GatewayApi) -> MCPServer:
    """The MCP server: eight memory tools and the profile/summary resources."""
    server: MCPServer = MCPServer(
        SERVER_NAME,
        title="Engram memory",
        instructions=INSTRUCTIONS,
        version=version("engram-client"),
    )
    _add_reading_tools(server, api)
    _add_writing_tools(server, api)
    _add_resources(server, api)
    return server


# --- reading -------------------------------------------------------------------------------


def _add_reading_tools(server: MCPServer, api: GatewayApi) -> None:
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=read_only)
    async def search_memory(
        query: Annotated[
            str,
            Field(
                min_length=1,
                description="What to recall, as a question or topic "
                "(e.g. 'what is the user allergic to?').",
            ),
        ],
        ctx: Context,
        user: UserArg = "",
        conversation: ConversationArg = "default",
        top_k: Annotated[
            int | None,
            Field(ge=1, le=100, description="How many memories to return (default 5)."),
        ] = None,
    ) -> dict[str, Any]:
        """Recall what Engram remembers that is relevant to `query`, exactly as a chat
        would: the conversation's memories, the user's other conversations and the
        tenant-wide ones. Returns `hits` (each a memory with its `id`, `text`, `kind`,
        `score`, `scope` and the score breakdown `scores`: dense, sparse, relevance,
        recency, total, mmr), the conversation's rolling `summary` and the user's
        `profile`. `outcome` says why there are few or no hits (`nothing_relevant`,
        `empty`)."""
        async with _tool_call():
            found = await api.engram(ctx).search(
                query, user=user, conversation=conversation, top_k=top_k
            )
        return _json(found)

    @server.tool(annotations=read_only, description=LIST_MEMORIES)
    async def list_memories(
        ctx: Context,
        user: Annotated[
            UserId | None,
            Field(
                description="Only this user's memories ('' for those without a user); "
                "unset: any user.",
            ),
        ] = None,
        conversation: Annotated[
            str | None, Field(max_length=200, description="Only this conversation's memories.")
        ] = None,
        kinds: Annotated[
            list[MemoryKindName] | None,
            Field(description="Only these kinds (any of); unset: every kind."),
        ] = None,
        tags: Annotated[
            list[str] | None, Field(description="Only memories with any of these tags.")
        ] = None,
        created_after: Annotated[
            str | None,
            Field(
                description="Only memories created at or after this ISO 8601 instant "
                "(with a time zone, e.g. 2025-05-01T00:00:00Z)."
            ),
        ] = None,
        created_before: Annotated[
            str | None, Field(description="Only memories created before this ISO 8601 instant.")
        ] = None,
        include_superseded: Annotated[
            bool, Field(description="Also list versions that newer memories replaced.")
        ] = False,
        limit: Annotated[int, Field(ge=1, le=500, description="Page size.")] = 20,
        cursor: Annotated[
            str | None, Field(description="`next_cursor` of the previous page, for the next one.")
        ] = None,
    ) -> dict[str, Any]:
        async with _tool_call():
            page = await api.engram(ctx).list_page(
                user=user,
                conversation=conversation,
                kinds=kinds or (),
                tags=tags or (),
                created_after=created_after,
                created_before=created_before,
                include_superseded=include_superseded,
                limit=limit,
                cursor=cursor,
            )
        return _json(page)

    @server.tool(annotations=read_only)
    async def get_memory(
        memory_id: MemoryId,
        ctx: Context,
        include_history: Annotated[
            bool,
            Field(
                description="Also return `history`: the versions it replaced, oldest first, "
                "each with `valid_from`/`valid_to` and who changed it (`metadata`)."
            ),
        ] = False,
    ) -> dict[str, Any]:
        """One memory by id: its text, kind, scope (`user_id`, `conversation_id`), tags,
        timestamps, the turns it came from (`source_turn_ids`, which are memory ids too)
        and `superseded_by` when a newer memory replaced it."""
        engram = api.engram(ctx)
        async with _tool_call():
            memory = _json(await engram.get(memory_id))
            if include_history:
                memory["history"] = _json(await engram.history(memory_id))["data"]
        return memory

    @server.tool(annotations=read_only)
    async def get_profile(user: UserArg, ctx: Context) -> dict[str, Any]:
        """What Engram knows about the user as structured profile entries (identity,
        preference, constraint, instruction): `entries`, each with `category`, `key`,
        `value`, `confidence` and `importance`, one active value per key."""
        async with _tool_call():
            return await _profile(api, ctx, user)


async def _profile(api: GatewayApi, ctx: Context | None, user: str) -> dict[str, Any]:
    page = await api.engram(ctx).list_page(user=user, kinds=["profile"], limit=PROFILE_PAGE)
    entries = [
        {
            "id": m.id,
            **(m.profile.model_dump(mode="json") if m.profile else {"value": m.text}),
            "updated_at": m.updated_at.isoformat() if m.updated_at else None,
        }
        for m in page.data
    ]
    return {"object": "profile", "user": user, "entries": entries}


@asynccontextmanager
async def _tool_call() -> AsyncIterator[None]:
    """An API error, or an argument the API's models refuse, as the tool's error."""
    try:
        yield
    except (EngramError, ValidationError) as exc:
        raise ToolError(str(exc)) from None


# --- writing -------------------------------------------------------------------------------


def _add_writing_tools(server: MCPServer, api: GatewayApi) -> None:
    @server.tool(annotations=ToolAnnotations(read_only_hint=False, open_world_hint=False))
    async def add_memory(
        text: Annotated[
            str | list[str],
            Field(
                description="What the user said that may be worth remembering: one message, "
                "or several (each learned as one user message, in order)."
            ),
        ],
        ctx: Context,
        user: UserArg = "",
        conversation: NewConversationArg = None,
        wait_seconds: Annotated[
            float,
            Field(
                ge=0,
                le=MAX_WAIT_S,
                description="Wait up to this long for the facts to be learned before "
                "returning (0: return at once, the learning goes on).",
            ),
        ] = 0,
    ) -> dict[str, Any]:
        """Learn from text as Engram learns from a chat: the text is stored, facts are
        extracted from it and reconciled with what is known (a correction replaces the
        old fact, which is kept as history). Asynchronous: returns each event's `status`
        (`pending`, then `applied` once the facts are searchable, or `skipped` with a
        `reason` when nothing was learned) and the overall `status`."""
        engram = api.engram(ctx)
        async with _tool_call():
            accepted = await engram.add(text, user=user, conversation=conversation)
            try:
                events = await engram.wait(
                    accepted.event_ids, timeout_s=wait_seconds, poll_s=POLL_INTERVAL_S
                )
            except EventTimeout as pending:
                events = pending.events
        return {"status": _overall(events), "events": [_json(e) for e in events]}

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, open_world_hint=False))
    async def remember_fact(
        text: Annotated[
            str,
            Field(
                min_length=1,
                description="The fact, worded as it should be recalled "
                "(e.g. 'User is allergic to peanuts.').",
            ),
        ],
        ctx: Context,
        user: UserArg = "",
        conversation: NewConversationArg = None,
        tags: TagsArg = None,
    ) -> dict[str, Any]:
        """Store one fact verbatim (no extraction, no reconciliation): it is searchable
        at once. Returns the new memory with its `id`; when the scope already holds the
        same fact, that memory instead, with `duplicate_of` set to its id."""
        async with _tool_call():
            created = await api.engram(ctx).create(
                text, user=user, conversation=conversation, tags=tags or ()
            )
        return _json(created)

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True
        )
    )
    async def update_memory(
        memory_id: MemoryId,
        ctx: Context,
        text: Annotated[str | None, Field(description="The new text (re-embedded).")] = None,
        tags: Annotated[
            list[str] | None, Field(max_length=32, description="The new tags (replace the old).")
        ] = None,
    ) -> dict[str, Any]:
        """Correct a memory's text and/or tags. The id keeps naming the current version;
        the previous one is kept as history (see get_memory's include_history). Only the
        current version of a memory can be edited."""
        async with _tool_call():
            return _json(await api.engram(ctx).patch(memory_id, text=text, tags=tags))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    async def delete_memory(memory_id: MemoryId, ctx: Context) -> dict[str, Any]:
        """Forget a memory for good, together with its history versions. Returns
        `deleted_ids`."""
        async with _tool_call():
            return _json(await api.engram(ctx).delete(memory_id))


def _overall(events: list[EventOut]) -> str:
    """pending while any is; skipped when every one was; else applied."""
    statuses = {e.status for e in events}
    if "pending" in statuses:
        return "pending"
    return "skipped" if statuses == {"skipped"} else "applied"


# --- resources -----------------------------------------------------------------------------


def _add_resources(server: MCPServer, api: GatewayApi) -> None:
    @server.resource(
        "engram://users/{user}/profile",
        name="profile",
        title="A user's profile",
        mime_type="application/json",
    )
    async def user_profile(user: str, ctx: Context) -> dict[str, Any]:
        """The user's active profile entries (as get_profile returns them)."""
        try:
            return await _profile(api, ctx, user)
        except EngramError as exc:
            raise ResourceError(str(exc)) from None

    @server.resource(
        "engram://users/{user}/conversations/{conversation}/summary",
        name="conversation-summary",
        title="A conversation's summary",
        mime_type="text/markdown",
    )
    async def user_conversation_summary(user: str, conversation: str, ctx: Context) -> str:
        """The rolling summary of one of the user's conversations."""
        return await _summary(api, ctx, user, conversation)

    @server.resource(
        "engram://conversations/{conversation}/summary",
        name="tenant-conversation-summary",
        title="A conversation's summary (no user)",
        mime_type="text/markdown",
    )
    async def conversation_summary(conversation: str, ctx: Context) -> str:
        """The rolling summary of a conversation that belongs to no user."""
        return await _summary(api, ctx, "", conversation)


async def _summary(api: GatewayApi, ctx: Context, user: str, conversation: str) -> str:
    try:
        page = await api.engram(ctx).list_page(
            conversation=conversation, user=user, kinds=["summary"], limit=1
        )
    except (EngramError, ValidationError) as exc:
        raise ResourceError(str(exc)) from None
    if page.data:
        return page.data[0].text
    owner = f"user {user!r}" if user else "no user"
    raise ResourceError(f"No summary yet for conversation {conversation!r} of {owner}.")
