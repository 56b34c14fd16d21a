"""Redis failures: a server killed, paused (SIGSTOP) or restarted without its data, on a
private server per test. Every failure surfaces as LockBackendUnavailable within the
socket timeouts, and a holder is told it lost the lock no later than its lease end."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_distlock.engine import Lock, LockBackendUnavailable, LockLost
from tests.support.engine import (
    Recorder,
    await_until,
    blocked_clients,
    deadline_of,
    lock_key,
    thread_future,
)

FAST = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}


async def test_release_on_a_dead_server_raises_and_the_holder_learns_it_lost(
    api, make_backend, private_redis
):
    recorder = Recorder()
    lost_at = []
    backend = make_backend(private_redis, client_kwargs=FAST, observer=recorder)
    lock = Lock(
        "doomed", backend=backend, timeout=1.0, on_lost=lambda _: lost_at.append(time.monotonic())
    )
    await api.acquire(lock)
    private_redis.kill()
    started = time.monotonic()
    with pytest.raises(LockBackendUnavailable) as caught:
        await api.release(lock)
    assert time.monotonic() - started < 1.0
    assert caught.value.name == "doomed"
    lease_end = deadline_of(lock)

    event = await recorder.await_for("lost", within=3)
    assert event is not None
    assert lost_at
    assert lost_at[0] <= lease_end + 0.15  # told no later than the lease end (+ slack)
    assert lock.lost is True
    assert lock.held is False
    assert "Redis" in event.reason or "reach" in event.reason


async def test_leaving_with_after_redis_died_raises_lock_lost_by_the_lease_end(
    api, make_backend, private_redis
):
    """Design: a holder whose renewals cannot reach Redis gets lock.lost, on_lost, a
    LOST event and LockLost on leaving ``with`` -- not only when a renewal finds the
    key gone."""
    recorder = Recorder()
    backend = make_backend(private_redis, client_kwargs=FAST, observer=recorder)
    lock = Lock("doomed", backend=backend, timeout=0.9)

    async def hold_while_redis_dies():
        async with api.hold(lock):
            await asyncio.sleep(0.35)  # after a successful renewal
            private_redis.kill()
            lease_end = deadline_of(lock)
            assert await recorder.await_for("lost", within=3)
            assert time.monotonic() <= lease_end + 0.15
            assert lock.lost

    with pytest.raises(LockLost):
        await hold_while_redis_dies()
    assert recorder.kinds().count("lost") == 1


async def test_leaving_with_after_redis_died_is_quiet_without_raise_on_lost(
    api, make_backend, private_redis
):
    recorder = Recorder()
    backend = make_backend(private_redis, client_kwargs=FAST, observer=recorder)
    lock = Lock("doomed", backend=backend, timeout=0.6, raise_on_lost=False)
    async with api.hold(lock):
        private_redis.kill()
        assert await recorder.await_for("lost", within=3)
    assert lock.held is False


@pytest.mark.parametrize("blocking", [False, True], ids=["non-blocking", "blocking"])
async def test_acquire_on_a_dead_server_fails_fast(api, make_backend, private_redis, blocking):
    backend = make_backend(private_redis, client_kwargs=FAST)
    private_redis.kill()
    lock = Lock("dead", backend=backend)
    started = time.monotonic()
    with pytest.raises(LockBackendUnavailable):
        await api.acquire(lock, blocking=blocking, blocking_timeout=None)
    assert time.monotonic() - started < 1.0
    assert lock.held is False
    with pytest.raises(LockBackendUnavailable):
        await api.locked(lock)
    with pytest.raises(LockBackendUnavailable):
        async with api.hold(lock):
            pass


async def _waiting_forever_behind_a_holder(api, make_backend, private_redis):
    """A waiter with no time limit, blocked on the server behind a holder: its pending
    acquire (a future or a task)."""
    backend = make_backend(private_redis, client_kwargs=FAST)
    holder = Lock("forever", backend=backend, timeout=30, auto_renew=False)
    await api.acquire(holder)
    waiter = Lock("forever", backend=backend)
    if api.name == "sync":
        pending = thread_future(lambda: waiter.acquire(blocking_timeout=None))
    else:
        pending = asyncio.create_task(waiter.aacquire(blocking_timeout=None))
    probe = private_redis.client()
    try:
        await await_until(lambda: blocked_clients(probe) == 1)
    finally:
        probe.close()
    return pending


async def test_a_waiter_waiting_forever_fails_when_the_server_dies(
    api, make_backend, private_redis
):
    pending = await _waiting_forever_behind_a_holder(api, make_backend, private_redis)
    private_redis.kill()
    killed_at = time.monotonic()
    with pytest.raises(LockBackendUnavailable):
        await asyncio.wait_for(pending, 10)
    assert time.monotonic() - killed_at < 1.5


async def test_acquire_on_a_paused_server_fails_within_the_socket_timeout(
    api, make_backend, private_redis
):
    backend = make_backend(private_redis, client_kwargs=FAST)
    lock = Lock("stalled", backend=backend)
    async with api.hold(lock):  # connections are open and healthy
        pass
    private_redis.pause()
    try:
        started = time.monotonic()
        with pytest.raises(LockBackendUnavailable):
            await api.acquire(lock, blocking_timeout=None)
        elapsed = time.monotonic() - started
    finally:
        private_redis.resume()
    assert 0.4 <= elapsed < 2.0
    assert lock.held is False


@pytest.mark.parametrize("cancelled", [False, True], ids=["awaited", "cancelled"])
async def test_an_async_release_on_a_paused_server_ends_within_the_socket_timeout(
    make_backend, private_redis, cancelled
):
    """A release carries on when its task is cancelled, but only as long as the socket
    timeout allows: a stalled server never keeps the task waiting, and a cancelled task
    still ends cancelled."""
    backend = make_backend(private_redis, client_kwargs=FAST)
    lock = Lock("stalled", backend=backend, auto_renew=False)
    assert await lock.aacquire()
    private_redis.pause()
    try:
        started = time.monotonic()
        task = asyncio.create_task(lock.arelease())
        await asyncio.sleep(0.1)
        if cancelled:
            task.cancel()
        with pytest.raises(asyncio.CancelledError if cancelled else LockBackendUnavailable):
            await asyncio.wait_for(task, 5)
        elapsed = time.monotonic() - started
    finally:
        private_redis.resume()
    assert 0.4 <= elapsed < 1.5
    assert task.cancelled() is cancelled
    assert task.cancelling() == int(cancelled)  # the timeout's own cancellation taken back


async def test_a_waiter_waiting_forever_fails_when_the_server_stalls(
    api, make_backend, private_redis
):
    pending = await _waiting_forever_behind_a_holder(api, make_backend, private_redis)
    private_redis.pause()
    try:
        paused_at = time.monotonic()
        with pytest.raises(LockBackendUnavailable):
            await asyncio.wait_for(pending, 15)
        # One re-check interval (at most 1 s) plus the socket timeouts.
        assert time.monotonic() - paused_at < 3.5
    finally:
        private_redis.resume()


async def test_holder_of_a_stalled_server_is_told_lost_by_its_lease_end(
    api, make_backend, private_redis
):
    """With redis-py's default 5 s socket timeout, a renewal that cannot get an answer
    must still give up at the lease end, not 5 s later."""
    recorder = Recorder()
    backend = make_backend(
        private_redis,
        client_kwargs={"socket_timeout": 5, "socket_connect_timeout": 5},
        observer=recorder,
    )
    lock = Lock("stalled", backend=backend, timeout=1.0)
    await api.acquire(lock)
    fence = lock.fence
    lease_end = deadline_of(lock)
    private_redis.pause()
    try:
        event = await recorder.await_for("lost", within=8)
        told_at = time.monotonic()
    finally:
        private_redis.resume()
    assert event is not None
    assert (event.name, event.fence) == ("stalled", fence)
    assert told_at <= lease_end + 0.25
    assert lock.lost


async def test_after_a_restart_without_data_fences_still_increase(api, make_backend, private_redis):
    """Clients retry once, as redis-py's do by default: the connections pooled before the
    restart are dead, and a retried acquire is safe (it recognises its own token)."""
    recorder = Recorder()
    backend = make_backend(
        private_redis,
        client_kwargs={**FAST, "retry": Retry(NoBackoff(), 1)},
        async_client_kwargs={**FAST, "retry": AsyncRetry(NoBackoff(), 1)},
        observer=recorder,
    )
    lock = Lock("restarted", backend=backend, timeout=0.9)
    await api.acquire(lock)
    before = lock.fence
    private_redis.restart()
    client = private_redis.client()
    try:
        assert client.exists(lock_key("restarted")) == 0  # the data is gone
        # The old holder's renewal finds its lock gone.
        assert await recorder.await_for("lost", within=3)
        assert lock.lost
        with pytest.raises(LockLost):
            await api.release(lock)
        # A new acquisition works, with a fence above any given before the restart.
        newcomer = Lock("restarted", backend=backend)
        assert await api.acquire(newcomer, blocking=False)
        assert newcomer.fence > before
        await api.release(newcomer)
    finally:
        client.close()


async def test_a_reentrant_lock_whose_release_failed_is_taken_afresh(
    api, make_backend, private_redis
):
    # Found by the seeded chaos run (single, reentrant, seed 104): the next acquire
    # re-entered the hold whose release had failed (same token and fence), and its release
    # only counted down, so the lock was never given back.
    backend = make_backend(private_redis, client_kwargs=FAST)
    lock = Lock("nested", backend=backend, reentrant=True, timeout=30)
    await api.acquire(lock)
    first_fence = lock.fence
    private_redis.pause()
    try:
        with pytest.raises(LockBackendUnavailable):
            await api.release(lock)
    finally:
        private_redis.resume()
    await api.acquire(lock)
    assert lock.fence > first_fence  # a new hold, not the failed one re-entered
    await api.release(lock)  # the one release of this hold gives the lock back
    with private_redis.client() as probe:
        assert probe.exists(lock_key("nested")) == 0
    assert not lock.held
