"""``engram bench scale`` end to end at a tiny size: each size's row is saved as soon as
it is measured (a long run stopped early keeps what it measured), and ``--restart``
times a new retrieval process on the same store until it serves and answers."""

from __future__ import annotations

import json
from pathlib import Path

from engram_cli.main import main


def test_a_run_saves_each_size_and_times_a_restart_on_the_same_store(tmp_path: Path) -> None:
    out = tmp_path / "scale"
    code = main(
        [
            "bench",
            "scale",
            *("--sizes", "60,120", "--engines", "edge", "--tenants", "1"),
            *("--queries", "3", "--restart", "--out", str(out)),
        ]
    )
    assert code == 0
    partial = json.loads((out / "partial-edge.json").read_text())
    assert sorted(partial) == ["120", "60"]
    largest = json.loads((out / "results.json").read_text())["engines"]["edge"]["120"]
    assert largest["memories"] == 120
    restart = largest["restart"]
    assert 0 < restart["serving_s"] <= restart["first_search_s"]
    assert restart["rss_mb"] > 0
