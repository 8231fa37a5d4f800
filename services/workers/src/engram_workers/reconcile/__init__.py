"""The reconcile worker: a pure planning core (:mod:`.core`) and its wiring (:mod:`.app`)."""

from engram_workers.reconcile.app import RECONCILE, ReconcileSettings, main

__all__ = ["RECONCILE", "ReconcileSettings", "main"]
