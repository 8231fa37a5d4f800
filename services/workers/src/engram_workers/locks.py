"""The per-key locks live in :mod:`engram_core.locks` (the gateway takes them too); this
name stays for the workers that import it from here."""

from engram_core.locks import LOCK_BUCKET, KeyLocks, LockSettingsMixin, LockTimeout

__all__ = ["LOCK_BUCKET", "KeyLocks", "LockSettingsMixin", "LockTimeout"]
