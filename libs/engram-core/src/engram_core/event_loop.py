"""Which asyncio event loop a service runs on (``ENGRAM_EVENT_LOOP``).

Every Engram process runs on uvloop where it is installed (``auto``), the gateway
through uvicorn's own choice and the others through :func:`run`. The loop is a large
share of a worker's CPU (every NATS message and gRPC call is a handful of callbacks),
and uvloop runs them in C; ``asyncio`` is there for debugging with the standard loop
(its debug mode, tools that patch it) and for platforms without uvloop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import signal
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
T = TypeVar("T")


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: EventLoopChoice) -> Literal["uvloop", "asyncio"]:
    """The loop ``choice`` means here: ``auto`` is uvloop when it is installed."""
    if choice == "auto":
        return "uvloop" if uvloop_installed() else "asyncio"
    return choice


def loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """What :class:`asyncio.Runner` builds its loop with (None: the standard loop)."""
    if resolve(choice) == "asyncio":
        return None
    import uvloop

    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: EventLoopChoice) -> T:
    """``asyncio.run(main)`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this coroutine runs on (for start-up logs)."""
    return type(asyncio.get_running_loop()).__module__.partition(".")[0]


def stop_on_signals() -> asyncio.Event:
    """An event the running loop sets on SIGTERM or SIGINT: what a service waits on
    before it shuts down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
