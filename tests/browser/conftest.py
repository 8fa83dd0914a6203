"""Browser tests: Playwright (sync API) driving Debian's chromium against a live server.

The browser is never downloaded (`playwright install` needs the network): Playwright
launches /usr/bin/chromium (PLAYWRIGHT_CHROMIUM to override). The live server listens on
127.0.0.1, port 18700 + 10 x the xdist worker number (the next free one in that range).
"""

import os
from collections.abc import Iterator

import pytest
from pytest_django.live_server_helper import LiveServer

# Playwright's sync API runs an event loop in this thread; the test's own ORM calls are
# synchronous and safe here.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402

CHROMIUM = os.environ.get("PLAYWRIGHT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BASE_PORT = 18700
SCREENSHOTS = os.path.join(os.path.dirname(__file__), "..", "..", "var", "screenshots")


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


@pytest.fixture(scope="session")
def browser_server(django_db_setup, django_db_blocker) -> Iterator[LiveServer]:
    first = BASE_PORT + 10 * _worker_index()
    server = None
    with django_db_blocker.unblock():
        for port in range(first, first + 10):
            try:
                server = LiveServer(f"127.0.0.1:{port}")
                break
            except Exception:  # noqa: BLE001, S112 - port taken: try the next one in our range
                continue
    if server is None:
        raise RuntimeError(f"no free port in {first}-{first + 9} for the live server")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    pg = context.new_page()
    yield pg
    context.close()


@pytest.fixture
def live(browser_server, transactional_db) -> str:
    """The live server's URL, with a database the server thread shares (committed rows)."""
    return browser_server.url
