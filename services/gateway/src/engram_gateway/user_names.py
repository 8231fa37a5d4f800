"""People's display names, as their chat client forwards them, to show beside user ids.

Open WebUI (with ``ENABLE_FORWARD_USER_INFO_HEADERS``) sends the person's name in
``X-OpenWebUI-User-Name``, percent-encoded (``Jos%C3%A9 M%C3%BCller``); other clients
may send raw UTF-8 bytes. :func:`display_name` reads either into text. When a chat
turn is recorded for a user, the gateway remembers that user's latest name in the
JetStream key-value bucket ``ENGRAM_USER_NAMES`` (shared by every gateway pod), keyed
by a hash of tenant and user id, so a name is only ever read back for the same tenant's
same user. ``GET /v1/users`` and the memory browser show it beside the id.

A name is a label, never identity: the user is still the body's ``user`` or the user
header, and a name is recorded only together with a turn (a temporary chat or a
bypassed request records none). Best effort: a bucket that is unreachable costs a log
line, never a chat (the write runs beside it). Each pod writes a name only when it
changed (or a day went by); a name not seen for ``USER_NAMES_TTL_S`` expires.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import unicodedata
from collections.abc import Iterable, Mapping
from contextlib import suppress
from urllib.parse import unquote

from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, ValidationError

from engram_core.bus import open_bucket
from engram_core.logging import get_logger
from engram_core.lru import LruCache
from engram_gateway.bus_link import BusLink

log = get_logger(__name__)

USER_NAMES_BUCKET = "ENGRAM_USER_NAMES"
USER_NAMES_TTL_S = 90 * 24 * 3600.0
#: A pod writes an unchanged name again after this long, so it does not expire in use.
REFRESH_S = 24 * 3600.0
MAX_NAME_CHARS = 200
#: Names this pod remembers having written (oldest forgotten first).
CACHE_SIZE = 10_000
#: A write or read of names waits at most this long (a chat or a listing never hangs on it).
TIMEOUT_S = 2.0


def display_name(headers: Mapping[str, str], header: str) -> str | None:
    """The name ``header`` carries, as text: percent-encoding and raw UTF-8 bytes
    decoded, NFC, control characters dropped, at most ``MAX_NAME_CHARS``; ``None`` when
    there is none."""
    raw = headers.get(header) if header else None
    if not raw:
        return None
    with suppress(UnicodeEncodeError, UnicodeDecodeError):
        # HTTP header bytes reach Starlette as Latin-1: a client's raw UTF-8 is decoded
        raw = raw.encode("latin-1").decode("utf-8")
    text = unquote(raw, errors="replace") if "%" in raw else raw
    text = unicodedata.normalize("NFC", text)
    text = "".join(ch for ch in text if unicodedata.category(ch)[0] != "C").strip()
    return text[:MAX_NAME_CHARS] or None


def _key(tenant: str, user_id: str) -> str:
    return hashlib.sha256(f"{tenant}\x1f{user_id}".encode()).hexdigest()


class _NameRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    user_id: str
    name: str


class UserNames:
    """The tenant-scoped directory of display names (bucket opened on first use, once
    the gateway's bus link is up)."""

    def __init__(self, bus: BusLink) -> None:
        self._bus = bus
        self._kv: KeyValue | None = None
        self._opening = asyncio.Lock()
        self._written: LruCache[str, tuple[str, float]] = LruCache(CACHE_SIZE)
        self._pending: set[asyncio.Task[None]] = set()

    async def _bucket(self) -> KeyValue | None:
        if self._kv is None and self._bus.ready:
            async with self._opening:
                if self._kv is None:
                    self._kv = await open_bucket(
                        self._bus.broker.connection.jetstream(timeout=TIMEOUT_S),
                        USER_NAMES_BUCKET,
                        ttl_s=USER_NAMES_TTL_S,
                        replicas=self._bus.settings.stream_replicas,
                    )
        return self._kv

    def remember_from(
        self, headers: Mapping[str, str], tenant: str, user_id: str, *, body_user: object
    ) -> None:
        """In the background: record the name the request's name header carries for the
        user a turn was just recorded for, when that user came from the user header too
        (the client's forwarded identity), not from the body's ``user``."""
        name = display_name(headers, self._bus.settings.gateway_user_name_header)
        if not name or not user_id or body_user:
            return
        task = asyncio.create_task(self.remember(tenant, user_id, name))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def remember(self, tenant: str, user_id: str, name: str) -> None:
        """Record ``name`` for the tenant's user, unless this pod recorded it lately."""
        key = _key(tenant, user_id)
        written = self._written.get(key)
        if written is not None and written[0] == name and time.monotonic() - written[1] < REFRESH_S:
            return
        try:
            async with asyncio.timeout(TIMEOUT_S):
                kv = await self._bucket()
                if kv is None:
                    return
                record = _NameRecord(user_id=user_id, name=name)
                await kv.put(key, record.model_dump_json().encode())
        except Exception as exc:
            log.warning("user_name.not_recorded", error=f"{type(exc).__name__}: {exc}")
            return
        self._written.put(key, (name, time.monotonic()))

    async def names(self, tenant: str, user_ids: Iterable[str]) -> dict[str, str]:
        """The recorded names of these users of the tenant (those that have one); empty
        while the bucket cannot be read."""
        wanted = [user_id for user_id in dict.fromkeys(user_ids) if user_id]
        if not wanted:
            return {}
        try:
            async with asyncio.timeout(TIMEOUT_S):
                kv = await self._bucket()
                if kv is None:
                    return {}
                found = await asyncio.gather(*(self._get(kv, tenant, u) for u in wanted))
        except Exception as exc:
            log.warning("user_name.not_read", error=f"{type(exc).__name__}: {exc}")
            return {}
        return {user_id: name for user_id, name in zip(wanted, found, strict=True) if name}

    @staticmethod
    async def _get(kv: KeyValue, tenant: str, user_id: str) -> str | None:
        try:
            entry = await kv.get(_key(tenant, user_id))
        except NotFoundError:  # never recorded, expired or deleted
            return None
        if not entry.value:
            return None
        try:
            record = _NameRecord.model_validate_json(entry.value)
        except ValidationError:
            return None
        return record.name if record.user_id == user_id else None
