"""Memories stored single-tenant live in tenant ``default``: once API keys are configured
and none maps to ``default``, the gateway says at start that they exist and no key can
reach them (with the real retrieval service)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from engram_gateway.keys import entry_for
from engram_testing.worker_stack import RealRetrieval, running_retrieval

from .conftest import StartGateway

KEY = "key-of-acme"
UNREACHABLE = "auth.default_tenant_unreachable"


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


async def start_logged(
    start_gateway: StartGateway, **settings: Any
) -> list[MutableMapping[str, Any]]:
    """The gateway's log events from its start until the default tenant was counted."""
    with structlog.testing.capture_logs() as logs:
        await start_gateway(**settings)
        for _ in range(100):
            if any(e["event"] in (UNREACHABLE, "auth.default_tenant_not_counted") for e in logs):
                break
            await asyncio.sleep(0.05)
    return logs


async def test_keys_without_the_default_tenant_warn_that_its_memories_are_out_of_reach(
    start_gateway: StartGateway, retrieval: RealRetrieval
) -> None:
    single = await start_gateway(retrieval_address=retrieval.address)
    for text in ("User's cat is Miso.", "User likes tea."):
        created = await single.client().post("/v1/memories", json={"text": text, "user": "al"})
        assert created.status_code == 201, created.text

    logs = await start_logged(
        start_gateway, retrieval_address=retrieval.address, api_keys=entry_for(KEY, "acme")
    )

    (warning,) = [e for e in logs if e["event"] == UNREACHABLE]
    assert warning["log_level"] == "warning"
    assert warning["memories"] == 2 and warning["tenant"] == "default"
    assert "=default" in warning["detail"]


@pytest.mark.parametrize("tenant_of_key", ["default", "acme"])
async def test_no_warning_when_a_key_reaches_default_or_it_holds_nothing(
    start_gateway: StartGateway, retrieval: RealRetrieval, tenant_of_key: str
) -> None:
    if tenant_of_key == "default":
        single = await start_gateway(retrieval_address=retrieval.address)
        created = await single.client().post("/v1/memories", json={"text": "User likes tea."})
        assert created.status_code == 201, created.text
    logs = await start_logged(
        start_gateway, retrieval_address=retrieval.address, api_keys=entry_for(KEY, tenant_of_key)
    )
    await asyncio.sleep(0.3)
    assert not [e for e in logs if e["event"] == UNREACHABLE]
