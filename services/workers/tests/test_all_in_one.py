"""``engram-workers``: which workers it runs, where each serves its health endpoint, and
the settings it refuses (the process itself runs in tests/e2e/test_learning.py)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from engram_core.settings import ConfigError
from engram_core.worker_catalog import WORKER_CATALOG, worker_entry
from engram_workers import all_in_one
from engram_workers.evict import EVICT, EvictSettings


def test_every_worker_unless_only_names_some() -> None:
    assert all_in_one.parse_only(None) == WORKER_CATALOG
    chosen = all_in_one.parse_only(" mirror,ingest ")
    assert [entry.name for entry in chosen] == ["ingest", "mirror"]  # catalogue order


@pytest.mark.parametrize(("only", "message"), [("ingset", "ingset"), (" , ", "no worker")])
def test_an_unknown_or_empty_only_is_refused(only: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        all_in_one.parse_only(only)


def test_each_worker_keeps_its_own_health_port() -> None:
    evict = worker_entry("evict")
    assert all_in_one.health_port(evict, None) == 8204
    assert all_in_one.health_port(evict, 9300) == 9303  # engram up's ENGRAM_HEALTH_PORT_BASE
    assert all_in_one.health_port(evict, 0) == 0


def test_the_workers_load_their_own_spec_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_HEALTH_PORT", raising=False)
    monkeypatch.setenv("ENGRAM_MAX_ENTRIES", "7")
    (evict,) = all_in_one.load_workers(all_in_one.parse_only("evict"), 9300)
    assert evict.spec is EVICT
    assert isinstance(evict.settings, EvictSettings)
    assert (evict.settings.health_port, evict.settings.max_entries) == (9303, 7)


def test_one_health_port_for_several_workers_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_HEALTH_PORT", "8201")
    with pytest.raises(ConfigError, match="ENGRAM_HEALTH_PORT names one port"):
        all_in_one.load_workers(WORKER_CATALOG, None)
    with pytest.raises(SystemExit, match="ENGRAM_HEALTH_PORT"):
        all_in_one.main([])


def test_a_bad_flag_ends_the_process_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_HEALTH_PORT", raising=False)
    with pytest.raises(SystemExit, match="unknown workers"):
        all_in_one.main(["--only", "ingset"])
    with pytest.raises(SystemExit, match="must be a port"):
        all_in_one.main(["--health-port-base", "70000"])


class FakeWorker:
    """What serve_together uses of a Worker: its name, health port and serve()."""

    def __init__(self, name: str, fails: bool = False) -> None:
        self.spec = type("Spec", (), {"name": name})()
        self.settings = type("Settings", (), {"health_port": 0})()
        self.fails = fails
        self.stopped = False

    async def serve(self, stop: asyncio.Event) -> None:
        if self.fails:
            raise RuntimeError(f"{self.spec.name} could not start")
        await stop.wait()
        self.stopped = True


async def test_a_worker_that_fails_stops_the_others_and_the_process() -> None:
    healthy, broken = FakeWorker("ingest"), FakeWorker("evict", fails=True)
    stop = asyncio.Event()
    with pytest.raises(RuntimeError, match="evict could not start"):
        await asyncio.wait_for(all_in_one.serve_together(cast(Any, [healthy, broken]), stop), 5)
    assert stop.is_set() and healthy.stopped


async def test_a_stop_ends_every_worker() -> None:
    workers = [FakeWorker("ingest"), FakeWorker("reconcile")]
    stop = asyncio.Event()
    serving = asyncio.create_task(all_in_one.serve_together(cast(Any, workers), stop))
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(serving, 5)
    assert all(worker.stopped for worker in workers)
