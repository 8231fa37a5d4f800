"""Kept for the Helm chart's test script (``deploy/helm/engram/templates/tests/``),
which imports ``pb`` and ``pb_grpc`` from here: names re-exported from
:mod:`engram_core.codec`, which owns them. Code imports the domain types of
:mod:`engram_core.memory` through :mod:`engram_core.memory_port` instead."""

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
