"""The sampling profiler (ENGRAM_PROFILE_DIR): a process that burns CPU in one function
has that function at the top of its profile, weighted by the CPU it really used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from engram_cli.bench.load import RpcCalls, parse_server_timing

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


def _exposition(calls: dict[str, tuple[int, float]]) -> str:
    """Prometheus text as a worker's /metrics serves it: client call histograms by
    method, beside a server histogram whose calls are not the caller's."""
    lines = ["# TYPE rpc_client_call_duration_seconds histogram"]
    for method, (count, seconds) in calls.items():
        labels = f'rpc_method="{method}",rpc_service="engram.v1.MemoryService",rpc_system="grpc"'
        lines += [
            f'rpc_client_call_duration_seconds_bucket{{{labels},le="+Inf"}} {count}',
            f"rpc_client_call_duration_seconds_count{{{labels}}} {count}",
            f"rpc_client_call_duration_seconds_sum{{{labels}}} {seconds}",
        ]
    lines += [
        "# TYPE rpc_server_call_duration_seconds histogram",
        'rpc_server_call_duration_seconds_count{rpc_method="Search"} 999',
        'rpc_server_call_duration_seconds_sum{rpc_method="Search"} 9.0',
    ]
    return "\n".join(lines) + "\n"


async def test_retrieval_calls_are_counted_per_turn_by_caller_and_method() -> None:
    served = {
        "ingest": [{"Get": (10, 0.01)}, {"Get": (30, 0.05), "Upsert": (20, 0.1)}],
        "evict": [{"Count": (5, 0.005)}, {"Count": (5, 0.005)}],
    }

    def metrics(request: httpx2.Request) -> httpx2.Response:
        caller = request.url.host.removesuffix(".test")
        return httpx2.Response(200, text=_exposition(served[caller].pop(0)))

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(metrics)) as http:
        calls = RpcCalls(http, {c: f"http://{c}.test/metrics" for c in served})
        before = await calls.read()
        after = await calls.read()

    table = RpcCalls.per_unit(before, after, units=10)
    # 20 more Gets over 10 turns, 40 ms between them; a method new since the first read
    # counts from zero; a caller that made no call in between is left out.
    assert table == {
        "ingest": {
            "Get": {"per_turn": 2.0, "mean_ms": 2.0},
            "Upsert": {"per_turn": 2.0, "mean_ms": 5.0},
        }
    }


async def test_an_unreachable_metrics_endpoint_fails_the_read() -> None:
    def broken(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(503, text="starting")

    async with httpx2.AsyncClient(transport=httpx2.MockTransport(broken)) as http:
        with pytest.raises(httpx2.HTTPStatusError):
            await RpcCalls(http, {"ingest": "http://ingest.test/metrics"}).read()
