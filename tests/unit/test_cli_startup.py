"""The ``engram`` command starts fast: what a client command imports, checked in a fresh
interpreter (not timed: a timing test would be flaky on a busy machine).

``engram status`` took 12 s on a first run and ``engram search`` 1.5-5 s, most of it
importing every command's stack (the benchmarks' ONNX models and the gateway, FastStream,
numpy) to build the argument parser. Now only the command that runs is imported, and
each client command imports what it talks with and nothing more."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engram_cli.stack.nats_server import free_port

#: Never needed to start a client command: the models, the services, the messaging
#: stack, the benchmarks' maths.
HEAVY = (
    "onnxruntime",
    "engram_gateway",
    "engram_retrieval",
    "engram_workers",
    "faststream",
    "fastapi",
    "numpy",
    "engram_cli.bench.command",
    "engram_cli.bench.locomo",
)

_PROBE = """
import json, sys
from engram_cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def modules_after(*argv: str) -> set[str]:
    """The modules loaded once ``engram <argv>`` has run, against a stack that is not
    there (every address refused at once)."""
    nowhere = {
        "ENGRAM_GATEWAY_URL": f"http://127.0.0.1:{free_port()}",
        "ENGRAM_NATS_URL": f"nats://127.0.0.1:{free_port()}",
        "ENGRAM_RETRIEVAL_ADDRESS": f"127.0.0.1:{free_port()}",
        "ENGRAM_HEALTH_PORT_BASE": str(free_port()),
    }
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **nowhere},
    )
    loaded: set[str] = set(json.loads(done.stdout.splitlines()[-1]))
    return loaded


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(
        name for name in modules if any(name == h or name.startswith(h + ".") for h in HEAVY)
    )


def test_the_entry_module_imports_no_command() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys, engram_cli.main; print(json.dumps(list(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = set(json.loads(done.stdout))
    assert heavy_in(loaded) == []
    assert not [m for m in loaded if m.startswith(("grpc", "engram_core", "nats", "pydantic"))]


@pytest.mark.parametrize(
    "argv",
    [
        ("status",),
        ("status", "--json"),
        ("search", "what do I like?", "--user", "alice"),
        ("dlq", "list"),
    ],
)
def test_a_client_command_loads_only_what_it_talks_with(argv: tuple[str, ...]) -> None:
    assert heavy_in(modules_after(*argv)) == []


def test_search_over_http_loads_no_grpc() -> None:
    loaded = modules_after("search", "what do I like?")
    assert not [m for m in loaded if m.startswith(("grpc", "engram_core.grpc_gen", "nats"))]


def test_engram_up_loads_no_other_command() -> None:
    """The supervisor ``make run`` leaves running for hours held every command's modules
    (139 MB resident at idle, the benchmarks' numpy and FastStream among them)."""
    assert heavy_in(modules_after("up", "--help")) == []
