"""``check_holds_now``: the watchdog asked to check one lock's holds at once, so that a
holder whose lock was taken away is told before the call returns (not a third of a lease
later), on the sync and the async path."""

from __future__ import annotations

import time

import pytest

from django_distlock.engine import Lock, LockLost, check_holds_now
from django_distlock.engine.keys import LockKeys
from tests.support.engine import PREFIX, Recorder


class OnLost:
    def __init__(self) -> None:
        self.calls: list[Lock] = []

    def __call__(self, lock: Lock) -> None:
        self.calls.append(lock)


async def test_a_lock_taken_away_is_lost_when_check_returns(api, make_backend, redis_client):
    recorder = Recorder()
    backend = make_backend(observer=recorder)
    on_lost = OnLost()
    lock = Lock("taken", backend=backend, timeout=30, on_lost=on_lost)

    async def hold_while_taken_away() -> float:
        async with api.hold(lock):
            # Taken away without a force release's notice: its key is gone from Redis.
            assert redis_client.delete(LockKeys.for_name(PREFIX, "taken").lock) == 1
            started = time.monotonic()
            assert check_holds_now("taken", prefix=PREFIX) == 1
            took = time.monotonic() - started
            assert lock.lost
            assert on_lost.calls == [lock]
            assert [event.cause for event in recorder.of("lost")] == ["gone"]
            return took

    with pytest.raises(LockLost):
        assert await hold_while_taken_away() < 1.0
    assert check_holds_now("taken") == 0  # settled: nothing left to check


async def test_a_lock_still_held_stays_held(api, backend, redis_client):
    lock = Lock("kept", backend=backend, timeout=30)
    other = Lock("other", backend=backend, timeout=30)
    async with api.hold(lock), api.hold(other):
        assert check_holds_now("kept") == 1
        assert check_holds_now("kept", prefix="another:") == 0
        assert check_holds_now("nobody") == 0
        assert not lock.lost
        assert await api.owned(lock)
        assert 29 < await api.ttl(lock) <= 30


def test_holds_without_auto_renew_are_not_checked(backend, redis_client):
    with Lock("manual", backend=backend, timeout=30, auto_renew=False):
        assert check_holds_now("manual") == 0
