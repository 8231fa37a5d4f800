"""A real headless Chromium for the memory browser's tests: Debian's ``chromium`` package
driven by Playwright's Python API. Playwright never downloads a browser here: it is
pointed at ``/usr/bin/chromium``, which the fixture installs with apt-get when it is
missing and that is possible (root, apt-get present), and otherwise skips with the
reason. Screenshots can be kept for the docs (``ENGRAM_UI_SCREENSHOTS=<dir>``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INSTALL_TIMEOUT_S = 900
SCREENSHOTS_ENV = "ENGRAM_UI_SCREENSHOTS"


def _install_chromium() -> str | None:
    """Install Debian's chromium; None when done, else why it could not be."""
    if not shutil.which("apt-get"):
        return "no apt-get on this machine to install Debian's chromium"
    if os.geteuid() != 0:
        return "chromium is not installed and installing it needs root"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return f"`{' '.join(command)}` timed out"
        if done.returncode != 0:
            return f"`{' '.join(command)}` failed: {done.stderr.strip()[-300:]}"
    return None if CHROMIUM.exists() else "apt-get installed no /usr/bin/chromium"


def chromium_or_skip() -> Path:
    if not CHROMIUM.exists():
        why = _install_chromium()
        if why is not None:
            pytest.skip(f"no headless Chromium: {why}")
    return CHROMIUM


@pytest.fixture(scope="session")
def chromium() -> Path:
    return chromium_or_skip()


@pytest.fixture
async def browser(chromium: Path) -> AsyncIterator[object]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=str(chromium), args=CHROMIUM_FLAGS
        )
        try:
            yield launched
        finally:
            await launched.close()


def screenshot_dir(fallback: Path) -> Path:
    """Where screenshots go: ``$ENGRAM_UI_SCREENSHOTS`` (the docs' images) or ``fallback``."""
    target = Path(os.environ.get(SCREENSHOTS_ENV) or fallback)
    target.mkdir(parents=True, exist_ok=True)
    return target


def shrink_png(path: Path, colors: int = 64) -> None:
    """Re-encode a screenshot with a small palette: UI screenshots stay legible and small."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
        small.save(path, optimize=True)


async def screenshot_transcript(
    chromium: Path, title: str, turns: list[tuple[str, str]], path: Path
) -> None:
    """A picture of an MCP session for the docs: each (call, answer) pair as the client
    saw it, laid out as a page by the same headless Chromium (nothing is fetched)."""
    from html import escape

    from playwright.async_api import async_playwright

    rows = "".join(
        f"<div class='call'>&rarr; {escape(call)}</div><pre>{escape(answer)}</pre>"
        for call, answer in turns
    )
    page_html = (
        "<html><body style='font:14px system-ui;margin:16px;background:#f6f7f9;color:#1d2330'>"
        f"<h2 style='margin:0 0 12px'>{escape(title)}</h2>"
        "<style>.call{font-weight:600;margin-top:10px}"
        "pre{background:#fff;border:1px solid #d9dde5;border-radius:6px;padding:8px;"
        "margin:4px 0;white-space:pre-wrap;font-size:12px}</style>"
        f"{rows}</body></html>"
    )
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(chromium), args=CHROMIUM_FLAGS
        )
        try:
            page = await browser.new_page(viewport={"width": 820, "height": 400})
            await page.set_content(page_html)
            await page.screenshot(path=str(path), full_page=True)
        finally:
            await browser.close()
    shrink_png(path)
