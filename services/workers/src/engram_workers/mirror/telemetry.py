"""The file mirror's own metrics (docs/observability.md).

- ``engram.mirror.files_skipped`` (counter): files the mirror would not read or write,
  by ``engram.mirror.reason`` — ``symlink``, ``special_file`` (a FIFO, socket or
  device), ``too_large``, ``not_utf8``, ``malformed`` (front matter or a value out of
  range), ``misplaced`` — and ``engram.mirror.side``: ``watcher`` (a hand edit that is
  not published) or ``writer`` (a memory change that could not be written, then
  dead-lettered). Every skip is also a ``mirror.malformed_file`` or
  ``mirror.unsafe_path`` log line naming the path and the reason.
- ``engram.mirror.watch.staleness`` (gauge, s): time since the hand-edit watcher last
  completed a pass. It passes at least every few seconds while idle, so a growing value
  is a stuck watcher; ``/readyz`` fails past ``ENGRAM_MIRROR_WATCH_STALL_S``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Final, Literal

from opentelemetry.metrics import CallbackOptions, Observation

from engram_core.metrics import meter

METRIC_FILES_SKIPPED: Final = "engram.mirror.files_skipped"
METRIC_WATCH_STALENESS: Final = "engram.mirror.watch.staleness"
MIRROR_REASON: Final = "engram.mirror.reason"
MIRROR_SIDE: Final = "engram.mirror.side"

SkipReason = Literal["symlink", "special_file", "too_large", "not_utf8", "malformed", "misplaced"]
Side = Literal["watcher", "writer"]

files_skipped = meter.create_counter(
    METRIC_FILES_SKIPPED,
    unit="{file}",
    description="Mirror files not read or written: a symlink or special file (never "
    "followed or opened), or a hand edit that is not a valid memory.",
)


class Heartbeat:
    """When a loop last completed a pass (monotonic clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last = clock()

    def beat(self) -> None:
        self.last = self._clock()

    def age_s(self) -> float:
        return max(0.0, self._clock() - self.last)


#: Watchers alive in this process (tests run several), for the staleness gauge.
_heartbeats: weakref.WeakSet[Heartbeat] = weakref.WeakSet()


def watch_heartbeat() -> Heartbeat:
    heartbeat = Heartbeat()
    _heartbeats.add(heartbeat)
    return heartbeat


def _observe_staleness(_: CallbackOptions) -> list[Observation]:
    ages = [heartbeat.age_s() for heartbeat in list(_heartbeats)]
    return [Observation(max(ages))] if ages else []


meter.create_observable_gauge(
    METRIC_WATCH_STALENESS,
    callbacks=[_observe_staleness],
    unit="s",
    description="Seconds since the mirror's hand-edit watcher last completed a pass "
    "(it passes every few seconds while idle; a growing value is a stuck watcher).",
)


def count_skipped(reason: SkipReason, side: Side) -> None:
    files_skipped.add(1, {MIRROR_REASON: reason, MIRROR_SIDE: side})
