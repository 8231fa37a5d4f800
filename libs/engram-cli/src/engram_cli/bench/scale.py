"""``engram bench scale``: Search latency, Upsert throughput and memory at growing sizes.

Each engine gets its own real ``engram-retrieval`` process on a fresh data dir. The
store grows size by size with synthetic memories (:mod:`engram_cli.bench.scale_corpus`:
20 tenants x 50 conversations) sent through gRPC ``Upsert`` in per-tenant batches;
after each size the bench measures ``Search`` at the client with a tenant +
conversation filter (conversation scope) and with the default scopes (conversation,
user, global), and reads the process's resident memory from ``/proc``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engram_cli.bench.common import (
    RetrievalProcess,
    child_processes,
    percentiles,
    process_memory_mb,
)
from engram_cli.bench.machine import measured_machine
from engram_cli.bench.scale_corpus import Layout, SyntheticMemory, memories, queries
from engram_cli.console import ProgressBar, print_table, render_table
from engram_cli.records import new_memory
from engram_core.memory import MemoryFilter, MemoryRecord, ScopeName, SearchQuery
from engram_core.memory_port import MemoryPort

# The environment of each engine's retrieval process ({data} = its data dir). No cache
# of recent texts' vectors: the questions come from a few templates and repeat, and a
# cached question would hide what embedding it costs.
_UNCACHED = {"ENGRAM_EMBED_CACHE_TEXTS": "0"}
ENGINES: dict[str, dict[str, str]] = {
    "edge": {"ENGRAM_QDRANT_URL": "", "ENGRAM_QDRANT_PATH": "", **_UNCACHED},
    "qdrant-local": {
        "ENGRAM_QDRANT_URL": "",
        "ENGRAM_QDRANT_PATH": "{data}/qdrant-local",
        **_UNCACHED,
    },
}
DEFAULT_ENGINE = "edge"
# qdrant-client's local mode is a pure-Python brute-force store: a contrast, not a
# contender, so it only runs up to this size unless told otherwise.
LOCAL_MODE_MAX = 10_000
WARM_UP = 10
#: How long a restart on a large store may take to serve before the bench gives up.
RESTART_TIMEOUT_S = 900.0
STAGES = ("embed_ms", "candidates_ms", "rerank_ms", "mmr_ms")


def to_record(m: SyntheticMemory) -> MemoryRecord:
    return new_memory(
        m.tenant,
        kind=m.kind,
        role=m.role,
        text=m.text,
        user_id=m.user_id,
        conversation_id=m.conversation_id,
        source_id=m.source_id,
        created_at=m.created_at,
    )


async def store_memories(
    memories: MemoryPort,
    items: Sequence[SyntheticMemory],
    batch: int,
    on_progress: Callable[[int], None],
) -> None:
    """Upsert ``items`` in per-tenant batches of up to ``batch`` (an Upsert names one
    tenant), taking the tenants in turn, as concurrent users' writes would arrive."""
    by_tenant: dict[str, list[SyntheticMemory]] = {}
    for m in items:
        by_tenant.setdefault(m.tenant, []).append(m)
    chunks = [
        [(tenant, group[i : i + batch]) for i in range(0, len(group), batch)]
        for tenant, group in by_tenant.items()
    ]
    done = 0
    for turn in itertools.zip_longest(*chunks):
        for tenant, chunk in filter(None, turn):
            await memories.upsert(tenant, [to_record(m) for m in chunk])
            done += len(chunk)
            on_progress(done)


async def measure_search(
    memories: MemoryPort, asks: Sequence[tuple[str, ...]], *, scoped: bool, label: str
) -> dict[str, Any]:
    """Client-side latency of one Search per question; ``scoped`` = conversation only."""
    latencies: list[float] = []
    stages: dict[str, list[float]] = {k: [] for k in STAGES}
    outcomes: Counter[str] = Counter()
    scopes: tuple[ScopeName, ...] = ("conversation",) if scoped else ()
    with ProgressBar(label, len(asks)) as bar:
        for tenant, user_id, conversation_id, question in asks:
            query = SearchQuery(
                tenant=tenant,
                text=question,
                user_id=user_id,
                conversation_id=conversation_id,
                scopes=scopes,
            )
            started = time.perf_counter()
            result, timings = await memories.search_timed(query)
            latencies.append((time.perf_counter() - started) * 1000)
            for key in STAGES:
                stages[key].append(getattr(timings, key))
            outcomes[result.outcome.upper()] += 1
            bar.advance()
    return {
        "queries": len(asks),
        "latency_ms": percentiles(latencies),
        "mean_ms": round(float(np.mean(latencies)), 2),
        "stage_mean_ms": {k: round(float(np.mean(v)), 2) for k, v in stages.items()},
        "outcomes": dict(outcomes),
    }


async def bench_engine(
    engine: str, sizes: Sequence[int], corpus: Sequence[SyntheticMemory], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix=f"engram-scale-{engine}-") as tmp:
        env = {k: v.format(data=tmp) for k, v in ENGINES[engine].items()}
        process = RetrievalProcess(Path(tmp), extra_env=env)
        async with process as memories:
            stored = 0
            for size in sizes:
                added = corpus[stored:size]
                started = time.perf_counter()
                with ProgressBar(f"[{engine}] storing to {size}", size) as bar:
                    bar.update(stored)
                    await store_memories(
                        memories,
                        added,
                        args.batch,
                        bar.counting_from(stored),
                    )
                upsert_s = time.perf_counter() - started
                stored = size
                asks = queries(list(corpus[:size]), args.queries + WARM_UP)
                for tenant, user_id, conversation_id, question in asks[:WARM_UP]:
                    await memories.search(
                        SearchQuery(
                            tenant=tenant,
                            text=question,
                            user_id=user_id,
                            conversation_id=conversation_id,
                        )
                    )
                settled_s = 0.0
                if args.settle:  # measure the steady state: wait for index builds to end
                    waited = time.perf_counter()
                    while True:  # the service has no event to wait on: poll its children
                        if not child_processes(process.pid):
                            break
                        await asyncio.sleep(0.5)
                    settled_s = round(time.perf_counter() - waited, 1)
                # the embedded store may be building an index in a child process meanwhile
                indexing = bool(child_processes(process.pid))
                scoped = await measure_search(
                    memories, asks[WARM_UP:], scoped=True, label=f"[{engine}] search conversation"
                )
                every = await measure_search(
                    memories, asks[WARM_UP:], scoped=False, label=f"[{engine}] search all scopes"
                )
                indexing = indexing or bool(child_processes(process.pid))
                count = 0
                for tenant in sorted({m.tenant for m in corpus[:size]}):
                    count += (await memories.count(tenant, MemoryFilter())).total
                rows[str(size)] = {
                    "memories": int(count),
                    "added": len(added),
                    "upsert_s": round(upsert_s, 2),
                    "upsert_per_s": round(len(added) / upsert_s, 1),
                    "search_ms": scoped["latency_ms"],
                    "search_all_scopes_ms": every["latency_ms"],
                    "search": scoped,
                    "search_all_scopes": every,
                    "indexing_during_search": indexing,
                    "settle_wait_s": settled_s,
                    **process_memory_mb(process.pid),
                }
                # a long run stopped early still leaves what it measured
                partial = Path(args.out) / f"partial-{engine}.json"
                partial.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(json.dumps(rows, indent=2))
        if args.restart and sizes:
            rows[str(sizes[-1])]["restart"] = await measure_restart(
                Path(tmp), env, queries(list(corpus[: sizes[-1]]), 1)[0]
            )
    return rows


async def measure_restart(
    data_dir: Path, env: dict[str, str], ask: tuple[str, ...]
) -> dict[str, Any]:
    """A fresh process on the same store: seconds until it reports SERVING, until its
    first Search is answered, and its memory then."""
    sys.stderr.write("restarting engram-retrieval on the same store\n")
    started = time.perf_counter()
    process = RetrievalProcess(data_dir, extra_env=env, ready_timeout_s=RESTART_TIMEOUT_S)
    async with process as memories:
        serving_s = time.perf_counter() - started
        tenant, user_id, conversation_id, question = ask
        await memories.search(
            SearchQuery(
                tenant=tenant, text=question, user_id=user_id, conversation_id=conversation_id
            )
        )
        return {
            "serving_s": round(serving_s, 2),
            "first_search_s": round(time.perf_counter() - started, 2),
            **process_memory_mb(process.pid),
        }


TABLE_TITLE = "Search latency in ms (conversation scope, all scopes), memory in MB"


def format_table(engines: dict[str, dict[str, dict[str, Any]]]) -> str:
    return render_table(*table(engines), title=TABLE_TITLE)


def table(engines: dict[str, dict[str, dict[str, Any]]]) -> tuple[list[str], list[list[object]]]:
    columns = ["engine", "memories", "upsert/s", "conv p50", "p95", "p99", "all p50", "p95"]
    columns += ["p99", "cand ms", "RSS MB", "peak MB"]
    rows: list[list[object]] = []
    for engine, by_size in engines.items():
        for size, row in by_size.items():
            if "skipped" in row:
                rows.append([engine, int(size), f"skipped: {row['skipped']}"])
                continue
            s, a = row["search_ms"], row["search_all_scopes_ms"]
            candidates_ms = row["search"]["stage_mean_ms"]["candidates_ms"]
            rows.append(
                [
                    *(engine, row["memories"], row["upsert_per_s"]),
                    *(s["p50"], s["p95"], s["p99"], a["p50"], a["p95"], a["p99"]),
                    *(candidates_ms, row["rss_mb"], row["peak_rss_mb"]),
                ]
            )
    return columns, rows


def plot(engines: dict[str, dict[str, dict[str, Any]]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = {
        engine: [(int(size), row) for size, row in rows.items() if "skipped" not in row]
        for engine, rows in engines.items()
    }
    charts: list[tuple[str, str, Callable[[dict[str, Any]], dict[str, float]]]] = [
        (
            "scale_latency.png",
            "Search latency at the client (ms)",
            lambda r: {
                "conversation p50": r["search_ms"]["p50"],
                "conversation p95": r["search_ms"]["p95"],
                "all scopes p50": r["search_all_scopes_ms"]["p50"],
            },
        ),
        ("scale_upsert.png", "Upsert throughput (memories/s)", lambda r: {"": r["upsert_per_s"]}),
        ("scale_rss.png", "retrieval process RSS (MiB)", lambda r: {"": r["rss_mb"]}),
    ]
    paths = []
    for name, ylabel, values in charts:
        fig, ax = plt.subplots(figsize=(7, 4))
        for engine, points in measured.items():
            if not points:
                continue
            xs = [size for size, _ in points]
            for series in values(points[0][1]):
                ys = [values(row)[series] for _, row in points]
                label = f"{engine} {series}".strip()
                ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log")
        if name == "scale_latency.png":  # engines differ by orders of magnitude
            ax.set_yscale("log")
        ax.set_xlabel("memories in the store")
        ax.set_ylabel(ylabel)
        ax.set_title(f"engram bench scale: {ylabel}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        paths.append(out / name)
    return paths


def parse_list(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def _cmd_scale(args: argparse.Namespace) -> int:
    try:
        sizes = sorted({int(s) for s in parse_list(args.sizes)})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] <= 0:
        print("engram bench scale: --sizes must be positive integers", file=sys.stderr)
        return 2
    if args.tenants < 1:
        print("engram bench scale: --tenants must be at least 1", file=sys.stderr)
        return 2
    engines = parse_list(args.engines)
    unknown = [e for e in engines if e not in ENGINES]
    if not engines or unknown:
        print(
            f"engram bench scale: --engines must name some of {', '.join(ENGINES)}",
            file=sys.stderr,
        )
        return 2
    machine = measured_machine()
    layout = Layout(tenants=args.tenants)
    corpus = memories(sizes[-1], layout)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for engine in engines:
        limit = args.local_max if engine == "qdrant-local" else sizes[-1]
        run = [s for s in sizes if s <= limit]
        rows = asyncio.run(bench_engine(engine, run, corpus, args)) if run else {}
        for size in sizes:
            if size > limit:
                rows[str(size)] = {"skipped": f"above --local-max {limit}"}
        results[engine] = rows
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print_table(*table(results), title=TABLE_TITLE)
    for engine, by_size in results.items():
        for stored, row in by_size.items():
            if "restart" in row:
                again = row["restart"]
                print(
                    f"{engine} at {stored}: restarted, serving after {again['serving_s']} s, "
                    f"first Search answered after {again['first_search_s']} s, "
                    f"RSS {again['rss_mb']} MB"
                )
    document = {
        "benchmark": "scale",
        "machine": machine,
        "corpus": {
            "tenants": layout.tenants,
            "conversations_per_tenant": layout.conversations,
            "users_per_tenant": layout.users,
            "conversation_sizes": f"zipf s={layout.zipf_s}",
            "upsert_batch": args.batch,
            "queries_per_size": args.queries,
        },
        "sizes": results.get(DEFAULT_ENGINE, {}),
        "engines": results,
    }
    (out / "results.json").write_text(json.dumps(document, indent=2))
    paths = plot(results, out)
    print(f"saved {out / 'results.json'} and {', '.join(str(p) for p in paths)}")
    return 0


def add_scale_parser(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    scale = kinds.add_parser(
        "scale", help="Search latency, Upsert throughput and RSS at 1k/10k/100k memories"
    )
    scale.add_argument("--sizes", default="1000,10000,100000", help="store sizes (comma-separated)")
    scale.add_argument(
        "--engines", default="edge,qdrant-local", help=f"some of: {', '.join(ENGINES)}"
    )
    scale.add_argument(
        "--tenants",
        type=int,
        default=Layout.tenants,
        help="tenants sharing the store (1: one big tenant, the case HNSW indexes are for)",
    )
    scale.add_argument("--queries", type=int, default=300, help="searches per size and kind")
    scale.add_argument("--batch", type=int, default=256, help="memories per Upsert")
    scale.add_argument(
        "--settle",
        action="store_true",
        help="before searching, wait until the service's background index builds end",
    )
    scale.add_argument(
        "--local-max",
        type=int,
        default=LOCAL_MODE_MAX,
        help="largest size run on qdrant-local (pure-Python local mode)",
    )
    scale.add_argument(
        "--restart",
        action="store_true",
        help="after the largest size, restart retrieval on the same store and time it "
        "until serving and until its first Search",
    )
    scale.add_argument("--out", default="bench-results/scale", help="output directory")
    scale.set_defaults(func=handler, run=_cmd_scale)
