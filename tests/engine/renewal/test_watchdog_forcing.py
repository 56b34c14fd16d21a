"""Force release is felt at once: the holder's process hears the force release's notice
and tells the holder within a second, whatever its lease, naming the force release and
who did it; on every topology, sync and async, from another backend (another host)."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time

import pytest
import redis

from django_distlock.engine import Lock, LockLost, LostCause, force_release
from django_distlock.engine.renewal import watchdog
from django_distlock.engine.renewal.watchdog import listening, subscriptions
from tests.support.engine import Recorder, primaries_of, wait_until

LEASE = 30.0
"""Renewals come every 10 s: a holder told within a second was told by the notice."""


async def test_the_holder_is_told_within_a_second_naming_who(api, make_backend, redis_client):
    recorder = Recorder()
    backend = make_backend(observer=recorder)
    operator = make_backend()  # the admin's process: its own clients and connections
    told = threading.Event()
    told_at: list[float] = []

    def on_lost(lock: Lock) -> None:
        told_at.append(time.monotonic())
        told.set()

    lock = Lock("forced", backend=backend, timeout=LEASE, on_lost=on_lost)

    async def hold_while_forced() -> None:
        async with api.hold(lock):
            assert await asyncio.to_thread(listening, backend, 10.0)
            started = time.monotonic()
            assert force_release(operator, "forced", lock.token, by="user 'alice'")
            assert await asyncio.to_thread(told.wait, 5.0), "the holder was not told"
            assert lock.lost
            told_at[0] -= started

    with pytest.raises(LockLost, match="force-released by user 'alice'"):
        await hold_while_forced()
    delay = told_at[0]
    print(f"force-release notice delay: {delay * 1000:.1f} ms")
    assert delay < 1.0
    [lost] = recorder.of("lost")
    assert lost.cause == LostCause.FORCED == "forced"
    assert lost.reason == "it was force-released by user 'alice'"


async def test_a_notice_for_another_token_leaves_the_holder_alone(api, make_backend, redis_client):
    backend = make_backend()
    lock = Lock("kept", backend=backend, timeout=LEASE)
    other = Lock("other", backend=make_backend(), timeout=LEASE, auto_renew=False)
    async with api.hold(lock):
        assert await asyncio.to_thread(listening, backend, 10.0)
        other.acquire()
        assert force_release(backend, "other", other.token, by="user 'bob'")
        assert not force_release(backend, "kept", "not-its-token", by="user 'bob'")
        await asyncio.sleep(0.3)
        assert not lock.lost
        assert await api.owned(lock)


def test_the_subscription_comes_back_after_its_connection_is_cut(make_backend, redis_client):
    """The server drops the subscriber's connection (a restart, a failover, a proxy):
    the process subscribes again by itself, and the next force release is still told
    within a second."""
    backend = make_backend()
    told = threading.Event()
    lock = Lock("cut", backend=backend, timeout=LEASE, on_lost=lambda lock: told.set())

    delays: list[float] = []

    def cut_then_force_release() -> None:
        with lock:
            assert listening(backend, 10.0)
            assert subscriptions(backend) == 1
            cut = sum(
                primary.client_kill_filter(_type="pubsub", skipme=True)
                for primary in primaries_of(redis_client)
            )
            assert cut >= 1
            wait_until(lambda: subscriptions(backend) == 2 and listening(backend))
            started = time.monotonic()
            assert force_release(make_backend(), "cut", lock.token, by="user 'carol'")
            assert told.wait(5.0)
            delays.append(time.monotonic() - started)

    with pytest.raises(LockLost, match="force-released by user 'carol'"):
        cut_then_force_release()
    assert delays[0] < 1.0


def test_closing_the_backend_ends_its_subscription_without_reconnecting(make_backend, redis_client):
    """Closing a backend closes the subscription's connection and opens none again
    (regression: the listener thread, reading the connection ``close()`` shut, took the
    error for a lost server, and redis-py's retry opened it again, named like the client,
    until the thread's next poll ended: a second after the close, or more on a busy
    machine)."""
    # redis-py's own retry, as a client built without options has it (the suite's
    # clients fail at once instead).
    default_retry = inspect.signature(redis.Redis).parameters["retry"].default
    backend = make_backend(client_kwargs={"client_name": "forced-close", "retry": default_retry})

    def named() -> set[int]:
        return {
            int(client["id"])
            for primary in primaries_of(redis_client)
            for client in primary.client_list()
            if client["name"] == "forced-close"
        }

    with Lock("closing", backend=backend, timeout=LEASE):
        assert listening(backend, 10.0)
        time.sleep(0.3)  # the listener thread is in its poll's read
    backend.client.close()  # from here on, only the engine's connections carry the name
    assert named()
    open_at_close = named()
    backend.close()
    seen: set[int] = set()
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        seen |= named()
        time.sleep(0.01)
    assert not seen - open_at_close, "a connection was opened after the backend was closed"
    assert not named()


async def test_the_listener_asks_for_one_hold_of_its_backend_not_for_every_hold(
    api, make_backend, redis_client, monkeypatch
):
    """Every poll, the listener asks whether a hold of its backend is still renewed, a look
    that stops at the first such hold; it does not list every renewed hold (regression:
    at 50,000 held locks that list, made every second, took a quarter of the watchdog's
    CPU). It still ends once no hold of its backend is renewed."""
    monkeypatch.setattr(watchdog, "POLL", 0.02)
    monkeypatch.setattr(watchdog, "LISTEN_IDLE", 0.2)
    listed: list[str] = []
    asked: list[str] = []
    for kind in (watchdog.ThreadWatchdog, watchdog.LoopWatchdog):
        holds, watches = kind.holds, kind.watches

        def counted_holds(self, holds=holds):
            listed.append(type(self).__name__)
            return holds(self)

        def counted_watches(self, backend, watches=watches):
            asked.append(type(self).__name__)
            return watches(self, backend)

        monkeypatch.setattr(kind, "holds", counted_holds)
        monkeypatch.setattr(kind, "watches", counted_watches)
    backend = make_backend()
    other = make_backend()  # its renewed hold must not keep this backend's listener
    locks = [Lock(f"polled:{number}", backend=backend, timeout=LEASE) for number in range(3)]
    async with api.hold(Lock("elsewhere", backend=other, timeout=LEASE)):
        try:
            for lock in locks:
                assert await api.acquire(lock)
            assert await asyncio.to_thread(listening, backend, 10.0)
            asked.clear()
            await asyncio.sleep(0.5)  # 25 polls, longer than LISTEN_IDLE
            assert len(asked) >= 5
            assert listed == []
            assert listening(backend)  # its holds are renewed: it stays
        finally:
            for lock in locks:
                if lock.held:
                    await api.release(lock)
        await asyncio.to_thread(wait_until, lambda: not listening(backend), 5.0)
        assert listening(other)
