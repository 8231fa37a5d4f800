"""What machine a benchmark ran on, and how fast it is, so runs on different days can be
set side by side.

Two machines of the same kind ("2 cores") are not equally fast: the same tree stored
218 memories/s on one and 366/s on another (docs/benchmarks.md). Every ``results.json``
therefore records the CPU's model and a calibration: the best of three runs of two fixed
workloads shaped like Engram's hot paths, the Python one (building, serialising and
hashing small dicts, as events, payloads and protobufs are) and the numpy one (float32
dot products of MiniLM-sized vectors, as ranking is). A run whose calibration is 1.5
times another's ran on a machine about that much slower; compare its figures with that
in mind, or better, re-run the baseline in the same sitting.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

_CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = _CPUINFO) -> str:
    """The CPU's model name as the kernel reports it (``unknown`` where it does not)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return platform.processor() or "unknown"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or "unknown"


def _python_workload() -> int:
    digest = 0
    for i in range(20_000):
        event = {"id": i, "kind": "turn", "text": f"message number {i}", "tags": ["a", "b"]}
        blob = json.dumps(event, sort_keys=True).encode()
        digest ^= hashlib.sha256(blob).digest()[0]
    return digest


def _numpy_workload() -> float:
    rng = np.random.default_rng(7)
    query = rng.standard_normal(384, dtype=np.float32)
    pool = rng.standard_normal((160, 384), dtype=np.float32)
    total = 0.0
    for _ in range(10_000):
        total += float((pool @ query).max())
    return total


def _best_ms(work: Callable[[], object], runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000.0, 1)


def calibration() -> dict[str, float]:
    """Milliseconds of each fixed workload on this machine now (lower is faster)."""
    return {"python_ms": _best_ms(_python_workload), "numpy_ms": _best_ms(_numpy_workload)}


def describe_machine(*, calibrate: bool = True) -> dict[str, Any]:
    """The ``machine`` entry of every benchmark's ``results.json``."""
    described: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
    }
    if calibrate:
        described["calibration"] = calibration()
    return described


def machine_line(machine: dict[str, Any]) -> str:
    """One line for a benchmark's output: what ran it and how fast it is."""
    line = f"machine: {machine['cpu_model']}, {machine['cpus']} CPUs"
    cal = machine.get("calibration")
    if cal:
        line += f"; calibration python {cal['python_ms']} ms, numpy {cal['numpy_ms']} ms"
    return line


def measured_machine() -> dict[str, Any]:
    """:func:`describe_machine`, said on stderr as well: a benchmark calls it before it
    starts anything, so the calibration reads the machine as the run found it."""
    machine = describe_machine()
    sys.stderr.write(machine_line(machine) + "\n")
    return machine
