"""The LoCoMo-format loader and the bench's pure helpers, on a tiny synthetic file."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from engram_cli.bench.locomo.bench import (
    CONFIGS,
    BenchPlan,
    Config,
    Ingested,
    choose_configs,
    evidence_counts,
    format_table,
    parse_ks,
    results_document,
    scored_questions,
    search_query,
    summarize,
    turn_memories,
)
from engram_cli.bench.locomo.dataset import (
    LocomoFormatError,
    load_samples,
    parse_samples,
    parse_session_datetime,
)


def synthetic() -> list[dict[str, Any]]:
    return [
        {
            "sample_id": "s-1",
            "conversation": {
                "speaker_a": "Ana",
                "speaker_b": "Bo",
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": [
                    {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a cat."},
                    {
                        "speaker": "Bo",
                        "dia_id": "D1:2",
                        "text": "Look at this!",
                        "img_url": ["http://example.invalid/x.jpg"],
                        "blip_caption": "a photo of a red kite",
                    },
                ],
                # sessions sort by number, not by key order
                "session_2_date_time": "12:19 am on 4 January, 2024",
                "session_2": [{"speaker": "Ana", "dia_id": "D2:1", "text": "The cat is Mo."}],
                "session_3_date_time": "not a date, but session 3 is empty",
                "session_3": [],
            },
            "qa": [
                {"question": "What pet?", "answer": "a cat", "evidence": ["D1:1"], "category": 4},
                {
                    "question": "Cat's name, and when adopted?",
                    "answer": "Mo",
                    "evidence": ["D1:1; D2:1", "D:1:2", "D2:01"],
                    "category": 1,
                },
                {"question": "Bad ids", "answer": "x", "evidence": ["D", "D9:9"], "category": 2},
                {"question": "A trap", "adversarial_answer": "y", "evidence": [], "category": 5},
                {"question": "Open", "answer": "z", "evidence": ["D2:1"], "category": "3"},
            ],
        },
        {
            "sample_id": "s-2",
            "conversation": {
                "speaker_a": "Cy",
                "speaker_b": "Di",
                "session_1_date_time": "9:00 am on 1 Feb, 2022",
                "session_1": [{"speaker": "Di", "dia_id": "D1:1", "text": "Hello."}],
            },
            "qa": [{"question": "Hi?", "answer": "yes", "evidence": ["D1:1"], "category": 5}],
        },
    ]


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "tiny_locomo.json"
    path.write_text(json.dumps(data))
    return path


def test_session_dates() -> None:
    assert parse_session_datetime("1:56 pm on 8 May, 2023") == datetime(
        2023, 5, 8, 13, 56, tzinfo=UTC
    )
    assert parse_session_datetime("12:19 am on 4 January, 2024") == datetime(
        2024, 1, 4, 0, 19, tzinfo=UTC
    )
    assert parse_session_datetime("12:05 PM on 30 Sept 2021").hour == 12
    for bad in ("yesterday", "13:00 pm on 1 May, 2023", "1:00 pm on 1 Mayo, 2023"):
        with pytest.raises(ValueError, match="not a LoCoMo session date"):
            parse_session_datetime(bad)


def test_loads_turns_with_session_dates_speakers_and_captions(tmp_path: Path) -> None:
    first, second = load_samples(write(tmp_path, synthetic()))
    assert (first.sample_id, first.speakers) == ("s-1", ("Ana", "Bo"))
    assert [t.dia_id for t in first.turns] == ["D1:1", "D1:2", "D2:1"]
    assert [t.session for t in first.turns] == [1, 1, 2]
    assert first.turns[0].created_at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert first.turns[0].memory_text == "Ana: I adopted a cat."
    assert first.turns[1].memory_text == (
        "Bo: Look at this! [shared an image: a photo of a red kite]"
    )
    assert first.last_session_at == datetime(2024, 1, 4, 0, 19, tzinfo=UTC)
    assert second.turns[0].speaker == "Di"


def test_questions_categories_and_evidence(tmp_path: Path) -> None:
    (sample, _) = load_samples(write(tmp_path, synthetic()))
    single, multi, bad, trap, open_domain = sample.questions
    assert (single.category_name, single.evidence, single.unusable) == ("single-hop", ("D1:1",), 0)
    assert multi.category_name == "multi-hop"
    assert multi.evidence == ("D1:1", "D2:1", "D1:2")
    assert (multi.recovered, multi.unusable) == (4, 0)
    assert bad.evidence == () and bad.unusable == 2  # "D" is malformed, D9:9 is no turn
    assert trap.category_name == "adversarial" and trap.evidence == ()
    assert open_domain.category == 3


def test_only_the_requested_samples(tmp_path: Path) -> None:
    path = write(tmp_path, synthetic())
    assert [s.sample_id for s in load_samples(path, ["s-2"])] == ["s-2"]
    with pytest.raises(LocomoFormatError, match="no sample nope"):
        load_samples(path, ["s-1", "nope"])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[0].pop("conversation"), "missing 'conversation'"),
        (lambda d: d[0]["conversation"].pop("session_2_date_time"), "session_2_date_time"),
        (lambda d: d[0]["conversation"].update(session_2_date_time="soon"), "not a LoCoMo"),
        (lambda d: d[0]["conversation"]["session_2"][0].pop("dia_id"), "missing 'dia_id'"),
        (lambda d: d[0]["conversation"]["session_2"][0].update(dia_id="D1:01"), "twice"),
        (lambda d: d[0]["qa"][0].update(category="hard"), "expected an integer"),
        (lambda d: d[1].update(sample_id="s-1"), "unique"),
    ],
)
def test_format_errors_say_where(mutate: Any, message: str) -> None:
    data = synthetic()
    mutate(data)
    with pytest.raises(LocomoFormatError, match=message):
        parse_samples(data)
    with pytest.raises(LocomoFormatError, match="list of samples"):
        parse_samples({"qa": []})


def test_turn_memories_and_search_query(tmp_path: Path) -> None:
    (sample, _) = load_samples(write(tmp_path, synthetic()))
    memories = turn_memories(sample)
    assert [m.source_id for m in memories] == ["D1:1", "D1:2", "D2:1"]
    assert [m.role for m in memories] == ["user", "assistant", "user"]
    assert {m.conversation_id for m in memories} == {"s-1"}
    assert all(m.kind == "turn" for m in memories)
    assert memories[2].created_at == datetime(2024, 1, 4, 0, 19, tzinfo=UTC)
    assert memories[1].metadata["speaker"] == "Bo"
    # the ids retrieval gives a memory written without one: a re-run rewrites, never copies
    assert len({m.id for m in memories}) == 3
    assert [m.id for m in turn_memories(sample)] == [m.id for m in memories]
    assert turn_memories(sample, "other")[0].id != memories[0].id
    query = search_query(sample, "What pet?", 50, CONFIGS["bm25"])
    assert (query.tenant, query.conversation_id, query.top_k) == ("locomo-s-1", "s-1", 50)
    assert query.score_threshold == 0.0
    assert query.recency_weight == 0.0 and query.mmr_lambda == 1.0
    assert query.scopes == ("conversation",)
    assert query.now == sample.last_session_at
    default = search_query(sample, "What pet?", 10, CONFIGS["default"])
    assert default.recency_weight is None and default.mmr_lambda is None


def test_scored_questions_and_evidence_counts(tmp_path: Path) -> None:
    samples = load_samples(write(tmp_path, synthetic()))
    picked = scored_questions(samples, (1, 2, 3, 4))
    assert [q.question for _, q in picked] == ["What pet?", "Cat's name, and when adopted?", "Open"]
    assert len(scored_questions(samples, (1, 2, 3, 4, 5))) == 4  # s-2's category 5
    assert evidence_counts(samples, (1, 2, 3, 4)) == {"unusable": 2, "recovered": 4, "without": 1}


def test_options() -> None:
    assert parse_ks("50,5,10,5") == (5, 10, 50)
    for bad in ("0,5", "101", "a", ""):
        with pytest.raises(ValueError, match="--k"):
            parse_ks(bad)
    chosen, skipped = choose_configs("bm25,hybrid+rerank,default", {})
    assert [c.name for c in chosen] == ["bm25", "default"]
    assert "ENGRAM_RERANKER_PATH" in skipped["hybrid+rerank"]
    chosen, skipped = choose_configs("all", {"ENGRAM_RERANKER_PATH": "/models/ce"})
    assert [c.name for c in chosen] == list(CONFIGS) and not skipped
    with pytest.raises(ValueError, match="unknown bm42"):
        choose_configs("bm42", {})


def test_table_and_results_document(tmp_path: Path) -> None:
    samples = load_samples(write(tmp_path, synthetic()))
    rows = [
        (4, {"recall@5": 1.0, "hit@5": 1.0, "ndcg@5": 1.0}),
        (1, {"recall@5": 0.5, "hit@5": 1.0, "ndcg@5": 0.25}),
    ]
    evidence = {"unusable": 2, "recovered": 4, "without": 1}
    results = [
        summarize(Config(name, "x"), rows, [3.0, 5.0], (1, 4), evidence, "tiny.json")
        for name in ("bm25", "default")
    ]
    first = results[0]
    assert first["overall"]["recall@5"] == 0.75
    assert first["by_category"]["multi-hop"] == {
        "questions": 1,
        "recall@5": 0.5,
        "hit@5": 1.0,
        "ndcg@5": 0.25,
    }
    assert first["latency_ms"]["p50"] == 4.0 and first["unusable_evidence"] == 2
    table = format_table(results, (5,))
    assert "multi-hop" in table and "75.0" in table
    plan = BenchPlan(samples=samples, ks=(5,), categories=(1, 4), configs=[], data_name="t")
    document = results_document(results, plan, Ingested(turns=4, seconds=2.0), {"x": "why"})
    assert document["config"] == "default" and set(document["configs"]) == {"bm25", "default"}
    assert document["tuned_on"] == "locomo_dev.json" and document["ingest_turns_per_s"] == 2.0
    assert "latency_samples_ms" not in json.dumps(document)
    assert document["skipped_configs"] == {"x": "why"}
