"""Where a process spends its CPU: a sampling profiler built on the standard library.

Enabled by ``ENGRAM_PROFILE_DIR`` (every process; :func:`engram_core.observability.
setup_observability` starts it). py-spy would be the first choice, but it needs ptrace
rights containers rarely grant; cProfile's per-call hooks multiply the cost of the very
code being measured. Here the kernel's profiling timer (``ITIMER_PROF``) sends the
process ``SIGPROF`` every :data:`INTERVAL_S` of CPU it uses; the handler runs in the main
thread where it was interrupted (between two bytecodes, so the time of a C call goes to
the Python function that made it) and looks at every Python thread: one that used CPU
since the last look and is not parked in a wait (the event loop's ``select``, a pool
thread waiting for work) has its stack counted once. Each thread's counts are then
scaled to the CPU it really used (``/proc/self/task/<tid>/schedstat``, ns), so a
function's weight is CPU milliseconds. CPU of threads Python does not know (ONNX
Runtime's and gRPC's own) is the process's CPU minus the Python threads'. The signal
interrupts system calls, which Python and well-behaved libraries retry: a mode for
benchmarks and investigations, off by default.

Sampling starts with the process; ``SIGUSR2`` writes the window sampled so far and
pauses, ``SIGUSR1`` starts a new window (what was sampled before is dropped), and a
normal exit writes the window in progress. ``engram bench overhead`` pauses every
process once the stack is up and samples one load phase. Files:

- ``<dir>/<service>-<pid>.folded``: one line per distinct stack, rooted at its thread,
  ``thread;root;...;leaf <CPU µs>`` (the input of flame graph tools: speedscope,
  flamegraph.pl, inferno);
- ``<dir>/<service>-<pid>.json``: the window's length, the process's CPU, the CPU the
  Python threads used, and per function its own and total (inclusive) CPU in ms.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

#: Seconds of the process's CPU between two looks.
INTERVAL_S = 0.005
#: Functions written to the JSON summary (the folded stacks keep everything).
TOP_FUNCTIONS = 300
_MARKERS = ("/site-packages/", "/src/", "/lib/python3")


def frame_label(frame: FrameType) -> str:
    """``qualname (path:line)``, the path from the package root."""
    code = frame.f_code
    path = code.co_filename
    for marker in _MARKERS:
        cut = path.rfind(marker)
        if cut >= 0:
            path = path[cut + len(marker) :]
            break
    return f"{code.co_qualname} ({path}:{code.co_firstlineno})"


def stack_of(frame: FrameType | None) -> list[str]:
    """The stack from the outermost frame to ``frame``."""
    labels: list[str] = []
    while frame is not None:
        labels.append(frame_label(frame))
        frame = frame.f_back
    labels.reverse()
    return labels


def thread_cpu_ns(native_id: int) -> int | None:
    """CPU time a thread of this process has used, in ns (None once it is gone)."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat", "rb") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


#: Innermost frames of a thread that waits (the CPU it used since the last look was
#: spent before it got there): the event loop's select (uvloop's loop is C, under ``Runner.run``), a
#: pool thread waiting for work, condition and queue waits.
_WAITS = frozenset(
    {
        ("select", "selectors.py"),
        ("run", "asyncio/runners.py"),
        ("_worker", "concurrent/futures/thread.py"),
        ("wait", "threading.py"),
        ("get", "queue.py"),
    }
)


def is_waiting(frame: FrameType) -> bool:
    code = frame.f_code
    return any(
        code.co_name == name and code.co_filename.endswith(suffix) for name, suffix in _WAITS
    )


@dataclass
class Window:
    """What was sampled since the window started: per thread, its stacks' weights (time
    it was seen busy in them) and the CPU it used."""

    started_wall: float = field(default_factory=time.monotonic)
    started_process_cpu: float = field(default_factory=time.process_time)
    stacks: Counter[tuple[int, tuple[str, ...]]] = field(default_factory=Counter)
    seen_ns: Counter[int] = field(default_factory=Counter)
    cpu_ns: Counter[int] = field(default_factory=Counter)
    names: dict[int, str] = field(default_factory=dict)

    def add(self, thread: int, stack: list[str] | None, seen_ns: int, cpu_ns: int) -> None:
        """``stack`` None: the thread used CPU but is waiting now."""
        self.cpu_ns[thread] += cpu_ns
        if stack is not None:
            self.stacks[(thread, tuple(stack))] += seen_ns
            self.seen_ns[thread] += seen_ns

    def cpu_stacks(self) -> Counter[tuple[str, ...]]:
        """Stacks weighted by CPU ns, each rooted at its thread's name."""
        weighted: Counter[tuple[str, ...]] = Counter()
        for (thread, stack), seen in self.stacks.items():
            share = self.cpu_ns[thread] / self.seen_ns[thread]
            weighted[(f"thread {self.names.get(thread, thread)}", *stack)] += round(seen * share)
        return weighted

    def functions(self, stacks: Counter[tuple[str, ...]]) -> list[dict[str, object]]:
        own: Counter[str] = Counter()
        total: Counter[str] = Counter()
        for stack, ns in stacks.items():
            own[stack[-1]] += ns
            for label in set(stack[1:]):
                total[label] += ns
        ranked = sorted(total, key=lambda label: (own[label], total[label]), reverse=True)
        return [
            {
                "function": label,
                "own_ms": round(own[label] / 1e6, 2),
                "total_ms": round(total[label] / 1e6, 2),
            }
            for label in ranked[:TOP_FUNCTIONS]
        ]

    def summary(self, service: str) -> dict[str, object]:
        stacks = self.cpu_stacks()
        unseen = sum(ns for thread, ns in self.cpu_ns.items() if not self.seen_ns[thread])
        return {
            "service": service,
            "pid": os.getpid(),
            "window_s": round(time.monotonic() - self.started_wall, 3),
            "process_cpu_ms": round((time.process_time() - self.started_process_cpu) * 1e3, 1),
            "python_threads_cpu_ms": round(sum(self.cpu_ns.values()) / 1e6, 1),
            "never_seen_busy_ms": round(unseen / 1e6, 1),
            "interval_s": INTERVAL_S,
            "functions": self.functions(stacks),
        }

    def folded(self) -> str:
        stacks = self.cpu_stacks()
        lines = (f"{';'.join(stack)} {ns // 1000}" for stack, ns in stacks.items())
        return "\n".join(sorted(lines)) + "\n"


class SamplingProfiler:
    """One per process (:func:`start_profiler`); everything runs in the main thread,
    in signal handlers."""

    def __init__(self, service: str, directory: Path) -> None:
        self.service = service
        self.directory = directory
        self.window = Window()
        self.sampling = False
        self._in_sample = False
        self._last_cpu: dict[int, int] = {}

    @property
    def paths(self) -> tuple[Path, Path]:
        stem = f"{self.service}-{os.getpid()}"
        return self.directory / f"{stem}.folded", self.directory / f"{stem}.json"

    def start_window(self) -> None:
        """Drop what was sampled and sample from now on."""
        self.window = Window()
        self._last_cpu.clear()
        self.sampling = True
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)

    def pause(self) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        self.sampling = False

    def sample(self, main_frame: FrameType | None) -> None:
        """Look at every thread: the CPU it used since the last look and, when it is
        busy, its stack. ``main_frame``: where the main thread was interrupted."""
        threads = {t.ident: t for t in threading.enumerate() if t.native_id}
        frames = sys._current_frames()
        main = threading.main_thread().ident
        for ident, frame in frames.items():
            thread = threads.get(ident)
            if thread is None or thread.native_id is None:
                continue
            if ident == main:
                if main_frame is None:
                    continue
                frame = main_frame
            native = thread.native_id
            cpu = thread_cpu_ns(native)
            if cpu is None:
                continue
            used = cpu - self._last_cpu.get(native, cpu)
            self._last_cpu[native] = cpu
            if used <= 0:
                continue
            self.window.names[native] = thread.name
            stack = None if is_waiting(frame) else stack_of(frame)
            self.window.add(native, stack, 1, used)

    def write(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        folded_path, json_path = self.paths
        folded = self.window.folded()
        summary = json.dumps(self.window.summary(self.service), indent=1)
        for path, text in ((folded_path, folded), (json_path, summary)):
            partial = path.with_suffix(path.suffix + ".part")
            partial.write_text(text)
            partial.replace(path)  # readers never see half a file

    def on_prof(self, _signum: int, frame: FrameType | None) -> None:
        if self.sampling and not self._in_sample:  # a signal during the last look: skip
            self._in_sample = True
            try:
                self.sample(frame)
            finally:
                self._in_sample = False

    def on_start(self, _signum: int, _frame: FrameType | None) -> None:
        self.start_window()

    def on_write(self, _signum: int, _frame: FrameType | None) -> None:
        was_sampling = self.sampling
        self.pause()
        if was_sampling:
            self.write()

    def at_exit(self) -> None:
        if self.sampling:
            self.pause()
            self.write()


def start_profiler(service: str, directory: Path) -> SamplingProfiler | None:
    """Sample this process from now until it exits; SIGUSR2 writes the window and
    pauses, SIGUSR1 starts a new one. Only the main thread can install signal handlers:
    from another thread nothing is started (None)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    profiler = SamplingProfiler(service, directory)
    signal.signal(signal.SIGPROF, profiler.on_prof)
    signal.signal(signal.SIGUSR1, profiler.on_start)
    signal.signal(signal.SIGUSR2, profiler.on_write)
    atexit.register(profiler.at_exit)
    profiler.start_window()
    return profiler
