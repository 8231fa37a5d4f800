"""The file-mirror worker (``engram-mirror``): every memory as Markdown under git.

See docs/mirror.md. ``main`` is the console script's entry point.
"""

from engram_workers.mirror.app import MIRROR, MirrorSettings, main
from engram_workers.mirror.core import Mirror

__all__ = ["MIRROR", "Mirror", "MirrorSettings", "main"]
