"""``engram bench overhead``: what memory adds to a chat, and where the time goes.

One run, one stack (``engram up``'s processes on a fresh data dir, all six workers) and
the scripted upstream in a process of its own (:mod:`engram_cli.bench.load`):

1. **latency**: one client at ``--rate`` chats/s for ``--seconds``, three times: straight
   to the upstream (``direct``), through the gateway with ``memory: false`` (``off``) and
   with memory (``on``, the write path running beside it). Added latency is a
   percentile of ``on`` minus the same percentile of ``off``; ``pre-upstream`` is the
   gateway's own measure (its ``Server-Timing`` header) of the time from a request's
   arrival until it was handed to the upstream.
2. **throughput**: ``--clients`` closed-loop clients for ``--seconds``, memory off, then on.
   Last of all (so its backlog need not drain), memory on with every worker stopped
   (SIGSTOP): what the read path alone costs per chat and allows, the ceiling of the
   on / off ratio however cheap the write path gets.
3. **pipeline**: ``engram bench pipeline``'s driver at ``--pipeline-rate`` turns/s (lag:
   a turn's ``turn.persisted`` to ingest's ``memory.changed``) while every worker's
   backlog is sampled; the phase ends when every worker has drained. Each caller's
   retrieval calls per turn, by method (:class:`~engram_cli.bench.load.RpcCalls`).
4. **profile** (unless ``--no-profile``): the services run with ``ENGRAM_PROFILE_DIR``
   (:mod:`engram_core.profiling`, paused once the stack is up); a shorter pipeline run is
   sampled, and each process's folded stacks and hottest functions are saved.

With ``--api chat,responses,messages`` (any of ``chat``, ``responses``, ``messages``,
``ollama``), the latency phase measures every API in the same phases, the APIs taking
turns chat by chat (each at ``--rate``), each API's bodies sent to its own route (and,
``direct``, to the scripted upstream's same route): what each API's adapter adds before
the upstream is comparable, on one machine under one load. ``latency_by_api`` holds
them and the report prints their ``pre-upstream`` percentiles side by side. The other
phases use the first API.

CPU per chat or turn: each process's kernel counters read before a phase and after the
write path drained, divided by the phase's chats (or turns). The load average is
recorded per phase, so a run on a busy machine says so.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx2
import nats

from engram_cli.bench.common import percentiles
from engram_cli.bench.load import (
    MODES,
    Backlog,
    ChatSample,
    Chatter,
    CpuMeter,
    RpcCalls,
    at_rate,
    closed_loop,
    latency_summary,
    scripted_llm_process,
    signal_services,
    stack_pids,
)
from engram_cli.bench.machine import measured_machine
from engram_cli.bench.overhead_report import (
    collect_profiles,
    plot_overhead,
    print_report,
    targets,
)
from engram_cli.bench.pipeline import drive_pipeline
from engram_cli.bench.writepath import running_stack
from engram_cli.cli_common import WORKERS
from engram_cli.stack.up import Stack
from engram_core.settings import parse_nats_urls

IDLE_S = 5.0
WARM_UP_CHATS = 40


@dataclass(frozen=True)
class OverheadConfig:
    rate: float = 10.0
    seconds: float = 20.0
    clients: int = 32
    conversations: int = 20
    history: int = 4
    pipeline_rate: float = 100.0
    pipeline_turns: int = 2000
    profile: bool = True
    profile_turns: int = 600
    apis: tuple[str, ...] = ("chat",)
    #: ``engram up --light``: retrieval and the workers in one process (no per-worker CPU,
    #: and no workers-stopped phase: stopping them would stop retrieval)
    light: bool = False


#: An API's route on the gateway and on the upstream (below ``/v1``, or the root).
API_PATHS = {
    "chat": ("/v1/chat/completions", "/chat/completions"),
    "responses": ("/v1/responses", "/responses"),
    "messages": ("/v1/messages", "/messages"),
    "ollama": ("/api/chat", "/../api/chat"),
}


class ApiChatter(Chatter):
    """:class:`Chatter`'s chats in another API's body (the same history and facts)."""

    def __init__(
        self, api: str, http: httpx2.AsyncClient, *, gateway: str, upstream: str, **kw: Any
    ) -> None:
        super().__init__(http, gateway=gateway, upstream=upstream, **kw)
        on_gateway, on_upstream = API_PATHS[api]
        direct = (
            upstream.removesuffix("/v1") + on_upstream.removeprefix("/..")
            if api == "ollama"
            else upstream + on_upstream
        )
        self.urls = {"direct": direct, "off": gateway + on_gateway, "on": gateway + on_gateway}
        self.api = api

    def body(self, mode: str) -> dict[str, Any]:
        body = super().body(mode)
        if self.api == "responses":
            body["input"] = body.pop("messages")
        elif self.api == "messages":
            body["max_tokens"] = 256
        elif self.api == "ollama":
            body["stream"] = False
        return body


def _ratio(phase: dict[str, Any], baseline: dict[str, Any]) -> float:
    return round(float(phase["chats_per_s"]) / max(float(baseline["chats_per_s"]), 1e-9), 3)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


class Run:
    """One bench run against a started stack."""

    def __init__(
        self,
        cfg: OverheadConfig,
        stack: Stack,
        chatter: Chatter,
        meter: CpuMeter,
        backlog: Backlog,
        rpc_calls: RpcCalls,
    ) -> None:
        self.cfg = cfg
        self.stack = stack
        self.chatter = chatter
        self.meter = meter
        self.backlog = backlog
        self.rpc_calls = rpc_calls

    async def idle(self) -> dict[str, float]:
        """CPU of the stack doing nothing, ms per second (the floor under every phase)."""
        before = self.meter.read()
        await asyncio.sleep(IDLE_S)
        after = self.meter.read()
        return {
            name: round((after[name] - before[name]) * 1e3 / IDLE_S, 2)
            for name in before
            if name != "bench client"
        }

    async def warm_up(self, chatter: Chatter | None = None) -> None:
        for mode in MODES:
            send = functools.partial((chatter or self.chatter).send, mode)
            await at_rate(send, 20, WARM_UP_CHATS / 20, "warm-up")
        await self.backlog.wait_drained()

    async def latency(self, chatters: dict[str, Chatter]) -> dict[str, dict[str, Any]]:
        """Per API, per mode. The APIs take turns chat by chat within each mode's phase
        (each at ``--rate``), so every API is measured under the same load."""
        by_api: dict[str, dict[str, Any]] = {api: {} for api in chatters}
        order = list(chatters)
        for mode in MODES:
            before, load = self.meter.read(), _load()
            sent: list[str] = []
            samples = await at_rate(
                _taking_turns(chatters, mode, sent),
                self.cfg.rate * len(order),
                self.cfg.seconds,
                f"{mode} at {self.cfg.rate:g}/s x {len(order)} APIs",
            )
            drained_s = await self.backlog.wait_drained()
            self.stack.check_alive()
            cpu = CpuMeter.per_unit(before, self.meter.read(), len(samples))
            for api in order:
                mine = [s for s, a in zip(samples, sent, strict=True) if a == api]
                by_api[api][mode] = {
                    **latency_summary(mine),
                    **_own_time(mine),
                    "cpu_ms_per_chat": cpu,
                    "drained_after_s": round(drained_s, 2),
                    "load_avg_1m": load,
                    "samples_ms": sorted(s.latency_ms for s in mine if s.status == 200),
                }
        return by_api

    async def _closed_loop(self, mode: str, drain: bool) -> dict[str, Any]:
        """``--clients`` closed-loop clients for ``--seconds``; CPU per chat read after
        the write path drained (``drain``) or right away."""
        before, load = self.meter.read(), _load()
        samples, elapsed = await closed_loop(
            functools.partial(self.chatter.send, mode), self.cfg.clients, self.cfg.seconds
        )
        drained = {"drained_after_s": round(await self.backlog.wait_drained(), 2)} if drain else {}
        self.stack.check_alive()
        ok = sum(s.status == 200 for s in samples)
        return {
            **latency_summary(samples),
            "chats_per_s": round(ok / elapsed, 1),
            "cpu_ms_per_chat": CpuMeter.per_unit(before, self.meter.read(), len(samples)),
            **drained,
            "load_avg_1m": load,
        }

    async def throughput(self) -> dict[str, Any]:
        phases: dict[str, Any] = {}
        for mode in ("off", "on"):
            sys.stderr.write(f"{self.cfg.clients} clients, memory {mode}, {self.cfg.seconds:g}s\n")
            phases[mode] = await self._closed_loop(mode, drain=True)
        phases["on_over_off"] = _ratio(phases["on"], phases["off"])
        return phases

    async def reads_only(self) -> dict[str, Any]:
        """Memory on, every worker stopped: the gateway's recall and record and
        retrieval's search, nothing else. The workers resume afterwards with a backlog
        this run does not wait for (the stack stops next)."""
        workers = [
            c.process for c in self.stack.components if c.name in WORKERS and c.process is not None
        ]
        sys.stderr.write(f"{self.cfg.clients} clients, memory on, workers stopped\n")
        for process in workers:
            process.send_signal(signal.SIGSTOP)
        try:
            return await self._closed_loop("on", drain=False)
        finally:
            for process in workers:
                process.send_signal(signal.SIGCONT)

    async def pipeline(self, turns: int, first: int) -> dict[str, Any]:
        before, load = self.meter.read(), _load()
        calls_before = await self.rpc_calls.read()
        deliveries_before = await self.backlog.deliveries()
        started = time.perf_counter()
        async with self.backlog.sampled() as series:
            result = await drive_pipeline(
                self.stack.settings,
                turns,
                self.cfg.pipeline_rate,
                self.cfg.conversations,
                timeout_s=120,
                first=first,
            )
            send_s = result["turns"] / result["achieved_send_rate_per_s"]
            await self.backlog.wait_drained()
        drained_after_s = time.perf_counter() - started - send_s
        self.stack.check_alive()
        summary = {k: v for k, v in result.items() if k not in ("samples_ms", "sample_order")}
        return {
            **summary,
            "drained_after_s": round(drained_after_s, 2),
            "whole_stack_turns_per_s": round(result["turns"] / (send_s + drained_after_s), 1),
            "max_backlog": {w: max((s.get(w, 0) for s in series), default=0) for w in WORKERS},
            "cpu_ms_per_turn": CpuMeter.per_unit(before, self.meter.read(), result["turns"]),
            "retrieval_calls": RpcCalls.per_unit(
                calls_before, await self.rpc_calls.read(), result["turns"]
            ),
            "deliveries_per_turn": Backlog.deliveries_per_unit(
                deliveries_before, await self.backlog.deliveries(), result["turns"]
            ),
            "load_avg_1m": load,
            "backlog_series": series,
            "lag_samples_ms": result["samples_ms"],
        }

    async def profile(self, profiles: Path) -> dict[str, Any]:
        """A pipeline run with every service sampling (SIGUSR1), written on SIGUSR2."""
        signal_services(self.stack, signal.SIGUSR1)
        await asyncio.sleep(0.2)
        run = await self.pipeline(self.cfg.profile_turns, first=self.cfg.pipeline_turns)
        asked = time.time()
        signal_services(self.stack, signal.SIGUSR2)
        return collect_profiles(profiles, asked, run["turns"], self.stack)


async def bench_overhead(cfg: OverheadConfig, out: Path) -> dict[str, Any]:
    profiles = (out / "profiles").resolve()
    env = {"ENGRAM_PROFILE_DIR": str(profiles)} if cfg.profile else {}
    results: dict[str, Any] = {"load_avg_1m_at_start": _load()}
    async with (
        scripted_llm_process() as (upstream_url, upstream_pid),
        running_stack(upstream_url, WORKERS, env, light=cfg.light) as stack,
    ):
        if cfg.profile:
            signal_services(stack, signal.SIGUSR2)  # start-up is not what is measured
        nc = await nats.connect(servers=parse_nats_urls(stack.settings.nats_url))
        limits = httpx2.Limits(max_connections=256, max_keepalive_connections=256)
        try:
            async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
                chatters: dict[str, Chatter] = {
                    api: ApiChatter(
                        api,
                        http,
                        gateway=stack.settings.local_gateway_url,
                        upstream=upstream_url,
                        conversations=cfg.conversations,
                        history=cfg.history,
                    )
                    for api in cfg.apis
                }
                chatter = chatters[cfg.apis[0]]
                meter = CpuMeter(stack_pids(stack, upstream_pid))
                rpc_calls = RpcCalls(http, _metrics_urls(stack))
                backlog = Backlog(nc.jetstream(), WORKERS)
                run = Run(cfg, stack, chatter, meter, backlog, rpc_calls)
                results["idle_cpu_ms_per_s"] = await run.idle()
                for each in chatters.values():
                    await run.warm_up(each)
                by_api = await run.latency(chatters)
                results["latency"] = by_api[cfg.apis[0]]
                results["latency_by_api"] = by_api
                results["throughput"] = await run.throughput()
                results["pipeline"] = await run.pipeline(cfg.pipeline_turns, first=0)
                if cfg.profile:
                    results["profile"] = await run.profile(profiles)
                if not cfg.light:
                    reads_only = await run.reads_only()
                    results["throughput"]["on_workers_stopped"] = reads_only
                    results["throughput"]["reads_only_over_off"] = _ratio(
                        reads_only, results["throughput"]["off"]
                    )
        finally:
            await nc.close()
    results["load_avg_1m_at_end"] = _load()
    return results


def _own_time(samples: list[ChatSample]) -> dict[str, Any]:
    """The gateway's own time before the upstream: ``pre-upstream`` minus ``recall``,
    chat by chat (what an API's adapter and the controls cost, whatever retrieval took)."""
    own = [
        s.timings["pre-upstream"] - s.timings.get("recall", 0.0)
        for s in samples
        if s.status == 200 and "pre-upstream" in s.timings
    ]
    return {"own_pre_upstream_ms": percentiles(own)} if own else {}


def _taking_turns(
    chatters: dict[str, Chatter], mode: str, sent: list[str]
) -> Callable[[], Coroutine[Any, Any, ChatSample]]:
    """A send that goes to each API in turn, noting in ``sent`` which one each chat was
    (when the chat is created, so in the order the samples come back)."""
    order = list(chatters)

    def send() -> Coroutine[Any, Any, ChatSample]:
        api = order[len(sent) % len(order)]
        sent.append(api)
        return chatters[api].send(mode)

    return send


def _metrics_urls(stack: Stack) -> dict[str, str]:
    """Each retrieval caller's Prometheus endpoint: the gateway's port, the workers'
    health ports."""
    urls = {"gateway": f"{stack.settings.local_gateway_url}/metrics"}
    ports = stack.worker_health_ports()
    if stack.light:  # one process: any worker's /metrics is all of them
        return {**urls, "workers": f"http://127.0.0.1:{next(iter(ports.values()))}/metrics"}
    for worker, port in ports.items():
        urls[worker] = f"http://127.0.0.1:{port}/metrics"
    return urls


def _cmd_overhead(args: argparse.Namespace) -> int:
    cfg = OverheadConfig(
        rate=args.rate,
        seconds=args.seconds,
        clients=args.clients,
        conversations=args.conversations,
        history=args.history,
        pipeline_rate=args.pipeline_rate,
        pipeline_turns=args.pipeline_turns,
        profile=args.profile,
        profile_turns=args.profile_turns,
        apis=tuple(api.strip() for api in args.api.split(",") if api.strip()),
        light=args.light,
    )
    unknown = [api for api in cfg.apis if api not in API_PATHS]
    if unknown or not cfg.apis:
        print(
            f"engram bench overhead: --api takes {', '.join(API_PATHS)} (got {args.api!r})",
            file=sys.stderr,
        )
        return 2
    numbers = (cfg.rate, cfg.seconds, cfg.clients, cfg.conversations, cfg.pipeline_rate)
    if min(numbers) <= 0 or cfg.pipeline_turns <= 0 or cfg.profile_turns <= 0 or cfg.history < 0:
        print("engram bench overhead: rates, counts and durations must be > 0", file=sys.stderr)
        return 2
    machine = measured_machine()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = asyncio.run(bench_overhead(cfg, out))
    results["targets"] = targets(results)
    print_report(results)
    print_api_latency(results["latency_by_api"])
    results["config"] = asdict(cfg)
    results["machine"] = machine
    plot_overhead(results, out / "overhead.png")
    (out / "results.json").write_text(json.dumps(_without_samples(results), indent=2))
    print(f"saved {out / 'results.json'}, {out / 'overhead.png'} and {out / 'profiles'}/")
    failed = sum(p["failed"] for p in results["latency"].values())
    pipeline = results["pipeline"]
    return 0 if not failed and pipeline["indexed"] == pipeline["turns"] else 1


def print_api_latency(by_api: dict[str, Any]) -> None:
    """Each API's pre-upstream time (memory on) and added latency (on minus off)."""
    print(
        "\nmemory on, ms            pre-upstream p50   p95   p99"
        "   without recall p50   p95   added p50 (on-off)"
    )
    for api, phases in by_api.items():
        pre = phases["on"].get("pre-upstream_ms", {})
        own = phases["on"].get("own_pre_upstream_ms", {})
        on, off = phases["on"].get("latency_ms", {}), phases["off"].get("latency_ms", {})
        added = on.get("p50", 0.0) - off.get("p50", 0.0)
        print(
            f"  {api:<22} {pre.get('p50', 0):14.2f} {pre.get('p95', 0):8.2f} "
            f"{pre.get('p99', 0):8.2f} {own.get('p50', 0):14.2f} {own.get('p95', 0):8.2f} "
            f"{added:14.2f}"
        )


def _without_samples(results: dict[str, Any]) -> dict[str, Any]:
    """results.json keeps the summaries; the raw samples only feed the plot."""
    slim: dict[str, Any] = json.loads(json.dumps(results))
    for phases in slim.get("latency_by_api", {}).values():
        for phase in phases.values():
            phase.pop("samples_ms", None)
    for phase in slim["latency"].values():
        phase.pop("samples_ms", None)
    slim["pipeline"].pop("lag_samples_ms", None)
    return slim


def add_overhead_parser(
    kinds: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    bench = kinds.add_parser(
        "overhead", help="latency and CPU memory adds per chat, throughput, and a profile"
    )
    bench.add_argument("--rate", type=float, default=10.0, help="chats/s of the latency phase")
    bench.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    bench.add_argument("--clients", type=int, default=32, help="clients of the throughput phase")
    bench.add_argument("--conversations", type=int, default=20, help="spread over this many")
    bench.add_argument(
        "--history", type=int, default=4, help="earlier messages sent with every chat"
    )
    bench.add_argument("--pipeline-rate", type=float, default=100.0, help="turns/s (2 per chat)")
    bench.add_argument("--pipeline-turns", type=int, default=2000, help="turns of that phase")
    bench.add_argument(
        "--no-profile", dest="profile", action="store_false", help="skip the profile phase"
    )
    bench.add_argument("--profile-turns", type=int, default=600, help="turns sampled")
    bench.add_argument(
        "--api",
        default="chat",
        help="comma-separated APIs whose latency is measured in this run: chat, responses, "
        "messages, ollama (the other phases use the first)",
    )
    bench.add_argument(
        "--light",
        action="store_true",
        help="run the stack as engram up --light (retrieval and the workers in one process; "
        "no workers-stopped phase)",
    )
    bench.add_argument("--out", default="bench-results/overhead", help="output directory")
    bench.set_defaults(func=handler, run=_cmd_overhead)
