"""The gateway's configuration: ``ENGRAM_*`` variables, validated at start-up."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import NoDecode

from engram_core.locks import LockSettingsMixin
from engram_core.near_duplicates import NearDuplicateSettingsMixin
from engram_core.settings import EngramSettings
from engram_core.urls import without_credentials
from engram_gateway.keys import KeyTable


class GatewaySettings(EngramSettings, LockSettingsMixin, NearDuplicateSettingsMixin):
    """Everything the gateway reads from the environment (on top of the shared variables)."""

    gateway_host: str = Field(default="127.0.0.1", min_length=1, description="Bind address.")
    gateway_port: int = Field(
        default=8100, ge=0, le=65535, description="Bind port (0: any free port, logged)."
    )
    gateway_max_body_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024, description="Largest request body accepted (413 above)."
    )
    gateway_body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A request body must arrive within this long (408 and the connection "
        "closed otherwise), so half-sent bodies cannot hold connections.",
    )
    gateway_retrieval_timeout_s: float = Field(
        default=3.0,
        gt=0,
        le=60,
        description="Deadline of the memory search before a chat goes on without memory.",
    )
    gateway_search_stream: bool = Field(
        default=True,
        description="Send the chats' memory searches as messages on one open gRPC stream "
        "to retrieval, which costs a chat about 0.6 ms less than a call each "
        "(docs/retrieval.md, 'The search stream'); false: a unary call each, for a proxy "
        "between the two that does not carry long-lived streams.",
    )
    gateway_publish_drain_s: float = Field(
        default=10.0,
        ge=0,
        le=120,
        description="On shutdown, wait this long for assistant turns still being published.",
    )
    gateway_passthrough: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("models", "embeddings"),
        description="/v1/<name>/... paths relayed to the upstream as they are (comma-"
        "separated first path segments); any other unknown path is a 404.",
    )
    # Defaults for the per-request memory controls. Unset: the retrieval service's own
    # defaults apply (the gateway only sends what the caller or the operator chose).
    gateway_memory_enabled: bool = Field(
        default=True, description="Memory on when a request does not say (memory=false bypasses)."
    )
    gateway_memory_top_k: int | None = Field(default=None, ge=1, le=100)
    gateway_memory_max_tokens: int = Field(
        default=1050,
        ge=0,
        le=100_000,
        description="Token budget of the injected memory message when a request does not "
        "say: the best memories in rank order until it is spent, memory_top_k as a cap; "
        "0: no budget, top_k hits. 1050 by the gateway's estimate, which counts a few "
        "percent over a real tokenizer: a median of about 1000 real tokens "
        "(docs/retrieval.md, 'Token budget').",
    )
    gateway_memory_recency_weight: float | None = Field(default=None, ge=0, le=1)
    gateway_memory_score_threshold: float | None = Field(default=None, ge=0, le=1)
    gateway_memory_mmr_lambda: float | None = Field(default=None, ge=0, le=1)
    gateway_memory_cross_session: bool = Field(
        default=True,
        description="Recall from the user's other conversations too when a request does not "
        "say (memory_cross_session=false keeps recall to the conversation).",
    )

    gateway_user_header: str = Field(
        default="X-OpenWebUI-User-Id",
        max_length=200,
        description="The request header naming the user when a chat's body has no `user` "
        "(Open WebUI forwards its user id in this one with ENABLE_FORWARD_USER_INFO_HEADERS); "
        "empty: only the body's `user`.",
    )
    gateway_conversation_header: str = Field(
        default="X-OpenWebUI-Chat-Id",
        max_length=200,
        description="The request header naming the conversation when a chat sets no "
        "memory_id (Open WebUI forwards its chat id in this one with "
        "ENABLE_FORWARD_USER_INFO_HEADERS); empty: only memory_id.",
    )
    gateway_user_name_header: str = Field(
        default="X-OpenWebUI-User-Name",
        max_length=200,
        description="The request header carrying the person's display name (Open WebUI "
        "forwards it percent-encoded with ENABLE_FORWARD_USER_INFO_HEADERS): recorded with "
        "the user's turns when the user came from ENGRAM_GATEWAY_USER_HEADER, shown beside "
        "the id in GET /v1/users and the memory browser; a label, never identity; empty: none.",
    )
    gateway_temporary_chat_prefixes: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("temporary:", "local:"),
        description="A conversation named by ENGRAM_GATEWAY_CONVERSATION_HEADER that starts "
        "with one of these (comma-separated) is a temporary chat: no recall, nothing "
        "recorded, unless the request itself sets memory; empty: none. Open WebUI names "
        "them 'temporary:<id>' (0.12; 'local:<id>' in older versions).",
    )
    gateway_temporary_chat_prefix: str | None = Field(
        default=None,
        max_length=200,
        description="Deprecated, the single-value form of "
        "ENGRAM_GATEWAY_TEMPORARY_CHAT_PREFIXES: a prefix added to the list (it never "
        "narrows it: turn the rule off with an empty ENGRAM_GATEWAY_TEMPORARY_CHAT_PREFIXES).",
    )
    gateway_task_prompt_pattern: str = Field(
        default=r"(?s)\A### Task:.*?<chat_history>",
        max_length=1000,
        description="A chat whose latest user message matches this regular expression is a "
        "client's background task (Open WebUI's titles, tags, follow-ups and search "
        "queries: a '### Task:' prompt around the pasted <chat_history>; its document and "
        "web-search prompt has no chat history and is a person's message): no recall, "
        "nothing recorded, unless the request itself sets memory; empty: none.",
    )
    gateway_ui: bool = Field(
        default=True, description="Serve the memory browser at /ui (GET / redirects there)."
    )
    gateway_mcp: bool = Field(
        default=True, description="Serve the MCP server (streamable HTTP) at /mcp."
    )

    # API keys → tenants (see engram_gateway.keys for the format). Neither set: one
    # tenant, "default", and no authentication (local use).
    api_keys: Annotated[KeyTable | None, NoDecode] = Field(
        default=None,
        description="Key entries sha256:<hex>=<tenant> (or <tenant>:admin: an operator's key, "
        "the only one that reads /v1/admin/...), separated by commas or newlines.",
    )
    api_keys_file: Annotated[KeyTable | None, NoDecode] = Field(
        default=None,
        description="A file of key entries (one per line, # comments), read at start.",
    )
    max_memory_chars: int = Field(
        default=8000,
        ge=1,
        le=1_000_000,
        description="Longest memory text the memory API accepts (400 above).",
    )

    llm_base_url: str = Field(
        default="http://localhost:11434/v1",
        description="The upstream OpenAI-compatible API, including its /v1 prefix.",
    )
    llm_responses_url: str | None = Field(
        default=None,
        description="Where the upstream serves the OpenAI Responses API (the full URL of "
        "its /responses endpoint); unset: ENGRAM_LLM_BASE_URL + /responses.",
    )
    llm_messages_url: str | None = Field(
        default=None,
        description="Where the upstream serves the Anthropic Messages API (the full URL of "
        "its /messages endpoint); unset: ENGRAM_LLM_BASE_URL + /messages.",
    )
    llm_ollama_chat_url: str | None = Field(
        default=None,
        description="Where the upstream serves Ollama's native chat (the full URL of its "
        "/api/chat endpoint); unset: ENGRAM_LLM_BASE_URL without its /v1, + /api/chat.",
    )
    llm_api_key: SecretStr | None = Field(
        default=None,
        description="Upstream key. When set it is always used; when unset the caller's "
        "Authorization header is forwarded.",
    )
    llm_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Upstream read timeout (per read: a long stream that keeps sending is fine).",
    )
    llm_connect_timeout_s: float = Field(default=10.0, gt=0)
    llm_max_retries: int = Field(
        default=0,
        ge=0,
        le=10,
        description="Retries of the upstream call (429/5xx/connection). 0: the caller retries.",
    )

    @field_validator("gateway_passthrough", mode="before")
    @classmethod
    def _split_names(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip().strip("/") for part in value.split(",") if part.strip())
        return value

    @field_validator("gateway_passthrough")
    @classmethod
    def _no_engram_paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if "/" in name or not name:
                raise ValueError(f"names are first path segments such as 'models' (got {name!r})")
            if name in ("chat", "memories", "events", "admin"):
                raise ValueError(f"/v1/{name} is Engram's own, not relayed")
        return value

    @field_validator("gateway_temporary_chat_prefixes", mode="before")
    @classmethod
    def _split_prefixes(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("gateway_temporary_chat_prefixes")
    @classmethod
    def _prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for prefix in value:
            if not prefix or len(prefix) > 200:
                raise ValueError(f"each prefix is 1-200 characters (got {prefix!r})")
        return value

    @property
    def temporary_chat_prefixes(self) -> tuple[str, ...]:
        """What starts a temporary chat's id: the list, plus the deprecated single value.
        An old setting only adds: an explicit 'local:' from before Open WebUI 0.12 must
        not make its 'temporary:' chats remembered."""
        prefixes, extra = self.gateway_temporary_chat_prefixes, self.gateway_temporary_chat_prefix
        return (*prefixes, extra) if extra and extra not in prefixes else prefixes

    @field_validator("gateway_task_prompt_pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("llm_responses_url", "llm_messages_url", "llm_ollama_chat_url")
    @classmethod
    def _endpoint_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return cls._http_url(value)

    @field_validator("llm_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                "must be an http(s) URL such as http://host:port/v1 "
                f"(got {without_credentials(value)!r})"
            )
        if parts.query or parts.fragment:
            raise ValueError(
                f"must not carry a query or fragment (got {without_credentials(value)!r}, "
                "shown without them)"
            )
        return value.strip().rstrip("/")

    @field_validator("llm_api_key")
    @classmethod
    def _blank_key_is_none(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            return None
        return value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return KeyTable.parse(value) if value.strip() else None
        return value

    @field_validator("api_keys_file", mode="before")
    @classmethod
    def _read_keys_file(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str | Path):
            if not str(value).strip():
                return None
            path = Path(str(value).strip())
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(
                    f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
                ) from None
            try:
                table = KeyTable.parse(text)
                if isinstance(info.data.get("api_keys"), KeyTable):
                    info.data["api_keys"].merged(table)  # only checks for conflicts
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None
            return table
        return value

    @property
    def key_table(self) -> KeyTable | None:
        """Every configured key (both settings), or None: single-tenant, no auth."""
        tables = [t for t in (self.api_keys, self.api_keys_file) if t is not None]
        if not tables:
            return None
        return tables[0].merged(tables[1]) if len(tables) == 2 else tables[0]

    @property
    def listen_url(self) -> str:
        host = f"[{self.gateway_host}]" if ":" in self.gateway_host else self.gateway_host
        return f"http://{host}:{self.gateway_port}"
