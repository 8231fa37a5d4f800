"""The commands that work on a running stack's memories: search, import and export,
migrations, rebuilding the index from the mirror, re-embedding, re-extraction, and the
dead letters (``engram dlq``)."""
