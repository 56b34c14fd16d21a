"""Waiting under faults (issue 9, item 4): a wait that ends while its BLPOP is still on
the way to the server, hundreds of waiters at once, and wake-ups at the edge of a
waiter's deadline."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from django_distlock.engine import Lock, LockError
from tests.support.engine import await_until, thread_future
from tests.support.proxy import sends_command

BLPOP_DELAY = 0.05
# Socket timeouts long enough that a waiter stuck reading its BLPOP shows as a 2 s stall
# (or LockBackendUnavailable), short enough that the test stays quick.
SLOW_SOCKETS = {"socket_timeout": 2, "socket_connect_timeout": 2}


async def attempt(api, lock: Lock, within: float, **kwargs) -> tuple[object, float]:
    """Acquire ``lock`` (and release it at once if that worked): True/False, or the
    exception raised, or "no answer" when it took longer than ``within`` seconds; and
    the seconds the acquire took."""

    async def acquire_and_release() -> tuple[object, float]:
        started = time.monotonic()
        try:
            outcome = await api.acquire(lock, **kwargs)
        except LockError as exc:
            return exc, time.monotonic() - started
        took = time.monotonic() - started
        if outcome:
            await api.release(lock)  # in the task that holds it
        return outcome, took

    started = time.monotonic()
    try:
        return await asyncio.wait_for(acquire_and_release(), within)
    except TimeoutError:
        return "no answer", time.monotonic() - started


async def proxied_backends(private_redis, make_proxy, make_backend):
    """A backend talking to ``private_redis`` directly (for holders) and one through a
    proxy that delays every BLPOP by 50 ms (for the waiter), its connections opened."""
    direct = make_backend(private_redis, client_kwargs=SLOW_SOCKETS)
    proxy = make_proxy(private_redis)
    through_proxy = make_backend(port=proxy.port, client_kwargs=SLOW_SOCKETS)
    return direct, proxy, through_proxy


async def warm_up(api, backend) -> None:
    """One wait that times out normally, so the waiter's connections are open and the
    scripts loaded before the delay starts (on a lock of its own: the release leaves a
    wake-up in that lock's list)."""
    holder = Lock("warm-up", backend=backend, timeout=30, auto_renew=False)
    assert await api.acquire(holder, blocking=False)
    assert await api.acquire(Lock("warm-up", backend=backend), blocking_timeout=0.05) is False
    await api.release(holder)


async def test_a_wait_ending_while_its_blpop_is_in_flight_returns_false_promptly(
    api, private_redis, make_proxy, make_backend
):
    direct, proxy, through_proxy = await proxied_backends(private_redis, make_proxy, make_backend)
    await warm_up(api, through_proxy)
    holder = Lock("busy", backend=direct, timeout=30, auto_renew=False)
    assert await api.acquire(holder, blocking=False)
    proxy.delay_client_data(sends_command("BLPOP"), BLPOP_DELAY)

    blocking_timeout = 0.02  # ends while the BLPOP is held by the proxy
    outcome, took = await attempt(
        api, Lock("busy", backend=through_proxy), 3, blocking_timeout=blocking_timeout
    )
    assert outcome is False, f"{outcome!r} after {took:.3f}s"
    assert took <= blocking_timeout + 0.3
    await api.release(holder)


async def test_a_holder_expiring_while_the_blpop_is_in_flight_hands_over_promptly(
    api, private_redis, make_proxy, make_backend
):
    """The holder crashed (no release): the waiter's re-check at the holder's lease end
    comes while its BLPOP is still on the way, and must get the lock."""
    direct, proxy, through_proxy = await proxied_backends(private_redis, make_proxy, make_backend)
    await warm_up(api, through_proxy)
    # The holder's 25 ms lease must not be spent connecting: an acquire answered after its
    # lease is over is given back.
    await warm_up(api, direct)
    proxy.delay_client_data(sends_command("BLPOP"), BLPOP_DELAY)
    crashed = Lock("expiring", backend=direct, timeout=0.025, auto_renew=False)
    assert await api.acquire(crashed, blocking=False)
    lease_left = crashed.valid_until - time.time()

    waiter = Lock("expiring", backend=through_proxy)
    outcome, took = await attempt(api, waiter, 3, blocking_timeout=3)
    assert outcome is True, f"{outcome!r} after {took:.3f}s"
    assert took <= lease_left + 0.3


async def test_a_release_while_the_blpop_is_in_flight_wakes_the_waiter(
    api, private_redis, make_proxy, make_backend
):
    """Passes before the fix too (the wake-up waits in the list until the BLPOP comes);
    a guard for the fix of the two cases above."""
    direct, proxy, through_proxy = await proxied_backends(private_redis, make_proxy, make_backend)
    await warm_up(api, through_proxy)
    holding, go = threading.Event(), threading.Event()
    released_at: list[float] = []

    def hold_then_release() -> None:
        holder = Lock("released", backend=direct, timeout=30, auto_renew=False)
        assert holder.acquire(blocking=False)
        holding.set()
        go.wait(10)
        time.sleep(BLPOP_DELAY / 3)  # the waiter's BLPOP is on its way by now
        holder.release()
        released_at.append(time.monotonic())

    releaser = threading.Thread(target=hold_then_release)
    releaser.start()
    try:
        assert holding.wait(10)
        proxy.delay_client_data(sends_command("BLPOP"), BLPOP_DELAY)
        waiter = Lock("released", backend=through_proxy)
        go.set()
        outcome, took = await attempt(api, waiter, 3, blocking_timeout=3)
    finally:
        go.set()
        releaser.join(10)
    assert outcome is True, f"{outcome!r} after {took:.3f}s"
    assert time.monotonic() - released_at[0] <= 0.3


WAITERS = 300


def connected_clients(client) -> int:
    return int(client.info("clients")["connected_clients"])


async def run_waiters(api, backend, name: str, count: int, blocking_timeout: float):
    """``count`` waiters at once (threads for sync, tasks for async) on ``name``: each
    one's (outcome or exception, seconds it took)."""

    def one_sync() -> tuple[object, float]:
        started = time.monotonic()
        try:
            outcome: object = Lock(name, backend=backend).acquire(blocking_timeout=blocking_timeout)
        except Exception as exc:
            outcome = exc
        return outcome, time.monotonic() - started

    async def one_async() -> tuple[object, float]:
        started = time.monotonic()
        try:
            outcome: object = await Lock(name, backend=backend).aacquire(
                blocking_timeout=blocking_timeout
            )
        except Exception as exc:
            outcome = exc
        return outcome, time.monotonic() - started

    if api.name == "async":
        return await asyncio.gather(*(one_async() for _ in range(count)))
    results: list[tuple[object, float]] = []
    threads = [threading.Thread(target=lambda: results.append(one_sync())) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


async def test_hundreds_of_waiters_time_out_cleanly_and_give_their_connections_back(
    api, private_redis, make_backend
):
    backend = make_backend(private_redis, client_kwargs={"max_connections": 10})
    holder = Lock("crowded", backend=backend, timeout=30, auto_renew=False)
    assert await api.acquire(holder, blocking=False)
    with private_redis.client() as probe:
        before = connected_clients(probe)
        results = await run_waiters(api, backend, "crowded", WAITERS, blocking_timeout=1)

        failures = [outcome for outcome, _ in results if outcome is not False]
        assert failures == [], f"{len(failures)} waiters failed, e.g. {failures[:3]}"
        slowest = max(took for _, took in results)
        assert len(results) == WAITERS
        # Every waiter honours its 1 s timeout, not the 30 s lease: 300 threads on two
        # CPUs are scheduled late on a loaded machine (CI once saw 2.3 s), so the bound
        # only tells a timeout kept from one that waited for the holder.
        assert slowest <= 1 + 4, f"the slowest waiter took {slowest:.2f}s"

        with contextlib.suppress(AssertionError):
            await await_until(lambda: connected_clients(probe) - before <= 20, within=3)
        left_open = connected_clients(probe) - before
        assert left_open <= 20, f"{left_open} connections still open after the waiters left"
    await api.release(holder)


def blocked_client_names(client) -> list[str]:
    """Names of the clients blocked in a command (a BLPOP here) right now."""
    return [entry["name"] for entry in client.client_list() if "b" in entry["flags"]]


def in_background(api, lock: Lock, **kwargs):
    """Acquire ``lock`` in a thread (sync) or a task (async), releasing it at once if
    that worked: (outcome or exception, monotonic time the acquire returned)."""

    def run() -> tuple[object, float]:
        try:
            outcome: object = lock.acquire(**kwargs)
        except LockError as exc:
            return exc, time.monotonic()
        at = time.monotonic()
        if outcome:
            lock.release()
        return outcome, at

    async def arun() -> tuple[object, float]:
        try:
            outcome: object = await lock.aacquire(**kwargs)
        except LockError as exc:
            return exc, time.monotonic()
        at = time.monotonic()
        if outcome:
            await lock.arelease()
        return outcome, at

    return thread_future(run) if api.name == "sync" else asyncio.create_task(arun())


async def test_a_wake_up_reaching_a_waiter_that_gave_up_goes_to_the_next_one(
    api, private_redis, make_proxy, make_backend
):
    """Waiter A's deadline passes while its BLPOP is still on the way; the BLPOP then
    blocks on the server ahead of waiter B's, and the holder releases: the wake-up lands
    on A's connection. B must get the lock within a round trip or two, not at its next
    re-check (``Tuning.wait_cap``, 1 s).

    Passes before the fix too (A reads the wake-up and passes it on, late); a guard for
    a fix of the in-flight case that would leave A's BLPOP behind."""
    direct, proxy, through_proxy = await proxied_backends(private_redis, make_proxy, make_backend)
    await warm_up(api, through_proxy)
    named = make_backend(private_redis, client_kwargs={**SLOW_SOCKETS, "client_name": "b"})
    holding, go = threading.Event(), threading.Event()
    released_at: list[float] = []

    def hold_then_release() -> None:
        holder = Lock("contended", backend=direct, timeout=30, auto_renew=False)
        assert holder.acquire(blocking=False)
        holding.set()
        go.wait(10)
        holder.release()
        released_at.append(time.monotonic())

    releaser = threading.Thread(target=hold_then_release)
    releaser.start()
    with private_redis.client() as probe:
        try:
            assert holding.wait(10)
            proxy.delay_client_data(sends_command("BLPOP"), BLPOP_DELAY)
            a = in_background(api, Lock("contended", backend=through_proxy), blocking_timeout=0.02)
            # A's BLPOP reaches the server (and blocks there, before the fix) before B's.
            await asyncio.sleep(BLPOP_DELAY + 0.03)
            b = in_background(api, Lock("contended", backend=named), blocking_timeout=5)
            await await_until(lambda: "b" in blocked_client_names(probe))
            go.set()
            (a_outcome, _), (b_outcome, b_at) = await asyncio.wait_for(asyncio.gather(a, b), 8)
        finally:
            go.set()
            releaser.join(10)
    assert a_outcome is False
    assert b_outcome is True
    assert b_at - released_at[0] <= 0.2, f"B got the lock {b_at - released_at[0]:.3f}s late"
