"""Load and measurements for ``engram bench overhead``: chats sent straight to the
upstream or through the gateway (memory on or off) at a fixed rate or by closed-loop
clients, each process's CPU from the kernel's counters, the workers' backlog from
JetStream, and the scripted upstream in a process of its own (so its CPU is its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from engram_cli.bench.common import percentiles, process_cpu_s
from engram_cli.console import ProgressBar
from engram_cli.stack.nats_server import free_port, port_is_open
from engram_cli.stack.up import Stack
from engram_core.events import STREAM_NAME

CONVERSATION_PREFIX = "overhead-"
MODES = ("direct", "off", "on")
DRAIN_TIMEOUT_S = 300.0


@dataclass
class ChatSample:
    started: float
    latency_ms: float
    status: int
    timings: dict[str, float] = field(default_factory=dict)


def parse_server_timing(value: str) -> dict[str, float]:
    """``{"recall": 2.1, ...}`` (ms) from a ``Server-Timing`` header value."""
    timings: dict[str, float] = {}
    for entry in value.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        for param in params:
            key, _, number = param.partition("=")
            if key == "dur" and name:
                with contextlib.suppress(ValueError):
                    timings[name] = float(number)
    return timings


class Chatter:
    """The bench's chats: one body recipe, three destinations. Every chat states a new
    fact ("I own a ohb000123."), after ``history`` earlier messages, so memory-on chats
    drive the whole write path (extraction, reconcile, summary, mirror)."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        *,
        gateway: str,
        upstream: str,
        conversations: int,
        history: int,
    ) -> None:
        self.http = http
        self.urls = {"direct": f"{upstream}/chat/completions"}
        self.urls["off"] = self.urls["on"] = f"{gateway}/v1/chat/completions"
        self.conversations = conversations
        self.history = history
        self.sent = 0

    def body(self, mode: str) -> dict[str, Any]:
        n = self.sent
        self.sent += 1
        history: list[dict[str, str]] = []
        for i in range(self.history // 2):
            history += [
                {"role": "user", "content": f"Tell me something about topic {i}."},
                {"role": "assistant", "content": f"Topic {i} is a fine topic. Noted."},
            ]
        body: dict[str, Any] = {
            "model": "bench",
            "messages": [*history, {"role": "user", "content": f"I own a ohb{n:06d}."}],
        }
        if mode != "direct":
            body["memory_id"] = f"{CONVERSATION_PREFIX}{n % self.conversations}"
        if mode == "off":
            body["memory"] = False
        return body

    async def send(self, mode: str) -> ChatSample:
        body = self.body(mode)
        started = time.perf_counter()
        try:
            reply = await self.http.post(self.urls[mode], json=body)
            status = reply.status_code
            timing = parse_server_timing(reply.headers.get("server-timing", ""))
        except httpx2.HTTPError:
            status, timing = 0, {}
        return ChatSample(started, (time.perf_counter() - started) * 1e3, status, timing)


async def at_rate(
    send: Callable[[], Coroutine[Any, Any, ChatSample]], rate: float, seconds: float, label: str
) -> list[ChatSample]:
    """Open loop: chats start on a fixed schedule, whether or not earlier ones are done."""
    count = max(1, round(rate * seconds))
    started = time.perf_counter()
    tasks: list[asyncio.Task[ChatSample]] = []
    with ProgressBar(label, count) as bar:
        for i in range(count):
            await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(send()))
            bar.advance()
    return list(await asyncio.gather(*tasks))


async def closed_loop(
    send: Callable[[], Coroutine[Any, Any, ChatSample]], clients: int, seconds: float
) -> tuple[list[ChatSample], float]:
    """``clients`` loops, each sending its next chat when the last one is answered."""
    deadline = time.perf_counter() + seconds
    samples: list[ChatSample] = []

    async def client() -> None:
        while time.perf_counter() < deadline:
            samples.append(await send())

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return samples, time.perf_counter() - started


class CpuMeter:
    """CPU seconds of each process of the run, read from the kernel's counters (a
    process with its descendants: the retrieval's index optimiser; this process
    without them, since it started the stack)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def read(self) -> dict[str, float]:
        own = os.getpid()
        return {
            name: time.process_time() if pid == own else process_cpu_s(pid)
            for name, pid in self.pids.items()
        }

    @staticmethod
    def per_unit(before: dict[str, float], after: dict[str, float], units: int) -> dict[str, float]:
        """Milliseconds per chat (or turn) of every process, and their total."""
        used = {name: (after[name] - before[name]) * 1e3 / max(1, units) for name in before}
        used["total"] = sum(used.values())
        return {name: round(ms, 2) for name, ms in used.items()}


RPC_CLIENT_METRIC = "rpc_client_call_duration_seconds"


class RpcCalls:
    """The retrieval calls each process made, by method, from the ``rpc.client.call
    .duration`` histogram on its ``/metrics``: which caller asks retrieval for what,
    how often per turn, and how long each took."""

    def __init__(self, http: httpx2.AsyncClient, metrics_urls: dict[str, str]) -> None:
        self.http = http
        self.metrics_urls = metrics_urls

    async def read(self) -> dict[str, dict[str, tuple[float, float]]]:
        """``{caller: {method: (calls, seconds)}}``."""
        calls: dict[str, dict[str, tuple[float, float]]] = {}
        for caller, url in self.metrics_urls.items():
            response = await self.http.get(url)
            response.raise_for_status()
            counts: dict[str, list[float]] = {}
            for family in text_string_to_metric_families(response.text):
                for sample in family.samples:
                    suffix = sample.name.removeprefix(RPC_CLIENT_METRIC)
                    if sample.name == suffix or suffix not in ("_count", "_sum"):
                        continue
                    method = sample.labels.get("rpc_method", "?")
                    slot = counts.setdefault(method, [0.0, 0.0])
                    slot[0 if suffix == "_count" else 1] += sample.value
            calls[caller] = {m: (c, s) for m, (c, s) in counts.items()}
        return calls

    @staticmethod
    def per_unit(
        before: dict[str, dict[str, tuple[float, float]]],
        after: dict[str, dict[str, tuple[float, float]]],
        units: int,
    ) -> dict[str, dict[str, dict[str, float]]]:
        """``{caller: {method: {"per_turn", "mean_ms"}}}`` for the calls made between the
        two reads (methods not called are left out)."""
        table: dict[str, dict[str, dict[str, float]]] = {}
        for caller, methods in after.items():
            for method, (count, seconds) in methods.items():
                count0, seconds0 = before.get(caller, {}).get(method, (0.0, 0.0))
                if count - count0 <= 0:
                    continue
                table.setdefault(caller, {})[method] = {
                    "per_turn": round((count - count0) / max(1, units), 3),
                    "mean_ms": round((seconds - seconds0) * 1e3 / (count - count0), 2),
                }
        return table


class Backlog:
    """Every worker's backlog (pending + delivered but not yet acknowledged)."""

    def __init__(self, js: Any, workers: tuple[str, ...]) -> None:
        self.js = js
        self.workers = workers

    async def read(self) -> dict[str, int]:
        backlog = {}
        for worker in self.workers:
            info = await self.js.consumer_info(STREAM_NAME, worker)
            backlog[worker] = int(info.num_pending) + int(info.num_ack_pending)
        return backlog

    async def deliveries(self) -> dict[str, int]:
        """Messages each worker's consumer has delivered so far, redeliveries included
        (its consumer sequence)."""
        delivered = {}
        for worker in self.workers:
            info = await self.js.consumer_info(STREAM_NAME, worker)
            delivered[worker] = int(info.delivered.consumer_seq or 0) if info.delivered else 0
        return delivered

    @staticmethod
    def deliveries_per_unit(
        before: dict[str, int], after: dict[str, int], units: int
    ) -> dict[str, float]:
        """``{worker: deliveries per turn, "total": …}`` between the two reads."""
        table = {w: round((after[w] - before.get(w, 0)) / max(1, units), 3) for w in after}
        table["total"] = round(sum(table.values()), 3)
        return table

    async def wait_drained(self, timeout_s: float = DRAIN_TIMEOUT_S) -> float:
        """Wait until no worker has anything left; returns the seconds waited."""
        started = time.perf_counter()
        while any((await self.read()).values()):
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"the workers did not drain within {timeout_s:.0f}s")
            await asyncio.sleep(0.2)
        return time.perf_counter() - started

    @contextlib.asynccontextmanager
    async def sampled(self, every_s: float = 0.5) -> AsyncIterator[list[dict[str, Any]]]:
        """Sample the backlog in the background while the block runs."""
        series: list[dict[str, Any]] = []
        started = time.perf_counter()

        async def sample() -> None:
            while True:
                with contextlib.suppress(Exception):
                    series.append({"t": time.perf_counter() - started, **(await self.read())})
                await asyncio.sleep(every_s)

        task = asyncio.create_task(sample())
        try:
            yield series
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def scripted_llm_process() -> AsyncIterator[tuple[str, int]]:
    """``engram scripted-llm`` in a process of its own: (base URL, pid)."""
    port = free_port()
    engram = Path(sys.executable).parent / "engram"
    process = await asyncio.create_subprocess_exec(
        str(engram),
        "scripted-llm",
        "--port",
        str(port),
        "--keep",
        "20",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_is_open("127.0.0.1", port):
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError("engram scripted-llm did not start")
            await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/v1", process.pid
    finally:
        if process.returncode is None:
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            process.kill()
            await process.wait()


def stack_pids(stack: Stack, upstream_pid: int) -> dict[str, int]:
    pids = {"nats-server": stack.nats.process.pid} if stack.nats.process else {}
    for component in stack.components:
        if component.process is not None:
            pids[component.name] = component.process.pid
    pids["scripted-llm"] = upstream_pid
    pids["bench client"] = os.getpid()
    return pids


def signal_services(stack: Stack, sig: int) -> None:
    for component in stack.components:
        if component.process is not None:
            component.process.send_signal(sig)


def latency_summary(samples: list[ChatSample]) -> dict[str, Any]:
    ok = [s for s in samples if s.status == 200]
    summary: dict[str, Any] = {
        "chats": len(samples),
        "failed": len(samples) - len(ok),
        "latency_ms": percentiles([s.latency_ms for s in ok]) if ok else {},
    }
    for name in ("pre-upstream", "recall", "search", "upstream", "record"):
        values = [s.timings[name] for s in ok if name in s.timings]
        if values:
            summary[f"{name}_ms"] = percentiles(values)
    return summary
