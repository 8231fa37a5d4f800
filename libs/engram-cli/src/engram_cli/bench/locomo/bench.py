"""``engram bench locomo``: turn-level retrieval quality on a LoCoMo-format file.

Every turn of every sample goes through the retrieval service's gRPC ``Upsert`` (a real
``engram-retrieval`` process on a temporary data dir; one tenant and conversation per
sample, ``created_at`` = the session's date, ``source_id`` = the ``dia_id``), and every
scored question through gRPC ``Search`` (conversation scope, ``now`` = the sample's last
session, ``top_k`` = the largest k, ``score_threshold`` 0: the ranking is measured, not
the cut-off). Each configuration runs its own retrieval process with its own
environment over the same stored data; the store is filled once. Turn-level scores are
reported beside session-level ones (``session_recall@k``, as published LoCoMo figures).

``--delivered`` adds what a chat would be given (:mod:`engram_cli.bench.locomo.delivered`):
every question through the gateway's recall and rendering with the product's defaults
and a curve of token budgets, into ``configs.<name>.delivered``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from engram_cli.bench.common import RetrievalProcess, percentiles
from engram_cli.bench.locomo.dataset import (
    CATEGORIES,
    DEFAULT_CATEGORIES,
    LocomoFormatError,
    Question,
    Sample,
    load_samples,
)
from engram_cli.bench.locomo.delivered import (
    DEFAULT_BUDGETS,
    delivered_pass,
    delivered_table,
    plot_delivered,
)
from engram_cli.bench.locomo.metrics import mean_scores, score_question, turns_of_hit
from engram_cli.bench.machine import describe_machine, measured_machine
from engram_cli.console import ProgressBar, print_table, render_table
from engram_cli.records import new_memory
from engram_core.memory import MemoryFilter, MemoryRecord, SearchQuery, SearchResult
from engram_core.memory_port import MemoryPort

TUNED_ON = "locomo_dev.json"  # the only file any default may be tuned on
DEFAULT_KS = (5, 10, 25, 50)
UPSERT_BATCH = 256
WARM_UP_QUERIES = 5


# Ablations rank by relevance alone, so they compare candidate sources and scorers;
# ``default`` keeps the service's recency weight and MMR.
class RankingKnobs(TypedDict, total=False):
    """The ranking knobs a configuration sets on every :class:`SearchQuery`."""

    recency_weight: float
    mmr_lambda: float


NEUTRAL_RANKING = RankingKnobs(recency_weight=0.0, mmr_lambda=1.0)
NO_RERANKER = {"ENGRAM_RERANKER_PATH": ""}
NO_LATE = {"ENGRAM_SEARCH_LATE_WEIGHT": "0"}


@dataclass(frozen=True)
class Config:
    name: str
    description: str
    env: dict[str, str] = field(default_factory=dict)  # for the retrieval process
    request: RankingKnobs = field(default_factory=lambda: RankingKnobs())
    needs_reranker: bool = False
    #: settings that change what is written (the configuration gets a store of its own)
    index_env: dict[str, str] = field(default_factory=dict)


CONFIGS = {
    c.name: c
    for c in (
        Config(
            "bm25",
            "BM25 over each turn's own words, ranked by BM25 (ENGRAM_SEARCH_CANDIDATES=lexical; "
            "a store indexed with ENGRAM_INDEX_PREVIOUS_TURN_WEIGHT=0: the plain baseline)",
            {"ENGRAM_SEARCH_CANDIDATES": "lexical", **NO_RERANKER},
            NEUTRAL_RANKING,
            index_env={"ENGRAM_INDEX_PREVIOUS_TURN_WEIGHT": "0"},
        ),
        Config(
            "dense",
            "dense candidates ranked by calibrated cosine (ENGRAM_SEARCH_CANDIDATES=dense)",
            {"ENGRAM_SEARCH_CANDIDATES": "dense", **NO_RERANKER, **NO_LATE},
            NEUTRAL_RANKING,
        ),
        Config(
            "hybrid",
            "dense + BM25 candidates ranked by the calibrated fused cosine/BM25 similarity "
            "(with neighbouring turns and date windows; no late interaction)",
            {"ENGRAM_SEARCH_CANDIDATES": "hybrid", **NO_RERANKER, **NO_LATE},
            NEUTRAL_RANKING,
        ),
        Config(
            "hybrid+maxsim",
            "dense + BM25 candidates; fused similarity blended with MaxSim over the MiniLM "
            "token vectors (late interaction, scored by Qdrant)",
            {"ENGRAM_SEARCH_CANDIDATES": "hybrid", **NO_RERANKER},
            NEUTRAL_RANKING,
        ),
        Config(
            "hybrid+rerank",
            "dense + BM25 candidates ranked by the cross-encoder at ENGRAM_RERANKER_PATH",
            {"ENGRAM_SEARCH_CANDIDATES": "hybrid"},
            NEUTRAL_RANKING,
            needs_reranker=True,
        ),
        Config(
            "chain",
            "the default ranking before the linear fusion: fused similarity, then MaxSim, "
            "neighbouring turns and date windows in turn (ENGRAM_SEARCH_FUSION=chain)",
            {"ENGRAM_SEARCH_FUSION": "chain"},
        ),
        Config(
            "default",
            "the service as configured (defaults: hybrid candidates, every signal in one linear "
            "fusion, recency weight 0.02, MMR λ 0.9)",
        ),
    )
}


@dataclass
class Ingested:
    """What the first configuration stored, reused by the others."""

    turns: int = 0
    seconds: float = 0.0
    turn_of_point: dict[str, str] = field(default_factory=dict)  # memory id → dia_id


def tenant_of(sample: Sample) -> str:
    return f"locomo-{sample.sample_id}"


def turn_memories(
    sample: Sample, tenant: str | None = None, user_id: str = ""
) -> list[MemoryRecord]:
    """The sample's turns as memories of ``tenant`` (default: the sample's own)."""
    speaker_a = sample.speakers[0]
    return [
        new_memory(
            tenant or tenant_of(sample),
            kind="turn",
            # both speakers are people; the first one plays the user
            role="user" if turn.speaker == speaker_a else "assistant",
            text=turn.memory_text,
            user_id=user_id,
            conversation_id=sample.sample_id,
            source_id=turn.dia_id,
            turn_index=i,
            created_at=turn.created_at,
            metadata={"speaker": turn.speaker, "session": str(turn.session)},
        )
        for i, turn in enumerate(sample.turns)
    ]


#: Where a delivered question is asked from (``--asked-from``): the sample's own
#: conversation; a new, empty conversation of the same person (everything recalled
#: comes from their other conversations); or inside another long conversation of
#: theirs (the next sample's turns, stored beside the sample's own as a distractor).
ASKED_FROM = ("own", "new", "other")


def distractor_of(samples: Sequence[Sample], sample: Sample) -> Sample:
    """The sample whose turns are the other conversation ``sample``'s questions are
    asked from with ``--asked-from other``: the next one, cyclically."""
    at = next(i for i, s in enumerate(samples) if s.sample_id == sample.sample_id)
    return samples[(at + 1) % len(samples)]


async def ingest(
    memories: MemoryPort,
    samples: Sequence[Sample],
    batch: int,
    ingested: Ingested,
    *,
    distractors: bool = False,
) -> None:
    """Each sample's turns into its own tenant; ``distractors``: also the next sample's
    turns, in their own conversation of the same tenant (not evidence: their ids are
    left out of ``turn_of_point``)."""
    total = sum(len(s.turns) for s in samples)
    if distractors:
        total += sum(len(distractor_of(samples, s).turns) for s in samples)
    done = 0
    started = time.perf_counter()
    with ProgressBar("ingesting turns", total) as bar:
        for sample in samples:
            turns = turn_memories(sample)
            other = (
                turn_memories(distractor_of(samples, sample), tenant_of(sample))
                if distractors
                else []
            )
            for offset in range(0, len(turns), batch):
                chunk = turns[offset : offset + batch]
                for stored in await memories.upsert(tenant_of(sample), chunk):
                    ingested.turn_of_point[stored.record.id] = stored.record.source_id
                done += len(chunk)
                bar.update(done)
            for offset in range(0, len(other), batch):
                chunk = other[offset : offset + batch]
                await memories.upsert(tenant_of(sample), chunk)
                done += len(chunk)
                bar.update(done)
    ingested.turns = total
    ingested.seconds = time.perf_counter() - started


async def check_stored(memories: MemoryPort, samples: Sequence[Sample]) -> None:
    for sample in samples:
        flt = MemoryFilter(conversation_id=sample.sample_id, kinds=("turn",))
        stored = (await memories.count(tenant_of(sample), flt)).total
        if stored != len(sample.turns):
            raise RuntimeError(
                f"{sample.sample_id}: {stored} turns stored, expected {len(sample.turns)}"
            )


def search_query(sample: Sample, question: str, top_k: int, config: Config) -> SearchQuery:
    return SearchQuery(
        tenant=tenant_of(sample),
        text=question,
        conversation_id=sample.sample_id,
        top_k=top_k,
        score_threshold=0.0,
        scopes=("conversation",),
        kinds=("turn", "fact", "episode"),
        now=sample.last_session_at,
        **config.request,
    )


def ranking_of(result: SearchResult, turn_of_point: dict[str, str]) -> list[frozenset[str]]:
    return [
        turns_of_hit(
            hit.memory.kind,
            hit.memory.source_id,
            list(hit.memory.source_turn_ids),
            turn_of_point,
        )
        for hit in result.hits
    ]


def scored_questions(
    samples: Sequence[Sample], categories: Sequence[int], limit: int = 0
) -> list[tuple[Sample, Question]]:
    """The questions with usable evidence; with ``limit``, the first ``limit`` of each
    sample."""
    picked = []
    for sample in samples:
        mine = [
            (sample, q)
            for q in sample.questions
            if q.category in categories and q.evidence and q.question.strip()
        ]
        picked += mine[:limit] if limit else mine
    return picked


async def query_all(
    memories: MemoryPort,
    config: Config,
    questions: Sequence[tuple[Sample, Question]],
    ks: Sequence[int],
    turn_of_point: dict[str, str],
) -> tuple[list[tuple[int, dict[str, float]]], list[float]]:
    top_k = max(ks)
    for sample, q in questions[:WARM_UP_QUERIES]:
        await memories.search(search_query(sample, q.question, top_k, config))
    rows: list[tuple[int, dict[str, float]]] = []
    latencies: list[float] = []
    label = f"searching ({config.name})"
    with ProgressBar(label, len(questions)) as bar:
        for sample, q in questions:
            query = search_query(sample, q.question, top_k, config)
            started = time.perf_counter()
            result = await memories.search(query)
            latencies.append((time.perf_counter() - started) * 1000.0)
            ranking = ranking_of(result, turn_of_point)
            rows.append((q.category, score_question(ranking, q.evidence, ks)))
            bar.advance()
    return rows, latencies


def summarize(
    config: Config,
    rows: Sequence[tuple[int, dict[str, float]]],
    latencies: Sequence[float],
    categories: Sequence[int],
    evidence: dict[str, int],
    data_name: str,
) -> dict[str, Any]:
    by_category = {}
    for category in categories:
        picked = [scores for c, scores in rows if c == category]
        if picked:
            by_category[CATEGORIES.get(category, f"category-{category}")] = {
                "questions": len(picked),
                **_rounded(mean_scores(picked)),
            }
    return {
        "config": config.name,
        "description": config.description,
        "env": config.env,
        "request": config.request,
        "questions": len(rows),
        "overall": _rounded(mean_scores([scores for _, scores in rows])),
        "by_category": by_category,
        "latency_ms": percentiles(list(latencies)),
        "unusable_evidence": evidence["unusable"],
        "recovered_evidence": evidence["recovered"],
        "questions_without_evidence": evidence["without"],
        "data": data_name,
        "tuned_on": TUNED_ON,
        "latency_samples_ms": [round(x, 3) for x in latencies],
    }


def _rounded(scores: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in scores.items()}


def evidence_counts(samples: Sequence[Sample], categories: Sequence[int]) -> dict[str, int]:
    """Over the questions of the scored categories."""
    questions = [q for s in samples for q in s.questions if q.category in categories]
    return {
        "unusable": sum(q.unusable for q in questions),
        "recovered": sum(q.recovered for q in questions),
        "without": sum(not q.evidence for q in questions),
    }


@dataclass
class BenchPlan:
    samples: list[Sample]
    ks: tuple[int, ...]
    categories: tuple[int, ...]
    configs: list[Config]
    batch: int = UPSERT_BATCH
    data_name: str = ""
    delivered: bool = False
    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    limit: int = 0  # scored questions per sample (0: all), for quick iterations
    asked_from: str = "own"  # ASKED_FROM: where the delivered pass asks its questions


def _asking_conversation(plan: BenchPlan) -> Callable[[Sample], str]:
    """The conversation (``memory_id``) a sample's delivered questions are asked from."""
    if plan.asked_from == "new":
        return lambda sample: f"{sample.sample_id}-new"
    if plan.asked_from == "other":
        return lambda sample: distractor_of(plan.samples, sample).sample_id
    return lambda sample: sample.sample_id


async def run_locomo(plan: BenchPlan) -> tuple[list[dict[str, Any]], Ingested]:
    questions = scored_questions(plan.samples, plan.categories, plan.limit)
    evidence = evidence_counts(plan.samples, plan.categories)
    # one store per distinct index_env, ingested by the first configuration that reads it
    stores: dict[tuple[tuple[str, str], ...], tuple[str, Ingested]] = {}
    results = []
    with tempfile.TemporaryDirectory(prefix="engram-locomo-") as tmp:
        for config in plan.configs:
            index = tuple(sorted(config.index_env.items()))
            data_dir, ingested = stores.setdefault(index, (f"store-{len(stores)}", Ingested()))
            env = {**config.env, **config.index_env}
            sys.stderr.write(f"[{config.name}] starting engram-retrieval\n")
            async with RetrievalProcess(Path(tmp) / data_dir, extra_env=env) as memories:
                if not ingested.turns:
                    await ingest(
                        memories,
                        plan.samples,
                        plan.batch,
                        ingested,
                        distractors=plan.delivered and plan.asked_from == "other",
                    )
                await check_stored(memories, plan.samples)
                rows, latencies = await query_all(
                    memories, config, questions, plan.ks, ingested.turn_of_point
                )
                result = summarize(
                    config, rows, latencies, plan.categories, evidence, plan.data_name
                )
                if plan.delivered:
                    result["delivered"] = await delivered_pass(
                        memories,
                        config.name,
                        questions,
                        plan.categories,
                        plan.budgets,
                        ingested.turn_of_point,
                        tenant_of,
                        asked_from=_asking_conversation(plan),
                    )
                    result["delivered"]["asked_from"] = plan.asked_from
            results.append(result)
    return results, next(iter(stores.values()))[1]


# -- output ------------------------------------------------------------------------


def _ndcg_k(ks: Sequence[int]) -> int:
    return 10 if 10 in ks else ks[0]


TABLE_TITLE = "LoCoMo retrieval (%), Search latency (ms)"


def format_table(results: Sequence[dict[str, Any]], ks: Sequence[int]) -> str:
    return render_table(*table(results, ks), title=TABLE_TITLE)


def table(
    results: Sequence[dict[str, Any]], ks: Sequence[int]
) -> tuple[list[str], list[list[object]]]:
    nk = _ndcg_k(ks)
    columns = ["config", "category", "n", *(f"R@{k}" for k in ks), f"H@{nk}", f"NDCG@{nk}"]
    columns += [f"session R@{nk}"]
    columns += ["p50 ms", "p95 ms", "p99 ms"]
    rows: list[list[object]] = []
    for result in results:
        groups = [("overall", {"questions": result["questions"], **result["overall"]})]
        groups += list(result["by_category"].items())
        for i, (name, scores) in enumerate(groups):
            latency = result["latency_ms"] if i == 0 else {}
            rows.append(
                [result["config"] if i == 0 else "", name, scores["questions"]]
                + [round(100 * scores[f"recall@{k}"], 1) for k in ks]
                + [round(100 * scores[f"hit@{nk}"], 1), round(100 * scores[f"ndcg@{nk}"], 1)]
                + [round(100 * scores.get(f"session_recall@{nk}", 0.0), 1)]
                + [latency.get(p, "") for p in ("p50", "p95", "p99")]
            )
    return columns, rows


_STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", "-")]


def plot_recall(results: Sequence[dict[str, Any]], ks: Sequence[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ["overall", *results[0]["by_category"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4), sharey=True)
    axes = list(axes) if len(panels) > 1 else [axes]
    for ax, panel in zip(axes, panels, strict=True):
        for n, result in enumerate(results):
            scores = result["overall"] if panel == "overall" else result["by_category"][panel]
            recall = [100 * scores[f"recall@{k}"] for k in ks]
            marker, line = _STYLES[n % len(_STYLES)]
            ax.plot(ks, recall, marker=marker, linestyle=line, label=result["config"], alpha=0.85)
        ax.set_title(panel)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(list(ks), [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("Recall@k (%)")
    axes[0].legend(fontsize=8)
    fig.suptitle("engram bench locomo: turn-level Recall@k")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_latency(results: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    samples = [np.asarray(r["latency_samples_ms"]) for r in results]
    # a few stalls (another process on the same cores) would flatten the histogram
    top = float(np.percentile(np.concatenate(samples), 99.5))
    bins = np.linspace(0.0, top, 60).tolist()
    fig, ax = plt.subplots(figsize=(7, 4))
    for result, values in zip(results, samples, strict=True):
        ax.hist(np.minimum(values, top), bins=bins, histtype="step", lw=1.5, label=result["config"])
    ax.set_xlabel("Search latency at the client (ms; the last bin holds the slowest 0.5 %)")
    ax.set_ylabel("queries")
    ax.set_title("engram bench locomo")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def results_document(
    results: Sequence[dict[str, Any]],
    plan: BenchPlan,
    ingested: Ingested,
    skipped: dict[str, str],
    machine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The top level is the ``default`` configuration's object (else the first one's);
    ``configs`` holds every configuration's. ``machine``: :func:`describe_machine`'s
    (described without calibrating when not given)."""

    def public(result: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in result.items() if k != "latency_samples_ms"}

    by_name = {r["config"]: public(r) for r in results}
    head = by_name.get("default") or public(results[0])
    return {
        "benchmark": "locomo",
        **head,
        "samples": [s.sample_id for s in plan.samples],
        "k": list(plan.ks),
        "categories": {str(c): CATEGORIES.get(c, f"category-{c}") for c in plan.categories},
        "turns": ingested.turns,
        "ingest_turns_per_s": round(ingested.turns / max(ingested.seconds, 1e-9), 1),
        "configs": by_name,
        "skipped_configs": skipped,
        "machine": machine or describe_machine(calibrate=False),
    }


# -- command -----------------------------------------------------------------------


def parse_ks(value: str) -> tuple[int, ...]:
    try:
        ks = tuple(sorted({int(k) for k in value.split(",") if k.strip()}))
    except ValueError as exc:
        raise ValueError(f"--k: integers separated by commas (got {value!r})") from exc
    if not ks or ks[0] < 1 or ks[-1] > 100:
        raise ValueError(f"--k: values must be within 1..100 (got {value!r})")
    return ks


DELIVERED_TITLE = "LoCoMo delivered (%): what a chat's memory message holds; tokens: MiniLM"


def parse_budgets(value: str) -> tuple[int, ...]:
    try:
        budgets = tuple(dict.fromkeys(int(b) for b in value.split(",") if b.strip()))
    except ValueError as exc:
        raise ValueError(f"--budgets: integers separated by commas (got {value!r})") from exc
    if not budgets or min(budgets) < 0 or max(budgets) > 100_000:
        raise ValueError(f"--budgets: values within 0..100000, 0 = top_k hits (got {value!r})")
    return budgets


def choose_configs(value: str, env: dict[str, str]) -> tuple[list[Config], dict[str, str]]:
    """The named configurations in order, and the skipped ones with the reason."""
    names = list(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
    if names == ["all"]:
        names = list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise ValueError(
            f"--config: unknown {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(CONFIGS)} or all"
        )
    chosen, skipped = [], {}
    for name in names:
        config = CONFIGS[name]
        if config.needs_reranker and not env.get("ENGRAM_RERANKER_PATH", "").strip():
            skipped[name] = (
                "needs a cross-encoder: set ENGRAM_RERANKER_PATH to a directory with "
                "model.onnx and tokenizer.json"
            )
            continue
        chosen.append(config)
    return chosen, skipped


def _cmd_locomo(args: argparse.Namespace) -> int:
    try:
        ks = parse_ks(args.k)
        budgets = parse_budgets(args.budgets)
        if args.limit < 0:
            raise ValueError("--limit must be 0 (all) or more")
        configs, skipped = choose_configs(args.config, dict(os.environ))
        sample_ids = [s.strip() for s in (args.samples or "").split(",") if s.strip()]
        samples = load_samples(Path(args.data), sample_ids)
    except (ValueError, OSError) as exc:
        kind = "bad data" if isinstance(exc, LocomoFormatError) else "error"
        print(f"engram bench locomo: {kind}: {exc}", file=sys.stderr)
        return 2
    for name, reason in skipped.items():
        print(f"note: {name} skipped ({reason})", file=sys.stderr)
    if not configs:
        print("engram bench locomo: no configuration left to run", file=sys.stderr)
        return 2
    if not 1 <= args.batch <= 2048:
        print("engram bench locomo: --batch must be within 1..2048", file=sys.stderr)
        return 2
    categories = (*DEFAULT_CATEGORIES, 5) if args.include_adversarial else DEFAULT_CATEGORIES
    plan = BenchPlan(
        samples=samples,
        ks=ks,
        categories=categories,
        configs=configs,
        batch=args.batch,
        data_name=Path(args.data).name,
    )
    plan.delivered = args.delivered
    plan.budgets = budgets
    plan.limit = args.limit
    plan.asked_from = args.asked_from
    if args.asked_from != "own" and not args.delivered:
        print("engram bench locomo: --asked-from needs --delivered", file=sys.stderr)
        return 2
    if args.asked_from == "other" and len(samples) < 2:
        print("engram bench locomo: --asked-from other needs two samples", file=sys.stderr)
        return 2
    if not scored_questions(samples, categories):
        print("engram bench locomo: no question with usable evidence to score", file=sys.stderr)
        return 2
    machine = measured_machine()
    results, ingested = asyncio.run(run_locomo(plan))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print_table(*table(results, ks), title=TABLE_TITLE)
    document = results_document(results, plan, ingested, skipped, machine)
    print(
        f"{document['turns']} turns ingested at {document['ingest_turns_per_s']}/s; "
        f"evidence ids unusable: {document['unusable_evidence']}, recovered: "
        f"{document['recovered_evidence']}; data: {plan.data_name}, tuned on: {TUNED_ON}"
    )
    for name, reason in skipped.items():
        print(f"{name}: skipped ({reason})")
    (out / "results.json").write_text(json.dumps(document, indent=2))
    plot_recall(results, ks, out / "recall_at_k.png")
    plot_latency(results, out / "latency.png")
    print(f"saved {out / 'results.json'}, {out / 'recall_at_k.png'}, {out / 'latency.png'}")
    if plan.delivered:
        print_table(*delivered_table(results), title=DELIVERED_TITLE)
        plot_delivered(results, out / "delivered.png")
        print(f"saved {out / 'delivered.png'}")
    return 0


def add_locomo_parser(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    bench = kinds.add_parser("locomo", help="turn-level retrieval quality on a LoCoMo-format file")
    bench.add_argument("--data", required=True, help="a JSON file in the LoCoMo format")
    bench.add_argument("--samples", default="", help="sample ids to keep (default: all)")
    bench.add_argument("--k", default=",".join(map(str, DEFAULT_KS)), help="cut-offs (1..100)")
    bench.add_argument(
        "--config",
        default=",".join(CONFIGS),
        help=f"configurations, compared side by side: {', '.join(CONFIGS)} (or all)",
    )
    bench.add_argument("--include-adversarial", action="store_true", help="also score category 5")
    bench.add_argument("--batch", type=int, default=UPSERT_BATCH, help="turns per Upsert")
    bench.add_argument(
        "--delivered",
        action="store_true",
        help="also score what a chat delivers: the gateway's recall and rendering, "
        "product defaults and a curve of token budgets",
    )
    bench.add_argument(
        "--budgets",
        default=",".join(map(str, DEFAULT_BUDGETS)),
        help="token budgets of the delivered curve (0: top_k hits, no budget)",
    )
    bench.add_argument(
        "--asked-from",
        choices=ASKED_FROM,
        default="own",
        help="where the delivered pass asks a sample's questions: its own conversation, "
        "a new one of the same person, or inside another long conversation of theirs "
        "(the next sample's turns, stored beside it)",
    )
    bench.add_argument("--limit", type=int, default=0, help="scored questions per sample (0: all)")
    bench.add_argument("--out", default="bench-results/locomo", help="output directory")
    bench.set_defaults(func=handler, run=_cmd_locomo)
