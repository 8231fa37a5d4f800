"""``engram bench paraphrase``: the recall-or-nothing decision on Engram's own paraphrase
set (:mod:`engram_cli.bench.paraphrase.evaluate`), before and after its calibration.

Each configuration runs a real ``engram-retrieval`` process on a fresh data dir with
its own environment: ``calibrated`` is the service as configured (category expansion on,
the personal threshold for questions about the user), ``uncalibrated`` turns both off
(one threshold, 0.35, for every question). ``--thresholds`` adds a sweep of explicit
request thresholds for the calibrated service. Output: a table and ``results.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engram_cli.bench.common import RetrievalProcess
from engram_cli.bench.paraphrase.evaluate import answer_all, load_set, scores, store
from engram_cli.console import print_table

CONFIGS: dict[str, dict[str, str]] = {
    "uncalibrated": {
        "ENGRAM_SEARCH_CATEGORY_EXPANSION": "false",
        "ENGRAM_SEARCH_PERSONAL_SCORE_THRESHOLD": "0.35",
    },
    "calibrated": {},
}


async def run(
    configs: Sequence[str], thresholds: Sequence[float], misses: bool
) -> list[dict[str, Any]]:
    data = load_set()
    rows: list[dict[str, Any]] = []
    for name in configs:
        with tempfile.TemporaryDirectory(prefix="engram-paraphrase-") as tmp:
            async with RetrievalProcess(Path(tmp), extra_env=CONFIGS[name]) as memories:
                key_of = await store(memories, data)
                for threshold in (None, *thresholds):
                    answers = await answer_all(memories, data, key_of, threshold)
                    label = "default" if threshold is None else f"{threshold:g}"
                    for part, picked in (
                        ("all", answers),
                        ("calibration", [a for a in answers if not a.holdout]),
                        ("held out", [a for a in answers if a.holdout]),
                    ):
                        row = {"config": name, "threshold": label, "questions_of": part}
                        rows.append({**row, **scores(picked)})
                    if misses and threshold is None:
                        for a in answers:
                            if a.expected and not a.recalled & a.expected:
                                print(f"[{name}] missed: {a.question}", file=sys.stderr)
                            elif not a.expected and a.recalled:
                                print(f"[{name}] recalled for: {a.question}", file=sys.stderr)
    return rows


def _cmd_paraphrase(args: argparse.Namespace) -> int:
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
    except ValueError:
        print("engram bench paraphrase: --thresholds: numbers in 0..1", file=sys.stderr)
        return 2
    if any(not 0.0 <= t <= 1.0 for t in thresholds):
        print("engram bench paraphrase: --thresholds: numbers in 0..1", file=sys.stderr)
        return 2
    rows = asyncio.run(run(list(CONFIGS), thresholds, args.misses))
    columns = ["config", "threshold", "questions", "n", "precision", "recall", "coverage"]
    columns += ["nothing rate"]
    print_table(
        columns,
        [
            [
                r["config"],
                r["threshold"],
                r["questions_of"],
                f"{r['questions']}+{r['nothing_questions']}",
                round(100 * r["precision"], 1),
                round(100 * r["recall"], 1),
                round(100 * r["coverage"], 1),
                round(100 * r["nothing_rate"], 1),
            ]
            for r in rows
        ],
        title="Paraphrase set: recall-or-nothing (%)",
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps({"benchmark": "paraphrase", "rows": rows}, indent=2)
    )
    print(f"saved {out / 'results.json'}")
    return 0


def add_paraphrase_parser(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    bench = kinds.add_parser(
        "paraphrase", help="recall-or-nothing on Engram's paraphrase set, before/after calibration"
    )
    bench.add_argument("--thresholds", default="", help="explicit thresholds to sweep too")
    bench.add_argument("--misses", action="store_true", help="list the questions it gets wrong")
    bench.add_argument("--out", default="bench-results/paraphrase", help="output directory")
    bench.set_defaults(func=handler, run=_cmd_paraphrase)
