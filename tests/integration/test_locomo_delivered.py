"""``engram bench locomo --delivered`` against a real retrieval service, on a tiny
LoCoMo-format file written here: each question goes through the gateway's own recall,
is scored on the memory message a chat would be given, and the results document
carries ``configs.<name>.delivered`` with the curve over budgets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engram_cli.bench.locomo.bench import (
    CONFIGS,
    BenchPlan,
    Ingested,
    ingest,
    query_all,
    results_document,
    run_locomo,
    scored_questions,
    summarize,
    tenant_of,
)
from engram_cli.bench.locomo.dataset import load_samples
from engram_cli.bench.locomo.delivered import delivered_pass, delivered_table, product_budget
from engram_core.memory_port import MemoryPort
from engram_testing.worker_stack import running_retrieval

FILLER = [
    "The weather was grey all week.",
    "I watched a documentary about deep sea fish.",
    "Work has been busy with the quarterly report.",
    "We repainted the kitchen a pale green.",
    "My neighbour lent me a ladder.",
    "The train was late again this morning.",
    "I tried a new bakery near the station.",
    "The football match went to penalties.",
]


def tiny_locomo() -> list[dict[str, Any]]:
    session_1 = [
        {"speaker": "Ana" if i % 2 == 0 else "Bo", "dia_id": f"D1:{i + 1}", "text": text}
        for i, text in enumerate(FILLER)
    ]
    session_1.append({"speaker": "Ana", "dia_id": "D1:9", "text": "I adopted a cat named Mo."})
    session_2 = [
        {"speaker": "Bo", "dia_id": "D2:1", "text": "How is Mo settling in?"},
        {"speaker": "Ana", "dia_id": "D2:2", "text": "Mo sleeps on the piano all day."},
    ]
    return [
        {
            "sample_id": "s-1",
            "conversation": {
                "speaker_a": "Ana",
                "speaker_b": "Bo",
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": session_1,
                "session_2_date_time": "10:00 am on 2 June, 2023",
                "session_2": session_2,
            },
            "qa": [
                {"question": "What pet did Ana adopt?", "evidence": ["D1:9"], "category": 4},
                {"question": "Where does Mo sleep?", "evidence": ["D2:2"], "category": 4},
            ],
        }
    ]


async def test_the_delivered_pass_scores_what_a_chat_would_be_given(tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny_locomo()))
    samples = load_samples(path)
    questions = scored_questions(samples, (4,))
    config = CONFIGS["default"]
    ingested = Ingested()
    async with running_retrieval(tmp_path / "retrieval") as retrieval:
        memories = MemoryPort(retrieval.client)
        await ingest(memories, samples, 256, ingested)
        rows, latencies = await query_all(
            memories, config, questions, (5, 10), ingested.turn_of_point
        )
        result = summarize(
            config,
            rows,
            latencies,
            (4,),
            {"unusable": 0, "recovered": 0, "without": 0},
            "tiny.json",
        )
        result["delivered"] = await delivered_pass(
            memories,
            "default",
            questions,
            (4,),
            (0, 40, product_budget()),
            ingested.turn_of_point,
            tenant_of,
        )

    delivered = result["delivered"]
    assert set(delivered) >= {"recall", "hit", "nothing_relevant", "tokens_p50", "tokens_p95"}
    assert delivered["budget"] == product_budget()
    assert delivered["tokenizer"].startswith("all-MiniLM-L6-v2")
    # with the product's budget the small conversation's evidence is delivered
    assert delivered["recall"] == 1.0 and delivered["hit"] == 1.0
    assert delivered["nothing_relevant"] == 0.0
    curve = {point["budget"]: point for point in delivered["curve"]}
    assert list(curve) == [product_budget(), 0, 40]
    # a budget too small for any note delivers the preamble alone: no evidence, few tokens
    assert curve[40]["recall"] == 0.0 and curve[40]["hits_p50"] == 0
    assert curve[40]["tokens_p50"] < curve[product_budget()]["tokens_p50"]
    assert delivered["by_category"]["single-hop"]["questions"] == 2
    # session-level scores beside turn-level ones
    assert result["overall"]["session_recall@5"] >= result["overall"]["recall@5"]

    plan = BenchPlan(samples=samples, ks=(5, 10), categories=(4,), configs=[config], delivered=True)
    document = results_document([result], plan, ingested, {})
    assert document["configs"]["default"]["delivered"]["recall"] == 1.0
    columns, table_rows = delivered_table([result])
    assert "tok p50" in columns and table_rows[0][0] == "default"


async def test_the_bm25_baseline_ranks_each_turns_own_words(tmp_path: Path) -> None:
    # The product indexes a turn with the words of the turn it answers; the baseline is
    # plain BM25, so it gets a store of its own, indexed without them.
    conversation = tiny_locomo()[0]
    conversation["conversation"]["session_2"] = [
        {"speaker": "Ana", "dia_id": "D2:1", "text": "What do you do on lazy Sundays?"},
        {"speaker": "Bo", "dia_id": "D2:2", "text": "Chess with my grandfather, then bread."},
    ]
    conversation["qa"] = [
        {"question": "What happens on lazy Sundays?", "evidence": ["D2:2"], "category": 4}
    ]
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([conversation]))
    plan = BenchPlan(
        samples=load_samples(path, []),
        ks=(1, 5),
        categories=(4,),
        configs=[CONFIGS["default"], CONFIGS["bm25"]],
    )
    results, ingested = await run_locomo(plan)
    recall = {r["config"]: r["overall"]["recall@5"] for r in results}
    # the answer shares no word with the question: only the product's index finds it
    assert recall == {"default": 1.0, "bm25": 0.0}
    assert ingested.turns == 11


async def test_questions_asked_from_another_conversation_recall_the_samples_own_turns(
    tmp_path: Path,
) -> None:
    # --asked-from other: each sample's questions are asked inside the next sample's
    # conversation, stored beside its own; the distractor's turns share the sample's
    # dia_ids but are never counted as evidence.
    own = tiny_locomo()[0]
    other = json.loads(json.dumps(own))
    other["sample_id"] = "s-2"
    other["conversation"]["session_1"][-1]["text"] = "Bo's sister plays the cello."
    other["conversation"]["session_2"] = [
        {"speaker": "Bo", "dia_id": "D2:1", "text": "Did the cello recital go well?"},
        {"speaker": "Ana", "dia_id": "D2:2", "text": "It was sold out, she played Elgar."},
    ]
    other["qa"] = [
        {"question": "What does Bo's sister play?", "evidence": ["D1:9"], "category": 4},
        {"question": "How did the cello recital go?", "evidence": ["D2:2"], "category": 4},
    ]
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([own, other]))
    plan = BenchPlan(
        samples=load_samples(path, []),
        ks=(5,),
        categories=(4,),
        configs=[CONFIGS["default"]],
        delivered=True,
        budgets=(),
        asked_from="other",
    )
    results, ingested = await run_locomo(plan)
    delivered = results[0]["delivered"]
    assert delivered["asked_from"] == "other"
    # every sample's turns and its distractor's were stored; only its own are evidence
    assert ingested.turns == 2 * (11 + 11) and len(ingested.turn_of_point) == 22
    # Ana's cat is found from inside the cello conversation, the cello from Ana's
    assert delivered["by_category"]["single-hop"]["questions"] == 4
    assert delivered["hit"] == 1.0
