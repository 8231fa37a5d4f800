"""``engram bench``: benchmarks that print a table and save JSON and plots.

``engram bench latency`` stores N synthetic memories through the retrieval
service's gRPC ``Upsert`` (a real ``engram-retrieval`` process on a fresh data dir)
and measures ``Search`` latency at the client, at each requested store size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from engram_cli.bench.common import RetrievalProcess
from engram_cli.bench.machine import measured_machine
from engram_cli.console import ProgressBar, print_table
from engram_cli.records import new_memory
from engram_core.memory import MemoryFilter, SearchQuery
from engram_core.memory_port import MemoryPort

_SUBJECTS = [
    "my sister",
    "our neighbour",
    "my manager",
    "the dentist",
    "my best friend",
    "the landlord",
    "my son",
    "the coach",
    "my grandmother",
    "the new intern",
]
_VERBS = [
    "recommended",
    "complained about",
    "fixed",
    "booked",
    "cancelled",
    "painted",
    "moved to",
    "forgot about",
    "paid for",
    "talked about",
]
_OBJECTS = [
    "a trip to Lisbon",
    "the blue bicycle",
    "a sushi restaurant downtown",
    "the kitchen sink",
    "a piano lesson",
    "the marathon in April",
    "a vegan cookbook",
    "the broken laptop",
    "a hiking trail near the lake",
    "the concert tickets",
    "a pottery class",
    "the garden fence",
    "a job interview",
    "the wedding venue",
]
_WHEN = ["yesterday", "last week", "on Sunday", "this morning", "in March", "after work"]
_QUERIES = [
    "Where did we plan to travel?",
    "What happened with the bicycle?",
    "Who fixed the sink?",
    "What do I know about the marathon?",
    "Which restaurant was recommended?",
    "What did my manager say?",
    "When is the concert?",
    "What about the pottery class?",
    "Tell me about the job interview",
    "What did grandmother talk about?",
]


def synthetic_texts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [
        f"{rng.choice(_SUBJECTS).capitalize()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
        f"{rng.choice(_WHEN)} (note {i})."
        for i in range(n)
    ]


async def _fill(
    memories: MemoryPort,
    tenant: str,
    texts: list[str],
    start: int,
    batch: int,
    on_progress: Callable[[int], None],
) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for offset in range(0, len(texts), batch):
        chunk = texts[offset : offset + batch]
        records = [
            new_memory(
                tenant,
                kind="turn",
                role="user",
                text=text,
                user_id="bench-user",
                conversation_id=f"conv-{(start + offset + i) % 20}",
                source_id=f"bench-{start + offset + i}",
                created_at=base + timedelta(hours=start + offset + i),
            )
            for i, text in enumerate(chunk)
        ]
        await memories.upsert(tenant, records)
        on_progress(offset + len(chunk))


async def _measure(memories: MemoryPort, tenant: str, queries: int) -> dict[str, object]:
    latencies: list[float] = []
    stage_sums: dict[str, list[float]] = {
        "embed_ms": [],
        "candidates_ms": [],
        "rerank_ms": [],
        "mmr_ms": [],
    }
    with ProgressBar("searching", queries) as bar:
        for i in range(queries):
            query = SearchQuery(
                tenant=tenant,
                text=_QUERIES[i % len(_QUERIES)],
                user_id="bench-user",
                conversation_id=f"conv-{i % 20}",
            )
            started = time.perf_counter()
            _, timings = await memories.search_timed(query)
            latencies.append((time.perf_counter() - started) * 1000)
            for key in stage_sums:
                stage_sums[key].append(getattr(timings, key))
            bar.advance()
    arr = np.array(latencies)
    return {
        "queries": queries,
        "latency_ms": {
            p: round(float(np.percentile(arr, q)), 2)
            for p, q in (("p50", 50), ("p95", 95), ("p99", 99))
        },
        "mean_ms": round(float(arr.mean()), 2),
        "stage_mean_ms": {k: round(float(np.mean(v)), 2) for k, v in stage_sums.items()},
        "samples_ms": [round(x, 3) for x in latencies],
    }


async def bench_latency(sizes: list[int], queries: int, batch: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="engram-bench-") as tmp:
        async with RetrievalProcess(Path(tmp)) as memories:
            # one growing store: fill up to each size in turn, then measure
            stored = 0
            all_texts = synthetic_texts(max(sizes))
            for size in sorted(sizes):
                tenant = "bench"
                started = time.perf_counter()
                with ProgressBar(f"storing up to {size}", size) as bar:
                    bar.update(stored)
                    await _fill(
                        memories,
                        tenant,
                        all_texts[stored:size],
                        stored,
                        batch,
                        bar.counting_from(stored),
                    )
                upsert_s = time.perf_counter() - started
                stored = size
                for _ in range(5):  # warm-up
                    await memories.search(SearchQuery(tenant=tenant, text="warm up"))
                result = await _measure(memories, tenant, queries)
                count = await memories.count(tenant, MemoryFilter())
                rows.append({"memories": count.total, "upsert_s": round(upsert_s, 2), **result})
    return rows


def _print_table(rows: list[dict[str, object]]) -> None:
    columns = ["memories", "queries", "p50 ms", "p95 ms", "p99 ms"]
    columns += ["embed", "cand", "rerank", "mmr"]
    table = []
    for row in rows:
        lat = row["latency_ms"]
        stages = row["stage_mean_ms"]
        assert isinstance(lat, dict) and isinstance(stages, dict)
        table.append(
            [row["memories"], row["queries"], lat["p50"], lat["p95"], lat["p99"]]
            + [stages[k] for k in ("embed_ms", "candidates_ms", "rerank_ms", "mmr_ms")]
        )
    print_table(columns, table, title="Search latency (stage means in ms)")


def _plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        samples = row["samples_ms"]
        assert isinstance(samples, list)
        ax.hist(samples, bins=40, alpha=0.6, label=f"{row['memories']} memories")
    ax.set_xlabel("Search latency at the client (ms)")
    ax.set_ylabel("queries")
    ax.set_title("engram bench latency")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cmd_latency(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or any(s <= 0 for s in sizes):
        print("engram bench latency: --sizes must be positive integers", file=sys.stderr)
        return 2
    machine = measured_machine()
    rows = asyncio.run(bench_latency(sizes, args.queries, args.batch))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _print_table(rows)
    results = {
        "benchmark": "latency",
        "machine": machine,
        "runs": [{k: v for k, v in row.items() if k != "samples_ms"} for row in rows],
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    _plot(rows, out / "latency.png")
    print(f"saved {out / 'results.json'} and {out / 'latency.png'}")
    return 0


def add_bench_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    from engram_cli.bench.corrections import add_corrections_parser
    from engram_cli.bench.footprint import add_footprint_parser
    from engram_cli.bench.locomo.bench import add_locomo_parser
    from engram_cli.bench.locomo.qa import add_qa_parser
    from engram_cli.bench.overhead import add_overhead_parser
    from engram_cli.bench.paraphrase.bench import add_paraphrase_parser
    from engram_cli.bench.pipeline import add_pipeline_parser
    from engram_cli.bench.scale import add_scale_parser
    from engram_cli.bench.writepath import add_write_path_parser

    bench = commands.add_parser("bench", help="benchmarks (tables, JSON, plots)")
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    add_write_path_parser(kinds, handler)
    add_pipeline_parser(kinds, handler)
    add_scale_parser(kinds, handler)
    add_locomo_parser(kinds, handler)
    add_paraphrase_parser(kinds, handler)
    add_qa_parser(kinds, handler)
    add_corrections_parser(kinds, handler)
    add_overhead_parser(kinds, handler)
    add_footprint_parser(kinds, handler)
    latency = kinds.add_parser("latency", help="Search latency at growing store sizes")
    latency.add_argument("--sizes", default="1000,10000", help="store sizes (comma-separated)")
    latency.add_argument("--queries", type=int, default=200, help="searches per size")
    latency.add_argument("--batch", type=int, default=256, help="memories per Upsert")
    latency.add_argument("--out", default="bench-results/latency", help="output directory")
    latency.set_defaults(func=handler, run=_cmd_latency)


def run_bench(args: argparse.Namespace) -> int:
    return int(args.run(args))
