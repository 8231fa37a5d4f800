"""Kept only for the CLI (libs/engram-cli) until it moves onto the domain types: the
names it still imports, re-exported from :mod:`engram_core.codec`, which owns them.
New code imports :mod:`engram_core.codec` (the gRPC edge) or, better, the domain types
of :mod:`engram_core.memory` through :mod:`engram_core.memory_port`."""

from __future__ import annotations

from engram_core.codec import (
    KIND_BY_NAME,
    KIND_NAMES,
    SCOPE_NAMES,
    from_timestamp,
    kind_name,
    pb,
    pb_grpc,
    to_timestamp,
)

__all__ = [
    "KIND_BY_NAME",
    "KIND_NAMES",
    "SCOPE_NAMES",
    "from_timestamp",
    "kind_name",
    "pb",
    "pb_grpc",
    "to_timestamp",
]
