"""Real-browser fixtures: Debian's headless ``chromium`` driven by Playwright's sync API.

Playwright's own browser downloads are never used (no ``playwright install``): the
browser is ``/usr/bin/chromium``, which ``tests/run.py`` installs with apt-get. The pages
come from pytest-django's ``live_server`` (a thread of this process serving
``tests.urls``, sharing the in-memory test database and the settings, overrides
included). A test module imports the ``*_fixture`` functions; the fixtures are
named without the suffix (``page``, ``admin_page``, ``lock_holder``...).

Also here: ``LockHolder``, another process that holds a lock until told to exit, and
``save_screenshot``, which writes PNGs under ``test-artifacts/`` at the repository root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

from tests.support import REPO_ROOT

ARTIFACTS = REPO_ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Every wait in the browser is bounded: a page that never appears fails the test quickly.
TIMEOUT_MS = 10_000
ADMIN_USERNAME = "admin"
ADMIN_PASSWORD = "browser-test-password"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", name="playwright_instance")
def playwright_instance_fixture() -> Iterator[Playwright]:
    """Playwright's sync driver, for one test module only.

    Its sync API runs an asyncio loop under the caller (greenlets), so while it is
    started Django sees a running loop in the main thread and refuses ORM calls
    (``SynchronousOnlyOperation``), and pytest-asyncio could not start its own loops.
    Hence module scope (stopped before other modules run) and
    ``DJANGO_ALLOW_ASYNC_UNSAFE`` for exactly that time: these tests are sync code.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            yield playwright


@pytest.fixture(scope="module", name="browser")
def browser_fixture(playwright_instance: Playwright) -> Iterator[Browser]:
    """Headless Debian chromium with a fresh user-data directory (``launch`` makes a new
    temporary profile each time and removes it on close; it refuses ``--user-data-dir``)."""
    launched = playwright_instance.chromium.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=CHROMIUM_ARGS,
        timeout=TIMEOUT_MS * 3,
    )
    try:
        yield launched
    finally:
        launched.close()


@pytest.fixture(name="browser_context")
def browser_context_fixture(browser: Browser) -> Iterator[BrowserContext]:
    """A fresh context (cookies, storage) per test."""
    context = browser.new_context(viewport={"width": 1600, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    context.set_default_navigation_timeout(TIMEOUT_MS)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture(name="page")
def page_fixture(browser_context: BrowserContext) -> Page:
    """A new tab per test."""
    return browser_context.new_page()


@pytest.fixture(name="admin_user")
def admin_user_fixture(transactional_db: Any, django_user_model: Any) -> Any:
    """A superuser the browser logs in as (``transactional_db``: the live server thread
    must see it)."""
    return django_user_model.objects.create_superuser(
        ADMIN_USERNAME, "admin@example.com", ADMIN_PASSWORD
    )


def admin_login(page: Page, base_url: str, username: str, password: str) -> None:
    """Log in through the real admin login form and wait for the admin index."""
    page.goto(f"{base_url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    with page.expect_navigation():
        page.click("input[type=submit]")


@pytest.fixture(name="admin_page")
def admin_page_fixture(page: Page, live_server: Any, admin_user: Any) -> Page:
    """A tab logged in to the live server's admin as the superuser."""
    admin_login(page, live_server.url, ADMIN_USERNAME, ADMIN_PASSWORD)
    return page


def save_screenshot(page: Page, filename: str) -> Path:
    """Write a full-page PNG to ``test-artifacts/filename`` and return its path."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / filename
    page.screenshot(path=str(path), full_page=True)
    return path


def is_png(path: Path) -> bool:
    """Whether ``path`` exists and holds a non-empty PNG image."""
    if not path.is_file():
        return False
    data = path.read_bytes()
    return len(data) > len(PNG_SIGNATURE) + 100 and data.startswith(PNG_SIGNATURE)


_HOLDER_SCRIPT = """
import json, os, sys
import django
django.setup()
from django_distlock import distlock
lock = distlock(
    sys.argv[1],
    timeout=float(sys.argv[2]),
    auto_renew=False,
    context=sys.argv[3],
    blocking_timeout=10,
    **json.loads(sys.argv[4]),
)
if not lock.acquire():
    print("busy", flush=True)
    sys.exit(1)
print("held", lock.fence, flush=True)
sys.stdin.readline()
os._exit(0)
"""


class LockHolder:
    """Another Python process that takes ``name`` (no auto-renew, so its TTL counts
    down) and keeps it until ``stop()``; it never releases it itself, so a force release
    from the admin is what frees it. ``kind`` are ``distlock()`` options such as
    ``{"shared": True}`` or ``{"limit": 3}``."""

    def __init__(
        self,
        name: str,
        *,
        timeout: float = 120.0,
        context: str = "browser-test",
        kind: dict[str, Any] | None = None,
    ) -> None:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
        env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        self.name = name
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _HOLDER_SCRIPT,
                name,
                str(timeout),
                context,
                json.dumps(kind or {}),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("held"):
            self.stop()
            raise RuntimeError(f"lock holder did not take {name!r}: {line!r}")
        self.fence = int(line.split()[1])

    def stop(self) -> None:
        """Tell the process to exit and wait for it (killed after 10 s)."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.write("\n")
                self.process.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture(name="lock_holder")
def lock_holder_fixture(redis_client: Any) -> Iterator[Any]:
    """``lock_holder(name, **options)`` starts a ``LockHolder`` (stopped afterwards)
    against the flushed session Redis."""
    holders: list[LockHolder] = []

    def start(name: str, **options: Any) -> LockHolder:
        holder = LockHolder(name, **options)
        holders.append(holder)
        return holder

    yield start
    for holder in holders:
        holder.stop()
