"""Metric label values a caller chooses, bounded.

Every distinct attribute value of a metric is a time series kept for the life of the
process: a caller who sends 2,000 model names would add 2,000 series to each LLM
metric (``/metrics`` grew from 8 MB to 87 MB that way). A :class:`BoundedLabel` keeps
the first ``limit`` distinct values it is asked about, as they are, and answers
:data:`OTHER` for every later one, so each such label holds at most ``limit + 1``
values per process. Spans keep the full value: they are not aggregated.
"""

from __future__ import annotations

import threading

#: The value standing for every value past the limit (OpenTelemetry's spelling for a
#: bounded set, as in ``http.request.method``).
OTHER = "_OTHER"


class BoundedLabel:
    """First come, kept: the first ``limit`` distinct values, then :data:`OTHER`."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return value if value in self._seen else OTHER

    def seen(self) -> frozenset[str]:
        return frozenset(self._seen)

    def forget(self, values: frozenset[str] | set[str] | None = None) -> None:
        """Forget ``values`` (all when None); for tests that must not use up the set."""
        with self._lock:
            if values is None:
                self._seen.clear()
            else:
                self._seen -= values
