"""The demo project (``testproject``) end to end, in subprocesses.

``tests.settings`` is not the demo's settings, so everything runs in child processes with
``DJANGO_SETTINGS_MODULE=testproject.settings``, a private Redis and a temporary SQLite
file (``DEMO_DB``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.redis_servers import RedisServer, _free_port

ROOT = Path(__file__).resolve().parent.parent

# Run inside the demo's settings: pay an invoice twice at once (sync, then async views).
PAY_SCRIPT = r"""
import json, threading, time
import django
from django.test.utils import setup_test_environment

django.setup()
setup_test_environment()
from django.test import Client
from testproject.invoices.models import Invoice

out = {"index": Client().get("/").status_code}
out["index_lists_invoices"] = b"INV-001" in Client().get("/").content
for url in ("pay", "apay"):
    invoice = Invoice.objects.order_by("number").first()
    Invoice.objects.filter(pk=invoice.pk).update(status="open")
    results = {}

    def first():
        results["first"] = Client().post(f"/invoices/{invoice.pk}/{url}/")

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(0.5)
    second = Client().post(f"/invoices/{invoice.pk}/{url}/")
    thread.join()
    invoice.refresh_from_db()
    out[url] = {
        "first": results["first"].status_code,
        "second": second.status_code,
        "retry_after": second.get("Retry-After"),
        "second_html": "423 Locked" in second.content.decode(),
        "status": invoice.status,
        "fence": invoice.fence,
    }
print(json.dumps(out))
"""


@pytest.fixture
def demo(
    tmp_path: Path, redis_server_factory: Callable[..., RedisServer]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``demo(*args)``: run ``manage.py *args`` for the demo, migrated once up front."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "REDIS_URL": redis_server_factory().url,
        "DEMO_DB": str(tmp_path / "demo.sqlite3"),
        "DEMO_PAY_SECONDS": "1.5",
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    run.env = env  # type: ignore[attr-defined]
    run("migrate", "--no-input", "-v", "0")
    return run


def test_check_passes(demo: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = demo("check")
    assert "no issues" in result.stdout


def test_pay_views_guard_and_fence(demo: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PAY_SCRIPT],
        cwd=ROOT,
        env=demo.env,  # type: ignore[attr-defined]
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["index"] == 200
    assert out["index_lists_invoices"]
    fences = []
    for url in ("pay", "apay"):
        pay = out[url]
        assert pay["first"] == 200, pay
        assert pay["second"] == 423, pay
        assert 1 <= int(pay["retry_after"]) <= 10  # the pay views lease: timeout=10
        assert pay["second_html"]
        assert pay["status"] == "paid"
        assert pay["fence"] > 0
        fences.append(pay["fence"])
    assert fences[1] > fences[0]  # same lock name invoice:<pk>, so a newer fence


def test_close_books_refuses_a_second_run(
    demo: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    first = subprocess.Popen(
        [sys.executable, "manage.py", "close_books", "--steps", "6", "--step-seconds", "0.5"],
        cwd=ROOT,
        env=demo.env,  # type: ignore[attr-defined]
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        assert "closing the books" in first.stdout.readline()
        second = demo("close_books", "--steps", "1", check=False)
        assert second.returncode == 1
        assert "lock 'close_books' is held by" in second.stderr
        assert f"pid {first.pid}" in second.stderr
        stdout, stderr = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, stderr
    assert "step 6/6" in stdout
    assert "books closed" in stdout


ADMIN_SCRIPT = r"""
import django
from django.test.utils import setup_test_environment

django.setup()
setup_test_environment()
from django.contrib.auth import get_user_model
from django.test import Client

user = get_user_model().objects.create_superuser("admin", password="pw")
client = Client()
client.force_login(user)
held = client.get("/admin/django_distlock/heldlock/")
events = client.get("/admin/django_distlock/lockevent/")
print(held.status_code, events.status_code, "report:1" in held.content.decode())
"""


def test_hold_locks(demo: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    started = time.monotonic()
    workers = subprocess.Popen(
        [sys.executable, "manage.py", "hold_locks", "--workers", "1", "--seconds", "3"],
        cwd=ROOT,
        env=demo.env,  # type: ignore[attr-defined]
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert workers.stdout is not None
        assert "1 workers holding locks" in workers.stdout.readline()
        assert "holds report:1" in workers.stdout.readline()
        admin = subprocess.run(
            [sys.executable, "-c", ADMIN_SCRIPT],
            cwd=ROOT,
            env=demo.env,  # type: ignore[attr-defined]
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert admin.stdout.split() == ["200", "200", "True"], admin
        listed = demo("distlock", "list")
        assert "report:1" in listed.stdout
        stdout, stderr = workers.communicate(timeout=30)
    finally:
        if workers.poll() is None:
            workers.kill()
            workers.wait()
    assert workers.returncode == 0, stderr
    assert "released report:1" in stdout
    assert "all workers done" in stdout
    assert time.monotonic() - started < 30


def _login(site: str, password: str) -> urllib.request.OpenerDirector:
    """Log in to the demo's admin through its form, as a person would."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    page = opener.open(f"{site}/admin/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, page
    form = {"username": "admin", "password": password, "csrfmiddlewaretoken": token[1]}
    form["next"] = "/admin/"
    request = urllib.request.Request(
        f"{site}/admin/login/",
        data=urllib.parse.urlencode(form).encode(),
        headers={"Referer": f"{site}/admin/login/"},
    )
    assert "Site administration" in opener.open(request, timeout=10).read().decode()
    return opener


def test_demo_script_sets_up_and_serves_the_site(tmp_path: Path) -> None:
    """The README's first command, ``python3 testproject/demo.py``, without ``REDIS_URL``:
    its own Redis, a generated admin password, the site served, everything stopped on
    Ctrl-C. (Run with the suite's ``.venv``, so it skips creating one.)"""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(PORT=str(port), DEMO_DB=str(tmp_path / "demo.sqlite3"), PYTHONUNBUFFERED="1")
    demo = subprocess.Popen(
        [sys.executable, "testproject/demo.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    site = f"http://127.0.0.1:{port}"
    banner: list[str] = []
    try:
        assert demo.stdout is not None
        while not any("admin:" in line for line in banner):
            line = demo.stdout.readline()
            assert line, "".join(banner)
            banner.append(line)
        text = "".join(banner)
        redis_url = re.search(r"Redis at (redis://127\.0\.0\.1:\d+)", text)
        password = re.search(r"password: (\S+)", text)
        assert redis_url, text
        assert password, text
        assert f"{site}/admin/" in text
        deadline = time.monotonic() + 60
        while True:
            try:
                index = urllib.request.urlopen(f"{site}/", timeout=5).read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "the demo never answered"
                time.sleep(0.2)
        assert "INV-001" in index
        admin = _login(site, password[1])
        held = admin.open(f"{site}/admin/django_distlock/heldlock/", timeout=10).read().decode()
        assert "Held locks" in held
        assert redis.Redis.from_url(redis_url[1]).ping()
    finally:
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C
        try:
            demo.wait(timeout=30)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
            if demo.stdout is not None:
                demo.stdout.close()
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(redis_url[1], socket_connect_timeout=1).ping()
