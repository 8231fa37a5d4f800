"""``engram bench qa``: LoCoMo question answering end to end, through the gateway, as
mem0, Zep and Letta report it.

The stack runs as ``engram up`` runs it (fresh data dir, free ports; no workers: the
conversations are stored directly, so nothing the bench asks is learned back). Every
turn of a sample is stored through retrieval's ``Upsert`` in tenant ``default`` for user
``locomo-<sample>`` and conversation ``<sample>``, dated by its session. Then, per
scored question, two arms against the same answer model:

- **memory**: a chat through the gateway (``user`` and ``memory_id`` as stored), so
  Engram's recall, token budget and rendering decide what the model reads;
- **full context**: the whole conversation (every session, dated, ``speaker: text``)
  sent straight to the answer model, the baseline every peer reports.

Each answer is graded by the judge model with :data:`JUDGE_PROMPT` (CORRECT / WRONG).
Reported per arm and category: accuracy, the tokens the answer model counted
(``usage``: prompt + completion) and the latency of the answer call. The answer and
judge models are any OpenAI-compatible URL; without ``--answer-url`` both are the
built-in scripted upstream, which checks the plumbing only: its figures are not scores
(``results.json`` says ``"scripted": true``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from engram_cli.bench.common import percentiles
from engram_cli.bench.locomo.bench import scored_questions, turn_memories
from engram_cli.bench.locomo.dataset import (
    CATEGORIES,
    DEFAULT_CATEGORIES,
    LocomoFormatError,
    Question,
    Sample,
    load_samples,
)
from engram_cli.bench.writepath import running_stack
from engram_cli.console import ProgressBar, print_table
from engram_cli.stack.scripted_llm import ScriptedUpstream
from engram_core.memory_port import MemoryPort
from engram_core.retrieval_client import RetrievalClient

TENANT = "default"  # the gateway's tenant when it runs without API keys
ARMS = ("memory", "full-context")
UNAVAILABLE_RETRIES = 3

ANSWER_PROMPT = (
    "You answer questions about a long conversation between {a} and {b}. Use the "
    "conversation or the notes you are given. Answer in one short sentence. If the "
    "answer is not there, say that you do not know."
)
JUDGE_PROMPT = """You are grading an answer to a question about a long conversation.

Question: {question}
Gold answer: {gold}
Generated answer: {answer}

The generated answer is CORRECT if it says the same thing as the gold answer: wording may
differ, a longer answer that contains the gold answer counts, and for a date or a time
the same day, month or year as the gold answer names counts. Otherwise it is WRONG.
Reply with one word: CORRECT or WRONG."""


@dataclass(frozen=True)
class Model:
    url: str  # an OpenAI-compatible base URL, with its /v1
    name: str
    api_key: str = ""

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class Graded:
    arm: str
    category: int
    correct: bool
    tokens: int
    latency_ms: float
    memory: str = ""  # the gateway's X-Engram-Memory (memory arm)


@dataclass
class QaPlan:
    samples: list[Sample]
    categories: tuple[int, ...] = DEFAULT_CATEGORIES
    limit: int = 0
    answer: Model | None = None  # None: the scripted upstream
    judge: Model | None = None  # None: the answer model
    arms: tuple[str, ...] = ARMS
    timeout_s: float = 120.0
    results: list[Graded] = field(default_factory=list)


def user_of(sample: Sample) -> str:
    return f"locomo-{sample.sample_id}"


def transcript(sample: Sample) -> str:
    """The whole conversation, session by session, each headed by its date."""
    lines: list[str] = []
    session = None
    for turn in sample.turns:
        if turn.session != session:
            session = turn.session
            lines += ["", f"Session {session} ({turn.created_at:%d %B %Y, %H:%M}):"]
        lines.append(turn.memory_text)
    return "\n".join(lines).strip()


async def store_conversations(address: str, samples: Sequence[Sample]) -> None:
    client = RetrievalClient(address, timeout_s=60)
    memories = MemoryPort(client)
    try:
        for sample in samples:
            turns = turn_memories(sample, TENANT, user_of(sample))
            for offset in range(0, len(turns), 256):
                await memories.upsert(TENANT, turns[offset : offset + 256])
    finally:
        await client.close()


async def chat(
    http: httpx2.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[str, int, float, str]:
    """(reply text, tokens the model counted, milliseconds, X-Engram-Memory)."""
    started = time.perf_counter()
    response = await http.post(f"{url.rstrip('/')}/chat/completions", json=body, headers=headers)
    elapsed = (time.perf_counter() - started) * 1000.0
    if response.status_code != 200:
        raise RuntimeError(f"{url}: HTTP {response.status_code}: {response.text[:300]}")
    payload = response.json()
    text = payload["choices"][0]["message"].get("content") or ""
    usage = payload.get("usage") or {}
    tokens = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
    return text, tokens, elapsed, response.headers.get("x-engram-memory", "")


def is_correct(verdict: str) -> bool:
    words = verdict.strip().upper()
    return "CORRECT" in words and "WRONG" not in words and "INCORRECT" not in words


async def ask_one(
    http: httpx2.AsyncClient,
    arm: str,
    gateway_url: str,
    answer: Model,
    judge: Model,
    sample: Sample,
    question: Question,
) -> Graded:
    system = ANSWER_PROMPT.format(a=sample.speakers[0], b=sample.speakers[1])
    if arm == "memory":
        url, headers = gateway_url, answer.headers()
        body: dict[str, Any] = {
            "model": answer.name,
            "user": user_of(sample),
            "memory_id": sample.sample_id,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question.question},
            ],
        }
    else:
        url, headers = answer.url, answer.headers()
        body = {
            "model": answer.name,
            "messages": [
                {
                    "role": "system",
                    "content": f"{system}\n\nThe conversation:\n{transcript(sample)}",
                },
                {"role": "user", "content": question.question},
            ],
        }
    for attempt in range(UNAVAILABLE_RETRIES + 1):
        text, tokens, latency, memory = await chat(http, url, {**body, "temperature": 0}, headers)
        # a chat without memory because retrieval was briefly unreachable is no answer of
        # Engram's; asked again, and reported if it stays so
        if memory != "unavailable" or attempt == UNAVAILABLE_RETRIES:
            break
        await asyncio.sleep(1.0)
    prompt = JUDGE_PROMPT.format(question=question.question, gold=question.answer, answer=text)
    verdict, *_ = await chat(
        http,
        judge.url,
        {"model": judge.name, "temperature": 0, "messages": [{"role": "user", "content": prompt}]},
        judge.headers(),
    )
    return Graded(arm, question.category, is_correct(verdict), tokens, latency, memory)


async def run_qa(plan: QaPlan) -> dict[str, Any]:
    questions = scored_questions(plan.samples, plan.categories, plan.limit)
    upstream = None
    answer = plan.answer
    if answer is None:
        upstream = ScriptedUpstream(replies=["I do not know."]).start()
        answer = Model(upstream.base_url, "scripted-model")
    judge = plan.judge or answer
    extra_env = {"ENGRAM_LLM_API_KEY": answer.api_key} if answer.api_key else {}
    try:
        async with running_stack(answer.url, workers=(), extra_env=extra_env) as stack:
            settings = stack.settings
            await store_conversations(settings.retrieval_address, plan.samples)
            gateway_url = f"http://{settings.gateway_host}:{settings.gateway_port}/v1"
            async with httpx2.AsyncClient(timeout=plan.timeout_s) as http:
                for arm in plan.arms:
                    with ProgressBar(f"answering ({arm})", len(questions)) as bar:
                        for sample, question in questions:
                            plan.results.append(
                                await ask_one(
                                    http, arm, gateway_url, answer, judge, sample, question
                                )
                            )
                            bar.advance()
    finally:
        if upstream is not None:
            upstream.stop()
    return results_document(plan, answer, judge, scripted=upstream is not None)


def summary(rows: Sequence[Graded]) -> dict[str, Any]:
    if not rows:
        return {}
    return {
        "questions": len(rows),
        "accuracy": round(statistics.fmean(r.correct for r in rows), 4),
        "tokens_per_question": round(statistics.fmean(r.tokens for r in rows), 1),
        "latency_ms": percentiles([r.latency_ms for r in rows]),
    }


def results_document(
    plan: QaPlan, answer: Model, judge: Model, *, scripted: bool
) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm in plan.arms:
        rows = [r for r in plan.results if r.arm == arm]
        statuses = [r.memory for r in rows if r.memory]
        arms[arm] = {
            **summary(rows),
            # how the gateway's recall went (used / empty / unavailable), memory arm only
            "memory": {status: statuses.count(status) for status in sorted(set(statuses))},
            "by_category": {
                CATEGORIES.get(c, f"category-{c}"): summary([r for r in rows if r.category == c])
                for c in plan.categories
                if any(r.category == c for r in rows)
            },
        }
    return {
        "benchmark": "locomo-qa",
        "scripted": scripted,
        "answer_model": {"url": answer.url, "name": answer.name},
        "judge_model": {"url": judge.url, "name": judge.name},
        "judge_prompt": JUDGE_PROMPT,
        "answer_prompt": ANSWER_PROMPT,
        "samples": [s.sample_id for s in plan.samples],
        "arms": arms,
    }


def qa_table(document: dict[str, Any]) -> tuple[list[str], list[list[object]]]:
    columns = ["arm", "category", "n", "accuracy %", "tokens/question", "p50 ms", "p95 ms"]
    rows: list[list[object]] = []
    for arm, scores in document["arms"].items():
        groups = [("overall", scores), *scores.get("by_category", {}).items()]
        for i, (name, s) in enumerate(groups):
            if not s:
                continue
            rows.append(
                [
                    arm if i == 0 else "",
                    name,
                    s["questions"],
                    round(100 * s["accuracy"], 1),
                    s["tokens_per_question"],
                    s["latency_ms"].get("p50", "") if i == 0 else "",
                    s["latency_ms"].get("p95", "") if i == 0 else "",
                ]
            )
    return columns, rows


def _model(url: str, name: str, key_env: str) -> Model | None:
    if not url:
        return None
    if not name:
        raise ValueError("a model URL needs its model name (--answer-model / --judge-model)")
    key = os.environ.get(key_env, "") if key_env else ""
    if key_env and not key:
        raise ValueError(f"{key_env} is not set")
    return Model(url, name, key)


def _cmd_qa(args: argparse.Namespace) -> int:
    try:
        samples = load_samples(
            Path(args.data), [s.strip() for s in args.samples.split(",") if s.strip()]
        )
        answer = _model(args.answer_url, args.answer_model, args.answer_key_env)
        judge = _model(args.judge_url, args.judge_model, args.judge_key_env)
        if args.limit < 0:
            raise ValueError("--limit must be 0 (all) or more")
    except (ValueError, OSError) as exc:
        kind = "bad data" if isinstance(exc, LocomoFormatError) else "error"
        print(f"engram bench qa: {kind}: {exc}", file=sys.stderr)
        return 2
    arms = ARMS if not args.no_full_context else ("memory",)
    plan = QaPlan(samples, limit=args.limit, answer=answer, judge=judge, arms=arms)
    if not scored_questions(samples, plan.categories, plan.limit):
        print("engram bench qa: no question with usable evidence to ask", file=sys.stderr)
        return 2
    document = asyncio.run(run_qa(plan))
    title = "LoCoMo QA" + (
        " (scripted upstream: plumbing only, not scores)" if document["scripted"] else ""
    )
    print_table(*qa_table(document), title=title)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(document, indent=2))
    print(f"saved {out / 'results.json'}")
    return 0


def add_qa_parser(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    bench = kinds.add_parser(
        "qa",
        help="LoCoMo question answering through the gateway, judged, with a full-context baseline",
    )
    bench.add_argument("--data", required=True, help="a JSON file in the LoCoMo format")
    bench.add_argument("--samples", default="", help="sample ids to keep (default: all)")
    bench.add_argument("--limit", type=int, default=0, help="questions per sample (0: all)")
    bench.add_argument(
        "--answer-url",
        default="",
        help="OpenAI-compatible base URL (with /v1); "
        "unset: the built-in scripted upstream (plumbing only)",
    )
    bench.add_argument("--answer-model", default="", help="the answer model's name")
    bench.add_argument("--answer-key-env", default="", help="environment variable holding its key")
    bench.add_argument(
        "--judge-url", default="", help="the judge's base URL (default: the answer model)"
    )
    bench.add_argument("--judge-model", default="", help="the judge model's name")
    bench.add_argument("--judge-key-env", default="", help="environment variable holding its key")
    bench.add_argument(
        "--no-full-context", action="store_true", help="skip the full-context baseline"
    )
    bench.add_argument("--out", default="bench-results/qa", help="output directory")
    bench.set_defaults(func=handler, run=_cmd_qa)
