"""``django_distlock.events``: what each ``EVENTS`` mode records, pruning, and force
releases (the writer thread: ``test_writer.py``; the rows: ``test_rows.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import threading
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from django_distlock import LockLost, distlock
from django_distlock.connections import get_backend
from django_distlock.engine import Lock
from django_distlock.engine.protocol.steps import HOSTNAME
from django_distlock.events import flush_events, prune_events, record_force_release
from django_distlock.models import HeldLock, LockEvent
from django_distlock.signals import lock_lost
from tests.support.engine import keys_of, lock_key
from tests.support.events import events_mode, kinds

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
        assert row.at.tzinfo is dt.UTC
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
def test_each_mode_records_the_kind_of_each_hold(mode, redis_client, event_writer):
    event_writer()
    with events_mode(mode):
        with distlock("export:7", limit=2) as first, distlock("export:7", limit=2) as second:
            fences = {first.fence, second.fence}
            assert not distlock("export:7", limit=2, blocking=False).acquire()
        with distlock("catalog", shared=True) as reader:
            reader.extend(5)
        flush_events()

    rows = list(LockEvent.objects.order_by("id").values_list("name", "kind", "mode", "limit"))
    assert rows == [
        ("export:7", "acquired", "limited", 2),
        ("export:7", "acquired", "limited", 2),
        ("export:7", "contended", "limited", 2),
        ("export:7", "released", "limited", 2),
        ("export:7", "released", "limited", 2),
        ("catalog", "acquired", "shared", None),
        ("catalog", "extended", "shared", None),
        ("catalog", "released", "shared", None),
    ]
    released = LockEvent.objects.filter(name="export:7", kind="released")
    assert set(released.values_list("fence", flat=True)) == fences  # each hold its own
    assert LockEvent.objects.filter(kind="acquired").first().mode_label == "shared"
    assert LockEvent.objects.filter(name="export:7").first().mode_label == "limited 2"


@pytest.mark.django_db(transaction=True)
def test_taking_a_reentrant_lock_again_records_nothing(redis_client):
    with events_mode("sync"):
        outer = distlock("order:5", reentrant=True)
        with outer, distlock("order:5", reentrant=True), outer:
            assert [e.kind for e in LockEvent.objects.filter(name="order:5")] == ["acquired"]
    rows = LockEvent.objects.filter(name="order:5").order_by("id")
    assert [(e.kind, e.mode) for e in rows] == [
        ("acquired", "exclusive"),
        ("released", "exclusive"),
    ]


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
            redis_client.delete(lock_key("short"))
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
async def test_an_async_shared_hold_records_its_mode_and_its_loss(redis_client, event_writer):
    event_writer()
    lost = asyncio.Event()
    loop = asyncio.get_running_loop()
    with events_mode("sync"):
        reader = distlock(
            "catalog",
            shared=True,
            timeout=0.6,
            raise_on_lost=False,
            on_lost=lambda lock: loop.call_soon_threadsafe(lost.set),
        )
        async with distlock("catalog", shared=True) as other, reader:
            fence = reader.fence
            # Its hold vanishes (as a force release would end it): its watchdog finds out.
            redis_client.hdel(keys_of("catalog").holders, reader.token)
            redis_client.zrem(keys_of("catalog").lock, reader.token)
            await asyncio.wait_for(lost.wait(), 10)
            assert await other.aowned()
    rows = await sync_to_async(list)(
        LockEvent.objects.filter(name="catalog").order_by("id").values_list("kind", "mode", "fence")
    )
    assert ("lost", "shared", fence) in rows
    assert [kind for kind, mode, _ in rows].count("acquired") == 2
    assert {mode for _, mode, _ in rows} == {"shared"}


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

    # The attempt that released nothing is no force release: it leaves no row.
    [first] = LockEvent.objects.filter(name="job")
    assert first.kind == "force_released"
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


@pytest.mark.django_db
def test_record_force_release_in_off_mode_records_nothing(django_user_model):
    with events_mode("off"):
        record_force_release(_held_lock(), None, released=True)
    assert not LockEvent.objects.exists()
