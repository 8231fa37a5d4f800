"""Where the local stack's pieces are, for ``engram up`` (which places them) and for
every client command (which finds them): one settings class, :class:`CliSettings`.

A stack moved with ``ENGRAM_GATEWAY_PORT``, ``ENGRAM_RETRIEVAL_LISTEN``,
``ENGRAM_NATS_URL`` or ``ENGRAM_HEALTH_PORT_BASE`` is found by ``engram status``,
``search``, ``import``... with the same variables and nothing else:

- the gateway: ``ENGRAM_GATEWAY_URL`` when set (a proxy, another host), else
  ``http://<ENGRAM_GATEWAY_HOST>:<ENGRAM_GATEWAY_PORT>`` (a wildcard host such as
  ``0.0.0.0`` is reached on loopback);
- retrieval: ``ENGRAM_RETRIEVAL_ADDRESS`` when set, else where ``engram up`` makes it
  listen (``ENGRAM_RETRIEVAL_LISTEN``, loopback for a wildcard host); ``up`` makes it
  listen on ``ENGRAM_RETRIEVAL_ADDRESS`` when only that is set;
- NATS: ``ENGRAM_NATS_URL``; the workers' health ports: ``ENGRAM_HEALTH_PORT_BASE`` and on.

Flags override the variables; ``--help`` shows the defaults this environment gives.
Also here: the API key, and a one-line error type that becomes exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import Field, SecretStr, model_validator

from engram_core.settings import ConfigError, EngramSettings, load_settings
from engram_core.worker_catalog import WORKER_CATALOG, worker_names

if TYPE_CHECKING:
    import httpx2
    from faststream.nats import NatsBroker

#: Every worker, in start order (engram_core.worker_catalog); each has its health port at
#: ``health_port_base`` + its offset in the catalogue.
WORKERS = worker_names()
DEFAULT_RETRIEVAL = "127.0.0.1:50051"
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1", "": "127.0.0.1"}


def reachable_host(host: str) -> str:
    """The host a local client dials for a server bound to ``host`` (URL form)."""
    host = _WILDCARDS.get(host, host)
    return f"[{host.strip('[]')}]" if ":" in host else host


def reachable_address(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    return f"{reachable_host(host)}:{port}"


class CliSettings(EngramSettings):
    """``ENGRAM_*`` variables of the ``engram`` command (flags override them)."""

    gateway_host: str = Field(default="127.0.0.1", description="Where `engram up` binds it.")
    gateway_port: int = Field(default=8100, ge=1, le=65535)
    gateway_url: str = Field(
        default="",
        description="The gateway's base URL for client commands (no /v1); default from "
        "ENGRAM_GATEWAY_HOST and ENGRAM_GATEWAY_PORT.",
    )
    retrieval_listen: str = Field(
        default="", description="Where `engram up` makes retrieval listen (host:port)."
    )
    health_port_base: int = Field(
        default=WORKER_CATALOG[0].health_port,
        ge=1,
        le=65535
        - max(entry.health_port - WORKER_CATALOG[0].health_port for entry in WORKER_CATALOG),
        description="The workers' health endpoints listen on this port and the next ones.",
    )
    api_key: SecretStr | None = Field(
        default=None, description="An Engram API key, sent as the bearer token."
    )
    mirror_root: Path | None = Field(
        default=None, description="The mirror's root (default <data_dir>/mirror)."
    )
    llm_model: str = Field(
        default="", description="import --via http: the model extraction uses (--model)."
    )

    @model_validator(mode="before")
    @classmethod
    def _derive_locations(cls, data: Any) -> Any:
        """Fill what was not set from what was: each place is configured once."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        listen, address = data.get("retrieval_listen"), data.get("retrieval_address")
        if not listen:
            data["retrieval_listen"] = address or DEFAULT_RETRIEVAL
        elif not address:
            data["retrieval_address"] = reachable_address(str(listen))
        if not data.get("gateway_url"):
            data["gateway_url"] = _local_gateway_url(
                str(data.get("gateway_host") or "127.0.0.1"), data.get("gateway_port", 8100)
            )
        return data

    @property
    def local_gateway_url(self) -> str:
        """Where ``engram up`` serves the gateway (host and port, loopback for a wildcard)."""
        return _local_gateway_url(self.gateway_host, self.gateway_port)

    @property
    def mirror(self) -> Path:
        return self.mirror_root or self.data_dir / "mirror"

    def worker_health_ports(self) -> dict[str, int]:
        first = WORKER_CATALOG[0].health_port
        return {
            entry.name: self.health_port_base + entry.health_port - first
            for entry in WORKER_CATALOG
        }


def _local_gateway_url(host: str, port: object) -> str:
    return f"http://{reachable_host(host)}:{port}"


class CommandError(Exception):
    """A problem the user can fix, reported as one line; exit status 2."""


async def connect_announcer(
    nats_url: str,
    what: str,
    *,
    replicas: int = 1,
    duplicate_window_s: float | None = None,
    timeout_s: float = 5.0,
) -> NatsBroker:
    """A connected broker (and the checked ENGRAM stream) for commands that write
    memories themselves and must announce them, so the mirror keeps them; a clear error
    when NATS is not there. Announce with ``ENGRAM_PUBLISH_RETRY_S`` (``retry_s``).
    ``duplicate_window_s``: the stream's (default: the bus's own)."""
    # Imported here: the messaging stack costs most of a second, and commands that only
    # read (status, search) must start fast.
    from engram_core.bus import DEFAULT_DUPLICATE_WINDOW_S, ensure_stream, make_broker

    if duplicate_window_s is None:
        duplicate_window_s = DEFAULT_DUPLICATE_WINDOW_S
    broker = make_broker(nats_url, client_name="engram-cli")
    try:
        await asyncio.wait_for(ensure_stream(nats_url, replicas, duplicate_window_s), timeout_s)
        await asyncio.wait_for(broker.connect(), timeout_s)
    except Exception as exc:
        with suppress(Exception):
            await broker.stop()
        raise CommandError(
            f"{what} announces every memory it writes on NATS, so the Markdown mirror keeps "
            f"it; NATS at {nats_url} is unreachable ({type(exc).__name__}). Start the stack "
            "(engram up) or set ENGRAM_NATS_URL."
        ) from None
    return broker


def environment_defaults() -> CliSettings | None:
    """The settings this environment gives, for ``--help``; None when they are invalid
    (the command itself then reports what is wrong)."""
    try:
        return load_settings(CliSettings)
    except ConfigError:
        return None


def _default(attribute: str, fallback: str) -> str:
    settings = environment_defaults()
    return str(getattr(settings, attribute)) if settings is not None else fallback


def add_retrieval_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retrieval",
        metavar="HOST:PORT",
        help="retrieval service (default here: "
        f"{_default('retrieval_address', DEFAULT_RETRIEVAL)}; from $ENGRAM_RETRIEVAL_ADDRESS "
        "or $ENGRAM_RETRIEVAL_LISTEN)",
    )


def add_gateway_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gateway",
        metavar="URL",
        help=f"gateway base URL (default here: {_default('gateway_url', 'http://127.0.0.1:8100')}"
        "; from $ENGRAM_GATEWAY_URL, or $ENGRAM_GATEWAY_HOST and $ENGRAM_GATEWAY_PORT)",
    )
    parser.add_argument(
        "--api-key", help="Engram API key (default: $ENGRAM_API_KEY; none in single-tenant mode)"
    )


def add_nats_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nats",
        metavar="URL",
        help=f"NATS server (default here: {_default('nats_url', 'nats://127.0.0.1:4222')}; "
        "from $ENGRAM_NATS_URL)",
    )


def add_health_port_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--health-port-base",
        type=int,
        metavar="PORT",
        help=f"the workers' first health port (default here: {_default('health_port_base', '8201')}"
        "; from $ENGRAM_HEALTH_PORT_BASE)",
    )


def add_data_dir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        help=f"state directory (default here: {_default('data_dir', '.engram')}; "
        "from $ENGRAM_DATA_DIR)",
    )


#: Flag (argparse dest) -> setting it overrides.
_FLAG_SETTINGS = {
    "retrieval": "retrieval_address",
    "gateway": "gateway_url",
    "api_key": "api_key",
    "data_dir": "data_dir",
    "mirror_root": "mirror_root",
    "nats": "nats_url",
    "health_port_base": "health_port_base",
}


def cli_settings(args: argparse.Namespace) -> CliSettings:
    overrides: dict[str, object] = {
        setting: getattr(args, flag)
        for flag, setting in _FLAG_SETTINGS.items()
        if getattr(args, flag, None) not in (None, "")
    }
    return load_settings(CliSettings, **overrides)


def auth_headers(settings: CliSettings) -> dict[str, str]:
    if settings.api_key is None:
        return {}
    return {"Authorization": f"Bearer {settings.api_key.get_secret_value()}"}


def api_error(response: httpx2.Response) -> str:
    """The message of an OpenAI-shaped error body, else the status line."""
    try:
        error = response.json()["error"]
        return (
            f"{response.status_code} {error.get('code') or error.get('type')}: {error['message']}"
        )
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} {response.reason_phrase}: {response.text[:200]}"


class DoneLog:
    """What a resumable command has done: append-only JSON lines, a header then one line
    per finished item (its ``key``). A line cut off by an interruption is ignored, so the
    file never needs repair; re-running skips every key it holds."""

    def __init__(self, path: Path, header: dict[str, object]) -> None:
        self.path = path
        self.header = header
        self.done: set[str] = set()
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                # "unit": what import state files of earlier versions called the key
                key = entry.get("key", entry.get("unit")) if isinstance(entry, dict) else None
                if isinstance(key, str):
                    self.done.add(key)
        self._file: TextIO | None = None

    def record(self, key: str, **details: object) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            self._file = self.path.open("a", encoding="utf-8")
            if fresh:
                self._file.write(json.dumps(self.header) + "\n")
        self._file.write(json.dumps({"key": key, **details}) + "\n")
        self._file.flush()
        self.done.add(key)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
