"""``engram bench locomo``: LoCoMo-format loader, retrieval metrics and the benchmark."""
