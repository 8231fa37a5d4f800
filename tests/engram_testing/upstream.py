"""The scripted upstream lives in engram_cli (the benchmarks use it too)."""

from engram_cli.stack.scripted_llm import RecordedRequest, Reply, ScriptedUpstream, UpstreamError

__all__ = ["RecordedRequest", "Reply", "ScriptedUpstream", "UpstreamError"]
