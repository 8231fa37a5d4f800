"""``engram up``: the whole local stack as separate processes under one supervisor.

Starts a real nats-server with JetStream under the data dir, then the retrieval
service, the gateway and the workers as child processes; prefixes and tees their
logs; waits until each is ready; prints where each listens; and on Ctrl-C (or when
any child dies) stops everything in reverse order. State lives under the data dir,
so a second ``engram up`` reuses it.

The workers share one process (``engram-workers``, component ``workers``), each still
its own durable consumer with its own health port, so a laptop install stays small;
``process_per_worker`` (``engram up --process-per-worker``) starts one process per
worker (``engram-<name>``, component ``<name>``), the layout the chart deploys;
``light`` (``engram up --light``) runs retrieval and the workers in one process
(:mod:`engram_cli.stack.node`, component ``node``), the workers calling retrieval
without a channel: the smallest footprint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

import httpx2

from engram_cli.cli_common import WORKERS, CliSettings, reachable_address
from engram_cli.stack.nats_server import NatsServerProcess, port_is_open
from engram_core.settings import parse_nats_urls

READY_TIMEOUT_S = 180.0
#: The component that runs every worker in one process (unless ``process_per_worker``).
ALL_WORKERS = "workers"
#: The component that runs retrieval and every worker in one process (``light``).
NODE = "node"
STOP_TIMEOUT_S = 15.0
#: A piece that exits after the stack is up is started again, up to this many times in
#: RESTART_WINDOW_S; one more exit in the window stops the stack (a crash loop is a bug
#: or a bad setting: said, not hidden behind restarts).
MAX_RESTARTS = 5
RESTART_WINDOW_S = 120.0
#: ``engram up`` reads the CLI's one settings class: where it places each piece is where
#: the client commands look for it.
StackSettings = CliSettings


@dataclass
class Component:
    name: str
    command: list[str]
    env: dict[str, str]
    endpoint: str
    is_ready: Callable[[], bool]
    process: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = None
    log: IO[bytes] | None = field(default=None, repr=False)


def _http_ok(*urls: str) -> Callable[[], bool]:
    """Ready once every URL answers 200."""

    def check() -> bool:
        try:
            return all(httpx2.get(url, timeout=1.0).status_code == 200 for url in urls)
        except httpx2.HTTPError:
            return False

    return check


def _listening(address: str) -> Callable[[], bool]:
    """Ready once ``address`` accepts connections: retrieval binds its port only after
    its models are loaded and its store is open, and reports SERVING right after, so a
    connection means ready without loading gRPC into the supervisor (13 MB resident,
    docs/benchmarks.md, footprint)."""
    host, _, port = address.rpartition(":")

    def check() -> bool:
        return port_is_open(host.strip("[]"), int(port))

    return check


def services_log_format(
    settings: CliSettings, *, terminal: bool, extra_env: dict[str, str] | None = None
) -> str:
    """The ``ENGRAM_LOG_FORMAT`` ``engram up`` gives its services: the one set (in the
    environment or ``extra_env``) as json or console; else console when their lines go
    to a terminal (a developer watching), JSON otherwise (a file, a pipe, CI). The
    services' own stderr is always a pipe to ``up``, so ``auto`` is decided here."""
    wanted = (extra_env or {}).get("ENGRAM_LOG_FORMAT", "").strip().lower()
    if not wanted and "log_format" in settings.model_fields_set:
        wanted = settings.log_format
    if wanted in ("json", "console"):
        return wanted
    return "console" if terminal else "json"


def _script(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


class Stack:
    def __init__(
        self,
        settings: CliSettings,
        *,
        echo: Callable[[str], None] = print,
        relay_logs: bool = True,
        extra_env: dict[str, str] | None = None,
        workers: tuple[str, ...] = WORKERS,
        process_per_worker: bool = False,
        light: bool = False,
    ) -> None:
        unknown = set(workers) - set(WORKERS)
        if unknown:
            raise ValueError(f"unknown workers: {sorted(unknown)}")
        if light and process_per_worker:
            raise ValueError("light runs the workers in retrieval's process: not one per worker")
        self.light = light
        self.settings = settings
        self.extra_env = extra_env or {}
        self.workers = workers
        self.process_per_worker = process_per_worker
        self.echo = echo
        self.relay_logs = relay_logs
        self.log_format = services_log_format(
            settings, terminal=relay_logs and sys.stdout.isatty(), extra_env=self.extra_env
        )
        self.data_dir = settings.data_dir.resolve()
        self.log_dir = self.data_dir / "logs"
        self._restarts: dict[str, list[float]] = {}  # when each piece was started again
        #: Set by Ctrl-C / SIGTERM: a restart waiting for its piece to be ready gives up.
        self.stop_requested = threading.Event()
        # A local stack runs one nats-server: the first URL of the list.
        nats = urlparse(parse_nats_urls(settings.nats_url)[0])
        self.nats = NatsServerProcess(
            self.data_dir / "nats",
            port=nats.port or 4222,
            host=nats.hostname or "127.0.0.1",
            log_file=self.log_dir / "nats.log",
        )
        self.components = self._components()
        self._stopping = False

    def _components(self) -> list[Component]:
        s = self.settings
        base = {
            **os.environ,
            **self.extra_env,
            "ENGRAM_DATA_DIR": str(self.data_dir),
            "ENGRAM_NATS_URL": s.nats_url,
            "ENGRAM_RETRIEVAL_ADDRESS": reachable_address(s.retrieval_listen),
            "PYTHONUNBUFFERED": "1",
        }
        base["ENGRAM_LOG_FORMAT"] = self.log_format
        gateway_url = s.local_gateway_url
        retrieval_env = {**base, "ENGRAM_RETRIEVAL_LISTEN": s.retrieval_listen}
        if self.light:
            first = [self._node_component(retrieval_env)]
        else:
            first = [
                Component(
                    name="retrieval",
                    command=[_script("engram-retrieval")],
                    env={**retrieval_env, "OTEL_SERVICE_NAME": "engram-retrieval"},
                    endpoint=f"grpc://{s.retrieval_listen}",
                    is_ready=_listening(reachable_address(s.retrieval_listen)),
                )
            ]
        return [
            *first,
            Component(
                name="gateway",
                command=[_script("engram-gateway")],
                env={
                    **base,
                    "OTEL_SERVICE_NAME": "engram-gateway",
                    "ENGRAM_GATEWAY_HOST": s.gateway_host,
                    "ENGRAM_GATEWAY_PORT": str(s.gateway_port),
                },
                endpoint=f"{gateway_url}/v1",
                # The gateway serves chats before its channel to retrieval is up (a chat
                # then goes without memory); `up` started retrieval, so it waits for both.
                is_ready=_http_ok(f"{gateway_url}/readyz", f"{gateway_url}/readyz/memory"),
            ),
            *([] if self.light else self._worker_components(base)),
        ]

    def _node_component(self, env: dict[str, str]) -> Component:
        ports = {w: p for w, p in self.worker_health_ports().items() if w in self.workers}
        command = [
            sys.executable,
            "-m",
            "engram_cli.stack.node",
            "--health-port-base",
            str(self.settings.health_port_base),
        ]
        if tuple(ports) != WORKERS:
            command += ["--only", ",".join(ports)]
        listening = _listening(reachable_address(self.settings.retrieval_listen))
        workers_ready = _http_ok(*(f"http://127.0.0.1:{p}/readyz" for p in ports.values()))
        return Component(
            name=NODE,
            command=command,
            env={
                **{k: v for k, v in env.items() if k != "ENGRAM_HEALTH_PORT"},
                "OTEL_SERVICE_NAME": "engram-node",
            },
            endpoint=f"grpc://{self.settings.retrieval_listen}, workers' health "
            + ", ".join(f"{w} http://127.0.0.1:{p}/readyz" for w, p in ports.items()),
            is_ready=lambda: listening() and workers_ready(),
        )

    def _worker_components(self, base: dict[str, str]) -> list[Component]:
        ports = {w: p for w, p in self.worker_health_ports().items() if w in self.workers}
        if not ports:
            return []
        if self.process_per_worker:
            return [
                Component(
                    name=worker,
                    command=[_script(f"engram-{worker}")],
                    env={
                        **base,
                        "OTEL_SERVICE_NAME": f"engram-{worker}",
                        "ENGRAM_HEALTH_PORT": str(port),
                    },
                    endpoint=f"health http://127.0.0.1:{port}/readyz",
                    is_ready=_http_ok(f"http://127.0.0.1:{port}/readyz"),
                )
                for worker, port in ports.items()
            ]
        command = [
            _script("engram-workers"),
            "--health-port-base",
            str(self.settings.health_port_base),
        ]
        if tuple(ports) != WORKERS:
            command += ["--only", ",".join(ports)]
        env = {key: value for key, value in base.items() if key != "ENGRAM_HEALTH_PORT"}
        return [
            Component(
                name=ALL_WORKERS,
                command=command,
                env={**env, "OTEL_SERVICE_NAME": "engram-workers"},
                endpoint="health "
                + ", ".join(f"{w} http://127.0.0.1:{p}/readyz" for w, p in ports.items()),
                is_ready=_http_ok(*(f"http://127.0.0.1:{p}/readyz" for p in ports.values())),
            )
        ]

    def worker_health_ports(self) -> dict[str, int]:
        return self.settings.worker_health_ports()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.echo(f"engram: data dir {self.data_dir}")
        self.echo(
            f"engram: service logs as {self.log_format} (ENGRAM_LOG_FORMAT=json|console), "
            f"also in {self.log_dir}"
        )
        self.nats.start()
        self.echo(f"engram: nats       ready  {self.nats.url} (JetStream, {self.nats.store_dir})")
        if self.process_per_worker:
            self.echo("engram: a process per worker (--process-per-worker)")
        elif self.light:
            self.echo(
                f"engram: retrieval and the workers ({', '.join(self.workers)}) share one "
                "process (--light), each worker its own durable consumer"
            )
        else:
            self.echo(
                f"engram: the workers ({', '.join(self.workers)}) share one process, each "
                "its own durable consumer; --process-per-worker runs one process each"
            )
        for component in self.components:
            self._spawn(component)
        self._wait_ready()

    def _spawn(self, component: Component) -> None:
        component.log = (self.log_dir / f"{component.name}.log").open("ab")
        component.process = subprocess.Popen(
            component.command,
            env=component.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops children
        )
        component.pump = threading.Thread(target=self._pump, args=(component,), daemon=True)
        component.pump.start()

    def _pump(self, component: Component) -> None:
        assert component.process is not None and component.process.stdout is not None
        prefix = f"[{component.name}] ".encode()
        for line in component.process.stdout:
            if component.log is not None:
                component.log.write(line)
                component.log.flush()
            if self.relay_logs:
                sys.stdout.buffer.write(prefix + line)
                sys.stdout.buffer.flush()

    def _wait_ready(self) -> None:
        pending = list(self.components)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while pending:
            self.check_alive()
            for component in list(pending):
                if component.is_ready():
                    pending.remove(component)
                    self.echo(f"engram: {component.name:<10} ready  {component.endpoint}")
            if time.monotonic() > deadline:
                names = ", ".join(c.name for c in pending)
                raise RuntimeError(f"not ready after {READY_TIMEOUT_S:.0f}s: {names}")
            time.sleep(0.25)
        gateway = next(c for c in self.components if c.name == "gateway")
        self.echo(f"engram: up. Point your OpenAI client at {gateway.endpoint} (Ctrl-C stops)")

    def restart(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one component with ``sig`` and start it again (fault-injection tests)."""
        self.kill(name, sig)
        self.revive(name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Stop one component with ``sig`` and leave it down (fault-injection tests)."""
        component = self._component(name)
        if component.process is not None:
            component.process.send_signal(sig)
            component.process.wait(timeout=STOP_TIMEOUT_S)
        self._reap(component)

    def _reap(self, component: Component) -> None:
        """Forget an exited process: its log pump drained, its pipe and log closed."""
        if component.process is not None:
            if component.pump is not None:
                component.pump.join(timeout=2)
            if component.process.stdout is not None:
                component.process.stdout.close()
            component.process = None
        if component.log is not None:
            component.log.close()
            component.log = None

    def revive(self, name: str) -> None:
        """Start a component :meth:`kill` stopped; return once it is ready."""
        component = self._component(name)
        self._spawn(component)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not component.is_ready() and not self.stop_requested.is_set():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready after restart")
            time.sleep(0.1)

    def _component(self, name: str) -> Component:
        for component in self.components:
            if component.name == name:
                return component
        shared = (
            ""
            if self.process_per_worker
            else f"; the workers share the process {ALL_WORKERS!r} (process_per_worker=True "
            "gives each its own)"
        )
        raise ValueError(
            f"no component {name!r} (have {', '.join(c.name for c in self.components)}){shared}"
        )

    def check_alive(self) -> None:
        if self.nats.process is not None and self.nats.process.poll() is not None:
            raise RuntimeError(f"nats-server exited with {self.nats.process.returncode}")
        for component in self.components:
            if component.process is not None and component.process.poll() is not None:
                raise RuntimeError(
                    f"{component.name} exited with {component.process.returncode}; "
                    f"see {self.log_dir / (component.name + '.log')}"
                )

    def keep_alive(self) -> None:
        """Start again what exited since the stack came up (nats-server on its store,
        a service once nats-server listens); raise when one exits more than
        :data:`MAX_RESTARTS` times within :data:`RESTART_WINDOW_S`."""
        nats = self.nats.process
        if nats is not None and nats.poll() is not None:
            self._count_restart("nats-server", nats.returncode, self.nats.log_file)
            self.nats.kill()  # closes its log
            self.nats.start()
            self.echo(f"engram: nats       ready  {self.nats.url} (restarted on its store)")
        for component in self.components:
            process = component.process
            if process is not None and process.poll() is not None:
                log = self.log_dir / f"{component.name}.log"
                self._count_restart(component.name, process.returncode, log)
                self._reap(component)
                self.revive(component.name)
                if not self.stop_requested.is_set():
                    self.echo(
                        f"engram: {component.name:<10} ready  {component.endpoint} (restarted)"
                    )

    def _count_restart(self, name: str, code: int | None, log: Path | None) -> None:
        now = time.monotonic()
        recent = [t for t in self._restarts.get(name, []) if now - t < RESTART_WINDOW_S]
        where = f"; see {log}" if log is not None else ""
        if len(recent) >= MAX_RESTARTS:
            raise RuntimeError(
                f"{name} exited with {code} for the {len(recent) + 1}th time in "
                f"{RESTART_WINDOW_S:.0f}s; not restarting it again{where}"
            )
        self._restarts[name] = [*recent, now]
        self.echo(
            f"engram: {name} exited with {code}; starting it again "
            f"({len(recent) + 1} of {MAX_RESTARTS} in {RESTART_WINDOW_S:.0f}s){where}"
        )

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        self.echo("engram: stopping")
        for component in reversed(self.components):
            process = component.process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for component in reversed(self.components):
            process = component.process
            if process is None:
                continue
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.echo(f"engram: {component.name} did not stop in {STOP_TIMEOUT_S}s; killing")
                process.kill()
                process.wait()
            if component.pump is not None:
                component.pump.join(timeout=2)
            if process.stdout is not None:
                process.stdout.close()
            if component.log is not None:
                component.log.close()
        self.nats.stop()
        self.echo("engram: stopped")


def run_stack(
    settings: CliSettings, *, process_per_worker: bool = False, light: bool = False
) -> int:
    """Run until Ctrl-C / SIGTERM; a piece that exits is started again, one caught in a
    crash loop stops the stack (:meth:`Stack.keep_alive`). Returns the exit code."""
    stack = Stack(settings, process_per_worker=process_per_worker, light=light)
    stop_requested = stack.stop_requested

    def request_stop(signum: int, _frame: object) -> None:
        stop_requested.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    code = 0
    try:
        if port_is_open(settings.gateway_host, settings.gateway_port):
            raise RuntimeError(
                f"{settings.gateway_host}:{settings.gateway_port} is in use: is Engram already up?"
            )
        stack.start()
        while not stop_requested.wait(0.5):
            stack.keep_alive()
    except RuntimeError as exc:
        print(f"engram: error: {exc}", file=sys.stderr)
        code = 1
    finally:
        stack.stop()
    return code
