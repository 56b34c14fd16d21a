"""``django_distlock.events.rows``: lock events as ``LockEvent`` rows, on SQLite and on
PostgreSQL: every column holds the event's value (timestamps as the ORM stores them),
both modes write them, a bad row loses only itself."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import zoneinfo

import pytest
from django.test import override_settings
from django.utils import timezone

from django_distlock import distlock
from django_distlock.engine import Event
from django_distlock.events import dropped as eventdropped
from django_distlock.events import flush_events
from django_distlock.events import rows as eventrows
from django_distlock.events import writer as eventwriter
from django_distlock.models import LockEvent
from tests.support.events import events_mode

ALIASES = [pytest.param("default", id="sqlite"), pytest.param("pg", id="postgresql")]


class EventsTo:
    """A database router sending the lock events to ``alias``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def db_for_read(self, model, **hints):
        return self.alias if model is LockEvent else None

    db_for_write = db_for_read


# -- values --------------------------------------------------------------------------------

INSTANTS = (
    1_795_000_000.0,
    1_795_000_000.25,
    1_795_000_000.000001,
    1_795_000_000.999999,
    1_711_846_799.5,  # the last second before Paris moved to summer time
    1_711_846_800.5,
)
LONG = "x" * 300  # longer than the host, thread and context columns
CUT = "x" * 255


def value_items(user_pk: int) -> list[eventrows.Item]:
    """One event of each shape the package records, one instant each."""
    owner = {"context": "", "host": "h", "pid": 7, "thread": "t"}
    events = [
        Event(kind="acquired", name="v:0", fence=41, waited=0.0125, **owner),
        Event(kind="released", name="v:1", fence=41, held=1.5, mode="limited", limit=3, **owner),
        Event(kind="contended", name="v:2", fence=41, waited=2.5, mode="shared", **owner),
        Event(kind="lost", name="v:3", fence=42, reason="gone", **owner),
        Event(kind="force_released", name="v:4", fence=43, **owner),
        Event(kind="extended", name="v:5", fence=44, context=LONG, host=LONG, pid=8, thread=LONG),
    ]
    users = (None, None, None, None, user_pk, None)
    return [
        (dataclasses.replace(event, at=at), user)
        for event, at, user in zip(events, INSTANTS, users, strict=True)
    ]


def expected_rows(user_pk: int, use_tz: bool) -> list[dict[str, object]]:
    """The rows of :func:`value_items`, by column, as the ORM reads them back."""
    row = {"context": "", "host": "h", "pid": 7, "thread": "t", "user_id": None}
    row |= {"waited_ms": None, "held_ms": None, "reason": "", "mode": "exclusive", "limit": None}
    rows = [
        {**row, "name": "v:0", "kind": "acquired", "fence": 41, "waited_ms": 12.5},
        {**row, "name": "v:1", "kind": "released", "fence": 41, "held_ms": 1500.0}
        | {"mode": "limited", "limit": 3},
        {**row, "name": "v:2", "kind": "contended", "fence": None, "waited_ms": 2500.0}
        | {"mode": "shared"},
        {**row, "name": "v:3", "kind": "lost", "fence": 42, "reason": "gone"},
        {**row, "name": "v:4", "kind": "force_released", "fence": 43, "user_id": user_pk},
        {**row, "name": "v:5", "kind": "extended", "fence": 44, "context": CUT, "host": CUT}
        | {"pid": 8, "thread": CUT},
    ]
    paris = zoneinfo.ZoneInfo("Europe/Paris")
    for row, timestamp in zip(rows, INSTANTS, strict=True):
        instant = dt.datetime.fromtimestamp(timestamp, dt.UTC)
        row["at"] = instant if use_tz else timezone.make_naive(instant, paris)
    return rows


def stored_rows(alias: str) -> list[dict[str, object]]:
    """Every column of every ``LockEvent`` row but the id, by lock name."""
    return [
        {key: value for key, value in row.items() if key != "id"}
        for row in LockEvent.objects.using(alias).order_by("name").values()
    ]


@pytest.mark.django_db(transaction=True, databases=["default", "pg"])
@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize("use_tz", [True, False], ids=["aware", "naive"])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_every_column_holds_the_events_value(alias, use_tz, mode, event_writer, django_user_model):
    operator = django_user_model.objects.db_manager(alias).create_user("operator")
    items = value_items(operator.pk)
    writer = event_writer(flush_size=4)  # a batch of 4, then one of 2
    settings = override_settings(
        DATABASE_ROUTERS=[EventsTo(alias)], USE_TZ=use_tz, TIME_ZONE="Europe/Paris"
    )
    # Kept for ten years: the writer's prune would delete the events of 2024.
    with settings, events_mode("off", EVENT_RETENTION=10 * 365 * 24 * 3600):
        if mode == "async":
            for item in items:
                writer.append(item)
            assert writer.flush(30)
        else:
            for item in items:
                eventwriter.write_now(item)
        rows = stored_rows(alias)
    assert rows == expected_rows(operator.pk, use_tz)  # a new column needs a value there


@pytest.mark.django_db(transaction=True, databases=["default", "pg"])
@pytest.mark.parametrize("alias", ALIASES)
def test_the_locks_events_are_written_in_both_modes(alias, redis_client, event_writer):
    event_writer()
    before = timezone.now()
    with override_settings(DATABASE_ROUTERS=[EventsTo(alias)]):
        with events_mode("async"):
            with distlock("rows:async") as lock:
                fence = lock.fence
            with distlock("rows:limited", limit=3), distlock("rows:limited", limit=3):
                pass
        flush_events()
        with events_mode("sync"), distlock("rows:sync", shared=True):
            pass
        after = timezone.now()
        rows = list(
            LockEvent.objects.using(alias)
            .order_by("id")
            .values_list("name", "kind", "fence", "at", "mode", "limit")
        )
    assert [row[:2] for row in rows] == [
        ("rows:async", "acquired"), ("rows:async", "released"),
        ("rows:limited", "acquired"), ("rows:limited", "acquired"),
        ("rows:limited", "released"), ("rows:limited", "released"),
        ("rows:sync", "acquired"), ("rows:sync", "released"),
    ]  # fmt: skip
    assert rows[0][2] == rows[1][2] == fence
    assert all(before <= row[3] <= after for row in rows)
    modes = [("exclusive", None)] * 2 + [("limited", 3)] * 4 + [("shared", None)] * 2
    assert [row[4:] for row in rows] == modes


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


# -- bad rows ------------------------------------------------------------------------------


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
    monkeypatch.setattr(eventwriter, "_sync_losses", eventdropped.LostEventCounter())
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
