"""``LockedCommand`` and ``LockedCommandMixin``: through ``call_command`` and as real
``manage.py`` processes contending for the same lock."""

from __future__ import annotations

import io
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.test import override_settings

from django_distlock import distlock
from django_distlock.commands.locked import LockedCommand, LockedCommandMixin
from django_distlock.models import HeldLock
from tests.support import REPO_ROOT
from tests.support.commands_app.management.commands import sync_catalog
from tests.support.engine import (
    blocked_clients,
    held_until_a_waiter_blocks,
    lock_key,
    stored_lock,
    wait_until,
)

HOSTNAME = socket.gethostname()


def _run(*args: str, **options: object) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def probe(monkeypatch, redis_client) -> list[dict[str, object]]:
    """Replace sync_catalog's handle() with one recording what Redis holds meanwhile."""
    seen: list[dict[str, object]] = []

    def handle(self, *args, **options):
        seen.append(
            {
                "stored": stored_lock(redis_client, "sync_catalog"),
                "pttl": redis_client.pttl(lock_key("sync_catalog")),
                "lock": self.lock,
                "fence": None if self.lock is None else self.lock.fence,
            }
        )

    monkeypatch.setattr(sync_catalog.Command, "handle", handle)
    return seen


def test_runs_under_a_lock_named_after_the_command(redis_client, probe):
    _run("sync_catalog")
    [seen] = probe
    stored = seen["stored"]
    assert stored is not None
    assert stored.fence == seen["fence"]
    assert stored.owner["context"] == "manage.py sync_catalog"
    assert stored.owner["pid"] == os.getpid()
    assert stored.owner["host"] == HOSTNAME
    assert stored.owner["auto_renew"] is True
    assert 29_000 < seen["pttl"] <= 30_000  # DISTLOCK["TIMEOUT"] by default
    assert not redis_client.exists(lock_key("sync_catalog"))


def test_the_command_sees_its_lock(redis_client):
    out, _ = _run("sync_catalog")
    assert out.startswith("locked sync_catalog fence=")
    assert int(out.split("fence=")[1]) > 0


def test_busy_lock_is_a_command_error_naming_the_holder(redis_client):
    with distlock("sync_catalog", context="test"), pytest.raises(CommandError) as info:
        _run("sync_catalog")
    message = str(info.value)
    assert message.startswith(
        f"lock 'sync_catalog' is held by {HOSTNAME}:{os.getpid()} MainThread since "
    )
    assert " UTC (" in message
    assert "ago); use --lock-wait to wait" in message


def test_busy_message_without_holder_details_when_the_holder_vanished(redis_client, monkeypatch):
    monkeypatch.setattr(HeldLock.objects, "filter", lambda **lookup: [])
    with distlock("sync_catalog"), pytest.raises(CommandError) as info:
        _run("sync_catalog")
    assert str(info.value) == (
        "lock 'sync_catalog' is busy (its holder could not be read: it may have released it "
        "just now); try again, or use --lock-wait to wait"
    )


def test_lock_wait_waits_for_the_holder_to_release(redis_client):
    with held_until_a_waiter_blocks(distlock("sync_catalog"), redis_client):
        out, _ = _run("sync_catalog", "--lock-wait", "20")
    assert out.startswith("locked sync_catalog")
    assert not redis_client.exists(lock_key("sync_catalog"))


def test_lock_wait_that_runs_out_names_the_wait(redis_client):
    with distlock("sync_catalog"), pytest.raises(CommandError) as info:
        _run("sync_catalog", lock_wait=0.05)
    assert "is still held by " in str(info.value)
    assert "after waiting " in str(info.value)


def test_class_attribute_lock_wait_applies(redis_client):
    class Patient(LockedCommand):
        lock_name = "patient"
        lock_wait = 0.05

        def handle(self, *args, **options):
            raise AssertionError("must not run")

    with distlock("patient"), pytest.raises(CommandError, match="after waiting"):
        _run(Patient())


def test_no_lock_runs_without_the_lock(redis_client):
    with distlock("sync_catalog"):
        out, _ = _run("sync_catalog", "--no-lock")
    assert out == "ran without a lock\n"


def test_lock_timeout_option_sets_the_lease(redis_client, probe):
    _run("sync_catalog", "--lock-timeout", "7")
    assert 6_000 < probe[0]["pttl"] <= 7_000
    assert probe[0]["stored"].lease_ms == 7_000


def test_lock_timeout_class_attribute_and_template_name(redis_client):
    class Probe(LockedCommand):
        lock_name = "import:{source}:{verbosity}"
        lock_timeout = 5

        def add_arguments(self, parser):
            parser.add_argument("source")

        def handle(self, *args, **options):
            self.stdout.write(str(redis_client.pttl(lock_key(self.lock.name))))

    out, _ = _run(Probe(), "catalog", verbosity=2)
    assert 4_000 < int(out) <= 5_000
    assert not redis_client.exists(lock_key("import:catalog:2"))


def test_lock_name_template_is_filled_from_the_options(redis_client):
    out, _ = _run("import_source", "catalog")
    assert out.startswith("locked import:catalog fence=")
    # Another source is another lock; the same source is busy.
    with distlock("import:catalog"):
        out, _ = _run("import_source", "prices")
        assert out.startswith("locked import:prices")
        with pytest.raises(CommandError, match="lock 'import:catalog' is held by"):
            _run("import_source", "catalog")


def test_a_template_naming_a_missing_option_is_a_command_error(redis_client):
    class Broken(LockedCommand):
        lock_name = "import:{nope}"

        def handle(self, *args, **options):
            raise AssertionError("must not run")

    with pytest.raises(CommandError, match=r"lock_name 'import:\{nope\}' .* cannot be filled"):
        _run(Broken())


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("x" * 600, "at most 512 characters"),
        ("a\x00b", "must not contain NUL"),
        ("lone\ud800", "encodable as UTF-8"),
    ],
    ids=["600-chars", "nul", "surrogate"],
)
def test_an_option_that_cannot_be_in_the_lock_name_is_a_command_error(
    redis_client, source, problem
):
    with pytest.raises(CommandError, match=rf"invalid lock for import_source: .*{problem}"):
        _run("import_source", source)
    assert redis_client.dbsize() == 0


def test_a_custom_get_lock_name(redis_client):
    class Custom(LockedCommand):
        def get_lock_name(self, **options):
            return f"custom:{options['verbosity'] * 10}"

        def handle(self, *args, **options):
            self.stdout.write(self.lock.name)

    out, _ = _run(Custom(), verbosity=3)
    assert out == "custom:30\n"


def test_mixin_on_an_existing_base_command(redis_client):
    out, _ = _run("legacy_report", "--day", "mon")
    assert out == "report for mon under legacy_report\n"
    with distlock("legacy_report"), pytest.raises(CommandError, match="is held by"):
        _run("legacy_report")
    with distlock("legacy_report"):
        out, _ = _run("legacy_report", no_lock=True)
    assert out == "report for today under None\n"


def test_mixin_works_with_any_base_command_subclass(redis_client):
    class Base(BaseCommand):
        def handle(self, *args, **options):
            self.stdout.write(f"base {self.lock.context}")

    class Command(LockedCommandMixin, Base):
        lock_name = "subclassed"

    out, _ = _run(Command())
    assert out == "base manage.py test_locked\n"


def test_a_command_name_too_long_for_a_context_label_is_cut_to_fit(redis_client):
    class Command(LockedCommand):
        lock_name = "long-command"

        def handle(self, *args, **options):
            self.stdout.write(stored_lock(redis_client, "long-command").owner["context"])

    Command.__module__ = "app.management.commands." + "c" * 250
    out, _ = _run(Command())
    assert out == ("manage.py " + "c" * 250)[:255] + "\n"


def test_lock_lost_while_running_fails_even_if_handle_returns(redis_client):
    lost = threading.Event()

    class Doomed(LockedCommand):
        lock_name = "doomed"
        lock_timeout = 0.6  # renewed every 0.2 s

        def on_lock_lost(self):
            super().on_lock_lost()
            lost.set()

        def handle(self, *args, **options):
            redis_client.delete(lock_key("doomed"))  # e.g. an operator's force-release
            assert lost.wait(10)
            assert self.lock.lost

    err = io.StringIO()
    with pytest.raises(CommandError) as info:
        call_command(Doomed(), stdout=io.StringIO(), stderr=err)
    assert str(info.value).startswith("lock 'doomed' was lost while the command ran")
    assert "Warning: lock 'doomed' was lost" in err.getvalue()


def test_a_failing_handle_releases_the_lock_and_keeps_its_error(redis_client):
    class Failing(LockedCommand):
        lock_name = "failing"

        def handle(self, *args, **options):
            raise CommandError("the work failed")

    with pytest.raises(CommandError, match=r"^the work failed$"):
        _run(Failing())
    assert not redis_client.exists(lock_key("failing"))
    with distlock("failing") as lock:  # free again
        assert stored_lock(redis_client, "failing").token == lock.token


def test_redis_down_is_a_command_error_naming_redis(dead_redis_url):
    caches = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": dead_redis_url,
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1},
        }
    }
    with override_settings(CACHES=caches), pytest.raises(CommandError) as info:
        _run("sync_catalog")
    assert "Redis unavailable" in str(info.value)
    assert "sync_catalog" in str(info.value)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--lock-wait=-1", "must not be negative"),
        ("--lock-wait=soon", "invalid duration 'soon'"),
        ("--lock-timeout=0", "must be more than zero seconds"),
        ("--lock-timeout=5w", "unknown unit 'w'"),
        ("--lock-timeout=400d", "at most 31536000 seconds"),
        ("--lock-timeout=1000000000000", "at most 31536000 seconds"),
        ("--lock-wait=366d", "at most 31536000 seconds"),
    ],
)
def test_bad_lock_options_are_rejected(redis_client, option, message):
    with pytest.raises(CommandError, match=message):
        _run("sync_catalog", option)
    assert not redis_client.exists(lock_key("sync_catalog"))


def test_lock_options_accept_durations(redis_client, probe):
    _run("sync_catalog", "--lock-timeout", "2m")
    assert 119_000 < probe[0]["pttl"] <= 120_000


# -- real processes -------------------------------------------------------------------


def _manage(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", *args, "--settings", "tests.settings"]


class Processes:
    """``manage.py`` processes started by a test; all killed and reaped afterwards."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []
        self.pumps: list[threading.Thread] = []

    def start(self, *args: str, **kwargs: object) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            _manage(*args),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kwargs,
        )
        self.started.append(process)
        return process

    def lines(self, process: subprocess.Popen[str]) -> queue.Queue[str]:
        """The process's stdout lines as they come ("" at the end)."""
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            for line in process.stdout:
                lines.put(line)
            lines.put("")

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        self.pumps.append(thread)
        return lines

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait(10)
        for thread in self.pumps:
            thread.join(10)
        for process in self.started:
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def processes() -> Iterator[Processes]:
    started = Processes()
    yield started
    started.close()


def test_two_manage_py_processes_contend(redis_client, processes):
    holder = processes.start("sync_catalog", "--hold", stdin=subprocess.PIPE)
    lines = processes.lines(holder)
    assert lines.get(timeout=30).startswith("locked sync_catalog fence=")
    assert lines.get(timeout=10) == "ready\n"

    second = subprocess.run(
        _manage("sync_catalog"), cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
    )
    assert second.returncode == 1
    assert f"is held by {HOSTNAME}:{holder.pid} MainThread since " in second.stderr
    assert second.stdout == ""

    # A third one waits, and runs once the holder lets go.
    waiter = processes.start("sync_catalog", "--lock-wait", "30")
    wait_until(lambda: blocked_clients(redis_client) == 1, timeout=30)
    holder.stdin.write("done\n")
    holder.stdin.flush()
    assert holder.wait(20) == 0
    out, err = waiter.communicate(timeout=20)
    assert waiter.returncode == 0, err
    assert out.startswith("locked sync_catalog fence=")


# -- kinds: lock_limit, lock_shared ---------------------------------------------------------


def test_lock_limit_lets_n_runs_hold_the_lock(redis_client):
    with distlock("export_reports", limit=2, context="first run"):
        out, _ = _run("export_reports")
        assert out.startswith("slot of export_reports fence=")
        assert out.rstrip().endswith("mode=limited")
        with distlock("export_reports", limit=2), pytest.raises(CommandError) as info:
            _run("export_reports")
    message = str(info.value)
    assert message.startswith("lock 'export_reports' is held by 2 holders (limited 2/2): ")
    assert message.count(f"{HOSTNAME}:{os.getpid()} MainThread since ") == 2
    assert message.endswith("; use --lock-wait to wait")
    assert not redis_client.exists(lock_key("export_reports"))


def test_a_busy_limited_lock_names_three_holders_and_counts_the_others(redis_client, hold):
    for _ in range(5):
        hold.enter_context(distlock("export_reports", limit=5))

    class Command(LockedCommand):
        lock_name = "export_reports"
        lock_limit = 5

        def handle(self, *args, **options):
            raise AssertionError("must not run")

    with pytest.raises(CommandError) as info:
        call_command(Command(), stdout=io.StringIO())
    message = str(info.value)
    assert message.startswith("lock 'export_reports' is held by 5 holders (limited 5/5): ")
    assert message.count(" since ") == 3
    assert "; and 2 more; use --lock-wait to wait" in message


def test_lock_shared_runs_beside_other_shared_holds(redis_client, monkeypatch):
    monkeypatch.setattr(sync_catalog.Command, "lock_shared", True)
    with distlock("sync_catalog", shared=True):
        out, _ = _run("sync_catalog")
        assert out.startswith("locked sync_catalog fence=")
    with distlock("sync_catalog"), pytest.raises(CommandError, match="is held by "):
        _run("sync_catalog")


def test_bad_kind_attributes_are_refused_when_the_class_is_defined():
    with pytest.raises(ValueError, match=r"\.Both: limit and shared cannot be combined"):

        class Both(LockedCommand):
            lock_limit = 2
            lock_shared = True

    with pytest.raises(TypeError, match="limit must be an int"):

        class Text(LockedCommandMixin, BaseCommand):
            lock_limit = "2"
