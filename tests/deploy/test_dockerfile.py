"""deploy/Dockerfile: one target per chart component, each starting that component."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from engram_core.worker_catalog import WORKER_CATALOG

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "deploy" / "Dockerfile"
#: chart component -> the console script its image runs (a worker image: its first worker)
COMMANDS = {
    "gateway": "engram-gateway",
    "retrieval": "engram-retrieval",
    **{entry.image: entry.script for entry in WORKER_CATALOG if not entry.sidecar},
}


def _stages() -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)$", line, re.IGNORECASE)
        if match:
            current = stages.setdefault(match.group(1), [])
        current.append(line)
    return stages


def _console_scripts() -> set[str]:
    scripts: set[str] = set()
    for pyproject in REPO_ROOT.glob("services/*/pyproject.toml"):
        scripts |= set(tomllib.loads(pyproject.read_text())["project"].get("scripts", {}))
    return scripts


def test_one_target_per_component() -> None:
    stages = _stages()
    assert set(COMMANDS) <= set(stages)
    assert len(re.findall(r"^FROM ", DOCKERFILE.read_text(), re.MULTILINE)) == len(stages)


@pytest.mark.parametrize("component", sorted(COMMANDS))
def test_each_target_runs_its_component_as_non_root(component: str) -> None:
    instructions = _stages()[component]
    assert instructions[-1] == f'CMD ["{COMMANDS[component]}"]'
    users = [i.split()[1] for i in instructions if i.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert COMMANDS[component] in _console_scripts()


def test_edits_worker_ships_in_the_file_mirror_image() -> None:
    assert "engram-edits" in _console_scripts()
    assert any("git" in i for i in _stages()["file-mirror"] if i.startswith("RUN "))


def test_images_install_from_the_lock_without_dev_dependencies() -> None:
    syncs = [i for s in _stages().values() for i in s if "uv sync" in i]
    assert syncs
    for sync in syncs:
        assert "--frozen" in sync and "--no-dev" in sync and "--package engram-" in sync


def test_retrieval_bakes_in_the_models() -> None:
    retrieval = " ".join(_stages()["retrieval"])
    assert "default_model_files()" in retrieval  # the build fails without the embedder
    assert "ENGRAM_RERANKER_PATH=${RERANKER_DIR:+/opt/engram/reranker}" in retrieval
    assert (REPO_ROOT / "deploy" / "reranker").is_dir()  # the COPY's default source
