"""Every process that runs the embedding model gives numpy's BLAS one thread: OpenBLAS's
threads spin between calls and take the core the model and the event loop need (on two
cores a Search took twice the CPU). The limit must be in place before numpy loads, so
each entry point is imported in a fresh interpreter and OpenBLAS itself is asked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import ctypes, glob, importlib, os, sys
if sys.argv[1] != "-":
    importlib.import_module(sys.argv[1])
import numpy
libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__), "..", "numpy.libs", "*openblas*"))
if not libs:
    print("no-openblas")
    raise SystemExit
lib = ctypes.CDLL(libs[0])
stems = ("scipy_openblas_get", "openblas_get")
names = [n + s for n in stems for s in ("_num_threads64_", "_num_threads")]
print(next(getattr(lib, n)() for n in names if hasattr(lib, n)))
"""


def blas_threads(module: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    "entry_point",
    [
        "engram_retrieval.__main__",  # engram-retrieval
        "engram_cli.stack.node",  # engram up --light
        "engram_cli.stack.embeddings_server",  # engram serve-embeddings
    ],
)
def test_the_model_processes_give_blas_one_thread(entry_point: str) -> None:
    if (cores := os.cpu_count() or 1) < 2 or blas_threads("-") == "no-openblas":
        pytest.skip(f"numpy here uses no threaded OpenBLAS ({cores} cores)")
    assert blas_threads("-") != "1"  # the probe sees the default it would otherwise get
    assert blas_threads(entry_point) == "1"
