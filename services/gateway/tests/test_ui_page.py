"""The memory browser's page on its own, in headless Chromium, with the gateway's API
replaced by a test double at the browser's network layer (Playwright routes): how it
renders the operator panel (consumer lag, dead letters, the worker filter, a gateway
without those endpoints), the event list (pending, applied, skipped with its reason),
and memory text that looks like markup. The page itself is served by the real
``engram_gateway.ui`` router. (The page against the real stack: tests/e2e.)"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi import FastAPI
from playwright.async_api import Browser, Page, Route, expect

from engram_cli.stack.nats_server import free_port
from engram_gateway import ui
from engram_testing.asgi import serving

CONSUMERS = {
    "object": "list",
    "data": [
        {
            "worker": "ingest",
            "subject": "engram.turn.persisted.v1",
            "pending": 12,
            "ack_pending": 2,
            "redelivered": 1,
            "dead_letters": 0,
        },
        {
            "worker": "reconcile",
            "subject": "engram.fact.proposed.v1",
            "pending": 0,
            "ack_pending": 0,
            "redelivered": 3,
            "dead_letters": 2,
        },
    ],
}


def dead_letter(n: int, worker: str) -> dict[str, Any]:
    return {
        "id": f"dl-{n}",
        "worker": worker,
        "subject": "engram.fact.proposed.v1",
        "reason": f"LLM answered 500 (attempt {n})",
        "deliveries": 5,
        "failed_at": f"2026-11-2{n}T10:00:00Z",
        "event_id": f"e{n}aaaaaa-0000-0000-0000-000000000000",
        "tenant": f"tenant-{n}",
        "conversation_id": "home",
    }


Handler = Callable[[str, dict[str, list[str]]], tuple[int, Any]]


@pytest.fixture
async def page_url() -> AsyncIterator[str]:
    app = FastAPI()
    app.include_router(ui.router)
    async with serving(app, free_port()) as url:
        yield url


async def open_page(browser: Browser, url: str, api: Handler) -> tuple[Page, list[str]]:
    """The page with every /v1 call answered by ``api(path, query)``; returns the page
    and the API calls it made."""
    page = await browser.new_page()
    page.set_default_timeout(10_000)
    calls: list[str] = []
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    async def answer(route: Route) -> None:
        parts = urlsplit(route.request.url)
        calls.append(f"{route.request.method} {parts.path}?{parts.query}")
        status, body = api(parts.path, parse_qs(parts.query))
        await route.fulfill(status=status, content_type="application/json", body=json.dumps(body))

    await page.route("**/v1/**", answer)
    await page.goto(f"{url}/ui/")
    assert errors == []
    return page, calls


def single_tenant(extra: Handler) -> Handler:
    def api(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        if path in ("/v1/users", "/v1/conversations"):
            return 200, {"object": "list", "data": [], "has_more": False}
        if path == "/v1/memories":
            return 200, {"object": "list", "data": [], "has_more": False, "next_cursor": None}
        return extra(path, query)

    return api


async def test_operator_panel_shows_lag_and_dead_letters(browser: Browser, page_url: str) -> None:
    def admin(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        if path == "/v1/admin/consumers":
            return 200, CONSUMERS
        if path == "/v1/admin/dead-letters":
            worker = query.get("worker", ["reconcile"])[0]
            limit = int(query["limit"][0])
            letters = [dead_letter(n, worker) for n in (1, 2, 3)][:limit]
            return 200, {"object": "list", "data": letters}
        return 404, {"error": {"message": "no", "type": "x", "param": None, "code": "not_found"}}

    page, calls = await open_page(browser, page_url, single_tenant(admin))
    await page.get_by_role("link", name="Operator").click()
    consumers = page.locator("#consumers-table tbody tr")
    await expect(consumers).to_have_count(2)
    await expect(consumers.nth(0)).to_contain_text("ingest")
    cells = consumers.nth(0).locator("td")
    await expect(cells).to_have_text(["ingest", "engram.turn.persisted.v1", "12", "2", "1", "0"])
    letters = page.locator("#dead-table tbody tr")
    await expect(letters).to_have_count(3)
    await expect(letters.nth(0)).to_contain_text("LLM answered 500 (attempt 1)")
    await expect(letters.nth(0)).to_contain_text("2026-11-21 10:00 UTC")
    await expect(letters.nth(0).locator("td").nth(6)).to_have_text("tenant-1")
    assert "GET /v1/admin/dead-letters?limit=50" in calls

    await page.get_by_label("Worker").fill("ingest")
    await page.get_by_label("Limit").fill("2")
    await page.get_by_role("button", name="Show").click()
    await expect(letters).to_have_count(2)
    await expect(letters.nth(1).locator("td").nth(1)).to_have_text("ingest")
    assert "GET /v1/admin/dead-letters?worker=ingest&limit=2" in calls
    assert not [c for c in calls if not c.startswith("GET ")]  # read-only


async def test_operator_panel_without_the_endpoints_says_so(
    browser: Browser, page_url: str
) -> None:
    def none(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        return 404, {
            "error": {"message": "Unknown path", "type": "x", "param": None, "code": "not_found"}
        }

    page, _ = await open_page(browser, page_url, single_tenant(none))
    await page.get_by_role("link", name="Operator").click()
    await expect(page.locator("#status")).to_have_text("This gateway has no operator endpoints.")


async def test_operator_panel_with_a_tenants_key_says_it_needs_an_admin_key(
    browser: Browser, page_url: str
) -> None:
    def refused(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        message = "This endpoint shows figures shared by every tenant and needs an admin key."
        error = {"message": message, "type": "permission_error", "param": None}
        return 403, {"error": {**error, "code": "admin_key_required"}}

    page, _ = await open_page(browser, page_url, single_tenant(refused))
    await page.get_by_role("link", name="Operator").click()
    await expect(page.locator("#status")).to_have_text(
        "The operator panel needs an admin key; this key reads and writes its own tenant's "
        "memories only."
    )
    await expect(page.locator("#consumers-table tbody tr")).to_have_text(["Nothing here."])
    await expect(page.get_by_role("heading", name="Sign in")).to_be_hidden()


async def test_events_show_pending_applied_and_skipped(browser: Browser, page_url: str) -> None:
    statuses = {
        "e1": {
            "status": "applied",
            "stage": None,
            "reason": None,
            "applied_at": "2026-11-24T10:00:00Z",
        },
        "e2": {
            "status": "skipped",
            "stage": None,
            "reason": "no facts in chit-chat",
            "applied_at": None,
        },
        "e3": {"status": "pending", "stage": "reconcile", "reason": None, "applied_at": None},
        "e4": {
            "status": "applied",
            "stage": None,
            "reason": None,
            "fallback": "the model's answer was unusable (qwen3): reconcile: …",
            "applied_at": "2026-11-24T10:00:00Z",
        },
    }

    def events(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        if path == "/v1/memories/add":
            return 202, {
                "object": "memory.add",
                "status": "pending",
                "event_ids": ["e1", "e2", "e3", "e4"],
            }
        event = path.rsplit("/", 1)[-1]
        return 200, {"object": "event", "id": event, "accepted_at": None, **statuses[event]}

    page, calls = await open_page(browser, page_url, single_tenant(events))
    await page.get_by_role("link", name="Add").click()
    await page.get_by_label("Text (one message per line)").fill(
        "I like tea.\nHello!\nI moved.\nMy kayak is Zephyr."
    )
    await page.get_by_role("button", name="Learn").click()
    rows = page.locator("#events-table tbody tr")
    await expect(rows).to_have_count(4)
    await expect(rows.nth(0).locator("td").nth(2)).to_have_text("applied")
    await expect(rows.nth(1).locator("td").nth(2)).to_have_text("skipped: no facts in chit-chat")
    await expect(rows.nth(2).locator("td").nth(3)).to_have_text("reconcile")
    await expect(rows.nth(3).locator("td").nth(2)).to_have_text(
        "applied, by the fallback: the model's answer was unusable (qwen3): reconcile: …"
    )
    assert "POST /v1/memories/add?" in calls


async def test_memory_text_that_looks_like_markup_stays_text(
    browser: Browser, page_url: str
) -> None:
    sneaky = "<img src=x onerror=\"document.title='pwned'\"><b>bold</b>"
    memory: dict[str, object] = {
        "object": "memory", "id": "11111111-1111-1111-1111-111111111111", "kind": "fact",
        "text": sneaky, "role": "", "user_id": "alice", "conversation_id": "home",
        "tags": [], "created_at": "2026-11-24T10:00:00Z", "updated_at": None,
        "valid_from": None, "valid_to": None, "superseded_by": "", "source_id": "",
        "turn_index": 0, "source_turn_ids": [], "profile": None, "turn_range": None,
        "metadata": {},
    }  # fmt: skip

    def listing(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        return 200, memory

    def api(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        if path == "/v1/memories":
            return 200, {"object": "list", "data": [memory], "has_more": False, "next_cursor": None}
        return single_tenant(listing)(path, query)

    page, _ = await open_page(browser, page_url, api)
    await expect(page.locator("#memory-list")).to_contain_text(sneaky)
    assert await page.locator("#memory-list img, #memory-list b").count() == 0
    assert await page.title() != "pwned"


def memory_named(n: int, **fields: Any) -> dict[str, Any]:
    return {
        "object": "memory", "id": f"{n:08d}-1111-1111-1111-111111111111", "kind": "fact",
        "text": f"Memory number {n}.", "role": "", "user_id": "alice", "conversation_id": "home",
        "tags": [], "created_at": "2026-11-24T10:00:00Z", "updated_at": "2026-11-24T10:00:00Z",
        "valid_from": None, "valid_to": None, "superseded_by": "", "source_id": "",
        "turn_index": 0, "source_turn_ids": [], "profile": None, "turn_range": None,
        "metadata": {}, **fields,
    }  # fmt: skip


async def test_paging_follows_the_cursor_and_comes_back(browser: Browser, page_url: str) -> None:
    pages = {
        None: ([memory_named(1), memory_named(2)], "cursor-2"),
        "cursor-2": ([memory_named(3), memory_named(4)], "cursor-3"),
        "cursor-3": ([memory_named(5)], None),
    }

    def api(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        if path == "/v1/memories":
            data, following = pages[query.get("cursor", [None])[0]]
            return 200, {
                "object": "list",
                "data": data,
                "has_more": following is not None,
                "next_cursor": following,
            }
        return 200, {"object": "list", "data": [], "has_more": False}

    page, calls = await open_page(browser, page_url, api)
    items = page.locator("#memory-list article")
    await expect(items).to_have_count(2)
    newer, older = (
        page.get_by_role("button", name="← Newer"),
        page.get_by_role("button", name="Older →"),
    )
    await expect(newer).to_be_disabled()
    await older.click()
    await expect(items.first).to_contain_text("Memory number 3.")
    await older.click()
    await expect(items).to_have_count(1)
    await expect(older).to_be_disabled()
    await expect(page.locator("#page-number")).to_have_text("Page 3")
    await newer.click()
    await expect(items.first).to_contain_text("Memory number 3.")
    await newer.click()
    await expect(items.first).to_contain_text("Memory number 1.")
    assert [c for c in calls if "cursor=" in c] == [
        "GET /v1/memories?limit=25&cursor=cursor-2",
        "GET /v1/memories?limit=25&cursor=cursor-3",
        "GET /v1/memories?limit=25&cursor=cursor-2",
    ]


async def test_filters_become_list_parameters(browser: Browser, page_url: str) -> None:
    page, calls = await open_page(browser, page_url, single_tenant(lambda p, q: (404, {})))
    filters = page.get_by_role("form", name="Filters")
    await filters.get_by_label("Tag", exact=True).fill("pets")
    await filters.get_by_role("checkbox", name="fact").check()
    await filters.get_by_role("checkbox", name="episode").check()
    await filters.get_by_label("Created from").fill("2026-11-01")
    await filters.get_by_label("Created until").fill("2026-11-30")
    await filters.get_by_role("checkbox", name="include superseded").check()
    await filters.get_by_role("button", name="Apply filters").click()
    wanted = (
        "GET /v1/memories?tag=pets&kind=fact&kind=episode&limit=25&include_superseded=true"
        "&created_after=2026-11-01T00%3A00%3A00Z&created_before=2026-12-01T00%3A00%3A00.000Z"
    )
    await expect(page.locator("#memory-list")).to_contain_text("No memories match.")
    assert wanted in calls, calls
