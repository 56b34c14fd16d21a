"""Signals: one per lock event, carrying the engine's Event, in every writer mode."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from django.dispatch import Signal

from django_distlock import LockLost, distlock
from django_distlock import signals as distlock_signals
from django_distlock.engine import Event, Lock
from django_distlock.engine.protocol.steps import HOSTNAME
from django_distlock.events import flush_events, record_force_release
from django_distlock.models import HeldLock, LockEvent
from django_distlock.signals import (
    lock_acquired,
    lock_contended,
    lock_extended,
    lock_force_released,
    lock_lost,
    lock_released,
)
from tests.support.engine import lock_key
from tests.support.events import events_mode

LOCK_SIGNALS = (lock_acquired, lock_released, lock_extended, lock_contended, lock_lost)


@contextlib.contextmanager
def receiving(*signals: Signal, sender: object = None) -> Iterator[list[dict]]:
    """Every send of ``signals`` while inside, as ``{"signal": ..., "sender": ...,
    **kwargs}``, with the name of the thread it ran in."""
    received: list[dict] = []

    def receiver(signal, sender, **kwargs):
        received.append(
            {"signal": signal, "sender": sender, "thread": threading.current_thread().name} | kwargs
        )

    for signal in signals:
        signal.connect(receiver, sender=sender)
    try:
        yield received
    finally:
        for signal in signals:
            signal.disconnect(receiver, sender=sender)


def test_the_module_exports_seven_signals():
    assert sorted(distlock_signals.__all__) == [
        "lock_acquired",
        "lock_contended",
        "lock_extended",
        "lock_force_released",
        "lock_lost",
        "lock_not_replicated",
        "lock_released",
    ]
    for name in distlock_signals.__all__:
        assert isinstance(getattr(distlock_signals, name), Signal)


def test_each_lock_event_sends_its_signal_with_the_event(redis_client):
    started = time.monotonic()
    with (
        events_mode("off"),
        receiving(*LOCK_SIGNALS, sender=Lock) as received,
        distlock("invoice:42", context="billing.pay") as lock,
    ):
        fence = lock.fence
        lock.extend(5)
        assert not distlock("invoice:42", blocking=False).acquire()
    elapsed = time.monotonic() - started

    assert [r["signal"] for r in received] == [
        lock_acquired,
        lock_extended,
        lock_contended,
        lock_released,
    ]
    assert {r["sender"] for r in received} == {Lock}
    events = [r["event"] for r in received]
    assert all(isinstance(event, Event) for event in events)
    assert [event.kind for event in events] == ["acquired", "extended", "contended", "released"]
    acquired, extended, contended, released = events
    assert acquired.fence == extended.fence == released.fence == fence
    assert contended.fence is None
    assert contended.retry_after > 0
    # Both measured, and both within the test (their order depends on the round trips).
    assert 0 < acquired.waited < elapsed
    assert 0 < released.held < elapsed
    assert (acquired.name, acquired.context, acquired.host) == (
        "invoice:42",
        "billing.pay",
        HOSTNAME,
    )
    assert {r["thread"] for r in received} == {"MainThread"}


def test_signals_of_shared_and_limited_holds_carry_their_mode(redis_client):
    with events_mode("off"), receiving(*LOCK_SIGNALS, sender=Lock) as received:
        with distlock("catalog", shared=True) as reader, distlock("catalog", shared=True):
            assert not distlock("catalog", blocking=False).acquire()  # a writer
            reader_fence = reader.fence
        with distlock("export:7", limit=3) as slot:
            slot.extend(5)

    events = [r["event"] for r in received]
    assert [(e.name, e.kind, e.mode, e.limit) for e in events] == [
        ("catalog", "acquired", "shared", None),
        ("catalog", "acquired", "shared", None),
        ("catalog", "contended", "exclusive", None),
        ("catalog", "released", "shared", None),
        ("catalog", "released", "shared", None),
        ("export:7", "acquired", "limited", 3),
        ("export:7", "extended", "limited", 3),
        ("export:7", "released", "limited", 3),
    ]
    assert events[0].fence == reader_fence
    assert events[0].fence < events[1].fence  # each hold its own fence


def test_lock_lost_is_sent_from_the_watchdog(redis_client):
    lost = threading.Event()
    with events_mode("off"), receiving(lock_lost) as received:
        lock_lost.connect(lambda **kwargs: lost.set(), weak=False, dispatch_uid="test-lost")
        try:
            lock = distlock("short", timeout=0.6)
            assert lock.acquire()
            redis_client.delete(lock_key("short"))
            assert lost.wait(10)
            with pytest.raises(LockLost):
                lock.release()
        finally:
            lock_lost.disconnect(dispatch_uid="test-lost")
    [sent] = received
    assert sent["sender"] is Lock
    assert sent["event"].kind == "lost"
    assert "another holder" in sent["event"].reason
    # Told from the notifier thread, never from the renewal path.
    assert sent["thread"] == "distlock-notifier"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["off", "sync", "async"])
def test_signals_are_sent_in_every_mode(mode, redis_client, event_writer):
    event_writer()
    with events_mode(mode), receiving(*LOCK_SIGNALS) as received, distlock("any"):
        pass
    assert [r["event"].kind for r in received] == ["acquired", "released"]


@pytest.mark.django_db
def test_an_event_is_recorded_before_its_signal_is_sent(redis_client):
    seen: list[int] = []
    with events_mode("sync"), receiving(lock_acquired) as received:
        lock_acquired.connect(
            lambda **kwargs: seen.append(LockEvent.objects.filter(name="first").count()),
            weak=False,
            dispatch_uid="test-count",
        )
        try:
            with distlock("first"):
                pass
        finally:
            lock_acquired.disconnect(dispatch_uid="test-count")
    assert len(received) == 1
    assert seen == [1]


@pytest.mark.django_db
def test_a_failing_receiver_breaks_neither_the_lock_nor_the_record(redis_client, caplog):
    def broken(**kwargs):
        raise RuntimeError("receiver bug")

    lock_acquired.connect(broken)
    try:
        with (
            caplog.at_level(logging.ERROR, logger="django.dispatch"),
            events_mode("sync"),
            receiving(lock_acquired) as received,
            distlock("sturdy") as lock,
        ):
            assert lock.owned()
    finally:
        lock_acquired.disconnect(broken)
    assert len(received) == 1  # the other receiver still ran
    rows = LockEvent.objects.filter(name="sturdy").order_by("id")
    assert list(rows.values_list("kind", flat=True)) == ["acquired", "released"]
    assert "receiver bug" in caplog.text


def test_async_receivers_run_for_sync_locks(redis_client):
    seen: list[str] = []

    async def receiver(sender, event, **kwargs):
        await asyncio.sleep(0)
        seen.append(event.kind)

    lock_acquired.connect(receiver)
    try:
        with events_mode("off"), distlock("mixed"):
            assert seen == ["acquired"]
    finally:
        lock_acquired.disconnect(receiver)


async def test_async_locks_call_sync_receivers_at_once_and_schedule_async_ones(redis_client):
    awaited = asyncio.Event()
    kinds: list[str] = []

    async def async_receiver(sender, event, **kwargs):
        kinds.append(event.kind)
        awaited.set()

    lock_acquired.connect(async_receiver)
    try:
        with events_mode("off"), receiving(lock_acquired) as received:
            async with distlock("in-a-loop"):
                assert [r["event"].kind for r in received] == ["acquired"]
                assert received[0]["thread"] == threading.current_thread().name
                await asyncio.wait_for(awaited.wait(), 10)
    finally:
        lock_acquired.disconnect(async_receiver)
    assert kinds == ["acquired"]


async def test_a_failing_async_receiver_is_logged(redis_client, caplog):
    failed = asyncio.Event()

    async def broken(sender, **kwargs):
        failed.set()
        raise RuntimeError("async receiver bug")

    lock_acquired.connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="django.dispatch"), events_mode("off"):
            async with distlock("in-a-loop"):
                await asyncio.wait_for(failed.wait(), 10)
                for _ in range(3):
                    await asyncio.sleep(0)
    finally:
        lock_acquired.disconnect(broken)
    assert "async receiver bug" in caplog.text


def test_force_release_sends_lock_force_released(django_user_model):
    held = HeldLock(name="job", host="worker-1", pid=1, thread="t", context="", fence=3)
    with events_mode("off"), receiving(lock_force_released) as received:
        record_force_release(held, None, released=True)
        record_force_release(held, None, released=False)
    assert [r["sender"] for r in received] == [HeldLock, HeldLock]
    assert [r["held_lock"] for r in received] == [held, held]
    assert [r["user"] for r in received] == [None, None]
    assert [r["released"] for r in received] == [True, False]


@pytest.mark.django_db
def test_force_release_signal_carries_the_user(django_user_model):
    operator = django_user_model.objects.create_user("operator")
    held = HeldLock(name="job", host="worker-1", pid=1, thread="t", context="", fence=3)
    with events_mode("sync"), receiving(lock_force_released, sender=HeldLock) as received:
        record_force_release(held, operator, released=True)
    [sent] = received
    assert sent["user"] == operator
    flush_events()
    assert LockEvent.objects.get(name="job").user == operator
