"""``engram bench corrections``: does a correction win over what it corrects?

Sixteen corrections people make ("My wife's name is Anne." … "Actually, my wife's name
is Jane."), each stored as reconcile leaves it: the old and the new user turn with their
replies, the superseded old fact and the current fact, among 30 other memories of the
same user. The question is then asked from the same conversation and from another one
of the user. Two ways of storing the same thing, side by side in one retrieval process:

- ``before``: what Engram stored before corrections were tracked (no link from a fact to
  the turn it came from, no mark on the corrected turn);
- ``engram``: facts name their source turns and the old turn is marked corrected
  (``metadata.corrected_at``), so search demotes it and lists the current fact first.

Reported per configuration: how often the current fact is the first hit, its mean rank,
how often the corrected turn is recalled at all and how often it outranks the current
fact (the case the issue reported: "0.96 vs 0.92").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from engram_cli.bench.common import RetrievalProcess
from engram_cli.console import ProgressCallback, print_table
from engram_cli.records import new_memory
from engram_core.memory import MemoryKindName, MemoryRecord, SearchQuery
from engram_core.memory_port import MemoryPort

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)

#: (old statement, correction, old fact, current fact, question)
CASES: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "My wife's name is Anne.",
        "Actually, my wife's name is Jane.",
        "User's wife's name is Anne",
        "User's wife's name is Jane",
        "What is my wife's name?",
    ),
    (
        "I live in Paris.",
        "I moved, I live in Lisbon now.",
        "User lives in Paris",
        "User lives in Lisbon",
        "Where do I live?",
    ),
    (
        "I work as a nurse.",
        "I changed jobs, I work as a teacher now.",
        "User works as a nurse",
        "User works as a teacher",
        "What is my job?",
    ),
    (
        "My favourite food is sushi.",
        "Correction: my favourite food is ramen.",
        "User's favourite food is sushi",
        "User's favourite food is ramen",
        "What is my favourite food?",
    ),
    (
        "I drive a red Fiat.",
        "I sold the Fiat, I drive a green Volvo now.",
        "User drives a red Fiat",
        "User drives a green Volvo",
        "What car do I drive?",
    ),
    (
        "My dog is called Rex.",
        "Sorry, my dog is called Max, not Rex.",
        "User's dog is called Rex",
        "User's dog is called Max",
        "What is my dog's name?",
    ),
    (
        "I am vegetarian.",
        "I eat fish again, so I am pescatarian now.",
        "User is vegetarian",
        "User is pescatarian",
        "What is my diet?",
    ),
    (
        "My sister lives in Berlin.",
        "My sister moved to Vienna.",
        "User's sister lives in Berlin",
        "User's sister lives in Vienna",
        "Where does my sister live?",
    ),
    (
        "I play the guitar.",
        "I quit the guitar, I play the piano now.",
        "User plays the guitar",
        "User plays the piano",
        "What instrument do I play?",
    ),
    (
        "My birthday is on May 3.",
        "Oops, my birthday is on May 13.",
        "User's birthday is on May 3",
        "User's birthday is on May 13",
        "When is my birthday?",
    ),
    (
        "I prefer coffee.",
        "These days I prefer tea over coffee.",
        "User prefers coffee",
        "User prefers tea",
        "What do I like to drink?",
    ),
    (
        "My son is 5 years old.",
        "My son just turned 6.",
        "User's son is 5 years old",
        "User's son is 6 years old",
        "How old is my son?",
    ),
    (
        "I use an Android phone.",
        "I switched to an iPhone.",
        "User uses an Android phone",
        "User uses an iPhone",
        "What phone do I use?",
    ),
    (
        "My manager is Tom.",
        "My new manager is Sara.",
        "User's manager is Tom",
        "User's manager is Sara",
        "Who is my manager?",
    ),
    (
        "I am allergic to cats.",
        "Turns out I am allergic to dogs, not cats.",
        "User is allergic to cats",
        "User is allergic to dogs",
        "What am I allergic to?",
    ),
    (
        "My gym is Fitness One.",
        "I changed gyms, I go to Iron Temple now.",
        "User's gym is Fitness One",
        "User's gym is Iron Temple",
        "Which gym do I go to?",
    ),
)
#: What else the user said: 15 unrelated statements, each as a turn and a fact.
OTHER = (
    "I enjoy hiking in the mountains",
    "I read science fiction",
    "I have two cats",
    "I grew up in Porto",
    "I am learning Japanese",
    "I run every morning",
    "I collect vinyl records",
    "I volunteer at the library",
    "I bake sourdough bread",
    "I support the local football club",
    "I write poetry",
    "I play chess online",
    "I am saving for a sailboat",
    "I visit my parents on Sundays",
    "I like jazz",
)
CONFIGS = ("before", "engram")
USER = "pat"


def _memory(
    tenant: str,
    kind: MemoryKindName,
    text: str,
    conversation: str,
    minutes: int,
    **fields: Any,
) -> MemoryRecord:
    return new_memory(
        tenant,
        kind=kind,
        text=text,
        user_id=USER,
        conversation_id=conversation,
        created_at=NOW + timedelta(minutes=minutes),
        **fields,
    )


async def store_case(memories: MemoryPort, tenant: str, case: int, config: str) -> None:
    old, new, old_fact, new_fact, _ = CASES[case]
    tracked = config == "engram"
    turns = [
        _memory(tenant, "turn", old, "home", 0, role="user", turn_index=0),
        _memory(tenant, "turn", "Noted.", "home", 1, role="assistant", turn_index=1),
        _memory(tenant, "turn", new, "home", 60, role="user", turn_index=2),
        _memory(tenant, "turn", "Noted.", "home", 61, role="assistant", turn_index=3),
    ]
    for n, text in enumerate(OTHER):
        turns.append(_memory(tenant, "turn", f"{text}.", "life", -500 + n, role="user"))
    turn_ids = [s.record.id for s in await memories.upsert(tenant, turns)]
    current = _memory(
        tenant, "fact", new_fact, "home", 60, source_turn_ids=[turn_ids[2]] if tracked else []
    )
    [stored] = await memories.upsert(tenant, [current])
    current_id = stored.record.id
    superseded = _memory(
        tenant,
        "fact",
        old_fact,
        "home",
        0,
        superseded_by=current_id,
        source_turn_ids=[turn_ids[0]] if tracked else [],
    )
    writes = [superseded] + [
        _memory(tenant, "fact", f"User says: {text}", "life", -500 + n)
        for n, text in enumerate(OTHER)
    ]
    if tracked:
        corrected = turns[0].model_copy(
            update={
                "id": turn_ids[0],
                "metadata": {
                    **turns[0].metadata,
                    "corrected_by": current_id,
                    "corrected_at": (NOW + timedelta(minutes=60)).isoformat(),
                },
            }
        )
        writes.append(corrected)
    await memories.upsert(tenant, writes)


async def ask(memories: MemoryPort, tenant: str, case: int, conversation: str) -> dict[str, Any]:
    old, _, _, new_fact, question = CASES[case]
    result = await memories.search(
        SearchQuery(
            tenant=tenant,
            text=question,
            user_id=USER,
            conversation_id=conversation,
            now=NOW + timedelta(days=1),
        )
    )
    texts = [h.memory.text for h in result.hits]
    fact_rank = texts.index(new_fact) + 1 if new_fact in texts else None
    old_rank = texts.index(old) + 1 if old in texts else None
    return {
        "fact_rank": fact_rank,
        "old_turn_rank": old_rank,
        "old_above_fact": old_rank is not None and (fact_rank is None or old_rank < fact_rank),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    n = len(rows)
    ranks = [r["fact_rank"] for r in rows if r["fact_rank"] is not None]
    return {
        "questions": n,
        "fact_first_pct": round(100 * sum(r["fact_rank"] == 1 for r in rows) / n, 1),
        "fact_recalled_pct": round(100 * len(ranks) / n, 1),
        "fact_mean_rank": round(sum(ranks) / len(ranks), 2) if ranks else 0.0,
        "old_turn_recalled_pct": round(
            100 * sum(r["old_turn_rank"] is not None for r in rows) / n, 1
        ),
        "old_above_fact_pct": round(100 * sum(r["old_above_fact"] for r in rows) / n, 1),
    }


async def run(progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="engram-corrections-") as tmp:
        async with RetrievalProcess(Path(tmp)) as memories:
            total, done = len(CONFIGS) * len(CASES), 0
            for config in CONFIGS:
                rows = []
                for case in range(len(CASES)):
                    tenant = f"{config}-{case}"
                    await store_case(memories, tenant, case, config)
                    for conversation in ("home", "elsewhere"):
                        rows.append(
                            {
                                "conversation": conversation,
                                **await ask(memories, tenant, case, conversation),
                            }
                        )
                    done += 1
                    if progress:
                        progress(done, total)
                results[config] = {"summary": summarize(rows), "rows": rows}
    return results


TABLE_COLUMNS = (
    "config",
    "questions",
    "fact 1st %",
    "fact recalled %",
    "fact rank",
    "old turn recalled %",
    "old above fact %",
)


def table_rows(results: dict[str, Any]) -> list[list[object]]:
    rows: list[list[object]] = []
    for config, result in results.items():
        s = result["summary"]
        rows.append(
            [
                config,
                s["questions"],
                s["fact_first_pct"],
                s["fact_recalled_pct"],
                s["fact_mean_rank"],
                s["old_turn_recalled_pct"],
                s["old_above_fact_pct"],
            ]
        )
    return rows


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ("fact_first_pct", "old_turn_recalled_pct", "old_above_fact_pct")
    labels = ("current fact first", "corrected turn recalled", "corrected turn above fact")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.38
    for i, config in enumerate(results):
        values = [results[config]["summary"][m] for m in metrics]
        ax.bar([x + i * width for x in range(len(metrics))], values, width, label=config)
    ax.set_xticks([x + width / 2 for x in range(len(metrics))], labels)
    ax.set_ylabel("% of questions")
    ax.set_title("engram bench corrections")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cmd_corrections(args: argparse.Namespace) -> int:
    with ProgressCallback("corrections") as bar:
        results = asyncio.run(run(bar))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print_table(TABLE_COLUMNS, table_rows(results))
    document = {"benchmark": "corrections", "cases": len(CASES), "configs": results}
    (out / "results.json").write_text(json.dumps(document, indent=2))
    plot(results, out / "corrections.png")
    print(f"saved {out / 'results.json'} and {out / 'corrections.png'}", file=sys.stderr)
    return 0


def add_corrections_parser(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = kinds.add_parser("corrections", help="does a correction win over what it corrects?")
    parser.add_argument("--out", default="bench-results/corrections", help="output directory")
    parser.set_defaults(func=handler, run=_cmd_corrections)
