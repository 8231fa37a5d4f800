"""The sampling profiler (ENGRAM_PROFILE_DIR): a process that burns CPU in one function
has that function at the top of its profile, weighted by the CPU it really used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engram_cli.bench_load import parse_server_timing

PROGRAM = """
import sys, time
from pathlib import Path
from engram_core.profiling import start_profiler

def burn_cpu(seconds):
    end = time.process_time() + seconds
    n = 0
    while time.process_time() < end:
        n += 1
    return n

def idle(seconds):
    time.sleep(seconds)

start_profiler("probe", Path(sys.argv[1]))
burn_cpu(0.6)
idle(0.3)
"""


def test_the_busiest_function_leads_the_profile_in_cpu_ms(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], check=True, timeout=60)
    (summary_path,) = tmp_path.glob("probe-*.json")
    (folded_path,) = tmp_path.glob("probe-*.folded")
    summary = json.loads(summary_path.read_text())

    top = summary["functions"][0]
    assert top["function"].startswith("burn_cpu ")
    # Weighted by the thread's CPU counter: about the 0.6 s it burned, not sample counts.
    assert 350 <= top["own_ms"] <= 900, top
    assert not any(f["function"].startswith("idle ") for f in summary["functions"])
    assert summary["process_cpu_ms"] >= top["own_ms"]

    lines = folded_path.read_text().splitlines()
    assert lines and all(line.startswith("thread MainThread;") for line in lines)
    stack, weight = max((line.rsplit(" ", 1) for line in lines), key=lambda p: int(p[1]))
    assert stack.split(";")[-1].startswith("burn_cpu ") and int(weight) > 0


def test_server_timing_values_are_read_in_ms_and_junk_is_skipped() -> None:
    header = 'recall;dur=12.5, pre-upstream;dur=14.02;desc="before", upstream;dur=x, record'
    assert parse_server_timing(header) == {"recall": 12.5, "pre-upstream": 14.02}
