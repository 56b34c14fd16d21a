"""Cancelling asyncio tasks in the middle of lock operations: no lock is left held by
nobody-who-knows, other waiters are not left stuck, cancelled tasks stay cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest
from redis.asyncio.connection import AbstractConnection

from django_distlock.engine import Backend, Lock
from django_distlock.engine.transport.routes import AsyncServer
from tests.support.engine import (
    await_until,
    blocked_clients,
    close_backend,
    keys_of,
    lock_key,
    stored_lock,
    wait_until,
)


async def cancel_and_wait(task: asyncio.Task) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_cancelling_a_waiter_leaves_the_others_waiting_properly(backend, redis_client, fair):
    holder = Lock("cancel", backend=backend, fair=fair, timeout=30)
    await holder.aacquire()
    first = Lock("cancel", backend=backend, fair=fair)
    second = Lock("cancel", backend=backend, fair=fair)
    first_task = asyncio.create_task(first.aacquire(blocking_timeout=30))
    await await_until(lambda: blocked_clients(redis_client) == 1)
    second_task = asyncio.create_task(second.aacquire(blocking_timeout=30))
    await await_until(lambda: blocked_clients(redis_client) == 2)

    await cancel_and_wait(first_task)
    assert first.held is False
    assert stored_lock(redis_client, "cancel").token == holder.token
    if fair:
        assert redis_client.llen(keys_of("cancel").queue) == 1

    released_at = time.monotonic()
    await holder.arelease()
    assert await asyncio.wait_for(second_task, 5)
    # Well under the 1 s a waiter sleeps when a wake-up was lost.
    assert time.monotonic() - released_at < 0.3


async def test_a_cancelled_release_still_releases(backend, redis_client):
    cancelled_in_flight = 0
    for delay in (1, 1, 2, 2, 3):
        lock = Lock("cancel", backend=backend)
        await lock.aacquire()
        task = asyncio.create_task(lock.arelease())
        for _ in range(delay):  # let it start and send the release
            await asyncio.sleep(0)
        if task.cancel():
            cancelled_in_flight += 1
            with pytest.raises(asyncio.CancelledError):
                await task
            assert task.cancelled()  # and it stays cancelled
        else:
            await task
        assert redis_client.exists(lock_key("cancel")) == 0
        assert lock.held is False
        assert lock.token is None
    assert cancelled_in_flight > 0
    # Nothing left behind: the next one gets it at once.
    assert await Lock("cancel", backend=backend).aacquire(blocking=False)


async def test_a_release_cancelled_while_its_answer_is_on_the_way_reads_it_on(
    backend, redis_client
):
    """The release is not sent again on a new connection: the answer is read on the
    connection it was sent on, which goes back to the pool."""
    lock = Lock("cancel", backend=backend, auto_renew=False)
    await lock.aacquire()
    await lock.arelease()  # the pool now holds the connection a release uses
    await lock.aacquire()
    connections = redis_client.info("stats")["total_connections_received"]
    releases = _calls(redis_client, "evalsha")
    task = asyncio.create_task(lock.arelease())
    await asyncio.sleep(0)  # sent; waiting for the answer
    assert task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert redis_client.exists(lock_key("cancel")) == 0
    assert lock.held is False
    assert redis_client.info("stats")["total_connections_received"] == connections
    assert _calls(redis_client, "evalsha") == releases + 1


def _calls(redis_client, command: str) -> int:
    return int(redis_client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_cancelled_async_with_exit_still_releases(backend, redis_client):
    lock = Lock("cancel", backend=backend)
    entered = asyncio.Event()

    async def body():
        async with lock:
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(body())
    await entered.wait()
    await cancel_and_wait(task)
    assert redis_client.exists(lock_key("cancel")) == 0


async def test_cancelling_an_acquire_in_flight_never_leaves_an_orphan_lock(backend, redis_client):
    """Cancel at random points of an uncontended acquire: either the task got the lock and
    knows it, or nobody holds it."""
    rng = random.Random(1234)
    outcomes = {"cancelled": 0, "acquired": 0}
    for _ in range(150):
        lock = Lock("inflight", backend=backend, auto_renew=False, timeout=30)

        async def attempt(lock=lock):
            assert await lock.aacquire()
            return lock.token

        task = asyncio.create_task(attempt())
        if rng.random() < 0.5:
            for _ in range(rng.randrange(6)):
                await asyncio.sleep(0)
        else:
            await asyncio.sleep(rng.uniform(0, 0.0015))
        task.cancel()
        try:
            token = await task
        except asyncio.CancelledError:
            assert task.cancelled()
            outcomes["cancelled"] += 1
            assert redis_client.exists(lock_key("inflight")) == 0
        else:
            outcomes["acquired"] += 1
            assert stored_lock(redis_client, "inflight").token == token
            redis_client.delete(lock_key("inflight"))
    assert outcomes["cancelled"] > 0


async def _take_and_give_back(lock: Lock) -> None:
    assert await lock.aacquire(blocking_timeout=10)
    await lock.arelease()


async def _two_waiters(backend, redis_client, fair: bool) -> tuple[asyncio.Task, asyncio.Task]:
    """Two tasks blocked, one after the other, waiting for "handoff" (held by the caller);
    each takes it and gives it back."""
    tasks = []
    for count in (1, 2):
        lock = Lock("handoff", backend=backend, fair=fair, timeout=30)
        tasks.append(asyncio.create_task(_take_and_give_back(lock)))
        await await_until(lambda count=count: blocked_clients(redis_client) == count)
    return tasks[0], tasks[1]


async def _the_second_takes_over_promptly(
    second_task: asyncio.Task, released_at: float, redis_client
) -> None:
    await asyncio.wait_for(second_task, 5)
    assert time.monotonic() - released_at < 0.5
    assert redis_client.exists(lock_key("handoff")) == 0


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_cancelling_a_waiter_as_it_is_woken_does_not_strand_the_next(
    backend, redis_client, fair
):
    """Cancel the first waiter at random moments around the holder's release: whether
    or not it consumed the wake-up, the second waiter gets the lock promptly."""
    rng = random.Random(99)
    for _ in range(20):
        holder = Lock("handoff", backend=backend, fair=fair, timeout=30)
        await holder.aacquire()
        first_task, second_task = await _two_waiters(backend, redis_client, fair)
        await holder.arelease()
        released_at = time.monotonic()
        await asyncio.sleep(rng.uniform(0, 0.002))
        first_task.cancel()
        await asyncio.gather(first_task, return_exceptions=True)
        await _the_second_takes_over_promptly(second_task, released_at, redis_client)


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_a_waiter_cancelled_after_its_wait_took_the_wake_up_hands_it_on(
    backend, redis_client, fair
):
    """The window of a stranded waiter, hit on purpose: the server has answered the first
    waiter's ``BLPOP`` with the wake-up (it left the server's blocked clients), and the
    first waiter is cancelled before its task ever sees that answer. The wake-up it
    consumed must reach the second waiter at once, not at the second's re-check (up to
    the holder's lease, 30 s here)."""
    for _ in range(5):
        holder = Lock("handoff", backend=backend, fair=fair, timeout=30)
        assert holder.acquire()  # sync: its release below runs no task of this loop
        first_task, second_task = await _two_waiters(backend, redis_client, fair)
        holder.release()
        released_at = time.monotonic()
        # No await from the release to the cancel: the first waiter cannot run meanwhile.
        wait_until(lambda: blocked_clients(redis_client) == 1, timeout=5)
        assert first_task.cancel()
        await asyncio.gather(first_task, return_exceptions=True)
        await _the_second_takes_over_promptly(second_task, released_at, redis_client)


@pytest.mark.parametrize("operation", ["aacquire", "aextend"])
async def test_a_cancellation_the_redis_client_swallows_still_cancels(
    backend, redis_client, monkeypatch, operation
):
    """On Python 3.11 ``asyncio.wait_for`` returns the result when the task is cancelled
    just as the awaited operation finishes, and the cancellation is lost; redis-py's
    ``send_packed_command`` awaits each write that way when the connection has a socket
    timeout. A task cancelled there must still end cancelled, without the lock."""
    lock = Lock("swallowed", backend=backend, timeout=30)
    assert await lock.aacquire()  # connections open, scripts loaded
    if operation == "aacquire":
        await lock.arelease()
    send = AbstractConnection.send_packed_command
    victims: list[asyncio.Task] = []

    async def send_and_lose_a_cancellation(self, *args, **kwargs):
        await send(self, *args, **kwargs)
        if asyncio.current_task() in victims:
            victims.clear()
            asyncio.current_task().cancel()
            # Lost, as asyncio.wait_for loses it when the write finished meanwhile.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", send_and_lose_a_cancellation)
    if operation == "aacquire":
        task = asyncio.create_task(lock.aacquire())
    else:
        task = asyncio.create_task(lock.aextend(10))
    victims.append(task)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    monkeypatch.undo()
    if operation == "aacquire":
        assert redis_client.exists(lock_key("swallowed")) == 0
    else:
        await lock.arelease()


async def test_a_task_cancelled_while_another_reads_the_slot_map_ends_cancelled(cluster_setup):
    """The first tasks of an event loop on a cluster wait while one of them reads the slot
    map (a new asyncio ``RedisCluster``: tens of milliseconds). One cancelled meanwhile
    must end cancelled (regression: the wait swallowed the cancellation, and the task went
    on as if never cancelled, taking locks)."""
    backend = Backend(cluster=cluster_setup.urls)
    try:
        first = asyncio.create_task(Lock("map:a", backend=backend).aacquire())
        await asyncio.sleep(0)  # the first task now reads the slot map
        waiting = asyncio.create_task(Lock("map:b", backend=backend).aacquire())
        await asyncio.sleep(0)  # the second one waits for it
        assert not first.done()
        assert waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await first
        assert not cluster_setup.client().exists(lock_key("map:b"))
    finally:
        await close_backend(backend)


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_a_waiter_cancelled_as_its_woken_wait_ends_hands_the_wake_up_on(
    backend, redis_client, monkeypatch, fair
):
    """The window of issue 19, item 5, hit on purpose: the first waiter's ``BLPOP`` is
    answered with the wake-up, and the waiter is cancelled while that wait's connection
    goes back to its pool, before its steps learn they were woken. Its clean-up must hand
    the wake-up on: the second waiter gets the lock at once, not at its re-check (the
    holder's lease: 30 s here). Before the fix the second waiter stranded."""
    finishing = asyncio.Event()
    original = AsyncServer.close_wait

    async def slow_close_wait(self, connection, *, clean):
        if clean and not finishing.is_set():
            finishing.set()
            await asyncio.sleep(0.05)  # a pool whose lock is busy: the task may be cancelled
        await original(self, connection, clean=clean)

    monkeypatch.setattr(AsyncServer, "close_wait", slow_close_wait)
    holder = Lock("handoff", backend=backend, fair=fair, timeout=30)
    assert holder.acquire()
    first_task, second_task = await _two_waiters(backend, redis_client, fair)
    holder.release()
    released_at = time.monotonic()
    await asyncio.wait_for(finishing.wait(), 5)  # the first waiter's wait is ending
    assert first_task.cancel()
    await asyncio.gather(first_task, return_exceptions=True)
    await _the_second_takes_over_promptly(second_task, released_at, redis_client)
