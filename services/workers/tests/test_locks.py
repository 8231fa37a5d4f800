"""Per-conversation locks on JetStream KV, against the real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from engram_core.locks import KeyLocks, LockTimeout


async def test_holders_of_one_key_never_overlap(nats_url) -> None:
    holding: dict[str, int] = {"conv-1": 0, "conv-2": 0}
    most_at_once: dict[str, int] = {"conv-1": 0, "conv-2": 0}
    async with KeyLocks.connect(nats_url) as a, KeyLocks.connect(nats_url) as b:

        async def work(locks: KeyLocks, conversation: str) -> None:
            async with locks.hold("tenant", conversation):
                holding[conversation] += 1
                most_at_once[conversation] = max(most_at_once[conversation], holding[conversation])
                await asyncio.sleep(0.05)
                holding[conversation] -= 1

        # two "replicas" (connections), six holders of conv-1, one of conv-2
        await asyncio.gather(
            *(work(a if i % 2 else b, "conv-1") for i in range(6)), work(a, "conv-2")
        )
    assert most_at_once == {"conv-1": 1, "conv-2": 1}


async def test_a_busy_lock_times_out(nats_url) -> None:
    async with (
        KeyLocks.connect(nats_url) as holder,
        KeyLocks.connect(nats_url, wait_s=0.3) as waiter,
    ):
        async with holder.hold("t", "c"):
            with pytest.raises(LockTimeout):
                async with waiter.hold("t", "c"):
                    pass
        async with waiter.hold("t", "c"):  # free again once released
            pass


async def test_a_crashed_holders_lock_expires(nats_url) -> None:
    async with KeyLocks.connect(nats_url, ttl_s=1.0) as locks:
        await locks._kv.create(locks.key("t", "c"), b"crashed-owner")  # never released
        async with KeyLocks.connect(nats_url, ttl_s=1.0, wait_s=5.0) as other:
            started = asyncio.get_running_loop().time()
            async with other.hold("t", "c"):
                waited = asyncio.get_running_loop().time() - started
    assert 0.5 < waited < 5.0


async def test_a_long_holder_keeps_its_lock_past_the_ttl(nats_url) -> None:
    async with (
        KeyLocks.connect(nats_url, ttl_s=1.0) as holder,
        KeyLocks.connect(nats_url, ttl_s=1.0, wait_s=0.2) as waiter,
        holder.hold("t", "c"),
    ):
        await asyncio.sleep(2.0)  # twice the TTL: the refresher keeps it alive
        with pytest.raises(LockTimeout):
            async with waiter.hold("t", "c"):
                pass


async def test_waiters_in_one_process_queue_locally_not_on_the_bucket(
    nats_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four messages of one conversation handled at once by one worker: each takes the
    bucket's lock once, in turn, instead of all four polling it."""
    async with KeyLocks.connect(nats_url) as locks:
        attempts = 0
        create = locks._kv.create

        async def counted_create(*args, **kwargs):
            nonlocal attempts
            attempts += 1
            return await create(*args, **kwargs)

        monkeypatch.setattr(locks._kv, "create", counted_create)
        order: list[int] = []

        async def work(i: int) -> None:
            async with locks.hold("tenant", "conv"):
                order.append(i)
                await asyncio.sleep(0.05)

        await asyncio.gather(*(work(i) for i in range(4)))
        assert attempts == 4
        assert sorted(order) == [0, 1, 2, 3]
        assert locks._local == {}  # nothing left behind for a key nobody holds
