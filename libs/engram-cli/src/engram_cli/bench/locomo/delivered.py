"""``engram bench locomo --delivered``: recall as a chat delivers it.

Each scored question goes through the gateway's own recall (``engram_gateway.recall``:
``search_query`` from the request's controls, the same ``recall`` a chat runs, with its
window, token budget and rendering) against the configuration's retrieval process, as a
chat in the sample's conversation (``memory_id`` = the sample, no user) whose only
message is the question. Scored on what would be injected: the evidence turns among the
hits of the memory message (recall, hit), how often retrieval answered
``nothing_relevant``, and the message's size in tokens, counted with the packaged MiniLM
WordPiece tokenizer (``tokenizer.json``, no special tokens) and, beside it, the
gateway's own estimate that its budget is spent against.

The product's defaults (``GatewaySettings()``: the default budget, threshold and top_k)
make the headline; every budget of the curve (0 = no budget, the ``top_k`` hits) is run
the same way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from engram_cli.bench.locomo.dataset import CATEGORIES, Question, Sample
from engram_cli.console import ProgressBar
from engram_core.memory_port import MemoryPort
from engram_gateway.controls import MemoryControls
from engram_gateway.recall import recall, search_query
from engram_gateway.settings import GatewaySettings
from engram_retrieval.embedder import default_model_files

DEFAULT_BUDGETS = (0, 250, 500, 1000, 2000)
TOKENIZER_NAME = "all-MiniLM-L6-v2 WordPiece (tokenizer.json, no special tokens)"


def minilm_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(default_model_files().tokenizer))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@dataclass(frozen=True)
class Delivered:
    """One question's delivery."""

    category: int
    recall: float
    hit: float
    nothing_relevant: bool
    tokens: int  # MiniLM WordPiece
    estimated_tokens: int  # the gateway's estimate
    hits: int


def product_budget() -> int:
    return GatewaySettings().gateway_memory_max_tokens


def controls_for(sample: Sample, budget: int | None, memory_id: str = "") -> MemoryControls:
    """The product's defaults for a chat in the sample's conversation (or ``memory_id``'s);
    ``budget`` (None: the product's) replaces the token budget."""
    controls = MemoryControls(memory_id=memory_id or sample.sample_id).with_defaults(
        GatewaySettings()
    )
    if budget is None:
        return controls
    return controls.model_copy(update={"memory_max_tokens": budget})


async def deliver_one(
    memories: MemoryPort,
    tenant: str,
    sample: Sample,
    question: Question,
    budget: int | None,
    turn_of_point: dict[str, str],
    tokenizer: Tokenizer,
    memory_id: str = "",
) -> Delivered:
    controls = controls_for(sample, budget, memory_id)
    query = search_query(tenant=tenant, query=question.question, user_id="", controls=controls)
    query = replace(query, now=sample.last_session_at)
    messages = [{"role": "user", "content": question.question}]
    memory = await recall(memories, query, messages=messages, now=sample.last_session_at)
    if memory.status.value == "unavailable":
        raise RuntimeError("retrieval failed during the delivered pass")
    found = {turn_of_point.get(h["id"], "") for h in memory.hits} & set(question.evidence)
    text = memory.system_message["content"] if memory.system_message else ""
    return Delivered(
        category=question.category,
        recall=len(found) / len(set(question.evidence)),
        hit=1.0 if found else 0.0,
        nothing_relevant=memory.outcome == "nothing_relevant",
        tokens=len(tokenizer.encode(text, add_special_tokens=False).ids) if text else 0,
        estimated_tokens=memory.tokens,
        hits=len(memory.hits),
    )


def summary_of(rows: Sequence[Delivered]) -> dict[str, Any]:
    if not rows:
        return {}
    tokens = sorted(r.tokens for r in rows)
    return {
        "questions": len(rows),
        "recall": round(statistics.fmean(r.recall for r in rows), 4),
        "hit": round(statistics.fmean(r.hit for r in rows), 4),
        "nothing_relevant": round(statistics.fmean(r.nothing_relevant for r in rows), 4),
        "tokens_p50": _quantile(tokens, 0.5),
        "tokens_p95": _quantile(tokens, 0.95),
        "estimated_tokens_p50": _quantile(sorted(r.estimated_tokens for r in rows), 0.5),
        "hits_p50": _quantile(sorted(r.hits for r in rows), 0.5),
    }


def _quantile(ordered: Sequence[int], q: float) -> int:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else 0


def by_category(rows: Sequence[Delivered], categories: Sequence[int]) -> dict[str, Any]:
    return {
        CATEGORIES.get(c, f"category-{c}"): summary_of([r for r in rows if r.category == c])
        for c in categories
        if any(r.category == c for r in rows)
    }


async def delivered_pass(
    memories: MemoryPort,
    label: str,
    questions: Sequence[tuple[Sample, Question]],
    categories: Sequence[int],
    budgets: Sequence[int],
    turn_of_point: dict[str, str],
    tenant_of: Any,
    *,
    asked_from: Callable[[Sample], str] | None = None,
) -> dict[str, Any]:
    """``configs.<name>.delivered``: the product's budget's scores at the top level, by
    category, and the curve over ``budgets``. ``asked_from``: the conversation a sample's
    questions are asked from (default: the sample's own)."""
    tokenizer = minilm_tokenizer()
    default = product_budget()
    wanted = list(dict.fromkeys([default, *budgets]))
    curve: dict[int, list[Delivered]] = {}
    started = time.perf_counter()
    for budget in wanted:
        rows: list[Delivered] = []
        with ProgressBar(f"delivering ({label}, budget {budget})", len(questions)) as bar:
            for sample, question in questions:
                rows.append(
                    await deliver_one(
                        memories,
                        tenant_of(sample),
                        sample,
                        question,
                        budget,
                        turn_of_point,
                        tokenizer,
                        asked_from(sample) if asked_from else "",
                    )
                )
                bar.advance()
        curve[budget] = rows
    head = curve[default]
    return {
        **summary_of(head),
        "budget": default,
        "by_category": by_category(head, categories),
        "curve": [{"budget": b, **summary_of(curve[b])} for b in wanted],
        "tokenizer": TOKENIZER_NAME,
        "seconds": round(time.perf_counter() - started, 1),
    }


def delivered_table(results: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[object]]]:
    columns = ["config", "budget", "category", "n", "recall", "hit", "nothing rel.", "tok p50"]
    columns += ["tok p95", "est. p50", "hits p50"]
    rows: list[list[object]] = []
    for result in results:
        delivered = result.get("delivered")
        if not delivered:
            continue
        groups = [(p["budget"], "overall", p) for p in delivered["curve"]]
        groups += [(delivered["budget"], n, s) for n, s in delivered["by_category"].items()]
        for i, (budget, name, s) in enumerate(groups):
            rows.append(
                [
                    result["config"] if i == 0 else "",
                    budget or "none (top_k)",
                    name,
                    s["questions"],
                    round(100 * s["recall"], 1),
                    round(100 * s["hit"], 1),
                    round(100 * s["nothing_relevant"], 1),
                    s["tokens_p50"],
                    s["tokens_p95"],
                    s["estimated_tokens_p50"],
                    s["hits_p50"],
                ]
            )
    return columns, rows


def plot_delivered(results: Sequence[dict[str, Any]], path: Path) -> None:
    """Delivered recall against the message's median size, one line per configuration,
    one point per budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for result in results:
        delivered = result.get("delivered")
        if not delivered:
            continue
        curve = sorted(delivered["curve"], key=lambda p: p["tokens_p50"])
        xs = [p["tokens_p50"] for p in curve]
        ys = [100 * p["recall"] for p in curve]
        ax.plot(xs, ys, marker="o", label=result["config"])
        for p, x, y in zip(curve, xs, ys, strict=True):
            ax.annotate(
                str(p["budget"] or "no budget"),
                (x, y),
                fontsize=7,
                xytext=(3, -9),
                textcoords="offset points",
            )
    ax.set_xlabel("memory message, median tokens (MiniLM WordPiece)")
    ax.set_ylabel("delivered evidence recall (%)")
    ax.set_title("engram bench locomo --delivered: recall against tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
