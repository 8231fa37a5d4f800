"""`engram up` and `engram up --light` (what `make run` runs): starts everything, serves
the official openai client (stream and non-stream), stops cleanly on Ctrl-C, and reuses
its data."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest

from engram_cli.stack.scripted_llm import RuleBasedBrain
from engram_testing.upstream import ScriptedUpstream

from .conftest import count_memories, stack_settings, wait_for

pytestmark = pytest.mark.e2e


class EngramUp:
    def __init__(self, env: dict[str, str], *flags: str) -> None:
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

    def wait_for_line(self, prefix: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(line.startswith(prefix) for line in self.lines):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.lines[-40:])
                raise AssertionError(f"no line starting {prefix!r}; output tail:\n{tail}")
            time.sleep(0.1)

    def interrupt(self, timeout_s: float = 60) -> int:
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


@pytest.mark.parametrize(
    ("flags", "shared_by", "serving"),
    [
        ((), "workers", "retrieval.listening"),
        (("--light",), "node", "node.serving"),  # make run
    ],
)
async def test_engram_up_serves_chats_stops_cleanly_and_keeps_data(
    tmp_path: Path,
    scripted_upstream: ScriptedUpstream,
    flags: tuple[str, ...],
    shared_by: str,
    serving: str,
) -> None:
    settings = stack_settings(tmp_path / "data")
    env = {
        **os.environ,
        "ENGRAM_DATA_DIR": str(settings.data_dir),
        "ENGRAM_NATS_URL": settings.nats_url,
        "ENGRAM_GATEWAY_PORT": str(settings.gateway_port),
        "ENGRAM_RETRIEVAL_LISTEN": settings.retrieval_listen,
        "ENGRAM_HEALTH_PORT_BASE": str(settings.health_port_base),
        "ENGRAM_LLM_BASE_URL": scripted_upstream.base_url,
    }
    scripted_upstream.replies = [
        RuleBasedBrain("Hello from upstream", "Streaming hello from upstream")
    ]
    base_url = f"http://127.0.0.1:{settings.gateway_port}/v1"

    up = EngramUp(env, *flags)
    try:
        up.wait_for_line("engram: up.")
        assert any(base_url in line for line in up.lines)  # it says where to point clients
        # the workers share one process, and up says so (--process-per-worker: one each)
        assert any("share one process" in line for line in up.lines), "\n".join(up.lines)
        assert any(line.startswith(f"engram: {shared_by:<10} ready") for line in up.lines)
        # Every worker and retrieval run on uvloop (ENGRAM_EVENT_LOOP=auto, installed).
        started = [line for line in up.lines if "worker.started" in line]
        listening = [line for line in up.lines if serving in line]
        assert len(started) == 6 and len(listening) == 1, "\n".join(up.lines)
        assert all("uvloop" in line for line in started + listening), "\n".join(started)
        client = openai.OpenAI(base_url=base_url, api_key="sk-test")
        reply = client.chat.completions.create(
            model="scripted-model",
            messages=[{"role": "user", "content": "I keep bees."}],
            extra_body={"memory_id": "bees"},
        )
        assert reply.choices[0].message.content == "Hello from upstream"
        streamed = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(
                model="scripted-model",
                stream=True,
                extra_body={"memory_id": "bees"},
                messages=[{"role": "user", "content": "Say hello, streaming."}],
            )
            if chunk.choices
        )
        assert streamed == "Streaming hello from upstream"
        # The client commands find the relocated stack from the same variables alone.
        status = await asyncio.to_thread(
            subprocess.run,
            [str(Path(sys.executable).parent / "engram"), "status", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["services"]["gateway"]["url"] == base_url.removesuffix("/v1") + "/readyz"
        assert report["services"]["retrieval"]["address"] == settings.retrieval_listen
        assert report["services"]["ingest"]["url"].endswith(f":{settings.health_port_base}/readyz")
        await wait_for(
            lambda: _at_least(settings.retrieval_listen, "bees", 4), 30, what="four turns indexed"
        )
    finally:
        code = up.interrupt()
    assert code == 0, "\n".join(up.lines[-40:])
    assert up.lines[-1] == "engram: stopped"

    again = EngramUp(env, *flags)
    try:
        again.wait_for_line("engram: up.")
        assert await count_memories(settings.retrieval_listen, "default", "bees") == 4
    finally:
        assert again.interrupt() == 0


async def _at_least(address: str, conversation: str, n: int) -> bool:
    return await count_memories(address, "default", conversation) >= n
