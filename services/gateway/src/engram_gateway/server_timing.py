"""The gateway's own timings of a chat, sent back as a ``Server-Timing`` header.

``RequestIdMiddleware`` (the outermost) stamps when the request reached the gateway;
the chat route adds how long recall took (and, as ``search``, how much of it was the
retrieval service's own time for the search), the time from arrival until the request was
handed to the upstream (``pre-upstream``: everything the gateway adds before the model
starts), the upstream call until its response headers, and recording the user turn.
``engram bench overhead`` reads them; browsers' developer tools show them too.
Durations are milliseconds (the header's unit).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from starlette.requests import Request

HEADER = "Server-Timing"
_STARTED = "started_at"


def stamp_arrival(state: dict[str, object]) -> None:
    """Called by the outermost middleware with the request's ASGI ``state``."""
    state[_STARTED] = time.perf_counter()


class ServerTiming:
    """Named durations of one request, in the order they were taken."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.durations: dict[str, float] = {}

    @classmethod
    def of(cls, request: Request) -> ServerTiming:
        started = request.scope.get("state", {}).get(_STARTED)
        return cls(started if isinstance(started, float) else time.perf_counter())

    @contextmanager
    def measure(self, name: str) -> Iterator[None]:
        begun = time.perf_counter()
        try:
            yield
        finally:
            self.durations[name] = time.perf_counter() - begun

    def add(self, name: str, seconds: float) -> None:
        """A duration measured elsewhere (retrieval's own time for the search)."""
        self.durations[name] = seconds

    def since_arrival(self, name: str) -> None:
        self.durations[name] = time.perf_counter() - self.started

    def header(self) -> str:
        return ", ".join(f"{name};dur={s * 1e3:.2f}" for name, s in self.durations.items())
