"""``engram status`` shows the workers' model tasks per task and model: how many were
asked, how many took their fallback and why (issue 36), from the counters the workers
serve on ``/metrics``."""

from __future__ import annotations

import io

from opentelemetry.sdk.resources import Resource

from engram_cli.stack.status import model_task_rates, one_per_process, print_model_tasks
from engram_core import metrics, semconv
from engram_core.metrics import prometheus_exposition, setup_metrics


def counted(task: str, model: str, outcome: str, times: int) -> None:
    for _ in range(times):
        metrics.llm_tasks.add(
            1,
            {
                semconv.ENGRAM_LLM_TASK: task,
                semconv.GEN_AI_REQUEST_MODEL: model,
                semconv.ENGRAM_LLM_OUTCOME: outcome,
            },
        )


def test_the_fallback_rate_per_task_and_model_from_the_workers_metrics() -> None:
    setup_metrics(Resource.create({"service.name": "engram-test"}))
    counted("extract_facts", "status-qwen3", "answered", 3)
    counted("extract_facts", "status-qwen3", "unusable", 1)
    counted("reconcile", "status-qwen3", "answered", 2)
    text = prometheus_exposition()[0].decode()

    rows = [r for r in model_task_rates(text) if r["model"] == "status-qwen3"]
    assert rows == [
        {
            "task": "extract_facts",
            "model": "status-qwen3",
            "asked": 4,
            "fell_back": 1,
            "fallback_rate": 0.25,
            "fallbacks": {"unusable": 1},
        },
        {
            "task": "reconcile",
            "model": "status-qwen3",
            "asked": 2,
            "fell_back": 0,
            "fallback_rate": 0.0,
            "fallbacks": {},
        },
    ]
    # two workers' texts together (ingest's and reconcile's /metrics) add up
    doubled = [r for r in model_task_rates(text + "\n" + text) if r["model"] == "status-qwen3"]
    assert [r["asked"] for r in doubled] == [8, 4]


def test_the_table_names_the_task_the_model_the_rate_and_why() -> None:
    out = io.StringIO()
    print_model_tasks(
        {
            "tasks": [
                {
                    "task": "extract_facts",
                    "model": "",
                    "asked": 4,
                    "fell_back": 1,
                    "fallback_rate": 0.25,
                    "fallbacks": {"no_model": 1},
                }
            ]
        },
        out,
    )
    rows = [line.split() for line in out.getvalue().splitlines()]
    assert ["extract_facts", "(none)", "4", "1", "25%", "no_model", "1"] in rows

    quiet = io.StringIO()
    print_model_tasks({"tasks": []}, quiet)
    assert quiet.getvalue() == "model tasks: none asked yet\n"
    down = io.StringIO()
    print_model_tasks({"error": "no /metrics from ingest, reconcile, summarize"}, down)
    assert "no /metrics" in down.getvalue()


def test_workers_sharing_one_process_are_counted_once() -> None:
    setup_metrics(Resource.create({"service.name": "engram-test"}))
    counted("summarize", "shared-process-model", "answered", 2)
    text = prometheus_exposition()[0].decode()
    # engram-workers answers /metrics on ingest's, reconcile's and summarize's ports alike
    once = model_task_rates("\n".join(one_per_process([text, text, text])))
    assert [r["asked"] for r in once if r["model"] == "shared-process-model"] == [2]
    # separate processes count separate tasks: every one of them is kept
    ingest = 'engram_llm_tasks_total{engram_llm_task="extract_facts"} 3.0'
    reconcile = 'engram_llm_tasks_total{engram_llm_task="reconcile"} 3.0'
    assert one_per_process([ingest, reconcile, "", ""]) == [ingest, reconcile, "", ""]
