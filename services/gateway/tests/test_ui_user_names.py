"""The memory browser's user list shows the display name a chat client forwarded beside
the user's id (and the id alone where there is none), as text whatever it contains;
the page in headless Chromium, the API a test double (as in test_ui_page)."""

from __future__ import annotations

from typing import Any

from playwright.async_api import Browser, expect

from .test_ui_page import open_page, page_url  # noqa: F401  (page_url: a fixture)

USERS = {
    "object": "list",
    "data": [
        {"object": "user", "id": "e57f2f08", "name": "José Müller", "memories": 3},
        {"object": "user", "id": "u-2", "name": "<img src=x onerror=alert(1)>", "memories": 2},
        {"object": "user", "id": "u-3", "memories": 1},
        {"object": "user", "id": "", "memories": 1},
    ],
    "has_more": False,
}


def api(path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
    if path == "/v1/users":
        return 200, USERS
    if path == "/v1/conversations":
        return 200, {"object": "list", "data": [], "has_more": False}
    return 200, {"object": "list", "data": [], "has_more": False, "next_cursor": None}


async def test_users_are_shown_by_name_beside_their_id(browser: Browser, page_url: str) -> None:  # noqa: F811
    page, _ = await open_page(browser, page_url, api)
    users = page.locator("#user-list li")
    await expect(users).to_have_count(4)
    await expect(users.nth(0).locator(".user-name")).to_have_text("José Müller e57f2f08")
    await expect(users.nth(0).locator(".user-id")).to_have_text("e57f2f08")
    await expect(users.nth(1).locator(".user-name")).to_have_text(
        "<img src=x onerror=alert(1)> u-2"
    )
    assert await page.locator("#user-list img").count() == 0
    await expect(users.nth(2)).to_have_text("u-31")
    await expect(users.nth(2).locator(".user-name")).to_have_count(0)
    await expect(users.nth(3)).to_contain_text("(no user)")

    await users.nth(0).get_by_role("button").click()
    await expect(page.locator("#f-user")).to_have_value("e57f2f08")
