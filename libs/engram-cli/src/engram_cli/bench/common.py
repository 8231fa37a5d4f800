"""Pieces every ``engram bench`` shares: a real retrieval process, percentiles, and the
memory of a process as the kernel reports it. (Progress bars and tables: ``console``.)"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import numpy as np

from engram_cli.stack.nats_server import free_port
from engram_core.memory_port import MemoryPort
from engram_core.retrieval_client import RetrievalClient


class RetrievalProcess:
    """A real ``engram-retrieval`` child process on a free port and a fresh data dir,
    entered as the :class:`MemoryPort` on it; ``extra_env`` adds or overrides
    ``ENGRAM_*`` settings for it."""

    def __init__(
        self,
        data_dir: Path,
        extra_env: dict[str, str] | None = None,
        *,
        ready_timeout_s: float = 120.0,
    ) -> None:
        self.ready_timeout_s = ready_timeout_s
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.extra_env = extra_env or {}
        self.process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("engram-retrieval is not running")
        return self.process.pid

    async def __aenter__(self) -> MemoryPort:
        env = {
            **os.environ,
            **self.extra_env,
            "ENGRAM_DATA_DIR": str(self.data_dir),
            "ENGRAM_RETRIEVAL_LISTEN": self.address,
            "ENGRAM_LOG_LEVEL": "warning",
            "ENGRAM_LOG_FORMAT": "json",
        }
        script = Path(sys.executable).parent / "engram-retrieval"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = (self.data_dir / "retrieval.log").open("ab")
        self.process = await asyncio.create_subprocess_exec(
            str(script), env=env, stdout=self.log, stderr=asyncio.subprocess.STDOUT
        )
        self.client = RetrievalClient(self.address, timeout_s=60)
        deadline = time.monotonic() + self.ready_timeout_s
        while not await self.client.is_serving():
            if self.process.returncode is not None:
                raise RuntimeError(f"engram-retrieval exited; see {self.data_dir}/retrieval.log")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"engram-retrieval not serving after {self.ready_timeout_s:.0f}s"
                )
            await asyncio.sleep(0.2)
        return MemoryPort(self.client)

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        if self.process is not None:
            self.process.terminate()
            await asyncio.wait_for(self.process.wait(), timeout=30)
        self.log.close()


def percentiles(samples: list[float]) -> dict[str, float]:
    arr = np.array(samples)
    return {
        p: round(float(np.percentile(arr, q)), 2)
        for p, q in (("p50", 50), ("p95", 95), ("p99", 99))
    }


def process_memory_mb(pid: int) -> dict[str, float]:
    """Resident memory of a process now (``VmRSS``), at its peak (``VmHWM``), and what
    the resident set is: the process's own memory (``RssAnon``) and mapped file pages
    (``RssFile``, which the kernel can drop and read back), in MiB."""
    wanted = {
        "VmRSS": "rss_mb",
        "VmHWM": "peak_rss_mb",
        "RssAnon": "anon_rss_mb",
        "RssFile": "file_rss_mb",
    }
    found: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in wanted:
            found[wanted[name]] = round(int(value.split()[0]) / 1024, 1)  # kB
    return found


def child_processes(pid: int) -> list[int]:
    """Direct children of a process (e.g. the retrieval service's index optimiser)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        children.extend(int(c) for c in text)
    return children


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _own_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of one process (its reaped children included)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # the name may contain spaces
    return sum(int(value) for value in fields[11:15]) / _CLOCK_TICKS


def process_cpu_s(pid: int) -> float:
    """CPU seconds a process and its live descendants have used, from the kernel's
    counters (``/proc/<pid>/stat``); 0 for a process that is gone."""
    try:
        total = _own_cpu_s(pid)
        children = child_processes(pid)
    except (OSError, ValueError):
        return 0.0
    return total + sum(process_cpu_s(child) for child in children)
