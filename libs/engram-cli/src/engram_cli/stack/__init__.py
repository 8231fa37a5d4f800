"""The local stack and the servers that stand in for what it talks to: ``engram up``
(:mod:`engram_cli.stack.up`), the nats-server it runs, ``engram status``, and the
scripted LLM and embeddings servers (``engram scripted-llm``, ``engram serve-embeddings``)
that demos, benchmarks and tests put behind it."""
