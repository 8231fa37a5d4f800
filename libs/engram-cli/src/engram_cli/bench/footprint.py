"""``engram bench footprint``: what ``make run`` holds in memory before the first chat.

Runs ``engram up`` as ``make run`` does (the real command, its own process, a fresh data
dir, free ports), once per layout: the workers in one process (``shared``, the default)
and ``--process-per-worker`` (``per_process``, the chart's layout). Once ``up`` says
``engram: up.`` (every ``/readyz`` answered), it waits ``--idle-s`` seconds and reads
every process of the tree — the supervisor, nats-server, retrieval, the gateway, the
workers and their children:

- ``rss_mb``: resident memory (``VmRSS``); their sum is what the target (500 MB) counts,
  the way ``ps`` or a task manager adds it up;
- ``anon_rss_mb`` / ``file_rss_mb``: what the resident set is, the process's own memory
  and mapped files (libraries, model weights; pages the kernel can drop and read back);
- ``pss_mb``: proportional set size (``Pss`` in ``smaps_rollup``): a page shared by n
  processes counts 1/n in each, so the sum counts a shared library once — what the
  machine actually gives the stack.

Then Ctrl-C, as a person would. The scripted LLM runs in this process (not counted);
nothing calls it at idle.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engram_cli.bench.common import child_processes, process_memory_mb
from engram_cli.console import print_table
from engram_cli.stack.nats_server import free_port, free_port_block
from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream
from engram_core.worker_catalog import WORKER_CATALOG

#: What the issue asks of a single-machine install at idle, summed RSS.
TARGET_MB = 500.0
LAYOUTS = {"shared": [], "per_process": ["--process-per-worker"], "light": ["--light"]}
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, parents first."""
    found = [pid]
    try:
        children = child_processes(pid)
    except OSError:
        return found
    for child in children:
        found += descendants(child)
    return found


def process_label(pid: int) -> str:
    """``engram-workers``, ``nats-server``...: the program, not the interpreter."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [os.path.basename(a.decode(errors="replace")) for a in argv if a]
    if len(words) > 2 and words[0].startswith("python") and words[1] == "-m":
        return words[2]  # python -m engram_cli.stack.node
    if len(words) > 1 and words[0].startswith("python"):
        return words[1]
    return words[0] if words else str(pid)


def pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def footprint(root: int) -> dict[str, Any]:
    """Every process under ``root`` (``engram up``) with its RSS and PSS, and the sums."""
    processes: list[dict[str, Any]] = []
    for pid in descendants(root):
        try:
            memory = process_memory_mb(pid)
            processes.append(
                {
                    "process": process_label(pid),
                    "pid": pid,
                    "rss_mb": memory["rss_mb"],
                    "pss_mb": pss_mb(pid),
                    "anon_rss_mb": memory.get("anon_rss_mb", 0.0),
                    "file_rss_mb": memory.get("file_rss_mb", 0.0),
                }
            )
        except (OSError, KeyError):  # gone in between: not part of the idle stack
            continue
    return {
        "processes": processes,
        "count": len(processes),
        "rss_mb": round(sum(p["rss_mb"] for p in processes), 1),
        "pss_mb": round(sum(p["pss_mb"] for p in processes), 1),
    }


class EngramUp:
    """``engram up`` in a process of its own, its output read in a thread."""

    def __init__(self, flags: list[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "engram"), "up", *flags],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_until_up(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(line.startswith("engram: up.") for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.lines[-30:])
                raise RuntimeError(f"engram up did not come up; its output's tail:\n{tail}")
            time.sleep(0.2)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._reader.join(timeout=5)
        return code


def measure(
    layout: str, idle_s: float, llm_url: str, echo: Callable[[str], None]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="engram-footprint-") as data_dir:
        env = {
            **os.environ,
            "ENGRAM_DATA_DIR": data_dir,
            "ENGRAM_NATS_URL": f"nats://127.0.0.1:{free_port()}",
            "ENGRAM_GATEWAY_PORT": str(free_port()),
            "ENGRAM_RETRIEVAL_LISTEN": f"127.0.0.1:{free_port()}",
            "ENGRAM_HEALTH_PORT_BASE": str(free_port_block(len(WORKER_CATALOG))),
            "ENGRAM_LLM_BASE_URL": llm_url,
            "ENGRAM_LOG_FORMAT": "json",
        }
        env.pop("ENGRAM_RETRIEVAL_ADDRESS", None)
        env.pop("ENGRAM_GATEWAY_URL", None)
        echo(f"{layout}: engram up {' '.join(LAYOUTS[layout])}".rstrip())
        up = EngramUp(LAYOUTS[layout], env)
        try:
            started = time.monotonic()
            up.wait_until_up(READY_TIMEOUT_S)
            ready_s = round(time.monotonic() - started, 1)
            echo(f"{layout}: up in {ready_s}s; idle for {idle_s:g}s")
            time.sleep(idle_s)
            result = footprint(up.process.pid)
        finally:
            code = up.stop()
        return {**result, "ready_s": ready_s, "idle_s": idle_s, "exit_code": code}


def _rows(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for layout, result in results.items():
        for p in result["processes"]:
            rows.append(
                [
                    layout,
                    p["process"],
                    f"{p['rss_mb']:.1f}",
                    f"{p['pss_mb']:.1f}",
                    f"{p['anon_rss_mb']:.1f}",
                    f"{p['file_rss_mb']:.1f}",
                ]
            )
        rows.append(
            [
                layout,
                f"= {result['count']} processes",
                f"{result['rss_mb']:.1f}",
                f"{result['pss_mb']:.1f}",
                "",
                "",
            ]
        )
    return rows


def _cmd_footprint(args: argparse.Namespace) -> int:
    layouts = [name.strip() for name in args.layouts.split(",") if name.strip()]
    unknown = set(layouts) - set(LAYOUTS)
    if unknown or not layouts:
        print(
            f"engram bench footprint: --layouts takes {', '.join(LAYOUTS)} (got {args.layouts!r})",
            file=sys.stderr,
        )
        return 2
    upstream = ScriptedUpstream(replies=[RuleBasedBrain()]).start()
    try:
        results = {
            layout: measure(layout, args.idle_s, upstream.base_url, _stderr) for layout in layouts
        }
    finally:
        upstream.stop()
    print_table(["layout", "process", "RSS MB", "PSS MB", "anon MB", "file MB"], _rows(results))
    for layout, result in results.items():
        verdict = "meets" if result["rss_mb"] <= TARGET_MB else "misses"
        print(
            f"{layout}: {result['rss_mb']:.1f} MB RSS summed {verdict} the {TARGET_MB:g} MB target"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "footprint",
        "target_rss_mb": TARGET_MB,
        "cpus": os.cpu_count(),
        "layouts": results,
    }
    (out / "results.json").write_text(json.dumps(document, indent=2))
    print(f"saved {out / 'results.json'}", file=sys.stderr)
    return 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def add_footprint_parser(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = kinds.add_parser(
        "footprint", help="memory of every process `engram up` starts, idle after ready"
    )
    parser.add_argument(
        "--layouts",
        default="shared,per_process,light",
        help="shared (the workers in one process, the default of engram up), per_process "
        "(--process-per-worker), light (--light: retrieval and the workers in one "
        "process); comma-separated",
    )
    parser.add_argument(
        "--idle-s", type=float, default=30.0, help="seconds idle after ready before reading"
    )
    parser.add_argument("--out", default="bench-results/footprint", help="output directory")
    parser.set_defaults(func=handler, run=_cmd_footprint)
