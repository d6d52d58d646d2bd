"""The dashboard's browser tests: Debian's Chromium driven by Playwright, a dashboard served
on loopback from a thread, and screenshots kept as test artifacts.

Playwright never downloads a browser here: it drives ``/usr/bin/chromium`` (``make test``
installs Debian's ``chromium`` package). Where Chromium or Playwright is missing the browser
tests are skipped with the reason, except under CI (``CI`` set), where they fail instead.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pawn_queue.config import PawnQueueConfig, load_config
from pawn_queue.store.base import Store

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page
    from starlette.applications import Starlette

    from pawn_queue.dashboard import DashboardSettings
    from pawn_queue.dashboard.snapshots import Monitor

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking switches Chromium keeps calling home (closed here).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = REPO / "test-artifacts" / "dashboard"
README_SCREENSHOT = REPO / "docs" / "dashboard.png"
UPDATE_SCREENSHOT_VAR = "UPDATE_DASHBOARD_SCREENSHOT"  # set to 1: the suite rewrites it


def _missing() -> str | None:
    if not CHROMIUM.exists():
        how = (
            "run 'make test' (it installs Debian's chromium package)"
            if shutil.which("apt-get")
            else "apt-get is not available: install Chromium at /usr/bin/chromium"
        )
        return f"browser tests need {CHROMIUM}: {how}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "browser tests need playwright: pip install --group dev (make test does)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Chromium for one test module: Playwright's blocking API keeps an event loop running
    in this thread while it is open, where later async tests could not run theirs."""
    reason = _missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI installs everything: a skip there would hide a gap
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class Watched:
    """A page with what its console said and the errors its scripts raised."""

    page: Page
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


@pytest.fixture
def watched(browser: Browser) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(15_000)
    seen = Watched(page)

    def on_console(message: ConsoleMessage) -> None:
        seen.console.append(f"{message.type}: {message.text}")

    def on_dialog(dialog: Any) -> None:
        seen.dialogs.append(str(dialog.message))
        dialog.dismiss()

    page.on("console", on_console)
    page.on("pageerror", lambda error: seen.errors.append(str(error)))
    page.on("dialog", on_dialog)
    try:
        yield seen
    finally:
        context.close()


def screenshot(page: Page, name: str) -> Path:
    """Save the page as ``test-artifacts/dashboard/{name}.png``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@dataclass
class Served:
    """A dashboard serving on loopback."""

    url: str
    app: Starlette

    @property
    def monitor(self) -> Monitor:
        monitor: Monitor = self.app.state.monitor
        return monitor


@contextmanager
def served_dashboard(
    config: dict[str, Any] | PawnQueueConfig,
    settings: DashboardSettings,
    *,
    store: Store | None = None,
) -> Iterator[Served]:
    """Serve a dashboard over ``config``'s store on a free 127.0.0.1 port, in a thread."""
    from pawn_queue.dashboard import DashboardServer, create_app, listen

    sock = listen("127.0.0.1", 0, settings.token)
    port = sock.getsockname()[1]
    app = create_app(load_config(config), settings, store=store)
    server = DashboardServer(app, sock)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(server.run())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="dashboard", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if failure:
            raise failure[0]
        if time.monotonic() > deadline:
            raise TimeoutError("the dashboard did not start within 30 s")
        time.sleep(0.02)
    try:
        yield Served(f"http://127.0.0.1:{port}", app)
    finally:
        server.stop()
        thread.join(30)
        sock.close()
