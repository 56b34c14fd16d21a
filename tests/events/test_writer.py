"""``django_distlock.events.writer``: the async writer's buffer, thread and flushes, database
outages, process exit and fork, and its hourly prune."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.db.backends.signals import connection_created
from django.utils import timezone

from django_distlock import distlock
from django_distlock.events import dropped as eventdropped
from django_distlock.events import flush_events
from django_distlock.events import writer as eventwriter
from django_distlock.models import LockEvent
from tests.support import REPO_ROOT
from tests.support.events import HungDatabase, events_mode, kinds
from tests.support.servers import HOST

# -- the async writer ----------------------------------------------------------------------


@pytest.fixture
def writes(monkeypatch):
    """A ``threading.Event`` set each time the async writer has written a batch."""
    written = threading.Event()
    real = eventwriter.write_in_batches

    def write_in_batches(items, batch_size):
        result = real(items, batch_size)
        written.set()
        return result

    monkeypatch.setattr(eventwriter, "write_in_batches", write_in_batches)
    return written


@pytest.mark.django_db(transaction=True)
def test_async_writer_flushes_when_flush_size_events_are_buffered(
    redis_client, event_writer, writes
):
    event_writer(flush_size=4)  # and a one-hour interval
    with events_mode("async"):
        with distlock("size"):
            pass
        assert not writes.is_set()
        with distlock("size"):
            pass
        assert writes.wait(10)
    # The writer may still prune after its first flush: read once it is idle (SQLite's
    # shared in-memory database refuses a read while another connection writes).
    flush_events()
    assert kinds("size") == ["acquired", "released"] * 2


@pytest.mark.django_db(transaction=True)
def test_async_writer_flushes_on_its_interval(redis_client, event_writer, writes):
    event_writer(interval=0.2, flush_size=1000)
    with events_mode("async"), distlock("interval"):
        pass
    assert writes.wait(10)
    assert kinds("interval") == ["acquired", "released"]


@pytest.mark.django_db(transaction=True)
def test_the_writer_thread_closes_its_own_connections_when_it_ends(redis_client, event_writer):
    # The test database is SQLite in memory, whose connections Django's close() leaves
    # open: a thread that ended with one open left it to the garbage collector (Python
    # 3.13 warns "unclosed database").
    opened = []

    def created(sender, connection, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            opened.append(connection.connection)

    connection_created.connect(created)
    try:
        writer = event_writer()
        with events_mode("async"), distlock("closed"):
            pass
        flush_events()
        assert kinds("closed") == ["acquired", "released"]
        writer.close(10)  # joins the thread
    finally:
        connection_created.disconnect(created)
    assert opened, "the writer thread opened no connection"
    for raw in opened:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            raw.execute("SELECT 1")


@pytest.mark.django_db(transaction=True)
def test_flush_events_writes_the_buffer_now(redis_client, event_writer):
    event_writer()  # flushes only when told
    with events_mode("async"), distlock("told"):
        pass
    assert kinds("told") == []
    flush_events()
    assert kinds("told") == ["acquired", "released"]


def test_flush_events_without_a_writer_returns_at_once_and_starts_nothing(monkeypatch):
    monkeypatch.setattr(eventwriter, "_writer", None)
    writer_threads = {t for t in threading.enumerate() if t.name == "distlock-events"}
    started = time.monotonic()
    flush_events(timeout=5)
    assert time.monotonic() - started < 1  # did not wait for its timeout
    assert eventwriter.current_writer() is None
    assert {t for t in threading.enumerate() if t.name == "distlock-events"} <= writer_threads


@pytest.mark.django_db(transaction=True)
def test_a_full_buffer_drops_events_and_counts_them(redis_client, event_writer, caplog):
    writer = event_writer(capacity=5)
    with caplog.at_level(logging.WARNING, logger="django_distlock.events"):
        with events_mode("async"):
            for _ in range(10):
                with distlock("burst"):
                    pass
        assert writer.dropped_total == 15
        flush_events()
        assert len(kinds("burst")) == 5
        writer.close(10)
    # The first drop at once, the others within the quiet minute summed up at exit.
    records = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.WARNING] * 2
    assert "buffer is full (5 events" in records[0].getMessage()
    assert "dropped 1 lock event(s)" in records[0].getMessage()
    assert "dropped 14 lock event(s)" in records[1].getMessage()


def test_the_child_of_a_fork_starts_with_an_empty_writer(monkeypatch):
    monkeypatch.setattr(eventwriter, "_writer", eventwriter.BufferedEventWriter())
    eventwriter._forget_writer_after_fork()
    assert eventwriter.current_writer() is None


# -- outages -------------------------------------------------------------------------------


@pytest.fixture
def missing_table(transactional_db):
    """The LockEvent table is dropped for the test (a database that lost it)."""
    with connection.schema_editor() as editor:
        editor.delete_model(LockEvent)
    yield
    with connection.schema_editor() as editor:
        editor.create_model(LockEvent)


@pytest.mark.django_db(transaction=True)
def test_a_database_outage_loses_events_but_never_breaks_locks(
    redis_client, event_writer, missing_table, caplog
):
    writer = event_writer()
    with caplog.at_level(logging.WARNING, logger="django_distlock.events"):
        with events_mode("async"):
            for _ in range(3):
                with distlock("outage") as lock:
                    assert lock.owned()  # Redis says so: the outage is the database's
        flush_events()
    assert writer.failed_total == 6
    [record] = [r for r in caplog.records if "could not record" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "could not record 6 lock event(s)" in record.getMessage()
    assert "lockevent" in record.getMessage()  # the database's error names the table
    # The writer keeps going once the database is back.
    with connection.schema_editor() as editor:
        editor.create_model(LockEvent)
    with events_mode("async"), distlock("outage"):
        pass
    flush_events()
    assert kinds("outage") == ["acquired", "released"]
    with connection.schema_editor() as editor:
        editor.delete_model(LockEvent)


@pytest.mark.django_db(transaction=True)
def test_sync_mode_outage_is_logged_and_leaves_the_callers_transaction_usable(
    redis_client, missing_table, caplog, monkeypatch, django_user_model
):
    monkeypatch.setattr(eventwriter, "_sync_losses", eventdropped.LostEventCounter())
    with (
        caplog.at_level(logging.WARNING, logger="django_distlock.events"),
        events_mode("sync"),
        transaction.atomic(),
    ):
        django_user_model.objects.create_user("alice")
        with distlock("outage") as lock:
            assert lock.owned()
        # A failed insert in our savepoint does not poison the caller's transaction.
        assert django_user_model.objects.count() == 1
    assert django_user_model.objects.filter(username="alice").exists()
    [record] = [r for r in caplog.records if "could not record" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "could not record 1 lock event(s)" in record.getMessage()


def test_sync_mode_without_database_access_still_locks(redis_client, caplog, monkeypatch):
    monkeypatch.setattr(eventwriter, "_sync_losses", eventdropped.LostEventCounter())
    with (
        caplog.at_level(logging.WARNING, logger="django_distlock.events"),
        events_mode("sync"),
        distlock("no-db") as lock,
    ):
        assert lock.owned()
    assert "Database access not allowed" in caplog.text


@pytest.fixture
def hung_database(monkeypatch):
    """A :class:`HungDatabase` in place of the writer's row writing; it recovers at the
    end of the test at the latest, so the writer can stop."""
    hung = HungDatabase()
    monkeypatch.setattr(eventwriter, "write_in_batches", hung.hanging(eventwriter.write_in_batches))
    yield hung
    hung.recover()


def _hang_with_a_full_buffer(writer, hung: HungDatabase) -> None:
    """2 events in the writer's hung batch, 4 in its buffer (full), 4 dropped."""
    with distlock("hang"):
        pass  # a full batch (flush_size=2): the writer takes it and hangs
    assert hung.writing.wait(10)
    for _ in range(4):
        with distlock("hang"):
            pass
    assert writer.dropped_total == 4


@pytest.mark.django_db(transaction=True)
def test_events_dropped_while_the_database_hangs_are_logged_from_the_recording_side(
    redis_client, event_writer, hung_database, caplog
):
    """The loss report used to run only on the writer thread: stuck in the database, it
    said nothing about the events dropped meanwhile, for as long as the hang lasted."""
    writer = event_writer(capacity=4, flush_size=2)
    with caplog.at_level(logging.WARNING, logger="django_distlock.events"):
        with events_mode("async"):
            _hang_with_a_full_buffer(writer, hung_database)
        dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
        assert dropped, "no warning while the writer was stuck"
        assert hung_database.writing.is_set()
        assert not hung_database.recovered.is_set()
        # Rate-limited: the first drop is logged at once, the next ones summed up later.
        [record] = dropped
        assert record.levelno == logging.WARNING
        assert "dropped 1 lock event(s)" in record.getMessage()
        assert record.threadName != "distlock-events"


@pytest.mark.django_db(transaction=True)
def test_the_warning_at_exit_counts_every_event_lost(
    redis_client, event_writer, hung_database, caplog
):
    """It used to count the buffer only: not the batch the writer was stuck on, nor the
    events dropped before (the issue saw "0 buffered events" for 100 lost)."""
    writer = event_writer(capacity=4, flush_size=2)
    with caplog.at_level(logging.WARNING, logger="django_distlock.events"):
        with events_mode("async"):
            _hang_with_a_full_buffer(writer, hung_database)
        writer.close(0.2)
    [record] = [r for r in caplog.records if "gave up waiting" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert (
        "10 lock event(s) lost in all (4 buffered, 2 being written, "
        "4 dropped from the full buffer, 0 lost to database errors)"
    ) in record.getMessage()
    hung_database.recover()
    flush_events()  # the writer ends once the database answers, writing what it held
    assert kinds("hang") == ["acquired", "released"] * 3


SILENT_DATABASE_SCRIPT = """
import json, os, sys, time
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_distlock"],
    DATABASES={"default": json.loads(sys.argv[1])},
    DISTLOCK={"URL": os.environ["DISTLOCK_TEST_REDIS_URL"], "EVENTS": "async"},
    USE_TZ=True,
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()
from django.db import connections
from django_distlock import distlock
from django_distlock.events import writer as eventwriter

eventwriter.CONNECT_TIMEOUT = 2  # psycopg's least
eventwriter.EXIT_TIMEOUT = 0.5
with distlock("pg:silent"):
    pass
writer = eventwriter.current_writer()
started = time.monotonic()
flushed = writer.flush(12)
print(json.dumps({
    "flushed": flushed,
    "seconds": time.monotonic() - started,
    "failed": writer.failed_total,
    "own_options": connections["default"].settings_dict["OPTIONS"],
}))
"""


def test_the_writer_gives_up_connecting_to_a_postgresql_that_never_answers(redis_client):
    """A server that accepts TCP and never answers kept the writer in ``connect`` for
    psycopg's default of 130 s (libpq's: for ever): the writer's own connection now has a
    ``connect_timeout``; the application's connections keep their options."""
    with socket.create_server((HOST, 0)) as silent:  # the kernel accepts; nobody answers
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "distlock",
            "USER": "postgres",
            "HOST": HOST,
            "PORT": str(silent.getsockname()[1]),
        }
        child = subprocess.run(
            [sys.executable, "-c", SILENT_DATABASE_SCRIPT, json.dumps(database)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert child.returncode == 0, child.stderr
    result = json.loads(child.stdout)
    assert result["flushed"], child.stderr
    assert 1.5 < result["seconds"] < 8, result
    assert result["failed"] == 2
    assert "connect_timeout" not in result["own_options"]
    [lost] = [line for line in child.stderr.splitlines() if "could not record" in line]
    assert "could not record 2 lock event(s)" in lost
    assert "connection timeout expired" in lost  # psycopg's words
    assert "could not prune" not in child.stderr  # which would have waited once more


# -- process exit and fork -----------------------------------------------------------------


CHILD_SETUP = """
import os, sys
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_distlock"],
    DATABASES={"default": {
        "ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1], "OPTIONS": {"timeout": 60},
    }},
    DISTLOCK={"URL": os.environ["DISTLOCK_TEST_REDIS_URL"], "EVENTS": "async"},
    USE_TZ=True,
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django_distlock import distlock, events
from django_distlock.events import writer as eventwriter
eventwriter.FLUSH_INTERVAL = 3600.0  # nothing is written before the process ends
"""


def _run_child(script: str, database: Path, **options) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD_SETUP + script, str(database)],
        cwd=REPO_ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **options,
    )


def _stored(database: Path) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(database)) as db:
        return db.execute("SELECT name, kind FROM django_distlock_lockevent ORDER BY id").fetchall()


def test_events_are_written_at_process_exit(tmp_path, redis_client):
    database = tmp_path / "events.sqlite3"
    child = _run_child('with distlock("exit"):\n    pass\n', database)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert _stored(database) == [("exit", "acquired"), ("exit", "released")]


def test_exit_is_prompt_when_the_database_hangs(tmp_path, redis_client):
    database = tmp_path / "events.sqlite3"
    script = """
eventwriter.EXIT_TIMEOUT = 0.5
print("migrated", flush=True)
sys.stdin.readline()
with distlock("exit:hung"):
    pass
"""
    child = _run_child(script, database, stdin=subprocess.PIPE)
    try:
        assert child.stdout.readline() == "migrated\n"
        # The child's insert now waits up to its 60 s busy timeout.
        with contextlib.closing(sqlite3.connect(database, isolation_level=None)) as blocker:
            blocker.execute("BEGIN EXCLUSIVE")
            child.stdin.write("go\n")
            child.stdin.flush()
            _, err = child.communicate(timeout=30)
            blocker.execute("ROLLBACK")
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert "gave up waiting 0.5 s for the lock event writer" in err
    assert _stored(database) == []


def test_a_forked_child_writes_its_own_events_and_not_its_parents(tmp_path, redis_client):
    database = tmp_path / "events.sqlite3"
    script = """
import multiprocessing

with distlock("fork:parent"):
    pass  # buffered in the parent when it forks

def child():
    with distlock("fork:child"):
        pass  # written by the child's own writer as it exits (os._exit)

process = multiprocessing.get_context("fork").Process(target=child)
process.start()
process.join(30)
assert process.exitcode == 0, process.exitcode
events.flush_events()
"""
    child = _run_child(script, database)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert sorted(_stored(database)) == [
        ("fork:child", "acquired"),
        ("fork:child", "released"),
        ("fork:parent", "acquired"),
        ("fork:parent", "released"),
    ]


# -- pruning -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_async_writer_prunes_past_the_retention_at_most_hourly(redis_client, event_writer):
    now = timezone.now()
    LockEvent.objects.create(name="old", kind="acquired", at=now - dt.timedelta(hours=2))
    LockEvent.objects.create(name="recent", kind="acquired", at=now - dt.timedelta(minutes=30))
    event_writer()
    with events_mode("async", EVENT_RETENTION=3600):
        with distlock("fresh"):
            pass
        flush_events()
        assert set(LockEvent.objects.values_list("name", flat=True)) == {"recent", "fresh"}

        LockEvent.objects.create(name="old again", kind="acquired", at=now - dt.timedelta(hours=2))
        with distlock("fresh"):
            pass
        flush_events()
        assert LockEvent.objects.filter(name="old again").exists()  # pruned an hour later
