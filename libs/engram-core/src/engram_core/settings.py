"""Settings shared by every Engram process.

Each service defines exactly one settings class that subclasses
:class:`EngramSettings`; all variables use the ``ENGRAM_`` prefix (standard
``OTEL_*`` variables are read by the OpenTelemetry SDK as they are). Settings are
validated when the service starts, so bad configuration fails fast with a message
naming the variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engram_core.event_loop import EventLoopChoice, uvloop_installed
from engram_core.retry_policy import RetrySettings
from engram_core.urls import without_credentials

DEFAULT_DATA_DIR = Path(".engram")
#: A quarter of NATS' default max_payload (1 MiB): room for JSON escapes and a copy.
DEFAULT_MAX_TEXT_BYTES = 256 * 1024
NATS_SCHEMES = ("nats://", "tls://", "ws://", "wss://")
#: ENGRAM_GRPC_KEEPALIVE_S's default (engram_core.retrieval_client applies it on both sides).
DEFAULT_GRPC_KEEPALIVE_S = 20.0


def parse_nats_urls(value: str) -> list[str]:
    """``ENGRAM_NATS_URL`` as a list of server URLs: one URL, or several separated by
    commas (the nodes of a cluster). The one parser every process and command uses."""
    urls = [part.strip() for part in value.split(",") if part.strip()]
    if not urls:
        raise ValueError("needs at least one nats://host:port URL")
    for url in urls:
        if not url.startswith(NATS_SCHEMES):
            raise ValueError(f"must be nats://host:port (got {without_credentials(url)!r})")
    return urls


class EngramSettings(BaseSettings, RetrySettings):
    """Variables every Engram process understands (the retry policy included)."""

    model_config = SettingsConfigDict(
        env_prefix="ENGRAM_",
        env_file=None,
        extra="ignore",
        frozen=True,
    )

    data_dir: Path = Field(
        default=DEFAULT_DATA_DIR, description="Where local state (NATS, Qdrant, mirror) lives."
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console", "auto"] = Field(
        default="json",
        description="json (one object per line, for log stores) or console (readable, for "
        "a developer's terminal); auto: console when stderr is a terminal. `engram up` "
        "chooses for its services (console on a terminal) unless this is set.",
    )
    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        description="NATS server URL, or the URLs of a cluster's nodes separated by commas.",
    )
    retrieval_address: str = Field(
        default="127.0.0.1:50051", description="host:port of the retrieval gRPC service."
    )
    grpc_keepalive_s: float = Field(
        default=DEFAULT_GRPC_KEEPALIVE_S,
        gt=0,
        le=3600,
        description="How often a client pings retrieval over an idle gRPC connection (to "
        "notice one that died silently); retrieval's server accepts pings that often "
        "(half of it, or of the default if shorter). Set the same value everywhere.",
    )
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Replicas of the JetStream stream and key-value buckets (3 on a cluster).",
    )
    max_text_bytes: int = Field(
        default=DEFAULT_MAX_TEXT_BYTES,
        ge=1024,
        le=16 * 1024 * 1024,
        description="Largest text (UTF-8 bytes) of one turn or memory: a chat's user "
        "message, the memory API, a mirror file. Larger is refused (413, or reported and "
        "skipped): every event must fit one NATS message (max_payload, 1 MiB by default) "
        "with JSON escaping, and so must its dead letter, which carries a copy.",
    )
    traces_file: Path | None = Field(
        default=None,
        description="Also write finished spans as JSON lines here (local debugging, tests).",
    )
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Serve Prometheus /metrics on this port (0: off). For processes without "
        "an HTTP port of their own (retrieval); the gateway and workers also serve /metrics "
        "on their HTTP/health port.",
    )
    metrics_host: str = Field(
        default="127.0.0.1", description="Bind address of ENGRAM_METRICS_PORT (0.0.0.0 in a pod)."
    )
    event_loop: EventLoopChoice = Field(
        default="auto",
        description="The asyncio event loop: uvloop, asyncio (the standard one, for "
        "debugging), or auto (uvloop when installed).",
    )
    profile_dir: Path | None = Field(
        default=None,
        description="Sample where this process spends its CPU and write the profile here "
        "(SIGUSR1 starts a new window, SIGUSR2 and exit write it; engram_core.profiling). "
        "Costs about 1-2 % of a core; for benchmarks and investigations.",
    )

    @field_validator("log_level", "log_format", "event_loop", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("event_loop", mode="after")
    @classmethod
    def _loop_installed(cls, value: EventLoopChoice) -> EventLoopChoice:
        if value == "uvloop" and not uvloop_installed():
            raise ValueError("uvloop is not installed (use auto or asyncio)")
        return value

    @field_validator("nats_url")
    @classmethod
    def _nats_urls(cls, value: str) -> str:
        parse_nats_urls(value)
        return value

    @property
    def nats_servers(self) -> list[str]:
        return parse_nats_urls(self.nats_url)

    @field_validator("retrieval_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"must be host:port (got {value!r})")
        return value


S = TypeVar("S", bound=EngramSettings)


class ConfigError(SystemExit):
    """Raised (and exits non-zero) when a service's configuration is invalid."""


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build settings from the environment, turning validation errors into a clear exit."""
    try:
        return cls(**overrides)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            if not error["loc"]:  # a rule across variables: its message names them
                lines.append(f"  {error['msg'].removeprefix('Value error, ')}")
                continue
            name = "ENGRAM_" + "_".join(str(p) for p in error["loc"]).upper()
            lines.append(f"  {name}: {error['msg']}")
        raise ConfigError(
            f"invalid configuration for {cls.__name__}:\n" + "\n".join(lines)
        ) from None
