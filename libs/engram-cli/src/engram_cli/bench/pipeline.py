"""``engram bench pipeline``: turn → searchable lag and sustained throughput.

Starts the stack (gateway, retrieval, NATS and the workers, by default all of them)
against the scripted LLM and sends chats through the gateway — concurrently, on a
fixed schedule, so a slow reply does not slow the sender. Every chat publishes two
turns (the user's and the model's reply), so ``--rate`` turns/s means ``rate / 2``
chats/s. For every turn it records when the gateway's ``turn.persisted`` event
appears on NATS and when ingest announces the indexed turn (``memory.changed``,
published after the turn's ``Upsert`` returned); the lag is the difference. For a
sample of user turns it then runs a real ``Search`` to prove the turn is searchable
at that moment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import nats
import numpy as np

from engram_cli.bench.common import percentiles
from engram_cli.bench.machine import measured_machine
from engram_cli.bench.writepath import bench_stack
from engram_cli.cli_common import WORKERS
from engram_cli.console import ProgressBar, print_table
from engram_cli.stack.up import StackSettings
from engram_core.events import MemoryChanged, TurnPersisted
from engram_core.memory import SearchQuery
from engram_core.memory_port import MemoryPort
from engram_core.retrieval_client import RetrievalClient
from engram_core.settings import parse_nats_urls

TOKEN_PREFIX = "ppb"
CONVERSATION_PREFIX = "pipeline-"
VERIFY_EVERY = 10


async def bench_pipeline(
    turns: int, rate: float, conversations: int, workers: tuple[str, ...], timeout_s: float
) -> dict[str, Any]:
    async with bench_stack(None, workers) as settings:
        return await drive_pipeline(settings, turns, rate, conversations, timeout_s)


async def drive_pipeline(
    settings: StackSettings,
    turns: int,
    rate: float,
    conversations: int,
    timeout_s: float,
    *,
    first: int = 0,
) -> dict[str, Any]:
    """Send ``turns`` at ``rate`` through a running stack and measure the lag; ``first``
    numbers the chats (a second run on the same stack must not repeat the first's)."""
    chats = (turns + 1) // 2
    published: dict[str, float] = {}  # turn_id -> when turn.persisted was seen
    indexed: dict[str, float] = {}  # turn_id -> when memory.changed was seen
    verified: dict[str, bool] = {}
    retrieval = RetrievalClient(settings.retrieval_address)
    memories = MemoryPort(retrieval)
    checks: list[asyncio.Task[None]] = []

    async def verify(token: str, conversation: str) -> None:
        result = await memories.search(
            SearchQuery(
                tenant="default",
                text=f"I own a {token}.",
                conversation_id=conversation,
                top_k=5,
                score_threshold=0.0,
            )
        )
        verified[token] = any(token in hit.memory.text for hit in result.hits)

    async def on_turn(msg: Any) -> None:
        turn = TurnPersisted.model_validate_json(msg.data)
        if turn.conversation_id.startswith(CONVERSATION_PREFIX):
            published.setdefault(turn.turn_id, time.perf_counter())

    async def on_change(msg: Any) -> None:
        change = MemoryChanged.model_validate_json(msg.data)
        memory = change.memory
        turn_id = memory.metadata.get("turn_id", "")
        if (
            memory.kind != "turn"
            or not memory.conversation_id.startswith(CONVERSATION_PREFIX)
            or turn_id in indexed
        ):
            return
        # Callbacks of two subscriptions may run out of order: match them up at the end.
        indexed[turn_id] = time.perf_counter()
        token = next(
            (w.strip(".") for w in memory.text.split() if w.startswith(TOKEN_PREFIX)), None
        )
        if token and int(token[len(TOKEN_PREFIX) :]) % VERIFY_EVERY == 0:
            checks.append(asyncio.create_task(verify(token, memory.conversation_id)))

    nc = await nats.connect(servers=parse_nats_urls(settings.nats_url))
    await nc.subscribe(TurnPersisted.subject, cb=on_turn)
    await nc.subscribe(MemoryChanged.subjects_wildcard(), cb=on_change)
    base = f"{settings.local_gateway_url}/v1"
    failures = 0

    async def chat(http: httpx2.AsyncClient, i: int) -> None:
        nonlocal failures
        n = first + i
        try:
            reply = await http.post(
                "/chat/completions",
                json={
                    "model": "bench",
                    "memory_id": f"{CONVERSATION_PREFIX}{n % conversations}",
                    "messages": [{"role": "user", "content": f"I own a {TOKEN_PREFIX}{n:06d}."}],
                },
            )
        except httpx2.HTTPError:  # a dropped connection is a failed chat, counted
            failures += 1
            return
        if reply.status_code != 200:
            failures += 1

    limits = httpx2.Limits(max_connections=256, max_keepalive_connections=256)
    chat_rate = rate / 2
    async with httpx2.AsyncClient(base_url=base, timeout=120, limits=limits) as http:
        started = time.perf_counter()
        in_flight: list[asyncio.Task[None]] = []
        with ProgressBar("sending chats", chats) as bar:
            for i in range(chats):
                await asyncio.sleep(max(0.0, started + i / chat_rate - time.perf_counter()))
                in_flight.append(asyncio.create_task(chat(http, i)))
                bar.advance()
        send_s = time.perf_counter() - started
        await asyncio.gather(*in_flight)
    expected = 2 * chats - 2 * failures
    deadline = time.monotonic() + timeout_s
    with ProgressBar("waiting for ingest", expected) as bar:
        while len(indexed) < expected and time.monotonic() < deadline:
            bar.update(len(indexed))
            await asyncio.sleep(0.2)
        bar.update(len(indexed))
    await asyncio.gather(*checks)
    await nc.close()
    await retrieval.close()
    done = [t for t in published if t in indexed]
    lags = [max(0.0, indexed[t] - published[t]) * 1000 for t in done]
    last = max(indexed.values(), default=started)
    return {
        "turns": 2 * chats,
        "chats": chats,
        "target_rate_per_s": rate,
        "achieved_send_rate_per_s": round(2 * chats / send_s, 1),
        "sustained_indexed_per_s": round(len(indexed) / (last - started), 1),
        "published": len(published),
        "indexed": len(indexed),
        "failed_chats": failures,
        "searchable_verified": f"{sum(verified.values())}/{len(verified)}",
        "lag_ms": percentiles(lags) if lags else {},
        "samples_ms": lags,
        "sample_order": [indexed[t] - started for t in done],
    }


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.hist(result["samples_ms"], bins=40)
    left.set_xlabel("turn → searchable lag (ms)")
    left.set_ylabel("turns")
    right.plot(result["sample_order"], result["samples_ms"], ".", markersize=3)
    right.set_xlabel("seconds into the run")
    right.set_ylabel("lag (ms)")
    fig.suptitle(f"engram bench pipeline at {result['target_rate_per_s']:g} turns/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cmd_pipeline(args: argparse.Namespace) -> int:
    workers = tuple(w.strip() for w in args.workers.split(",") if w.strip())
    if args.turns <= 0 or args.rate <= 0 or args.conversations <= 0:
        print(
            "engram bench pipeline: --turns, --rate, --conversations must be > 0", file=sys.stderr
        )
        return 2
    if "ingest" not in workers or set(workers) - set(WORKERS):
        print(
            f"engram bench pipeline: --workers must include ingest, from {', '.join(WORKERS)}",
            file=sys.stderr,
        )
        return 2
    machine = measured_machine()
    result = asyncio.run(
        bench_pipeline(args.turns, args.rate, args.conversations, workers, args.timeout)
    )
    lag = result["lag_ms"] or {"p50": "-", "p95": "-", "p99": "-"}
    print_table(
        ["rate/s", "sent/s", "indexed/s", "indexed", "lag p50 ms", "p95", "p99", "verified"],
        [
            [
                result["target_rate_per_s"],
                result["achieved_send_rate_per_s"],
                result["sustained_indexed_per_s"],
                result["indexed"],
                lag["p50"],
                lag["p95"],
                lag["p99"],
                result["searchable_verified"],
            ]
        ],
        title="turn → searchable",
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {k: v for k, v in result.items() if k not in ("samples_ms", "sample_order")}
    (out / "results.json").write_text(
        json.dumps(
            {
                "benchmark": "pipeline",
                "workers": list(workers),
                "machine": machine,
                **summary,
                "lag_mean_ms": round(float(np.mean(result["samples_ms"])), 2)
                if result["samples_ms"]
                else None,
            },
            indent=2,
        )
    )
    _plot(result, out / "pipeline.png")
    print(f"saved {out / 'results.json'} and {out / 'pipeline.png'}")
    return 0 if result["indexed"] == result["turns"] and not result["failed_chats"] else 1


def add_pipeline_parser(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    bench = kinds.add_parser("pipeline", help="gateway → JetStream → ingest: lag and throughput")
    bench.add_argument(
        "--turns", type=int, default=1000, help="turns to publish (two per chat: user, reply)"
    )
    bench.add_argument("--rate", type=float, default=50.0, help="turns per second")
    bench.add_argument("--conversations", type=int, default=20, help="spread over this many")
    bench.add_argument(
        "--workers",
        default=",".join(WORKERS),
        help="workers to run (comma-separated; ingest is required)",
    )
    bench.add_argument("--timeout", type=float, default=120.0, help="wait for stragglers (s)")
    bench.add_argument("--out", default="bench-results/pipeline", help="output directory")
    bench.set_defaults(func=handler, run=_cmd_pipeline)
