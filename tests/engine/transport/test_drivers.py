"""The sync and async drivers: script loading, error mapping, wait connections."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Coroutine
from typing import Any

import pytest
import redis
from redis.exceptions import (
    AskError,
    ConnectionError,
    MovedError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)

from django_distlock.engine import Backend, Lock, LockBackendError, LockBackendUnavailable, Tuning
from django_distlock.engine.protocol.ops import AwaitWakeUp, Call, Pause, StartWait
from django_distlock.engine.protocol.scripts import TTL
from django_distlock.engine.transport.drivers import AsyncDriver, SyncDriver, completed
from django_distlock.engine.transport.requests import (
    FAILOVER_BUDGET,
    FAILOVER_DELAY,
    MAX_REDIRECTS,
    TRYAGAIN_BUDGET,
    TRYAGAIN_DELAY,
    Routing,
)
from django_distlock.engine.transport.routes import AsyncServer
from tests.support.engine import (
    async_client,
    await_until,
    blocked_clients,
    close_backend,
    keys_of,
    lock_key,
    sync_client,
    thread_future,
)
from tests.support.probe import single_server_only

# -- cluster redirects (decided from the error replies alone) ------------------------


def redirect_of(
    error: Exception, redirects: int = 0, started: float | None = None, is_cluster: bool = True
) -> tuple[str, float] | None:
    """What a request that followed ``redirects`` redirects since monotonic ``started``
    does with the refusal ``error``: ``(kind, delay)``, or ``None`` when it gives up
    (``Routing.refused`` raises ``error``)."""
    routing = Routing(("GET", "k"))
    routing.redirects = redirects
    routing.started = time.monotonic() if started is None else started
    try:
        redirect = routing.refused(error, is_cluster)
    except type(error) as raised:
        if raised is not error:
            raise
        return None
    return redirect.kind, redirect.delay


def test_ask_during_a_split_slot_is_followed_past_max_redirects_within_the_budget():
    # A migration with a slot's keys split: the source answers ASK, the target TRYAGAIN,
    # in turn. Past MAX_REDIRECTS the ASKs are paced like TRYAGAIN (regression: the lock
    # failed after 16 quick turns, about 0.35 s into a move).
    ask = AskError("9539 127.0.0.1:7001")
    assert redirect_of(ask, 0) == ("ask", 0.0)
    assert redirect_of(ask, MAX_REDIRECTS) == ("ask", TRYAGAIN_DELAY)
    started_long_ago = time.monotonic() - TRYAGAIN_BUDGET
    assert redirect_of(ask, MAX_REDIRECTS, started_long_ago) is None
    assert redirect_of(TryAgainError("TRYAGAIN"), 0, started_long_ago) is None
    assert redirect_of(TryAgainError("TRYAGAIN"), 0) == ("again", TRYAGAIN_DELAY)


def test_a_wait_rides_tryagain_past_the_budget_of_a_request():
    """A blocking wait's TRYAGAIN (a BLPOP of two lists on the importing node, until the
    move ends) is bounded by the wait's own deadline, not TRYAGAIN_BUDGET."""
    wait = Routing(("BLPOP", "wake", "signal", 30), math.inf)
    wait.started = time.monotonic() - 10 * TRYAGAIN_BUDGET
    wait.answer([AskError("1 127.0.0.1:7002")], is_cluster=True)
    again = wait.answer([None, TryAgainError("TRYAGAIN")], is_cluster=True)
    assert (again.kind, again.delay) == ("again", TRYAGAIN_DELAY)
    assert wait.commands() == [("ASKING",), ("BLPOP", "wake", "signal", 30)]


def test_a_tryagain_after_ask_is_tried_again_still_asking():
    """The node an ASK sent us to answers TRYAGAIN while the slot's keys are split: the
    retry goes there with ASKING again (without it, that node answers MOVED)."""
    routing = Routing(("GET", "k"))
    routing.answer([AskError("1 127.0.0.1:7002")], is_cluster=True)
    assert routing.commands() == [("ASKING",), ("GET", "k")]
    again = routing.answer([None, TryAgainError("TRYAGAIN")], is_cluster=True)
    assert (again.kind, again.delay) == ("again", TRYAGAIN_DELAY)
    assert routing.commands() == [("ASKING",), ("GET", "k")]
    routing.answer([None, MovedError("1 127.0.0.1:7003")], is_cluster=True)
    assert routing.commands() == [("GET", "k")]  # the slot moved: a plain request


def test_tryagain_uses_up_no_redirect():
    """A slot split for a second refuses some fifty paced tries; the MOVED that ends the
    migration is still followed."""
    routing = Routing(("GET", "k"))
    for _ in range(MAX_REDIRECTS * 3):
        routing.answer([TryAgainError("TRYAGAIN")], is_cluster=True)
    moved = routing.answer([MovedError("1 127.0.0.1:7003")], is_cluster=True)
    assert moved.kind == "moved"


def test_moved_still_stops_at_max_redirects():
    moved = MovedError("9539 127.0.0.1:7002")  # a subclass of AskError in redis-py
    assert redirect_of(moved, MAX_REDIRECTS - 1) == ("moved", 0.0)
    assert redirect_of(moved, MAX_REDIRECTS) is None


def test_a_single_server_follows_no_redirect():
    assert redirect_of(MovedError("1 127.0.0.1:7002"), is_cluster=False) is None
    assert redirect_of(ResponseError("WRONGTYPE Operation against a key")) is None


def _refused_by_a_demoted_primary() -> ConnectionError:
    """What redis-py's Sentinel connection raises when the primary it reached answers
    ``READONLY`` (``SentinelManagedConnection.read_response``)."""
    try:
        try:
            raise ReadOnlyError("You can't write against a read only replica.")
        except ReadOnlyError:
            raise ConnectionError("The previous master is now a slave") from None
    except ConnectionError as exc:
        return exc


def test_a_request_refused_by_a_demoted_primary_is_sent_again_within_the_failover_budget():
    # It never ran: sent again at once (the connection asks the Sentinels on reconnect),
    # then paced, and given up past the budget.
    routing = Routing(("PTTL", "key"))
    refused = _refused_by_a_demoted_primary()
    assert routing.failed(refused) == 0.0
    assert routing.failed(refused) == FAILOVER_DELAY
    routing.started = time.monotonic() - FAILOVER_BUDGET
    assert routing.failed(refused) is None


def test_a_request_whose_connection_failed_is_not_sent_again():
    # It may have run: only an acquire, by its token, may be tried again (the steps).
    routing = Routing(("PTTL", "key"))
    assert routing.failed(ConnectionError("Connection reset by peer")) is None
    assert routing.failed(OSError("Broken pipe")) is None


# -- scripts are loaded when the server does not know them ------------------------------


async def test_every_operation_works_after_the_script_cache_is_flushed(api, backend, redis_client):
    lock = Lock("flushed", backend=backend, auto_renew=False)
    redis_client.script_flush()
    assert await api.acquire(lock)
    redis_client.script_flush()
    assert 0 < await api.ttl(lock) <= 30
    redis_client.script_flush()
    await api.extend(lock, 1)
    redis_client.script_flush()
    await api.release(lock)
    assert redis_client.exists(lock_key("flushed")) == 0


async def test_renewal_works_after_the_script_cache_is_flushed(api, backend, redis_client):
    # Renewed every third of a 1 s lease, with the scripts gone from the server: without
    # the renewals the key is gone at 1 s (a 0.3 s lease left too little room for a
    # late renewal on a loaded machine).
    lock = Lock("flushed", backend=backend, timeout=1.0)
    await api.acquire(lock)
    redis_client.script_flush()
    await asyncio.sleep(1.5)
    assert redis_client.pttl(lock_key("flushed")) > 0
    assert not lock.lost
    await api.release(lock)


# -- every Redis failure becomes LockBackendUnavailable ---------------------------------


async def test_a_redis_error_reply_becomes_lock_backend_error(api, backend, redis_client):
    """An error reply is a misconfiguration, not an outage: LockBackendError, which is
    a LockError but not LockBackendUnavailable (views must not answer it with 503)."""
    redis_client.lpush(keys_of("broken").fence, "not a counter")  # GET will fail
    lock = Lock("broken", backend=backend)
    with pytest.raises(LockBackendError) as caught:
        await api.acquire(lock)
    assert not isinstance(caught.value, LockBackendUnavailable)
    assert "WRONGTYPE" in str(caught.value)
    assert caught.value.name == "broken"
    assert isinstance(caught.value.__cause__, redis.RedisError)
    assert lock.held is False
    assert redis_client.exists(lock_key("broken")) == 0


async def test_queries_map_errors_too(api, dead_backend):
    lock = Lock("x", backend=dead_backend)
    with pytest.raises(LockBackendUnavailable) as caught:
        await api.locked(lock)
    assert caught.value.name == "x"


def test_bounded_call_maps_a_refused_connection(dead_backend):
    """``call_many`` (used by renewals) must raise LockBackendUnavailable like every
    other call, also when the connection cannot even be opened."""
    driver = SyncDriver(dead_backend, "x")
    call = Call(TTL, (lock_key("x"),), ("token",))
    with pytest.raises(LockBackendUnavailable):
        driver.call_many([call], 0.5)


async def test_bounded_call_is_bounded_while_connecting_to_a_stalled_server(private_redis):
    """A renewal may not wait longer than the lease it is trying to save, even if it
    has to open a connection first (redis-py's default socket timeout is 5 s)."""
    client = sync_client(private_redis.port, socket_timeout=5, socket_connect_timeout=5)
    backend = Backend(client, tuning=Tuning(renewal_attempt=0.3))
    driver = SyncDriver(backend, "x")
    call = Call(TTL, (lock_key("x"),), ("token",))
    private_redis.pause()
    try:
        started = time.monotonic()
        with pytest.raises(LockBackendUnavailable):
            driver.call_many([call], 0.3)
        elapsed = time.monotonic() - started
    finally:
        private_redis.resume()
        await close_backend(backend)
    assert elapsed < 1.0


# -- wait connections -------------------------------------------------------------------


@single_server_only
async def test_wait_connections_use_the_client_database(api, make_backend, redis_client):
    """Waiters block on connections of their own; they must talk to the same database
    as the client, or the wake-up pushed by a release would never reach them."""
    backend = make_backend(client_kwargs={"db": 3})
    holder = Lock("db3", backend=backend, timeout=30, auto_renew=False)
    waiter = Lock("db3", backend=backend)
    await api.acquire(holder)
    if api.name == "sync":

        def wait_in_thread():
            acquired = waiter.acquire(blocking_timeout=10), time.monotonic()
            waiter.release()
            return acquired

        pending = thread_future(wait_in_thread)
    else:

        async def wait():
            acquired = await waiter.aacquire(blocking_timeout=10), time.monotonic()
            await waiter.arelease()
            return acquired

        pending = asyncio.create_task(wait())
    await await_until(lambda: blocked_clients(redis_client) == 1)
    released_at = time.monotonic()
    await api.release(holder)
    acquired, at = await pending
    assert acquired
    assert at - released_at < 0.3
    assert redis_client.keys("*") == []  # all in db 3
    db3 = sync_client(redis_client.connection_pool.connection_kwargs["port"], db=3)
    try:
        assert db3.exists(keys_of("db3").fence) == 1
    finally:
        db3.close()


async def test_waiting_works_where_client_commands_are_forbidden(api, redis_server_factory):
    """Managed Redis services may forbid CLIENT (ID, UNBLOCK): waiting still works."""

    server = redis_server_factory(["--rename-command", "CLIENT", ""])
    backend = Backend(sync_client(server.port), async_client=lambda: async_client(server.port))
    probe = server.client()
    try:
        holder = Lock("no-client", backend=backend, timeout=30, auto_renew=False)
        await api.acquire(holder)
        # A wait that times out ends its blocking pop without CLIENT UNBLOCK.
        started = time.monotonic()
        assert not await api.acquire(Lock("no-client", backend=backend), blocking_timeout=0.2)
        assert time.monotonic() - started < 1.0
        waiter = Lock("no-client", backend=backend)
        if api.name == "sync":

            def wait_in_thread():
                acquired = waiter.acquire(blocking_timeout=10)
                waiter.release()
                return acquired

            pending = thread_future(wait_in_thread)
        else:
            pending = asyncio.create_task(waiter.aacquire(blocking_timeout=10))
        await await_until(lambda: blocked_clients(probe) == 1)
        released_at = time.monotonic()
        await api.release(holder)
        assert await pending
        assert time.monotonic() - released_at < 0.3
        if api.name == "async":
            await waiter.arelease()  # create_task around aacquire: the caller holds it
    finally:
        probe.close()
        await close_backend(backend)


# -- completed() --------------------------------------------------------------------------


async def test_completed_returns_the_result_and_no_cancellation():
    async def work():
        await asyncio.sleep(0.01)
        return 42

    assert await completed(work()) == (42, False)


async def test_completed_finishes_the_work_even_when_cancelled():
    finished = []

    async def work():
        await asyncio.sleep(0.05)
        finished.append(True)
        return "done"

    async def caller():
        return await completed(work())

    task = asyncio.create_task(caller())
    await asyncio.sleep(0.01)
    task.cancel()
    assert await task == ("done", True)
    assert finished == [True]


async def test_the_driver_closes_a_wait_left_by_finished_steps_without_a_window_for_cancelling(
    backend, redis_client, monkeypatch
):
    """Steps that end with a wait still open leave the driver to close it. It used to
    await that close, and a cancellation arriving meanwhile was raised again at the task's
    next await: already pending when the caller entered ``asyncio.timeout``, it counted as
    older than the timeout, which swallowed it with its own expiry (TimeoutError, and the
    cancelled task ran on). The close now goes on in the background and the caller gets
    the steps' result at once; a cancellation reaches the caller's own awaits."""
    driver = AsyncDriver(backend, "closing")
    closing, go_on = asyncio.Event(), asyncio.Event()
    close_wait = AsyncServer.close_wait

    async def slow_close_wait(self: AsyncServer, connection, *, clean: bool) -> None:
        closing.set()
        await go_on.wait()  # a pool whose lock is busy
        await close_wait(self, connection, clean=clean)

    monkeypatch.setattr(AsyncServer, "close_wait", slow_close_wait)
    wake_key = keys_of("closing").wake("me")

    def steps():
        yield StartWait((wake_key,))
        redis_client.lpush(wake_key, "1")  # the wait is answered: its reader is done
        yield Pause(0.2)
        return "taken"

    seen = []

    async def caller():
        seen.append(await driver.run(steps()))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0):
                await asyncio.sleep(1)
        await asyncio.sleep(1)
        seen.append("ran on after its cancellation")

    task = asyncio.create_task(caller())
    await asyncio.wait_for(closing.wait(), 5)
    task.cancel()
    await asyncio.sleep(0.01)
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert seen == ["taken"]
    assert redis_client.exists(wake_key) == 0  # the wake-up was read, not left behind
    await await_until(lambda: blocked_clients(redis_client) == 0)


async def _lose_a_cancellation(reached: asyncio.Event) -> None:
    """Set ``reached``, then lose the cancellation that follows as ``asyncio.wait_for``
    does on Python 3.11 (redis-py awaits writes through it): still counted by
    ``Task.cancelling()``, never raised."""
    reached.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(1)


async def _cancelled_at(run: Coroutine[Any, Any, Any], reached: asyncio.Event) -> None:
    """Run ``run`` in a task, cancel it once ``reached`` is set: it must end cancelled
    promptly (not at its steps' 30 s timer)."""
    task = asyncio.create_task(run)
    await asyncio.wait_for(reached.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)


async def test_a_cancellation_the_client_lost_while_routes_were_read_still_ends_the_steps(
    backend, monkeypatch
):
    """redis-py awaits writes through ``asyncio.wait_for``, which on Python 3.11 returns
    the result instead of raising when the cancellation arrives as the write finishes:
    the cancellation stays counted (``Task.cancelling()``) but nothing raises it. Lost so
    while the running loop's routes were first read (a cluster's slot map, in the
    re-entrant test of test_lock_kinds_processes.py on CI), it was taken as older than the
    steps, and the cancelled task waited on for the lock."""
    reading = asyncio.Event()
    aroutes = Backend.aroutes

    async def losing_aroutes(self: Backend):
        routes = await aroutes(self)
        if not reading.is_set():
            await _lose_a_cancellation(reading)
        return routes

    monkeypatch.setattr(Backend, "aroutes", losing_aroutes)

    def steps():
        yield Pause(30)
        return "waited"

    await _cancelled_at(AsyncDriver(backend, "lost").run(steps()), reading)


async def test_a_cancellation_the_client_lost_as_a_wait_was_sent_again_ends_the_wait(
    make_backend, redis_client, monkeypatch
):
    """The same loss while a wait is sent again (the server ended the last ``BLPOP`` at
    its own timeout): the driver waited on, cancelled, until its timer."""
    backend = make_backend(tuning=Tuning(server_wait=0.1))
    opened = 0
    reopening = asyncio.Event()
    open_wait = AsyncDriver._open_wait

    async def losing_open_wait(self: AsyncDriver, server, routing) -> None:
        nonlocal opened
        await open_wait(self, server, routing)
        opened += 1
        if opened == 2:
            await _lose_a_cancellation(reopening)

    monkeypatch.setattr(AsyncDriver, "_open_wait", losing_open_wait)

    def steps():
        yield StartWait((keys_of("lost").wake("me"),))
        yield AwaitWakeUp(30)
        return "woken"

    await _cancelled_at(AsyncDriver(backend, "lost").run(steps()), reopening)
    await await_until(lambda: blocked_clients(redis_client) == 0)
