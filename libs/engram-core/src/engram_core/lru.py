"""A bounded map that forgets the least recently used entry first (pure; no I/O).

The caches of the services are this one map: retrieval's recently embedded texts,
converted search vectors and what searched points' payloads say, the summarize worker's
episode boundaries, the gateway's recently written user names, the decoded memories of
search replies. Safe across threads (retrieval reads vectors on the event
loop and on the store's thread); the lock costs well under a microsecond a call.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most ``capacity`` entries; reading or writing one makes it the most recent.
    Capacity 0 keeps nothing (a cache turned off)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0 (got {capacity})")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if not self.capacity:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._entries.pop(key, None)
