"""How the gateway serves the memory browser and the MCP endpoint over HTTP: the page
and its assets without a key and under a CSP that allows nothing from elsewhere, ``/``
redirecting to it, and both switched off by their settings."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files

import pytest
from fastapi import FastAPI
from starlette.applications import Starlette

from engram_client import mcp_tools
from engram_gateway.keys import entry_for
from engram_gateway.mcp_http import LazyMcp
from engram_gateway.ui import ASSETS, CONTENT_SECURITY_POLICY

from .conftest import StartGateway

KEYS = entry_for("ui-key", "acme")


async def test_root_redirects_to_the_browser_served_without_a_key(
    start_gateway: StartGateway,
) -> None:
    http = (await start_gateway(api_keys=KEYS)).client()
    root = await http.get("/")
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    assert (await http.get("/ui")).headers["location"] == "/ui/"
    page = await http.get("/ui/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert '<script src="app.js" defer></script>' in page.text
    for name, media_type in ASSETS.items():
        asset = await http.get(f"/ui/{name}")
        assert asset.status_code == 200, name
        assert asset.headers["content-type"] == media_type
        assert asset.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    for name in ("__init__.py", "static", "secrets.txt"):
        missing = await http.get(f"/ui/{name}")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    # the API itself still needs the key
    assert (await http.get("/v1/memories")).status_code == 401


def test_the_page_loads_nothing_from_another_origin() -> None:
    """The CSP enforces it in a browser; the assets do not even try (no absolute URL,
    no inline script or style, which the policy would block)."""
    static = files("engram_gateway.ui") / "static"
    for name in ASSETS:
        text = (static / name).read_text(encoding="utf-8")
        if name == "favicon.svg":
            assert re.findall(r"https?://[^\"' ]+", text) == ["http://www.w3.org/2000/svg"]
            continue
        assert not re.search(r"https?://", text), name
        assert ".innerHTML" not in text and "insertAdjacentHTML" not in text, name
    html = (static / "index.html").read_text(encoding="utf-8")
    assert "<script>" not in html and "<style" not in html and " style=" not in html
    assert "onclick=" not in html
    for tag in re.findall(r"<(?:input|select|textarea)\b[^>]*>", html):
        if 'type="checkbox"' in tag:
            continue  # wrapped in their label
        element_id = re.search(r'id="([^"]+)"', tag)
        assert element_id, tag
        labelled = f'for="{element_id.group(1)}"' in html or re.search(
            rf"<label[^>]*>[^<]*{re.escape(tag)}", html
        )
        assert labelled, f"no label for {tag}"


@pytest.mark.parametrize("setting", ["gateway_ui", "gateway_mcp"])
async def test_each_can_be_switched_off(start_gateway: StartGateway, setting: str) -> None:
    http = (await start_gateway(**{setting: False})).client()
    ui_status = (await http.get("/ui/")).status_code
    mcp_status = (
        await http.post("/mcp", json={}, headers={"accept": "application/json"})
    ).status_code
    if setting == "gateway_ui":
        assert ui_status == 404 and (await http.get("/")).status_code == 404
        assert mcp_status != 404
    else:
        assert mcp_status == 404 and ui_status == 200


async def test_mcp_needs_the_api_key(start_gateway: StartGateway) -> None:
    http = (await start_gateway(api_keys=KEYS)).client()
    refused = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert refused.headers["www-authenticate"] == "Bearer"


def test_the_mcp_sdk_is_loaded_by_the_first_mcp_request_not_at_start() -> None:
    """A gateway nobody calls /mcp on does not hold the SDK (about 21 MB resident)."""
    probe = (
        "import sys\n"
        "from engram_gateway.app import create_app\n"
        "from engram_gateway.settings import GatewaySettings\n"
        "create_app(GatewaySettings(llm_base_url='http://127.0.0.1:9/v1'))\n"
        "print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert loaded.stdout.strip() == "[]", loaded.stdout


class _SessionsThatFail:
    """An MCP server whose session manager cannot start (its task group failed)."""

    starts = 0

    def streamable_http_app(self, **_: object) -> Starlette:
        return Starlette()

    @property
    def session_manager(self) -> _SessionsThatFail:
        return self

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        type(self).starts += 1
        raise RuntimeError("the session manager's task group failed")
        yield


async def test_an_mcp_start_that_fails_fails_its_request_is_retried_and_spares_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mcp_tools, "build_mcp_server", lambda api: _SessionsThatFail())
    endpoint = LazyMcp(FastAPI(), "127.0.0.1", None)
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": []}

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b""}

    async def send(_: object) -> None:
        raise AssertionError("nothing is answered by a server that did not start")

    for attempt in (1, 2):
        with pytest.raises(RuntimeError, match="task group failed"):
            await endpoint(scope, receive, send)
        assert _SessionsThatFail.starts == attempt  # the next request tries again
    await endpoint.stop()  # the gateway's shutdown is not failed by it
