"""``engram status``: is everything up, how far behind is each worker, how much is stored.

- the gateway's ``/readyz``, retrieval's gRPC health, each worker's ``/readyz`` on its
  health port (``ENGRAM_HEALTH_PORT_BASE`` + position, as ``engram up`` assigns them);
- per worker, its durable JetStream consumer on the ``ENGRAM`` stream: ``num_pending``
  (not yet delivered), ``num_ack_pending`` (delivered, not yet acknowledged),
  ``num_redelivered``;
- memories per kind for a tenant (retrieval ``Count``, current versions and all);
- the workers' model tasks per task and model: how many were asked, how many took their
  fallback and why (``engram.llm.tasks`` on each model-calling worker's ``/metrics``,
  counted since that worker started; once per process where workers share one) — a
  small local model whose answers cannot be used shows up here before anyone misses a
  fact.

Exit status 0 when every service answered ready, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any, TextIO
from urllib.parse import urlparse

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from engram_cli.cli_common import (
    WORKERS,
    CliSettings,
    add_gateway_flags,
    add_health_port_flag,
    add_nats_flag,
    add_retrieval_flag,
    cli_settings,
)
from engram_cli.console import print_table
from engram_cli.stack.nats_server import port_is_open
from engram_core.events import STREAM_NAME
from engram_core.memory import MemoryFilter
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.nats_admin import admin_connection
from engram_core.retrieval_client import RetrievalClient
from engram_core.settings import parse_nats_urls

TIMEOUT_S = 2.0
#: The workers that ask a model, whose /metrics count the tasks.
MODEL_WORKERS = ("ingest", "reconcile", "summarize")
_TASKS_SAMPLE = "engram_llm_tasks_total"


async def _http_ready(http: httpx2.AsyncClient, url: str) -> dict[str, Any]:
    try:
        response = await http.get(url)
    except httpx2.HTTPError as exc:
        return {"status": "unreachable", "url": url, "error": type(exc).__name__}
    status = "ready" if response.status_code == 200 else "not ready"
    entry: dict[str, Any] = {"status": status, "url": url}
    if response.status_code != 200:
        try:
            entry["checks"] = response.json().get("checks")
        except ValueError:
            entry["http_status"] = response.status_code
    return entry


def _listening(url: str) -> bool:
    parts = urlparse(url)
    return port_is_open(parts.hostname or "127.0.0.1", parts.port or 4222)


async def _consumers(nats_url: str) -> dict[str, Any]:
    from nats.js.errors import NotFoundError

    try:
        servers = parse_nats_urls(nats_url)
    except ValueError as exc:
        return {"error": f"ENGRAM_NATS_URL: {exc}"}
    # Every node of a cluster is probed: one that is down is no reason to give up.
    listening = await asyncio.gather(*(asyncio.to_thread(_listening, url) for url in servers))
    if not any(listening):
        return {"error": f"NATS at {nats_url} unreachable (nothing listens)"}

    stack = AsyncExitStack()
    try:
        nc = await asyncio.wait_for(
            stack.enter_async_context(admin_connection(",".join(servers))),
            timeout=TIMEOUT_S * len(servers),
        )
    except Exception as exc:  # nats-py raises several types for "no server"
        await stack.aclose()
        return {"error": f"NATS at {nats_url} unreachable ({type(exc).__name__})"}
    try:
        js = nc.jetstream(timeout=TIMEOUT_S)
        try:
            stream = await js.stream_info(STREAM_NAME)
        except NotFoundError:
            return {"error": f"no stream {STREAM_NAME}"}
        result: dict[str, Any] = {
            "stream": {"name": STREAM_NAME, "messages": int(stream.state.messages)},
            "consumers": {},
        }
        for worker in WORKERS:
            try:
                info = await js.consumer_info(STREAM_NAME, worker)
            except NotFoundError:
                result["consumers"][worker] = None
                continue
            result["consumers"][worker] = {
                "num_pending": int(info.num_pending or 0),
                "num_ack_pending": int(info.num_ack_pending or 0),
                "redelivered": int(info.num_redelivered or 0),
                "waiting_pulls": int(info.num_waiting or 0),
            }
        return result
    finally:
        await stack.aclose()


async def _counts(client: RetrievalClient, tenant: str) -> dict[str, Any]:
    memories = MemoryPort(client)
    try:
        current = await memories.count(tenant, MemoryFilter())
        everything = await memories.count(tenant, MemoryFilter(include_superseded=True))
    except RetrievalError as exc:
        return {"error": f"{exc.code.name}: {exc.details}"}
    return {
        "tenant": tenant,
        "current": current.total,
        "by_kind": dict(sorted(current.by_kind.items())),
        "superseded": everything.total - current.total,
    }


def model_task_rates(exposition: str) -> list[dict[str, Any]]:
    """Per (task, model): tasks asked, answered, fallbacks by kind and their rate, from
    Prometheus text holding ``engram.llm.tasks`` (several workers' texts concatenated)."""
    counts: dict[tuple[str, str], dict[str, float]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name != _TASKS_SAMPLE:
                continue
            labels = sample.labels
            key = (labels.get("engram_llm_task", ""), labels.get("gen_ai_request_model", ""))
            outcome = labels.get("engram_llm_outcome", "")
            by_outcome = counts.setdefault(key, {})
            by_outcome[outcome] = by_outcome.get(outcome, 0.0) + sample.value
    rows = []
    for (task, model), by_outcome in sorted(counts.items()):
        asked = int(sum(by_outcome.values()))
        fallbacks = {k: int(v) for k, v in sorted(by_outcome.items()) if k != "answered" and v}
        fell_back = sum(fallbacks.values())
        rows.append(
            {
                "task": task,
                "model": model,
                "asked": asked,
                "fell_back": fell_back,
                "fallback_rate": round(fell_back / asked, 3) if asked else 0.0,
                "fallbacks": fallbacks,
            }
        )
    return rows


def one_per_process(texts: list[str]) -> list[str]:
    """The ``/metrics`` texts without repeats of one process's counts: the workers that
    share a process (``engram-workers``) each answer ``/metrics`` with the process's
    counters, which must be counted once. Distinct workers count distinct tasks, so two
    texts with the same non-empty task lines come from one process."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for text in texts:
        lines = tuple(sorted(ln for ln in text.splitlines() if ln.startswith(_TASKS_SAMPLE)))
        if lines and lines in seen:
            continue
        seen.add(lines)
        kept.append(text)
    return kept


async def _model_tasks(http: httpx2.AsyncClient, ports: dict[str, int]) -> dict[str, Any]:
    texts, unreachable = [], []
    for worker in MODEL_WORKERS:
        try:
            response = await http.get(f"http://127.0.0.1:{ports[worker]}/metrics")
        except httpx2.HTTPError:
            unreachable.append(worker)
            continue
        if response.status_code == 200:
            texts.append(response.text)
        else:
            unreachable.append(worker)
    if not texts:
        return {"error": f"no /metrics from {', '.join(MODEL_WORKERS)}"}
    result: dict[str, Any] = {"tasks": model_task_rates("\n".join(one_per_process(texts)))}
    if unreachable:
        result["unreachable"] = unreachable
    return result


async def collect_status(settings: CliSettings, tenant: str) -> dict[str, Any]:
    client = RetrievalClient(settings.retrieval_address, timeout_s=TIMEOUT_S)
    gateway = settings.gateway_url.rstrip("/")
    async with httpx2.AsyncClient(timeout=TIMEOUT_S) as http:
        try:
            ports = settings.worker_health_ports()
            worker_urls = {w: f"http://127.0.0.1:{port}/readyz" for w, port in ports.items()}
            gateway_ready, serving, consumers, model_tasks, *workers = await asyncio.gather(
                _http_ready(http, f"{gateway}/readyz"),
                client.is_serving(timeout_s=TIMEOUT_S),
                _consumers(settings.nats_url),
                _model_tasks(http, ports),
                *(_http_ready(http, url) for url in worker_urls.values()),
            )
            counts = await _counts(client, tenant) if serving else {"error": "retrieval down"}
        finally:
            await client.close()
    services: dict[str, Any] = {
        "gateway": gateway_ready,
        "retrieval": {
            "status": "serving" if serving else "unreachable",
            "address": settings.retrieval_address,
        },
    }
    services.update(dict(zip(WORKERS, workers, strict=True)))
    return {
        "services": services,
        "jetstream": consumers,
        "memories": counts,
        "model_tasks": model_tasks,
    }


def all_ready(status: dict[str, Any]) -> bool:
    return all(s["status"] in ("ready", "serving") for s in status["services"].values())


def print_status(status: dict[str, Any], out: TextIO) -> None:
    services = [
        [name, entry["status"], entry.get("url") or entry.get("address", ""), entry.get("checks")]
        for name, entry in status["services"].items()
    ]
    print_table(["service", "status", "where", "checks"], services, title="services", out=out)
    js = status["jetstream"]
    if "error" in js:
        print(f"jetstream: {js['error']}", file=out)
    else:
        consumers = [
            [name, "-", "-", "-", "no consumer yet"]
            if info is None
            else [name, info["num_pending"], info["num_ack_pending"], info["redelivered"], ""]
            for name, info in js["consumers"].items()
        ]
        title = f"jetstream: stream {js['stream']['name']}, {js['stream']['messages']} messages"
        columns = ["consumer", "pending", "ack_pending", "redelivered", "note"]
        print_table(columns, consumers, title=title, out=out)
    counts = status["memories"]
    if "error" in counts:
        print(f"memories: {counts['error']}", file=out)
    else:
        kinds = ", ".join(f"{k} {v}" for k, v in counts["by_kind"].items() if v) or "none"
        print(
            f"memories of tenant {counts['tenant']!r}: {counts['current']} current ({kinds}), "
            f"{counts['superseded']} superseded",
            file=out,
        )
    print_model_tasks(status["model_tasks"], out)


def print_model_tasks(model_tasks: dict[str, Any], out: TextIO) -> None:
    if "error" in model_tasks:
        print(f"model tasks: {model_tasks['error']}", file=out)
        return
    if not model_tasks["tasks"]:
        print("model tasks: none asked yet", file=out)
        return
    rows = [
        [
            row["task"],
            row["model"] or "(none)",
            row["asked"],
            row["fell_back"],
            f"{row['fallback_rate']:.0%}",
            ", ".join(f"{kind} {n}" for kind, n in row["fallbacks"].items()),
        ]
        for row in model_tasks["tasks"]
    ]
    columns = ["task", "model", "asked", "fell back", "rate", "why"]
    title = "model tasks since each worker started (docs/workers.md, 'Local models')"
    print_table(columns, rows, title=title, out=out)


def add_status_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "status",
        help="services' health, worker lag (JetStream consumers), memory counts",
        description="Exit status 0 when every service is ready, 1 otherwise.",
    )
    parser.add_argument("--tenant", default="default", help="whose memories to count")
    parser.add_argument("--json", action="store_true")
    add_nats_flag(parser)
    add_health_port_flag(parser)
    add_gateway_flags(parser)
    add_retrieval_flag(parser)
    parser.set_defaults(func=handler)


def status_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    settings = cli_settings(args)
    status = asyncio.run(collect_status(settings, args.tenant))
    if args.json:
        print(json.dumps(status, indent=2), file=out)
    else:
        print_status(status, out)
    return 0 if all_ready(status) else 1
