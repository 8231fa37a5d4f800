"""Where the gateway is and what every request carries (shared by both clients)."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

DEFAULT_BASE_URL = "http://127.0.0.1:8100"


def _user_agent() -> str:
    try:
        return f"engram-client/{version('engram-client')}"
    except PackageNotFoundError:  # run from a source tree
        return "engram-client"


class Connection:
    def __init__(
        self, base_url: str, api_key: str | None, headers: Mapping[str, str] | None
    ) -> None:
        root = base_url.rstrip("/")
        self.base_url = root.removesuffix("/v1")
        self.headers = {"User-Agent": _user_agent(), **(headers or {})}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def unreachable(self, exc: Exception) -> str:
        return f"cannot reach the Engram gateway at {self.base_url}: {type(exc).__name__}"
