"""Calls someone waits for go first.

One event loop serves a chat's Search and the workers' calls (Upserts, Lists, Counts,
duplicate checks), and the store holds the GIL while it works (store/edge.py), so a
worker's call that starts while a chat's Search is in flight runs in the Search's
pauses (the query's embedding) and delays it. A caller marks its calls interactive
(gRPC metadata ``engram-priority: interactive``; the gateway does, for the person
waiting on a chat); while one is in flight, any other call waits before it starts,
until no interactive call is left or ``max_wait_s`` has passed, so the write path is
slowed under a stream of chats but never stopped. Calls already running are not
interrupted, except that a worker's Search pauses the same way between its stages
(:meth:`InteractiveFirst.between_steps`; docs/retrieval.md, "Background searches").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager, suppress

from engram_core.retrieval_client import INTERACTIVE_METADATA


def is_interactive(metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    return any((key, value) == INTERACTIVE_METADATA for key, value in metadata or ())


class InteractiveFirst:
    """Counts the interactive calls in flight; the others wait for none to be left
    (at most ``max_wait_s``; 0: they never wait)."""

    def __init__(self, max_wait_s: float) -> None:
        self.max_wait_s = max_wait_s
        self.in_flight = 0
        self.waited = 0  # background calls that had to wait (metrics, tests)
        self._idle = asyncio.Event()
        self._idle.set()

    @asynccontextmanager
    async def interactive(self) -> AsyncIterator[None]:
        self.in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def between_steps(self) -> None:
        """A background call's pause between two steps of its work: the loop first
        serves what has arrived meanwhile (a chat's Search gets to start), then, while
        an interactive call is in flight, this waits as :meth:`background` does."""
        await asyncio.sleep(0)
        await self.background()

    async def background(self) -> None:
        """Return once no interactive call is in flight, or after ``max_wait_s``."""
        if not self.in_flight or self.max_wait_s <= 0:
            return
        self.waited += 1
        with suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self.max_wait_s)
