"""Waiting for asynchronous outcomes: the one polling helper every test uses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


async def eventually(
    check: Callable[[], Any | Awaitable[Any]],
    timeout_s: float = 15.0,
    what: str = "",
    interval_s: float = 0.05,
) -> Any:
    """Poll until ``check`` (sync or async) returns something truthy, and return it.

    Fails the test with an ``AssertionError`` naming ``what`` after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or check}")
        await asyncio.sleep(interval_s)
