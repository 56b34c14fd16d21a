"""``django_distlock.events.rows``: lock events as database rows: timestamps as the ORM
stores them, every column filled, a bad row losing only itself, COPY on PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import logging
import subprocess
import sys
import time

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_distlock import distlock
from django_distlock.engine import Event
from django_distlock.events import losses as eventlosses
from django_distlock.events import rows as eventrows
from django_distlock.events import writer as eventwriter
from django_distlock.models import LockEvent
from tests.support import REPO_ROOT
from tests.support.events import events_mode

# -- timestamps and columns ----------------------------------------------------------------


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


# -- bad rows ------------------------------------------------------------------------------


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
    monkeypatch.setattr(eventwriter, "_sync_losses", eventlosses.LossReport())
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


# -- PostgreSQL ----------------------------------------------------------------------------


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
with distlock("pg:limited", limit=3), distlock("pg:limited", limit=3):
    pass
flush_events()
sync = override_settings(DISTLOCK={"URL": redis_url, "EVENTS": "sync"})
with sync, distlock("pg:sync", shared=True):
    pass
after = timezone.now()
rows = list(
    LockEvent.objects.order_by("id").values_list("name", "kind", "fence", "at", "mode", "limit")
)
assert [row[:2] for row in rows] == [
    ("pg:async", "acquired"), ("pg:async", "released"),
    ("pg:limited", "acquired"), ("pg:limited", "acquired"),
    ("pg:limited", "released"), ("pg:limited", "released"),
    ("pg:sync", "acquired"), ("pg:sync", "released"),
], rows
assert rows[0][2] == rows[1][2] == fence, rows
assert all(before <= row[3] <= after for row in rows), (before, after, rows)
assert [row[4:] for row in rows] == [("exclusive", None)] * 2 + [("limited", 3)] * 4 + [
    ("shared", None)
] * 2, rows
assert len(copies) == 1, copies  # the async batch; a single sync row is an INSERT
print("ok")
"""


def test_postgresql_gets_the_batch_by_copy_and_single_rows_by_insert(redis_client):
    from tests.support.postgres_servers import PostgresServer

    with PostgresServer() as server:
        child = subprocess.run(
            [sys.executable, "-c", POSTGRES_SCRIPT, json.dumps(server.settings("postgres"))],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert child.returncode == 0, child.stderr
    assert child.stdout == "ok\n"
