"""Optimising the embedded shard out of process, and where its generations live.

``EdgeShard.optimize()`` builds the HNSW indexes synchronously and holds the GIL until
it is done (measured: 10 s for 20k points, minutes for 100k on 2 cores), so the
service never calls it itself. It copies the shard, runs this module as a child
process (``python -m engram_retrieval.store.edge_optimize PATH DIM THRESHOLD``, at a
lower CPU priority) on the copy, and switches to the copy when it is done.

Generations: the configured path is generation 0; an optimisation writes
``<path>.gen-<n>`` beside it and switches by rewriting ``<path>.current`` (atomic
rename), the commit point. Leftovers of an interrupted optimisation or switch are
removed when the store is opened.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from engram_retrieval.store.base import StoreError
from engram_retrieval.store.edge_shard import open_shard

_GENERATION = ".gen-"


class ShardGenerations:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.pointer = root.with_name(root.name + ".current")
        self.active = self._read_active()

    @property
    def switched(self) -> bool:
        """Whether the active shard came from an optimisation (not the original path)."""
        return self.active != self.root

    def _generations(self) -> list[Path]:
        found = self.root.parent.glob(self.root.name + _GENERATION + "*")
        return sorted((p for p in found if p.name.rsplit("-", 1)[-1].isdigit()), key=self._number)

    @staticmethod
    def _number(path: Path) -> int:
        return int(path.name.rsplit("-", 1)[-1])

    def _read_active(self) -> Path:
        if self.pointer.is_file():
            name = self.pointer.read_text().strip()
            if name and (self.root.parent / name).is_dir():
                return self.root.parent / name
        if self.root.is_dir() and any(self.root.iterdir()):
            return self.root  # no switch was committed: the original is complete
        generations = self._generations()
        return generations[-1] if generations else self.root  # pointer lost: newest

    def open_active(self) -> Path:
        """The active shard's directory, once leftovers of interrupted runs are gone."""
        for stale in self._generations():
            if stale != self.active:
                shutil.rmtree(stale, ignore_errors=True)
        if self.switched and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)
        return self.active

    def next_path(self) -> Path:
        number = self._number(self.active) if self.switched else 0
        return self.root.with_name(f"{self.root.name}{_GENERATION}{number + 1}")

    def switch_to(self, target: Path) -> None:
        temporary = self.pointer.with_name(self.pointer.name + ".tmp")
        with temporary.open("w") as handle:
            handle.write(target.name)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.pointer)
        self.active = target


async def run_optimizer(path: Path, dim: int, index_threshold: int) -> dict[str, Any]:
    """Optimise the shard at ``path`` in a child process; its JSON report."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "engram_retrieval.store.edge_optimize",
        str(path),
        str(dim),
        str(index_threshold),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await process.communicate()
    except asyncio.CancelledError:
        process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        tail = err.decode(errors="replace").strip()[-500:]
        raise StoreError(f"the optimiser exited with {process.returncode}: {tail}")
    lines = out.decode().strip().splitlines()
    return dict(json.loads(lines[-1])) if lines else {}


def main(argv: list[str] | None = None) -> int:
    path, dim, threshold = (argv if argv is not None else sys.argv[1:])[:3]
    os.nice(10)  # the service's own work comes first
    started = time.perf_counter()
    shard, _ = open_shard(Path(path), int(dim), int(threshold))
    optimized = shard.optimize()
    shard.flush()
    info = shard.info()
    shard.close()
    report = {
        "optimized": optimized,
        "seconds": round(time.perf_counter() - started, 2),
        "segments": info.segments_count,
        "points": info.points_count,
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
