"""The memory browser in a real headless Chromium against the whole stack with two API
keys: sign in (by keyboard), see the user by the name their chat client forwarded, find
a memory by search and see why it was recalled, open its history, edit it and see the
edit in search, delete it — and the page never asks any other origin for anything, nor
shows another tenant's memories. At phone width the same page works.

Run with ``ENGRAM_UI_SCREENSHOTS=docs/img`` to refresh the screenshots in docs/ui.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx2
import pytest
from playwright.async_api import Browser, Page, expect

from engram_testing.browser import screenshot_dir, shrink_png

from .conftest import TOOLS_ADMIN_KEY, TOOLS_KEY_A, TOOLS_KEY_B, TwoTenantStack, wait_for

pytestmark = pytest.mark.e2e

USER, CONVERSATION, NAME = "ui-erin", "ui-tea", "Erin Sørensen"
TIMEOUT_MS = 15_000


async def seed(stack: TwoTenantStack) -> str:
    """Tenant A: a fact with one earlier version, and neighbours; tenant B: a look-alike."""
    scope = {"user": USER, "conversation": CONVERSATION}
    async with httpx2.AsyncClient(base_url=stack.base_url, timeout=30) as http:
        a = {"Authorization": f"Bearer {TOOLS_KEY_A}"}
        b = {"Authorization": f"Bearer {TOOLS_KEY_B}"}
        for text in ("User walks to work.", "User's sister lives in Kyoto."):
            created = await http.post("/v1/memories", json={"text": text, **scope}, headers=a)
            assert created.status_code == 201, created.text
        tea = await http.post(
            "/v1/memories",
            json={"text": "User's favourite tea is sencha.", "tags": ["tea"], **scope},
            headers=a,
        )
        memory_id: str = tea.json()["id"]
        edited = await http.patch(
            f"/v1/memories/{memory_id}",
            json={"text": "User's favourite tea is gyokuro."},
            headers=a,
        )
        assert edited.status_code == 200, edited.text
        other = await http.post(
            "/v1/memories",
            json={"text": "User's favourite tea is tenant B's oolong.", **scope},
            headers=b,
        )
        assert other.status_code == 201
        # as Open WebUI sends a chat: the person's id and name (percent-encoded) in headers
        person = {"X-OpenWebUI-User-Id": USER, "X-OpenWebUI-User-Name": "Erin%20S%C3%B8rensen"}
        chat = await http.post(
            "/v1/chat/completions",
            json={"model": "scripted", "messages": [{"role": "user", "content": "Hello!"}]},
            headers={**a, **person, "X-OpenWebUI-Chat-Id": "ui-hello"},
        )
        assert chat.status_code == 200, chat.text

        async def named() -> bool:
            users = (await http.get("/v1/users", headers=a)).json()["data"]
            return any(u.get("name") == NAME for u in users)

        await wait_for(named, 15, what="the person's name in /v1/users")
    return memory_id


def watch(page: Page, base_url: str) -> dict[str, list[str]]:
    """Every request to another origin, and every script error, the page produces."""
    seen: dict[str, list[str]] = {"foreign": [], "errors": []}
    page.on(
        "request",
        lambda request: (
            None if request.url.startswith(base_url) else seen["foreign"].append(request.url)
        ),
    )
    page.on("pageerror", lambda error: seen["errors"].append(str(error)))
    return seen


async def snap(page: Page, folder: Path, name: str, **options: Any) -> None:
    path = folder / name
    await page.screenshot(path=str(path), **options)
    shrink_png(path)


async def search(page: Page, query: str) -> None:
    view = page.locator("#view-search")
    await page.get_by_role("link", name="Search", exact=True).click()
    await view.get_by_label("Query").fill(query)
    await view.get_by_label("User").fill(USER)
    await view.get_by_label("Conversation").fill(CONVERSATION)
    await view.get_by_role("button", name="Search", exact=True).click()


async def test_sign_in_search_history_edit_delete(
    two_tenant_stack: TwoTenantStack, browser: Browser, tmp_path: Path
) -> None:
    base = two_tenant_stack.base_url
    memory_id = await seed(two_tenant_stack)
    shots = screenshot_dir(tmp_path / "screens")
    context = await browser.new_context(viewport={"width": 1000, "height": 720})
    page = await context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    seen = watch(page, base)

    # / redirects to the browser, which asks for a key; a wrong one is refused
    await page.goto(f"{base}/")
    await expect(page).to_have_url(f"{base}/ui/")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_focused()
    await page.get_by_label("Engram API key").fill("not-a-key")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#signin-error")).to_have_text(
        "That key is not valid for this gateway."
    )
    # by keyboard: Tab from the heading to the key field, type, Enter
    await page.get_by_label("Engram API key").fill("")
    await page.get_by_role("heading", name="Sign in").focus()
    await page.keyboard.press("Tab")
    await expect(page.get_by_label("Engram API key")).to_be_focused()
    await page.keyboard.type(TOOLS_KEY_A)
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Memories")).to_be_visible()
    await expect(page.locator("#user-list")).to_contain_text(USER)
    await expect(page.locator("#user-list .user-name")).to_have_text(f"{NAME} {USER}")
    await page.locator("#user-list").get_by_role("button", name=USER).click()
    await expect(page.locator("#conversation-list")).to_contain_text(CONVERSATION)
    await expect(page.locator("#memory-list")).to_contain_text("gyokuro")
    await snap(page, shots, "ui-memories.png")

    # search as a chat would recall: the hit, its scope and its score breakdown
    await search(page, "What tea does the user like best?")
    hit = page.locator("#search-hits li").filter(has_text="gyokuro")
    await expect(hit).to_have_count(1)
    await expect(hit).to_contain_text("scope: conversation")
    for column in ("dense", "sparse", "relevance", "recency", "total", "mmr"):
        await expect(hit.get_by_role("columnheader", name=column)).to_be_visible()
    await expect(page.locator("#search-hits")).not_to_contain_text("oolong")  # tenant B's
    await snap(page, shots, "ui-search.png")

    # the memory's page: fields, then its history (the version the edit replaced)
    await hit.get_by_role("link").click()
    assert page.url.endswith(f"#/memory/{memory_id}")
    await expect(page.locator("#memory-text")).to_have_text("User's favourite tea is gyokuro.")
    await expect(page.locator("#memory-fields")).to_contain_text(f"{USER}")
    await page.get_by_role("button", name="Show history").click()
    version = page.locator("#history-list li")
    await expect(version).to_have_count(1)
    await expect(version).to_contain_text("User's favourite tea is sencha.")
    await expect(version).to_contain_text("edited")
    await snap(page, shots, "ui-memory.png", full_page=True)

    # edit it, and the edit is what search recalls
    await page.get_by_label("Text", exact=True).fill("User's favourite tea is hojicha.")
    await page.get_by_role("button", name="Save").click()
    await expect(page.locator("#status")).to_contain_text("Saved")
    await expect(page.locator("#memory-text")).to_have_text("User's favourite tea is hojicha.")
    await search(page, "What tea does the user like best?")
    await expect(page.locator("#search-hits")).to_contain_text("hojicha")
    await expect(page.locator("#search-hits")).not_to_contain_text("gyokuro")

    # delete it (after a confirmation), history included
    await page.locator("#search-hits li").filter(has_text="hojicha").get_by_role("link").click()
    await expect(page.locator("#memory-text")).to_have_text("User's favourite tea is hojicha.")
    await page.get_by_role("button", name="Delete…").click()
    await page.get_by_role("button", name="Delete for good").click()
    await expect(page.locator("#status")).to_contain_text("Deleted 3 memories")
    await expect(page.get_by_role("heading", name="Memories")).to_be_visible()
    async with httpx2.AsyncClient(base_url=base, timeout=30) as http:
        gone = await http.get(
            f"/v1/memories/{memory_id}", headers={"Authorization": f"Bearer {TOOLS_KEY_A}"}
        )
    assert gone.status_code == 404
    await search(page, "What tea does the user like best?")
    await expect(page.locator("#search-outcome")).to_contain_text("hit(s)")
    await expect(page.locator("#search-hits")).not_to_contain_text("hojicha")

    # the key lives in this tab only: a new tab (another session) must sign in again
    other = await context.new_page()
    await other.goto(f"{base}/ui/")
    await expect(other.get_by_role("heading", name="Sign in")).to_be_visible()

    assert seen["foreign"] == [] and seen["errors"] == []
    await context.close()


async def test_phone_width(
    two_tenant_stack: TwoTenantStack, browser: Browser, tmp_path: Path
) -> None:
    base = two_tenant_stack.base_url
    async with httpx2.AsyncClient(base_url=base, timeout=30) as http:
        created = await http.post(
            "/v1/memories",
            json={"text": "User's brother lives in Osaka.", "user": "ui-phone"},
            headers={"Authorization": f"Bearer {TOOLS_KEY_A}"},
        )
        assert created.status_code == 201
    context = await browser.new_context(viewport={"width": 390, "height": 760}, is_mobile=True)
    page = await context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    seen = watch(page, base)
    await page.goto(f"{base}/ui/")
    await page.get_by_label("Engram API key").fill(TOOLS_KEY_A)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#memory-list")).to_contain_text("Osaka")
    # nothing wider than the screen: no sideways scrolling of the page
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, width
    await page.get_by_role("link", name="Search", exact=True).click()
    await expect(page.locator("#view-search")).to_be_visible()
    await snap(page, screenshot_dir(tmp_path / "screens"), "ui-phone.png")
    assert seen["foreign"] == [] and seen["errors"] == []
    await context.close()


async def sign_in(page: Page, base: str) -> None:
    await page.goto(f"{base}/ui/")
    await page.get_by_label("Engram API key").fill(TOOLS_KEY_A)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Memories")).to_be_visible()


async def test_learn_follow_the_event_then_read_profile_and_summary(
    two_tenant_stack: TwoTenantStack, browser: Browser
) -> None:
    """What the workers learn from text added in the page shows up in it: the event
    turns applied, the profile entry and the conversation summary appear."""
    base = two_tenant_stack.base_url
    page = await browser.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    seen = watch(page, base)
    await sign_in(page, base)

    await page.get_by_role("link", name="Add").click()
    learn = page.get_by_role("form", name="Learn from text")
    await learn.get_by_label("Text (one message per line)").fill("I am allergic to kiwi.")
    await learn.get_by_label("User").fill("ui-frank")
    await learn.get_by_label("Conversation").fill("ui-food")
    await learn.get_by_role("button", name="Learn").click()
    await expect(page.get_by_role("heading", name="Events")).to_be_visible()
    status = page.locator("#events-table tbody tr").first.locator("td").nth(2)
    await expect(status).to_have_text("applied", timeout=45_000)  # refreshed every 3 s

    await page.get_by_role("link", name="Profile").click()
    await page.locator("#view-profile").get_by_label("User").fill("ui-frank")

    async def shown() -> bool:
        await page.get_by_role("button", name="Show").click()
        rows = page.locator("#profile-table tbody tr")
        summaries = page.locator("#summary-list")
        return "kiwi" in (await rows.first.inner_text()) and "kiwi" in (
            await summaries.inner_text()
        )

    await wait_for(shown, 30, what="the profile entry and the summary")
    cells = page.locator("#profile-table tbody tr").first.locator("td")
    await expect(cells.nth(0)).to_have_text("constraint")
    await expect(cells.nth(1)).to_have_text("allergy")
    await expect(page.locator("#summary-list")).to_contain_text("ui-food")
    assert seen["foreign"] == [] and seen["errors"] == []
    await page.close()


# --- what a newcomer meets: tidy at desktop and phone width (issue 34) ---------------------

LONG_CONVERSATION = "temporary:h6s42zjeEPi0-SrvAAAL-a-long-open-webui-chat-id"
VIEWPORTS = {"desktop": (1000, 720), "phone": (390, 760)}


async def seed_tidy(stack: TwoTenantStack, user: str) -> None:
    """In a conversation with a long id: two facts and a turn, one fact edited in its
    tags only (its history holds a version with the same text)."""
    scope = {"user": user, "conversation": LONG_CONVERSATION}
    a = {"Authorization": f"Bearer {TOOLS_KEY_A}"}
    async with httpx2.AsyncClient(base_url=stack.base_url, timeout=30) as http:
        # more than the small-store size (5), so search ranks rather than returns all
        for text in (
            "User's favourite tea is sencha.",
            "User walks to the tea shop on Fridays.",
            "User's sister lives in Kyoto.",
            "User keeps bees on the roof.",
            "User plays the cello badly.",
            "User's kettle is blue.",
        ):
            created = await http.post(
                "/v1/memories", json={"text": text, "tags": ["tea"], **scope}, headers=a
            )
            assert created.status_code == 201, created.text
        listed = await http.get("/v1/memories", params={"user": user, "kind": "fact"}, headers=a)
        tea = listed.json()["data"]
        (sencha,) = [m for m in tea if "sencha" in m["text"]]
        tagged = await http.patch(
            f"/v1/memories/{sencha['id']}", json={"tags": ["tea", "green"]}, headers=a
        )
        assert tagged.status_code == 200, tagged.text


async def right_edge(locator: Any) -> float:
    box = await locator.bounding_box()
    assert box is not None
    return float(box["x"] + box["width"])


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
async def test_tidy_views_at_desktop_and_phone_width(
    two_tenant_stack: TwoTenantStack, browser: Browser, tmp_path: Path, viewport: str
) -> None:
    """A long conversation id keeps its count in view; a tags-only edit's history says
    what changed; a status message stays with its view; search says why facts come first
    and shows each hit's rank; the score table is whole at phone width."""
    base = two_tenant_stack.base_url
    user = f"ui-tidy-{viewport}"
    await seed_tidy(two_tenant_stack, user)
    width, height = VIEWPORTS[viewport]
    context = await browser.new_context(
        viewport={"width": width, "height": height}, is_mobile=viewport == "phone"
    )
    page = await context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    seen = watch(page, base)
    shots = screenshot_dir(tmp_path / "screens")
    await sign_in(page, base)

    # the long conversation id is cut with an ellipsis; its count stays inside the button
    await page.locator("#user-list").get_by_role("button", name=user).click()
    scope = page.locator("#conversation-list button").filter(has_text="temporary:")
    await expect(scope).to_have_attribute("title", LONG_CONVERSATION)
    count = scope.locator(".count")
    await expect(count).to_be_visible()
    await expect(count).to_have_text(re.compile(r"^\d+$"))  # the facts and their summary
    assert await right_edge(count) <= await right_edge(scope) + 0.5
    assert await right_edge(scope) <= width
    await snap(page, shots, f"ui-scopes-{viewport}.png")

    # a tags-only edit: the history shows the tag added and says the text is unchanged
    await scope.click()
    await expect(page.locator("#memory-list .item")).not_to_have_count(0)
    await (
        page.locator("#memory-list")
        .get_by_role("link", name="User's favourite tea is sencha.")
        .click()
    )
    await expect(page.locator("#memory-text")).to_have_text("User's favourite tea is sencha.")
    await page.get_by_role("button", name="Show history").click()
    version = page.locator("#history-list li")
    await expect(version).to_have_count(1)
    await expect(version.locator(".tag-diff ins")).to_have_text("+green")
    await expect(version.locator(".text-diff")).to_have_count(0)
    await expect(version.locator(".tag-diff")).to_contain_text("(were: tea)")
    # then a text edit: the words removed and added
    await page.get_by_label("Text", exact=True).fill("User's favourite tea is gyokuro.")
    await page.get_by_role("button", name="Save").click()
    await expect(page.locator("#status")).to_contain_text("Saved")
    await expect(page.locator("#memory-text")).to_have_text("User's favourite tea is gyokuro.")
    await page.get_by_role("button", name="Show history").click()
    newest = page.locator("#history-list li").last
    await expect(newest.locator(".text-diff del")).to_have_text("sencha.")
    await expect(newest.locator(".text-diff ins")).to_have_text("gyokuro.")
    await snap(page, shots, f"ui-history-{viewport}.png", full_page=True)

    # "Saved…" belongs to the memory it is about: another view starts without it
    await page.get_by_role("link", name="Search", exact=True).click()
    await expect(page.locator("#view-search")).to_be_visible()
    await expect(page.locator("#status")).to_have_text("")

    # search: the order is explained and each hit's rank by score is shown
    view = page.locator("#view-search")
    await view.get_by_label("Query").fill("Which tea does the user like?")
    await view.get_by_label("User").fill(user)
    await view.get_by_label("Conversation").fill(LONG_CONVERSATION)
    await view.get_by_role("button", name="Search", exact=True).click()
    hits = page.locator("#search-hits li")
    await expect(hits.first).to_be_visible()
    outcome = page.locator("#search-outcome")
    await expect(outcome).to_contain_text("Ranked")
    await expect(outcome).to_contain_text("reading order")
    await expect(hits.first.locator(".rank")).to_have_text(re.compile(r"^rank \d+$"))
    # every score of the first hit is on screen, labelled, none cut off
    cells = hits.first.locator("table.scores td")
    await expect(cells).to_have_count(6)
    for index, name in enumerate(("dense", "sparse", "relevance", "recency", "total", "mmr")):
        cell = cells.nth(index)
        await expect(cell).to_be_visible()
        await expect(cell).to_have_attribute("data-label", name)
        assert await right_edge(cell) <= width, name
        assert await cell.evaluate("c => c.scrollWidth <= c.clientWidth"), f"{name} overflows"
    assert await page.evaluate("document.documentElement.scrollWidth") <= width
    await snap(page, shots, f"ui-search-{viewport}.png", full_page=True)

    assert seen["foreign"] == [] and seen["errors"] == []
    await context.close()


async def test_operator_panel_reads_the_real_queues_with_an_admin_key_only(
    two_tenant_stack: TwoTenantStack, browser: Browser, tmp_path: Path
) -> None:
    """The operator panel against the real gateway and NATS: an admin key sees the
    workers' consumers; a tenant's key is told it needs one, and the status message does
    not follow it to the next view."""
    base = two_tenant_stack.base_url
    page = await browser.new_page(viewport={"width": 1000, "height": 720})
    page.set_default_timeout(TIMEOUT_MS)
    seen = watch(page, base)
    await sign_in(page, base)
    await page.get_by_role("link", name="Operator").click()
    await expect(page.locator("#status")).to_contain_text("needs an admin key")
    await page.get_by_role("link", name="Search", exact=True).click()
    await expect(page.locator("#status")).to_have_text("")

    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_label("Engram API key").fill(TOOLS_ADMIN_KEY)
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("link", name="Operator").click()
    workers = page.locator("#consumers-table tbody tr td:first-child")
    await expect(workers).to_contain_text(["ingest", "reconcile", "summarize"])
    await expect(page.locator("#status")).to_have_text("")
    await snap(page, screenshot_dir(tmp_path / "screens"), "ui-operator.png")
    assert seen["foreign"] == [] and seen["errors"] == []
    await page.close()
