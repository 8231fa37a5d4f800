"""Per-key mutual exclusion across processes (worker replicas, gateway pods), on a
JetStream key-value bucket.

Two reconcile (or summarize) replicas must not work on the same conversation at once;
two changes of one memory (:mod:`engram_core.memory_ops`) must not interleave.
A lock is a KV key created only if absent (an atomic compare-and-set on the stream);
its holder refreshes it while working, and the bucket's TTL frees the lock of a
crashed holder. Waiters poll with jitter until the key is free or they time out, in
which case the caller raises a retryable error and the message is redelivered later.
Within one process, callers of the same key queue on a local lock first, so a worker
handling several messages of one conversation at once makes one attempt at a time on
the bucket instead of each polling it (every attempt is a JetStream round trip).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress

from nats.aio.client import Client
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import BaseModel, Field

from engram_core.bus import key_value_bucket
from engram_core.logging import get_logger
from engram_core.retry import TransientError

log = get_logger(__name__)

LOCK_BUCKET = "ENGRAM_LOCKS"


class LockSettingsMixin(BaseModel):
    """Lock variables of the services that serialise per conversation or per memory."""

    lock_ttl_s: float = Field(
        default=30.0, gt=0, description="A crashed holder's lock expires after this."
    )
    lock_wait_s: float = Field(
        default=60.0, gt=0, description="Wait this long for a busy lock, then retry later."
    )


class LockTimeout(TransientError):
    """The lock stayed busy for longer than the caller was willing to wait (try again)."""


class KeyLocks:
    """Locks named by arbitrary string parts, shared by every process on one NATS."""

    def __init__(self, kv: KeyValue, nc: Client, *, ttl_s: float, wait_s: float) -> None:
        self._kv = kv
        self._nc = nc
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self.owner = uuid.uuid4().hex
        self._local: dict[str, _LocalLock] = {}

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, nats_url: str, *, ttl_s: float = 30.0, wait_s: float = 60.0, replicas: int = 1
    ) -> AsyncIterator[KeyLocks]:
        async with key_value_bucket(nats_url, LOCK_BUCKET, ttl_s=ttl_s, replicas=replicas) as (
            nc,
            kv,
        ):
            yield cls(kv, nc, ttl_s=ttl_s, wait_s=wait_s)

    @classmethod
    def from_settings(
        cls, settings: LockSettingsMixin, nats_url: str
    ) -> AbstractAsyncContextManager[KeyLocks]:
        """``connect`` with a worker's lock settings and its stream replicas (an async
        context manager)."""
        return cls.connect(
            nats_url,
            ttl_s=settings.lock_ttl_s,
            wait_s=settings.lock_wait_s,
            replicas=getattr(settings, "stream_replicas", 1),
        )

    @staticmethod
    def key(*parts: str) -> str:
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:40]

    @asynccontextmanager
    async def hold(self, *parts: str) -> AsyncIterator[None]:
        key = self.key(*parts)
        async with self._queued_locally(key), self._held(key):
            yield

    @asynccontextmanager
    async def _queued_locally(self, key: str) -> AsyncIterator[None]:
        local = self._local.setdefault(key, _LocalLock())
        local.users += 1
        try:
            try:
                async with asyncio.timeout(self.wait_s):
                    await local.lock.acquire()
            except TimeoutError:
                raise LockTimeout(f"lock busy for more than {self.wait_s:.0f}s") from None
            try:
                yield
            finally:
                local.lock.release()
        finally:
            local.users -= 1
            if not local.users:
                del self._local[key]

    @asynccontextmanager
    async def _held(self, key: str) -> AsyncIterator[None]:
        revision = await self._acquire(key)
        refresher = asyncio.create_task(self._refresh(key, revision))
        try:
            yield
        finally:
            refresher.cancel()
            with suppress(asyncio.CancelledError):
                await refresher
            with suppress(Exception):
                await self._kv.delete(key)

    async def _acquire(self, key: str) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        delay = 0.02
        while True:
            try:
                return await self._kv.create(key, self.owner.encode())
            except KeyWrongLastSequenceError:
                if loop.time() > deadline:
                    raise LockTimeout(f"lock busy for more than {self.wait_s:.0f}s") from None
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.5)

    async def _refresh(self, key: str, revision: int) -> None:
        # A refresh re-publishes the key, restarting its TTL; losing the race to a
        # stale-lock take-over is logged (the holder's work is idempotent either way).
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                revision = await self._kv.update(key, self.owner.encode(), last=revision)
            except KeyWrongLastSequenceError:
                log.warning("lock.lost", key=key)
                return


class _LocalLock:
    """This process's queue for one key, dropped once nobody holds or waits for it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
