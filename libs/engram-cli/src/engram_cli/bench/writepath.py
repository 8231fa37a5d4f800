"""``engram bench write-path``: how long a turn takes to become memory.

Starts the whole stack (as ``engram up`` does, on free ports and a fresh data dir)
against an LLM — by default the deterministic rule-based scripted LLM, so the
numbers measure Engram rather than a model — sends paced chats through the gateway
(each states one new fact, "I love <token>"), and listens on
``engram.memory.changed.v1`` for the moment each turn is indexed and the moment its
fact is committed by reconcile. Latency is measured from just before the chat is
sent (the gateway publishes the user turn before it forwards the request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import nats

from engram_cli.bench.common import percentiles
from engram_cli.bench.machine import measured_machine
from engram_cli.cli_common import WORKERS
from engram_cli.console import ProgressBar, print_table
from engram_cli.stack.nats_server import free_port, free_port_block
from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream
from engram_cli.stack.up import Stack, StackSettings
from engram_core.events import MemoryChanged
from engram_core.settings import parse_nats_urls

STAGES = ("indexed", "fact")


@asynccontextmanager
async def bench_stack(
    llm_url: str | None, workers: tuple[str, ...] = WORKERS
) -> AsyncIterator[StackSettings]:
    """The stack as ``engram up`` runs it, on a fresh data dir and free ports.

    Without ``llm_url`` the built-in scripted LLM answers, so numbers measure Engram.
    """
    async with running_stack(llm_url, workers) as stack:
        yield stack.settings


@asynccontextmanager
async def running_stack(
    llm_url: str | None,
    workers: tuple[str, ...] = WORKERS,
    extra_env: dict[str, str] | None = None,
    *,
    light: bool = False,
) -> AsyncIterator[Stack]:
    """:func:`bench_stack`, yielding the :class:`Stack` itself (its processes: pids,
    signals); ``extra_env`` adds ``ENGRAM_*`` settings for every service. A process per
    worker, unless ``light`` (retrieval and the workers in one, ``engram up --light``)."""
    upstream = None
    if llm_url is None:
        upstream = ScriptedUpstream(replies=[RuleBasedBrain()]).start()
        llm_url = upstream.base_url
    try:
        with tempfile.TemporaryDirectory(prefix="engram-bench-") as tmp:
            settings = StackSettings(
                data_dir=Path(tmp),
                nats_url=f"nats://127.0.0.1:{free_port()}",
                gateway_port=free_port(),
                # Both, so an ENGRAM_RETRIEVAL_ADDRESS in the environment cannot point away.
                retrieval_listen=(retrieval := f"127.0.0.1:{free_port()}"),
                retrieval_address=retrieval,
                health_port_base=free_port_block(len(WORKERS)),
            )
            stack = Stack(
                settings,
                echo=lambda _: None,
                relay_logs=False,
                extra_env={
                    "ENGRAM_LLM_BASE_URL": llm_url,
                    "ENGRAM_LOG_LEVEL": "warning",
                    **(extra_env or {}),
                },
                workers=workers,
                # Per-process CPU, profiles and SIGSTOP of the workers need a process each.
                process_per_worker=not light,
                light=light,
            )
            sys.stderr.write(f"starting the stack (workers: {', '.join(workers)})...\n")
            try:
                await asyncio.to_thread(stack.start)
                yield stack
            finally:
                await asyncio.to_thread(stack.stop)
    finally:
        if upstream is not None:
            upstream.stop()


async def bench_write_path(
    turns: int, conversations: int, rate: float, llm_url: str | None, timeout_s: float
) -> dict[str, Any]:
    async with bench_stack(llm_url) as settings:
        return await _drive(settings, turns, conversations, rate, timeout_s)


async def _drive(
    settings: StackSettings, turns: int, conversations: int, rate: float, timeout_s: float
) -> dict[str, Any]:
    sent: dict[str, float] = {}
    seen: dict[str, dict[str, float]] = {}

    async def on_change(msg: Any) -> None:
        change = MemoryChanged.model_validate_json(msg.data)
        memory = change.memory
        words = (w.strip(".,!?") for w in memory.text.split())
        token = next((w for w in words if w.startswith("wpb") and w in sent), None)
        if token is None:
            return
        stage = (
            "indexed"
            if memory.kind == "turn" and memory.role == "user"
            else "fact"
            if memory.kind == "fact" and change.cause.startswith("reconcile")
            else None
        )
        if stage is not None:
            seen.setdefault(token, {}).setdefault(stage, time.perf_counter())

    nc = await nats.connect(servers=parse_nats_urls(settings.nats_url))
    await nc.subscribe(MemoryChanged.subjects_wildcard(), cb=on_change)
    base = f"{settings.local_gateway_url}/v1"
    async with httpx2.AsyncClient(base_url=base, timeout=60) as http:
        with ProgressBar("chatting", turns) as bar:
            for i in range(turns):
                token = f"wpb{i:05d}"
                sent[token] = time.perf_counter()
                reply = await http.post(
                    "/chat/completions",
                    json={
                        "model": "bench",
                        "memory_id": f"bench-{i % conversations}",
                        "messages": [{"role": "user", "content": f"I love {token}."}],
                    },
                )
                reply.raise_for_status()
                bar.advance()
                await asyncio.sleep(max(0.0, sent[token] + 1.0 / rate - time.perf_counter()))
    deadline = time.monotonic() + timeout_s
    with ProgressBar("waiting for facts", turns) as bar:
        while sum("fact" in s for s in seen.values()) < turns and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            bar.update(sum("fact" in s for s in seen.values()))
    await nc.close()
    latencies = {
        stage: [(seen[t][stage] - sent[t]) * 1000 for t in sent if stage in seen.get(t, {})]
        for stage in STAGES
    }
    return {
        "turns": turns,
        "conversations": conversations,
        "rate_per_s": rate,
        "completed": {stage: len(v) for stage, v in latencies.items()},
        "latency_ms": {stage: percentiles(v) for stage, v in latencies.items() if v},
        "samples_ms": latencies,
    }


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = {"indexed": "turn indexed", "fact": "fact reconciled"}
    for stage in STAGES:
        if result["samples_ms"][stage]:
            ax.hist(result["samples_ms"][stage], bins=30, alpha=0.6, label=labels[stage])
    ax.set_xlabel("ms after the chat was sent")
    ax.set_ylabel("turns")
    ax.set_title("engram bench write-path")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cmd_write_path(args: argparse.Namespace) -> int:
    if args.turns <= 0 or args.conversations <= 0 or args.rate <= 0:
        print(
            "engram bench write-path: --turns, --conversations, --rate must be > 0", file=sys.stderr
        )
        return 2
    machine = measured_machine()
    result = asyncio.run(
        bench_write_path(args.turns, args.conversations, args.rate, args.llm_url, args.timeout)
    )
    rows = []
    for stage, label in (("indexed", "turn indexed"), ("fact", "fact reconciled")):
        lat = result["latency_ms"].get(stage, {"p50": "-", "p95": "-", "p99": "-"})
        rows.append([label, result["completed"][stage], lat["p50"], lat["p95"], lat["p99"]])
    print_table(["stage", "done", "p50 ms", "p95 ms", "p99 ms"], rows, title="write path")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps(
            {
                "benchmark": "write-path",
                "llm": args.llm_url or "scripted rule-based",
                "machine": machine,
                **{k: v for k, v in result.items() if k != "samples_ms"},
            },
            indent=2,
        )
    )
    _plot(result, out / "write_path.png")
    print(f"saved {out / 'results.json'} and {out / 'write_path.png'}")
    return 0 if result["completed"]["fact"] == args.turns else 1


def add_write_path_parser(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    bench = kinds.add_parser("write-path", help="publish -> indexed turn -> reconciled fact")
    bench.add_argument("--turns", type=int, default=100, help="chats to send")
    bench.add_argument("--conversations", type=int, default=5, help="spread over this many")
    bench.add_argument("--rate", type=float, default=5.0, help="chats per second")
    bench.add_argument(
        "--llm-url", default=None, help="OpenAI-compatible URL (default: the built-in scripted LLM)"
    )
    bench.add_argument("--timeout", type=float, default=120.0, help="wait for stragglers (s)")
    bench.add_argument("--out", default="bench-results/write-path", help="output directory")
    bench.set_defaults(func=handler, run=_cmd_write_path)
