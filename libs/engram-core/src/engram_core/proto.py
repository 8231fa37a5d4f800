"""The gRPC contract, re-exported under short names, plus conversions used on both sides."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from engram_core.grpc_gen.engram.memory.v1 import memory_pb2 as pb
from engram_core.grpc_gen.engram.memory.v1 import memory_pb2_grpc as pb_grpc
from engram_core.timestamps import storable_utc

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

KIND_NAMES: dict[pb.MemoryKind, str] = {
    pb.MEMORY_KIND_TURN: "turn",
    pb.MEMORY_KIND_FACT: "fact",
    pb.MEMORY_KIND_PROFILE: "profile",
    pb.MEMORY_KIND_SUMMARY: "summary",
    pb.MEMORY_KIND_EPISODE: "episode",
}
KIND_BY_NAME: dict[str, pb.MemoryKind] = {name: kind for kind, name in KIND_NAMES.items()}

SCOPE_NAMES: dict[pb.Scope, str] = {
    pb.SCOPE_CONVERSATION: "conversation",
    pb.SCOPE_USER: "user",
    pb.SCOPE_GLOBAL: "global",
}


_NAME_BY_NUMBER: dict[int, str] = {int(kind): name for kind, name in KIND_NAMES.items()}


def kind_name(kind: int) -> str:
    """The name of a kind number; "unspecified" for one this version does not know."""
    return _NAME_BY_NUMBER.get(kind, "unspecified")


def to_timestamp(value: datetime) -> Timestamp:
    """``ValueError`` for a time outside what a Timestamp holds (see
    :mod:`engram_core.timestamps`; entry points check it before)."""
    ts = Timestamp()
    ts.FromDatetime(storable_utc(value))
    return ts


def from_timestamp(ts: Timestamp) -> datetime | None:
    """None for an unset timestamp (seconds and nanos both zero)."""
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=UTC)
