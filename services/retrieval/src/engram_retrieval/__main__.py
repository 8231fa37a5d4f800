"""``engram-retrieval``: run the retrieval service (configured by ``ENGRAM_*`` variables)."""

from __future__ import annotations

import sys

from engram_core import event_loop
from engram_core.logging import get_logger
from engram_core.settings import load_settings
from engram_retrieval.embedder import ModelFilesError
from engram_retrieval.remote_embedder import EmbedderRequestError, EmbedderUnavailable
from engram_retrieval.server import StartupError, serve
from engram_retrieval.settings import RetrievalSettings
from engram_retrieval.store import StoreError


def main() -> None:
    settings = load_settings(RetrievalSettings)
    try:
        event_loop.run(serve(settings), settings.event_loop)
    except (
        ModelFilesError,
        EmbedderRequestError,
        EmbedderUnavailable,
        StartupError,
        StoreError,
    ) as exc:
        get_logger(__name__).error("retrieval.start_failed", error=str(exc))
        sys.exit(1)


if __name__ == "__main__":
    main()
