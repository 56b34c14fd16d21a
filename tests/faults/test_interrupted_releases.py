"""Releases that something interrupts or Redis refuses for a moment (issue 27): a hold
is gone from Redis within one lease after its owner stops believing it holds it, a
release that fails is never followed by a renewal, and a group gives back every name
whatever interrupts it, then re-raises the first interruption."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from django_distlock.engine import LockBackendUnavailable, LockGroup
from django_distlock.engine.locks.lock import Lock
from tests.support.engine import await_until, lock_key

NAMES = ["account:1", "account:2", "account:3"]
LEASE = 3.0
SLOW = {"socket_timeout": 3, "socket_connect_timeout": 1}


def held_names(probe) -> list[str]:
    return [name for name in NAMES if probe.exists(lock_key(name))]


@pytest.mark.parametrize("interruption", ["cancel", "cancel-twice", "timeout"])
async def test_a_group_interrupted_while_releasing_its_first_name_releases_every_name(
    make_backend, private_redis, interruption
):
    backend = make_backend(private_redis, async_client_kwargs=SLOW)
    group = LockGroup(NAMES, backend=backend, timeout=LEASE)
    entered, leave = asyncio.Event(), asyncio.Event()

    async def body():
        async with asyncio.timeout(None) as timer:
            async with group:
                entered.set()
                await leave.wait()
                if interruption == "timeout":
                    timer.reschedule(asyncio.get_running_loop().time() + 0.1)

    task = asyncio.create_task(body())
    await entered.wait()
    private_redis.pause()  # the first name's release stays in flight
    try:
        leave.set()
        await asyncio.sleep(0.1)
        if interruption != "timeout":
            task.cancel()
            if interruption == "cancel-twice":
                await asyncio.sleep(0.05)
                task.cancel()
        await asyncio.sleep(0.1)
    finally:
        private_redis.resume()
    if interruption == "timeout":
        with pytest.raises(TimeoutError):
            await task
    else:
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()  # and it stays cancelled
    with private_redis.client() as probe:
        assert held_names(probe) == []  # released, not left renewed
    assert not group.held


async def test_a_group_interrupted_by_ctrl_c_while_releasing_releases_every_name(
    make_backend, private_redis
):
    """The sync twin: ``KeyboardInterrupt`` from a signal handler while the first name's
    release waits for its answer."""
    backend = make_backend(private_redis, client_kwargs=SLOW)
    group = LockGroup(NAMES, backend=backend, timeout=LEASE)
    assert group.acquire(blocking=False)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    resume = threading.Timer(0.3, private_redis.resume)
    private_redis.pause()
    try:
        resume.start()
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            group.release()
        interrupted_at = time.monotonic()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resume.join()
        private_redis.resume()
    with private_redis.client() as probe:
        # The names after the interrupted one were released before the interrupt went on.
        assert held_names(probe)[1:] == []
        # The interrupted one is gone within its lease, whatever its release did.
        await await_until(lambda: held_names(probe) == [], within=LEASE)
    assert time.monotonic() - interrupted_at < LEASE


def busy_for(private_redis, seconds: float) -> threading.Thread:
    """A script that keeps the server busy for ``seconds``: meanwhile every other client
    is answered ``BUSY`` (past a 50 ms threshold)."""
    with private_redis.client() as admin:
        admin.config_set("busy-reply-threshold", 50)
    script = """
        local start = redis.call('TIME')
        local began = start[1] * 1000000 + start[2]
        while true do
            local now = redis.call('TIME')
            if now[1] * 1000000 + now[2] - began > tonumber(ARGV[1]) then return 1 end
        end
    """

    def run():
        with private_redis.client(socket_timeout=10) as client:
            client.eval(script, 0, int(seconds * 1_000_000))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


async def test_a_release_refused_for_a_moment_is_never_followed_by_a_renewal(
    api, make_backend, private_redis
):
    """``BUSY`` while releasing: the release raises, the watchdog renews the lock no more
    (it gives it back once Redis answers), and the key is gone within one lease."""
    backend = make_backend(private_redis, client_kwargs=SLOW, async_client_kwargs=SLOW)
    lock = Lock("busy", backend=backend, timeout=1.5)
    assert await api.acquire(lock, blocking=False)
    busy = busy_for(private_redis, 0.8)
    try:
        await asyncio.sleep(0.2)  # past the BUSY threshold
        with pytest.raises(LockBackendUnavailable, match="BUSY"):
            await api.release(lock)
        failed_at = time.monotonic()
    finally:
        await asyncio.to_thread(busy.join)
    with private_redis.client() as probe:
        await await_until(lambda: not probe.exists(lock_key("busy")), within=lock.timeout)
    assert time.monotonic() - failed_at < lock.timeout
    # And nothing brings it back: no renewal follows the failed release.
    await asyncio.sleep(lock.timeout)
    with private_redis.client() as probe:
        assert not probe.exists(lock_key("busy"))
