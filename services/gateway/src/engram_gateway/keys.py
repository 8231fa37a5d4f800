"""API keys → tenants. Keys are configured as SHA-256 hashes, never in clear.

Format (``ENGRAM_API_KEYS`` and the file named by ``ENGRAM_API_KEYS_FILE`` alike):
entries ``sha256:<64 hex digits>=<tenant>`` or ``sha256:<64 hex digits>=<tenant>:admin``,
separated by commas or newlines; blank lines and lines starting with ``#`` are ignored.
Tenants are 1-64 characters of ``A-Z a-z 0-9 . _ -`` starting with a letter or digit
(they name directories in the Markdown mirror). One key maps to one tenant; a tenant may
have several keys.

Roles: a key acts for its tenant, and nothing else. ``:admin`` makes it an operator's
key as well: it also reads what is shared by every tenant (the workers' queues, every
tenant's dead letters: the gateway's ``/v1/admin/...``). It still reads and writes only
its own tenant's memories. ``admin`` is the only role.

``python -m engram_gateway.keys hash [KEY] [--tenant T] [--admin]`` prints a key's entry
(the key is read from stdin when not given, so it stays out of the shell history);
``python -m engram_gateway.keys new TENANT [--admin]`` makes a random key and prints both.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import re
import secrets
import sys
from collections.abc import Iterable
from dataclasses import dataclass

PREFIX = "sha256:"
_ENTRY = re.compile(r"^sha256:(?P<hash>[0-9a-fA-F]{64})=(?P<tenant>[^:]*)(?::(?P<role>.*))?$")
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ADMIN_ROLE = "admin"


def key_hash(key: str) -> str:
    """The hex SHA-256 of a key, as it is configured (without the ``sha256:`` prefix)."""
    return hashlib.sha256(key.encode()).hexdigest()


def entry_for(key: str, tenant: str, *, admin: bool = False) -> str:
    return f"{PREFIX}{key_hash(key)}={tenant}" + (f":{ADMIN_ROLE}" if admin else "")


@dataclass(frozen=True)
class Caller:
    """Who a key speaks for: its tenant, and whether it is an operator's (admin) key."""

    tenant: str
    admin: bool = False


@dataclass(frozen=True)
class KeyTable:
    """Configured key hashes and whom they name. Never prints the hashes."""

    entries: tuple[tuple[bytes, Caller], ...]

    @classmethod
    def parse(cls, text: str) -> KeyTable:
        """Parse the configured entries; ``ValueError`` says which one is wrong (by
        position, never by content: a pasted clear key must not reach the logs)."""
        table: dict[str, Caller] = {}
        items = [
            item.strip()
            for line in text.splitlines()
            if not line.strip().startswith("#")
            for item in line.split(",")
        ]
        for number, item in enumerate((i for i in items if i), start=1):
            match = _ENTRY.match(item)
            if match is None:
                raise ValueError(
                    f"entry {number} is not 'sha256:<64 hex digits>=<tenant>[:admin]' "
                    "(compute one with: python -m engram_gateway.keys hash)"
                )
            digest, tenant = match["hash"].lower(), match["tenant"].strip()
            if not tenant:
                raise ValueError(f"entry {number} has an empty tenant")
            if not TENANT_PATTERN.match(tenant):
                raise ValueError(
                    f"entry {number}: tenant {tenant!r} must be 1-64 characters of "
                    "A-Z a-z 0-9 . _ - starting with a letter or digit"
                )
            role = match["role"]
            if role is not None and role.strip() != ADMIN_ROLE:
                raise ValueError(
                    f"entry {number}: unknown role {role.strip()!r} (the only role is "
                    f"'{ADMIN_ROLE}': sha256:<hex>=<tenant>:{ADMIN_ROLE})"
                )
            caller = Caller(tenant, admin=role is not None)
            known = table.get(digest, caller)
            if known.tenant != tenant:
                raise ValueError(f"entry {number}: the same key is mapped to two tenants")
            if known != caller:
                raise ValueError(f"entry {number}: the same key is listed with and without :admin")
            table[digest] = caller
        if not table:
            raise ValueError("no key entries")
        return cls(tuple((bytes.fromhex(h), c) for h, c in table.items()))

    def merged(self, other: KeyTable) -> KeyTable:
        mine = dict(self.entries)
        for digest, caller in other.entries:
            known = mine.get(digest, caller)
            if known.tenant != caller.tenant:
                raise ValueError("a key is mapped to different tenants in the two settings")
            if known != caller:
                raise ValueError("a key is listed with and without :admin in the two settings")
            mine[digest] = caller
        return KeyTable(tuple(mine.items()))

    @property
    def tenants(self) -> frozenset[str]:
        return frozenset(caller.tenant for _, caller in self.entries)

    @property
    def admin_keys(self) -> int:
        return sum(caller.admin for _, caller in self.entries)

    def caller_for(self, key: str) -> Caller | None:
        """Whom the key names, or None. Compares against every entry in constant time."""
        presented = hashlib.sha256(key.encode()).digest()
        found: Caller | None = None
        for digest, caller in self.entries:
            if hmac.compare_digest(presented, digest):
                found = caller
        return found

    def tenant_for(self, key: str) -> str | None:
        """The key's tenant, or None."""
        caller = self.caller_for(key)
        return caller.tenant if caller is not None else None

    def __repr__(self) -> str:
        return (
            f"KeyTable({len(self.entries)} keys, {len(self.tenants)} tenants, "
            f"{self.admin_keys} admin)"
        )

    __str__ = __repr__


def _read_key(given: str | None) -> str:
    key = given if given is not None else sys.stdin.readline().rstrip("\r\n")
    if not key:
        raise SystemExit("no key given (pass it as an argument or on stdin)")
    return key


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m engram_gateway.keys", description="Engram API key entries."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    hash_cmd = commands.add_parser("hash", help="print the sha256:<hex> of a key")
    hash_cmd.add_argument("key", nargs="?", help="the key (default: read one line from stdin)")
    hash_cmd.add_argument("--tenant", help="print the whole entry, sha256:<hex>=TENANT")
    new_cmd = commands.add_parser("new", help="make a random key for TENANT; print key and entry")
    new_cmd.add_argument("tenant")
    for command in (hash_cmd, new_cmd):
        command.add_argument(
            "--admin", action="store_true", help="an operator's key (TENANT:admin; needs a tenant)"
        )
    args = parser.parse_args(list(argv) if argv is not None else None)

    tenant = args.tenant
    if tenant is not None and not TENANT_PATTERN.match(tenant):
        raise SystemExit(f"invalid tenant {tenant!r}: 1-64 of A-Z a-z 0-9 . _ -")
    if args.admin and not tenant:
        raise SystemExit("--admin needs --tenant (an admin key still acts for one tenant)")
    if args.command == "hash":
        key = _read_key(args.key)
        print(entry_for(key, tenant, admin=args.admin) if tenant else f"{PREFIX}{key_hash(key)}")
    else:
        key = f"eng-{secrets.token_urlsafe(32)}"
        print(f"key:   {key}")
        print(f"entry: {entry_for(key, tenant, admin=args.admin)}")


if __name__ == "__main__":
    main()
