"""The memory browser: a static page at ``/ui/`` (``GET /`` redirects there) that signs
in with an Engram API key and then only calls the gateway's public HTTP API from the
browser, like any other client (``ENGRAM_GATEWAY_UI``, on by default).

Plain HTML, CSS and JavaScript shipped as package data (``ui/static/``): no build step,
no third-party code, no request to any other origin — the Content-Security-Policy on
every answer says so, and forbids inline scripts and framing. The page and its assets
hold no memory data, so they are served without a key (the API calls carry it); the
key is kept in the tab's ``sessionStorage`` only.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from engram_gateway.errors import GatewayError

UI_PATH = "/ui/"
#: Everything the page may load: its own scripts, styles and images, and API calls to
#: this origin. Nothing inline, nothing from elsewhere, never inside a frame.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
#: The files the page is made of, and their media types (anything else: 404).
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

router = APIRouter(include_in_schema=False)


@cache
def _asset(name: str) -> bytes:
    return (files(__package__) / "static" / name).read_bytes()


def _serve(name: str) -> Response:
    return Response(_asset(name), media_type=ASSETS[name], headers=SECURITY_HEADERS)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse(UI_PATH, status_code=307)


@router.get("/ui")
async def ui_without_slash() -> RedirectResponse:
    return RedirectResponse(UI_PATH, status_code=307)


@router.get(UI_PATH)
async def index() -> Response:
    return _serve("index.html")


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise GatewayError(
            404, f"No such file in the memory browser: {name[:64]}", code="not_found"
        )
    return _serve(name)
