"""Recording lock events: the writer modes, the async writer's buffer and thread, outages,
process exit and fork, pruning, and force releases."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_distlock import LockLost, distlock, eventrows, eventwriter
from django_distlock.connections import get_backend
from django_distlock.engine import Event, Lock
from django_distlock.engine.core import HOSTNAME
from django_distlock.events import flush_events, prune_events, record_force_release
from django_distlock.models import HeldLock, LockEvent
from django_distlock.signals import lock_lost

ROOT = Path(__file__).resolve().parent.parent


def events_mode(mode: str, **options: object) -> override_settings:
    return override_settings(DISTLOCK={"EVENTS": mode, **options})


def kinds(name: str) -> list[str]:
    return list(LockEvent.objects.filter(name=name).order_by("id").values_list("kind", flat=True))


@pytest.fixture
def missing_table(transactional_db):
    """The LockEvent table is dropped for the test (a database that lost it)."""
    with connection.schema_editor() as editor:
        editor.delete_model(LockEvent)
    yield
    with connection.schema_editor() as editor:
        editor.create_model(LockEvent)


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


# -- what each mode records ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_mode_records_acquire_extend_contended_release(mode, redis_client, event_writer):
    event_writer()
    before = timezone.now()
    started = time.monotonic()
    with events_mode(mode):
        with distlock("invoice:42", context="billing.pay", timeout=10) as lock:
            fence = lock.fence
            lock.extend(5)
            assert not distlock("invoice:42", blocking=False).acquire()
        flush_events()
    elapsed_ms = (time.monotonic() - started) * 1000
    after = timezone.now()

    rows = list(LockEvent.objects.filter(name="invoice:42").order_by("id"))
    assert [row.kind for row in rows] == ["acquired", "extended", "contended", "released"]
    acquired, extended, contended, released = rows
    assert acquired.fence == extended.fence == released.fence == fence
    assert contended.fence is None
    assert [row.context for row in rows] == ["billing.pay", "billing.pay", "", "billing.pay"]
    for row in rows:
        assert (row.host, row.pid, row.thread) == (HOSTNAME, os.getpid(), "MainThread")
        assert before <= row.at <= after
        assert row.at.tzinfo is not None
        assert row.user is None
    # Each took a round trip to Redis, within the test's own duration.
    assert 0 < acquired.waited_ms < elapsed_ms
    assert acquired.held_ms is None
    assert 0 < contended.waited_ms < elapsed_ms
    assert 0 < released.held_ms < elapsed_ms
    assert released.held_ms > contended.waited_ms  # the contended try ran during the hold
    assert released.waited_ms is None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_mode_records_a_lost_lock(mode, redis_client, event_writer):
    event_writer()
    lost = threading.Event()

    def on_lost(sender, event, **kwargs):
        lost.set()

    lock_lost.connect(on_lost, sender=Lock)
    started = time.monotonic()
    try:
        with events_mode(mode):
            lock = distlock("short", timeout=0.6)  # renewed every 0.2 s
            assert lock.acquire()
            fence = lock.fence
            redis_client.delete("distlock:{short}")
            assert lost.wait(10)
            with pytest.raises(LockLost):
                lock.release()
            flush_events()
    finally:
        lock_lost.disconnect(on_lost, sender=Lock)
    elapsed_ms = (time.monotonic() - started) * 1000

    acquired, lost_row = LockEvent.objects.filter(name="short").order_by("id")
    assert (acquired.kind, lost_row.kind) == ("acquired", "lost")
    assert lost_row.fence == fence
    assert "another holder" in lost_row.reason
    assert 0 < lost_row.held_ms < elapsed_ms  # from the acquire to the renewal that found out


@pytest.mark.django_db(transaction=True)
async def test_async_locks_record_events_in_sync_mode_before_returning(redis_client, event_writer):
    event_writer()
    with events_mode("sync"):
        async with distlock("async:job", context="tasks.nightly") as lock:
            fence = lock.fence
            rows = await sync_to_async(kinds)("async:job")
            assert rows == ["acquired"]
    assert await sync_to_async(kinds)("async:job") == ["acquired", "released"]
    row = await LockEvent.objects.filter(name="async:job").afirst()
    assert (row.fence, row.context) == (fence, "tasks.nightly")


@pytest.mark.django_db(transaction=True)
async def test_async_locks_record_events_in_async_mode(redis_client, event_writer):
    event_writer()
    with events_mode("async"):
        async with distlock("async:job"):
            pass
        await sync_to_async(flush_events, thread_sensitive=False)()
    assert await sync_to_async(kinds)("async:job") == ["acquired", "released"]


@pytest.mark.django_db(transaction=True)
def test_off_mode_records_nothing(redis_client, event_writer):
    writer = event_writer()
    with events_mode("off"), distlock("quiet") as lock:
        lock.extend(1)
    flush_events()
    assert not LockEvent.objects.exists()
    assert writer.dropped_total == 0
    assert "buffered=0" in repr(writer)


@pytest.mark.django_db(transaction=True)
def test_settings_changes_switch_the_mode(redis_client, event_writer):
    event_writer()
    with events_mode("off"):
        off_backend = get_backend()
        with distlock("a"):
            pass
    with events_mode("sync"):
        assert get_backend() is not off_backend
        with distlock("b"):
            pass
        assert kinds("b") == ["acquired", "released"]
    with events_mode("async"):
        with distlock("c"):
            pass
        assert kinds("c") == []
        flush_events()
        assert kinds("c") == ["acquired", "released"]
    assert kinds("a") == []


@pytest.mark.django_db(transaction=True)
def test_async_mode_does_no_database_work_in_the_lock_path(
    redis_client, event_writer, django_assert_num_queries
):
    event_writer()
    with events_mode("async"), django_assert_num_queries(0), distlock("fast") as lock:
        lock.extend(1)
    flush_events()
    assert kinds("fast") == ["acquired", "extended", "released"]


@pytest.mark.django_db
def test_sync_mode_writes_inside_the_callers_transaction(redis_client):
    with events_mode("sync"):
        with contextlib.suppress(RuntimeError), transaction.atomic():
            with distlock("rolled-back"):
                pass
            assert kinds("rolled-back") == ["acquired", "released"]
            raise RuntimeError("roll back")
        assert kinds("rolled-back") == []


@pytest.mark.django_db
def test_datetimes_are_naive_without_time_zone_support(redis_client):
    with override_settings(USE_TZ=False), events_mode("sync"):
        before = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        with distlock("naive"):
            pass
        after = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        rows = list(LockEvent.objects.filter(name="naive"))
    assert len(rows) == 2
    for row in rows:
        assert row.at.tzinfo is None
        assert before <= row.at <= after  # TIME_ZONE is UTC


@pytest.mark.django_db
@pytest.mark.parametrize("use_tz", [True, False])
def test_timestamps_are_stored_as_the_orm_would_store_them(use_tz):
    with override_settings(USE_TZ=use_tz, TIME_ZONE="Europe/Paris"):
        stored_at = eventrows.timestamp_adapter(connection)
        for timestamp in (
            1_795_000_000.0,
            1_795_000_000.25,
            1_795_000_000.000001,
            1_795_000_000.999999,
            1_711_846_799.5,  # the last second before Paris moved to summer time
            1_711_846_800.5,
        ):
            instant = dt.datetime.fromtimestamp(timestamp, dt.UTC)
            value = instant if use_tz else timezone.make_naive(instant)
            assert stored_at(timestamp) == connection.ops.adapt_datetimefield_value(value)


def test_the_writer_fills_every_column():
    columns = {field.name for field in LockEvent._meta.concrete_fields if not field.primary_key}
    assert set(eventrows.WRITTEN_FIELDS) == columns


@pytest.mark.django_db(transaction=True)
def test_long_labels_are_refused_or_cut_to_fit(redis_client, event_writer):
    event_writer()
    with pytest.raises(ValueError, match="context must be at most 255 characters"):
        distlock("labels", context="c" * 256)

    def hold() -> None:
        with distlock("labels", context="c" * 255):
            pass

    with events_mode("async"):
        thread = threading.Thread(target=hold, name="t" * 300)
        thread.start()
        thread.join()
    flush_events()
    rows = LockEvent.objects.filter(name="labels")
    assert [(len(row.context), len(row.thread)) for row in rows] == [(255, 255), (255, 255)]


# -- the async writer ------------------------------------------------------------------


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
    assert kinds("size") == ["acquired", "released"] * 2


@pytest.mark.django_db(transaction=True)
def test_async_writer_flushes_on_its_interval(redis_client, event_writer, writes):
    event_writer(interval=0.2, flush_size=1000)
    with events_mode("async"), distlock("interval"):
        pass
    assert writes.wait(10)
    assert kinds("interval") == ["acquired", "released"]


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
    [record] = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "15 events were dropped" in record.getMessage()


def test_the_child_of_a_fork_starts_with_an_empty_writer(monkeypatch):
    monkeypatch.setattr(eventwriter, "_writer", eventwriter.BufferedEventWriter())
    eventwriter._forget_writer_after_fork()
    assert eventwriter.current_writer() is None


# -- bad rows --------------------------------------------------------------------------


class EventsTo:
    """A database router sending the lock events to ``alias``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model, **hints):
        return self.alias if model is LockEvent else None

    db_for_write = db_for_read


def good_item(number: int) -> eventrows.Item:
    event = Event(
        kind="acquired", name=f"good:{number:02}", fence=number, context="ctx", host="h",
        pid=1, thread="t", at=time.time(),
    )  # fmt: skip
    return event, None


def bad_item(kind: str) -> eventrows.Item:
    """A row the database refuses, built directly as nothing in the package would."""
    if kind == "nul":  # PostgreSQL text cannot hold NUL
        event = Event(
            kind="acquired", name="bad", fence=1, context="a\x00b", host="h", pid=1,
            thread="t\x00", at=time.time(),
        )  # fmt: skip
        return event, None
    # A force release by a user deleted before the event was written.
    event = Event(
        kind="force_released", name="bad", fence=1, context="", host="h", pid=1, thread="t",
        at=time.time(),
    )  # fmt: skip
    return event, 987654


BAD_ROWS = [
    pytest.param("default", "missing-user", "foreign key", id="sqlite-missing-user"),
    pytest.param("pg", "nul", "NUL", id="postgresql-nul"),
    pytest.param("pg", "missing-user", "foreign key", id="postgresql-missing-user"),
]


def stored_names(alias: str) -> list[str]:
    return sorted(LockEvent.objects.using(alias).values_list("name", flat=True))


@pytest.mark.django_db(transaction=True, databases=["default", "pg"])
@pytest.mark.parametrize(("alias", "bad", "error"), BAD_ROWS)
def test_a_bad_row_loses_only_itself_in_async_mode(alias, bad, error, event_writer, caplog):
    writer = event_writer(flush_size=10)  # 46 rows: 5 sub-batches, the bad row in the 3rd
    items = [good_item(number) for number in range(45)]
    items.insert(23, bad_item(bad))
    with (
        override_settings(DATABASE_ROUTERS=[EventsTo(alias)]),
        caplog.at_level(logging.WARNING, logger="django_distlock.events"),
    ):
        for item in items:
            writer.append(item)
        assert writer.flush(30)
        assert stored_names(alias) == [f"good:{number:02}" for number in range(45)]
    assert writer.failed_total == 1
    [record] = [r for r in caplog.records if "could not record" in r.getMessage()]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "could not record 1 lock event(s)" in message
    assert "lock 'bad'" in message
    assert error.lower() in message.lower()


@pytest.mark.django_db(transaction=True, databases=["default", "pg"])
@pytest.mark.parametrize(("alias", "bad", "error"), BAD_ROWS)
def test_a_bad_row_is_logged_and_never_raised_in_sync_mode(alias, bad, error, caplog, monkeypatch):
    monkeypatch.setattr(eventwriter, "_sync_losses", eventwriter.LossReport())
    with (
        override_settings(DATABASE_ROUTERS=[EventsTo(alias)]),
        caplog.at_level(logging.WARNING, logger="django_distlock.events"),
    ):
        eventwriter.write_now(bad_item(bad))
        eventwriter.write_now(good_item(1))
        assert stored_names(alias) == ["good:01"]
    [record] = [r for r in caplog.records if "could not record" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "lock 'bad'" in record.getMessage()
    assert error.lower() in record.getMessage().lower()


# -- outages ---------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_database_outage_loses_events_but_never_breaks_locks(
    redis_client, event_writer, missing_table, caplog
):
    writer = event_writer()
    with caplog.at_level(logging.WARNING, logger="django_distlock.events"):
        with events_mode("async"):
            for _ in range(3):
                with distlock("outage") as lock:
                    assert lock.fence is not None
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
    monkeypatch.setattr(eventwriter, "_sync_losses", eventwriter.LossReport())
    with (
        caplog.at_level(logging.WARNING, logger="django_distlock.events"),
        events_mode("sync"),
        transaction.atomic(),
    ):
        django_user_model.objects.create_user("alice")
        with distlock("outage") as lock:
            assert lock.fence is not None
        # A failed insert in our savepoint does not poison the caller's transaction.
        assert django_user_model.objects.count() == 1
    assert django_user_model.objects.filter(username="alice").exists()
    [record] = [r for r in caplog.records if "could not record" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "could not record 1 lock event(s)" in record.getMessage()


def test_sync_mode_without_database_access_still_locks(redis_client, caplog, monkeypatch):
    monkeypatch.setattr(eventwriter, "_sync_losses", eventwriter.LossReport())
    with (
        caplog.at_level(logging.WARNING, logger="django_distlock.events"),
        events_mode("sync"),
        distlock("no-db") as lock,
    ):
        assert lock.owned()
    assert "Database access not allowed" in caplog.text


# -- process exit and fork -------------------------------------------------------------

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
from django_distlock import distlock, events, eventwriter
eventwriter.FLUSH_INTERVAL = 3600.0  # nothing is written before the process ends
"""


def _run_child(script: str, database: Path, **options) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD_SETUP + script, str(database)],
        cwd=ROOT,
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


POSTGRES_SCRIPT = """
import json, os, sys
import django
from django.conf import settings

redis_url = os.environ["DISTLOCK_TEST_REDIS_URL"]
settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_distlock"],
    DATABASES={"default": json.loads(sys.argv[1])},
    DISTLOCK={"URL": redis_url, "EVENTS": "async"},
    USE_TZ=True,
    TIME_ZONE="Asia/Tokyo",
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)

import psycopg
from django.test.utils import override_settings
from django.utils import timezone
from django_distlock import distlock
from django_distlock.events import flush_events
from django_distlock.models import LockEvent

copies = []
real_copy = psycopg.Cursor.copy
psycopg.Cursor.copy = lambda self, *args, **kwargs: copies.append(args) or real_copy(
    self, *args, **kwargs
)
before = timezone.now()
with distlock("pg:async") as lock:
    fence = lock.fence
flush_events()
with override_settings(DISTLOCK={"URL": redis_url, "EVENTS": "sync"}), distlock("pg:sync"):
    pass
after = timezone.now()
rows = list(LockEvent.objects.order_by("id").values_list("name", "kind", "fence", "at"))
assert [row[:2] for row in rows] == [
    ("pg:async", "acquired"), ("pg:async", "released"),
    ("pg:sync", "acquired"), ("pg:sync", "released"),
], rows
assert rows[0][2] == rows[1][2] == fence, rows
assert all(before <= row[3] <= after for row in rows), (before, after, rows)
assert len(copies) == 1, copies  # the async batch; a single sync row is an INSERT
print("ok")
"""


def test_postgresql_gets_the_batch_by_copy_and_single_rows_by_insert(redis_client):
    from tests.support.postgres_servers import PostgresServer

    with PostgresServer() as server:
        child = subprocess.run(
            [sys.executable, "-c", POSTGRES_SCRIPT, json.dumps(server.settings("postgres"))],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert child.returncode == 0, child.stderr
    assert child.stdout == "ok\n"


# -- pruning ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_prune_events_deletes_older_events_and_counts_them():
    now = timezone.now()
    for hours in (50, 30, 10, 1):
        LockEvent.objects.create(
            name=f"{hours}h", kind="acquired", at=now - dt.timedelta(hours=hours)
        )
    assert prune_events(dt.timedelta(days=1)) == 2
    assert set(LockEvent.objects.values_list("name", flat=True)) == {"10h", "1h"}
    assert prune_events(dt.timedelta(days=1)) == 0


def test_prune_events_rejects_bad_ages():
    with pytest.raises(TypeError, match="timedelta"):
        prune_events(3600)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        prune_events(dt.timedelta(seconds=-1))


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


# -- force release ---------------------------------------------------------------------


def _held_lock(**fields: object) -> HeldLock:
    values = {
        "name": "job",
        "host": "worker-1",
        "pid": 4242,
        "thread": "MainThread",
        "context": "billing.pay",
        "fence": 77,
        "acquired_at": timezone.now() - dt.timedelta(seconds=5),
        "lease": 30.0,
        "ttl": 25.0,
        "auto_renew": True,
        "token": "0123456789abcdef",
        **fields,
    }
    return HeldLock(**values)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_record_force_release_records_the_lock_and_who_released_it(
    mode, django_user_model, event_writer
):
    event_writer()
    operator = django_user_model.objects.create_user("operator")
    with events_mode(mode):
        record_force_release(_held_lock(), operator, released=True)
        record_force_release(_held_lock(), None, released=False)
        flush_events()

    first, second = LockEvent.objects.filter(name="job").order_by("id")
    assert first.kind == second.kind == "force_released"
    assert (first.fence, first.host, first.pid, first.thread, first.context) == (
        77,
        "worker-1",
        4242,
        "MainThread",
        "billing.pay",
    )
    assert first.user == operator
    assert first.reason == "force-released by operator"
    assert first.held_ms >= 5000
    assert second.user is None
    assert "nothing released" in second.reason


@pytest.mark.django_db
def test_record_force_release_in_off_mode_records_nothing(django_user_model):
    with events_mode("off"):
        record_force_release(_held_lock(), None, released=True)
    assert not LockEvent.objects.exists()
