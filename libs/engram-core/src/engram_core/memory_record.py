"""Kept only for the CLI (libs/engram-cli) until it moves: ``record_from_pb`` and
``record_to_pb`` now live in :mod:`engram_core.codec`, the one translation at the gRPC
edge."""

from __future__ import annotations

from engram_core.codec import record_from_pb, record_to_pb

__all__ = ["record_from_pb", "record_to_pb"]
