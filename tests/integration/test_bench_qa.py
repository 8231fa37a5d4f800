"""``engram bench qa`` end to end on the scripted upstream (plumbing only, no score
claimed): the stored conversation reaches the answer model through the gateway's memory,
the full-context baseline sends the whole dated conversation, the judge reads the gold
answer and its verdict is counted, per arm and category."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engram_cli.bench.locomo.dataset import load_samples
from engram_cli.bench.locomo.qa import JUDGE_PROMPT, Model, QaPlan, qa_table, run_qa
from engram_cli.stack.scripted_llm import ScriptedUpstream

CONVERSATION = [
    {
        "sample_id": "s-1",
        "conversation": {
            "speaker_a": "Ana",
            "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a cat named Mo."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely! Mine is a parrot."},
            ],
            "session_2_date_time": "9:00 am on 2 June, 2023",
            "session_2": [
                {"speaker": "Ana", "dia_id": "D2:1", "text": "Mo sleeps on the piano."},
            ],
        },
        "qa": [
            {
                "question": "What pet did Ana adopt?",
                "answer": "a cat",
                "evidence": ["D1:1"],
                "category": 4,
            },
            {
                "question": "Where does Mo sleep?",
                "answer": "on the piano",
                "evidence": ["D2:1"],
                "category": 4,
            },
        ],
    }
]


def scripted_brain(body: dict[str, Any]) -> str:
    """Answers from whatever context it was given; the judge says CORRECT when the
    generated answer contains the gold one."""
    text = "\n".join(str(m.get("content", "")) for m in body["messages"])
    if text.startswith("You are grading"):
        gold = text.split("Gold answer: ", 1)[1].split("\n", 1)[0]
        answer = text.split("Generated answer: ", 1)[1].split("\n", 1)[0]
        return "CORRECT" if gold.lower() in answer.lower() else "WRONG"
    if "adopted a cat" in text and "adopt" in body["messages"][-1]["content"]:
        return "Ana adopted a cat."
    return "I do not know."


async def test_the_qa_bench_runs_both_arms_through_the_scripted_upstream(tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(CONVERSATION))
    upstream = ScriptedUpstream(replies=[scripted_brain]).start()
    try:
        model = Model(upstream.base_url, "scripted-model")
        document = await run_qa(QaPlan(load_samples(path), answer=model))
        sent = upstream.chat_requests()
    finally:
        upstream.stop()

    assert document["scripted"] is False  # an upstream was named: its verdicts are counted
    memory, full = document["arms"]["memory"], document["arms"]["full-context"]
    # the cat is answered from memory and from the full context; the piano question is not
    assert memory["questions"] == full["questions"] == 2
    assert memory["memory"] == {"used": 2} and full["memory"] == {}
    assert memory["accuracy"] == full["accuracy"] == 0.5
    assert memory["by_category"]["single-hop"]["questions"] == 2
    assert memory["latency_ms"]["p50"] > 0 and memory["tokens_per_question"] > 0

    answers = [b for b in sent if not b["messages"][0]["content"].startswith("You are grading")]
    through_gateway = [b for b in answers if "memory_id" not in b and len(b["messages"]) == 3]
    # memory arm: the gateway injected the stored turn before the question
    assert any("adopted a cat" in b["messages"][1]["content"] for b in through_gateway)
    # full-context arm: the whole dated conversation in the system message
    assert any("Session 2 (02 June 2023, 09:00):" in b["messages"][0]["content"] for b in answers)
    judged = [b for b in sent if b["messages"][0]["content"].startswith("You are grading")]
    assert len(judged) == 4 and "Gold answer: on the piano" in judged[-1]["messages"][0]["content"]
    assert JUDGE_PROMPT.split("\n", 1)[0] in document["judge_prompt"]
    _, rows = qa_table(document)
    assert rows[0][:4] == ["memory", "overall", 2, 50.0]
