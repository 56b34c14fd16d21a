"""``LockTestHelper`` in this process: where it points ``DISTLOCK``, and the other side of
a test's locks (another holder, a lock taken away, an outage), on the suite's server."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.http import HttpResponse
from django.test import RequestFactory, override_settings

from django_distlock import LockBackendUnavailable, LockLost, distlock, lock_view
from django_distlock.models import LockEvent
from django_distlock.signals import lock_lost
from django_distlock.testing import HOLDER_CONTEXT, LockTestHelper

pytestmark = pytest.mark.django_db


@pytest.fixture
def locks(redis_server):
    with override_settings(DISTLOCK={"EVENTS": "off", "TIMEOUT": 12, "SENTINELS": [("x", 1)]}):
        helper = LockTestHelper(redis_server.url)
        helper.apply()
        yield helper
        helper.stop()


@lock_view("pay:{pk}")
def pay(request, pk):
    return HttpResponse("paid")


def test_it_points_distlock_at_its_server_under_a_fresh_prefix(redis_server):
    before = settings.DISTLOCK
    with override_settings(DISTLOCK={"TIMEOUT": 12, "SENTINELS": [("x", 1)], "MIN_REPLICAS": 2}):
        first, second = LockTestHelper(redis_server.url), LockTestHelper(redis_server.url)
        assert first.prefix != second.prefix
        with first:
            assert {
                "TIMEOUT": 12,  # the project's own keys stay
                "URL": redis_server.url,
                "KEY_PREFIX": first.prefix,
                "EVENTS": "sync",
            } == settings.DISTLOCK
            with distlock("report:1"):
                assert first.held() == ["report:1"]
                assert second.held() == []  # another test's prefix sees nothing
            assert LockEvent.objects.filter(name="report:1").count() == 2  # EVENTS="sync"
        second.stop()  # never applied: nothing to undo
    assert before == settings.DISTLOCK


def test_hold_is_another_owner(locks):
    factory = RequestFactory()
    with locks.hold("pay:7", timeout=5) as held:
        assert held.context == HOLDER_CONTEXT
        assert not distlock("pay:7", blocking=False).acquire()
        busy = pay(factory.post("/"), pk=7)
        assert busy.status_code == 423
        assert 1 <= int(busy["Retry-After"]) <= 5
        assert locks.held() == ["pay:7"]
        with pytest.raises(AssertionError, match="held already"), locks.hold("pay:7"):
            pass
    assert pay(factory.post("/"), pk=7).status_code == 200
    locks.assert_none_held()


def test_shared_holds_share(locks):
    with locks.hold("catalog", shared=True), locks.hold("catalog", shared=True):
        assert not distlock("catalog", blocking=False).acquire()
        reader = distlock("catalog", shared=True, blocking=False)
        assert reader.acquire()
        reader.release()
        assert locks.held() == ["catalog"]
    locks.assert_none_held()


@pytest.mark.django_db(transaction=True)  # the lost event is written from another thread
def test_lose_tells_the_holder_before_it_returns(locks):
    told: list[tuple[str, str]] = []

    def on_signal(sender, event, **named):
        told.append(("signal", event.name))

    lock = distlock(
        "report:2", timeout=30, on_lost=lambda lock: told.append(("on_lost", lock.name))
    )
    lock_lost.connect(on_signal)
    try:
        assert lock.acquire()
        started = time.monotonic()
        assert locks.lose("report:2") == 1
        took = time.monotonic() - started
        assert lock.lost
        assert sorted(told) == [("on_lost", "report:2"), ("signal", "report:2")]
    finally:
        lock_lost.disconnect(on_signal)
    with pytest.raises(LockLost):
        lock.release()
    assert took < 1.0  # not a renewal interval (10 s for a 30 s lease)
    assert LockEvent.objects.filter(name="report:2", kind="lost").count() == 1
    assert locks.held() == []
    assert locks.lose("nobody") == 0


# Events from async code are written on another thread's connection, outside the test's
# transaction: flushed after the test, they cannot reach the next one.
@pytest.mark.django_db(transaction=True)
async def test_in_async_code(locks):
    with locks.hold("report:5"):
        assert not await distlock("report:5", blocking=False).aacquire()
    lock = distlock("report:3", timeout=30)
    assert await lock.aacquire()
    assert locks.lose("report:3") == 1  # called on the holder's own loop
    assert lock.lost
    with pytest.raises(LockLost):
        await lock.arelease()


def test_lose_takes_a_lock_held_through_hold(locks):
    with locks.hold("pay:8"):
        assert locks.lose("pay:8") == 1
        assert locks.held() == []  # leaving the block does not fail the test


def test_unavailable_for_this_process_only(locks, redis_server):
    factory = RequestFactory()
    with locks.hold("pay:9"):
        with locks.unavailable():
            with pytest.raises(LockBackendUnavailable):
                distlock("report:4", blocking=False).acquire()
            assert pay(factory.post("/"), pk=1).status_code == 503
            with override_settings(DISTLOCK={**settings.DISTLOCK, "VIEW_FAIL_OPEN": True}):
                assert pay(factory.post("/"), pk=1).status_code == 200
            assert redis_server.client().ping()  # the server itself runs on
            assert locks.held() == ["pay:9"]  # the helper's own connection too
        with distlock("report:4"):
            assert locks.held() == ["pay:9", "report:4"]
    assert settings.DISTLOCK["URL"] == redis_server.url


def test_assert_none_held_names_the_locks(locks):
    with (
        distlock("left:1"),
        distlock("left:2"),
        pytest.raises(AssertionError, match="locks still held: left:1, left:2"),
    ):
        locks.assert_none_held()


def test_start_runs_a_server_of_its_own_until_stop(monkeypatch):
    monkeypatch.delenv("DISTLOCK_TEST_URL", raising=False)
    before = settings.DISTLOCK
    with LockTestHelper.start() as helper:
        assert helper.url != settings.CACHES["default"]["LOCATION"]
        with distlock("own:1"):
            assert helper.held() == ["own:1"]
        server = helper._server
        assert server is not None
        assert server.pid is not None
    assert server.pid is None
    assert before == settings.DISTLOCK


def test_start_uses_distlock_test_url(monkeypatch, redis_server):
    monkeypatch.setenv("DISTLOCK_TEST_URL", redis_server.url)
    helper = LockTestHelper.start()
    try:
        assert helper.url == redis_server.url
        assert helper._server is None
    finally:
        helper.stop()
