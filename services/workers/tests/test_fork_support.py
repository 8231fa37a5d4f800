"""Worker processes load gRPC with its fork handlers off, so the mirror's ``git`` (a fork
and exec) cannot crash while other workers of the process are inside gRPC."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = "import engram_workers.all_in_one, os; print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])"


def _run(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_a_worker_process_loads_grpc_with_fork_handlers_off() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    assert _run(env) == "false"


def test_an_operator_s_own_setting_is_kept() -> None:
    assert _run({**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "true"}) == "true"
