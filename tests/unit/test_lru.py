"""The services' one bounded cache: the least recently used entry goes first."""

from __future__ import annotations

import pytest

from engram_core.lru import LruCache


def test_a_read_keeps_an_entry_and_the_least_recently_used_goes_first() -> None:
    cache: LruCache[str, int] = LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # read: now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    cache.put("a", 10)  # a rewrite replaces the value, not a second entry
    assert len(cache) == 2 and cache.get("a") == 10


def test_pop_and_a_cache_turned_off() -> None:
    cache: LruCache[str, int] = LruCache(3)
    cache.put("a", 1)
    assert cache.pop("a") == 1 and cache.pop("a") is None and len(cache) == 0
    off: LruCache[str, int] = LruCache(0)
    off.put("a", 1)
    assert off.get("a") is None and len(off) == 0
    with pytest.raises(ValueError, match="capacity"):
        LruCache(-1)
