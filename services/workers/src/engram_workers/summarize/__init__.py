"""The summarize worker: pure rules (:mod:`.core`) and their wiring (:mod:`.app`)."""

from engram_workers.summarize.app import SUMMARIZE, SummarizeSettings, main

__all__ = ["SUMMARIZE", "SummarizeSettings", "main"]
