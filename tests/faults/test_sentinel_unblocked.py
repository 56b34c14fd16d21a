"""A planned Sentinel failover (``SENTINEL FAILOVER``) while waiters are blocked on a
lock: the old primary, turned into a replica, answers every blocked ``BLPOP`` with
``-UNBLOCKED``. That is a topology change, not an error of the lock: the waiters must
keep waiting (on the new primary) and get the lock when the holder releases it.

Once demoted, the old primary answers ``READONLY`` to every write that reaches it on a
connection still open to it (redis-py's Sentinel connections turn that into
``ConnectionError: The previous master is now a slave``): a request refused so never ran,
and is sent again to the primary the Sentinels name."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from typing import Any

from django_distlock.engine import Backend, Lock, LockBackendUnavailable
from tests.support.engine import blocked_clients
from tests.support.probe import SENTINEL, BackendMaker, Topology

NAME = "failing-over"
LEASE = 10.0
BLOCKING_TIMEOUT = 20.0
HOLD_FOR = 0.2
WARM_WAIT = 0.2
AFTER_FAILOVER_TIMEOUT = 5.0


async def test_waiters_blocked_across_a_planned_failover_get_the_lock_in_turn(private_sentinel):
    """A holder holds ``NAME`` (sync, its own backend, auto-renewed); a sync waiter (a
    thread) and an async waiter (a task) block on it with ``blocking_timeout=20``. Then
    ``SENTINEL FAILOVER`` promotes the replica and the old primary is demoted. Neither
    waiter may raise; once the holder has released the lock after the failover, each
    waiter gets it in turn, well within its blocking timeout.

    Today both waiters raise ``LockBackendError`` (``UNBLOCKED``) at the demotion, and
    nobody is left waiting when the holder releases."""
    topology = Topology(SENTINEL, sentinel=private_sentinel)
    maker = BackendMaker()
    try:
        holder_backend = maker(topology)
        waiters_backend = maker(topology)
        holder = Holder(Lock(NAME, backend=holder_backend, timeout=LEASE, auto_renew=True))
        await asyncio.to_thread(holder.holding.wait, 10)
        assert holder.error is None, holder.error
        await asyncio.to_thread(private_sentinel.wait_replica_in_sync)  # the replica has it
        outcomes: dict[str, tuple[object, float]] = {}

        def sync_waiter() -> None:
            lock = Lock(NAME, backend=waiters_backend, timeout=LEASE)
            started = time.monotonic()
            try:
                got = lock.acquire(blocking_timeout=BLOCKING_TIMEOUT)
            except Exception as exc:
                outcomes["sync"] = (exc, time.monotonic() - started)
                return
            outcomes["sync"] = (got, time.monotonic() - started)
            if got:
                time.sleep(HOLD_FOR)
                lock.release()

        async def async_waiter() -> None:
            lock = Lock(NAME, backend=waiters_backend, timeout=LEASE)
            started = time.monotonic()
            try:
                got = await lock.aacquire(blocking_timeout=BLOCKING_TIMEOUT)
            except Exception as exc:
                outcomes["async"] = (exc, time.monotonic() - started)
                return
            outcomes["async"] = (got, time.monotonic() - started)
            if got:
                await asyncio.sleep(HOLD_FOR)
                await lock.arelease()

        thread = threading.Thread(target=sync_waiter)
        thread.start()
        task = asyncio.create_task(async_waiter())
        try:
            probe = private_sentinel.primary.client()
            try:
                deadline = time.monotonic() + 10
                while blocked_clients(probe) < 2:
                    assert time.monotonic() < deadline, "the waiters did not block"
                    assert not outcomes, outcomes
                    await asyncio.sleep(0.01)
            finally:
                probe.close()

            await asyncio.to_thread(private_sentinel.failover)  # SENTINEL FAILOVER + demotion
            holder.release.set()
            await asyncio.to_thread(holder.thread.join, 15)
            assert holder.released_at is not None, f"the holder could not release: {holder.error!r}"

            await asyncio.wait_for(task, BLOCKING_TIMEOUT + 5)
        finally:
            holder.release.set()
            await asyncio.to_thread(holder.thread.join, 15)
            await asyncio.to_thread(thread.join, BLOCKING_TIMEOUT + 5)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        assert not thread.is_alive()
        seen = {
            waiter: f"{got!r} after {waited:.2f}s" for waiter, (got, waited) in outcomes.items()
        }
        seen["holder's failed releases"] = repr(holder.failed_releases)
        assert [outcomes[waiter][0] for waiter in ("sync", "async")] == [True, True], seen
        assert all(waited < BLOCKING_TIMEOUT for _, waited in outcomes.values()), seen
    finally:
        await maker.aclose()


async def test_requests_on_connections_to_the_demoted_primary_ride_out_a_planned_failover(
    private_sentinel,
):
    """Every pool of two backends holds idle connections to the primary (request and wait
    connections, sync and async: each waited once for a held lock and timed out). After
    ``SENTINEL FAILOVER`` has demoted that primary, with the lock still held:

    - a non-waiting acquire of a free lock (sync and async) gets it;
    - an acquire waiting with ``blocking_timeout=5`` (a sync thread, an async task) waits,
      and gets the lock once the holder has released it;
    - the holder's release (its request connection is idle too) succeeds at once.

    None of them may raise. Before the fix each raised ``LockBackendUnavailable:
    ConnectionError: The previous master is now a slave`` within milliseconds, at its
    first write on an idle connection (a waiter at its first ``BLPOP``)."""
    topology = Topology(SENTINEL, sentinel=private_sentinel)
    maker = BackendMaker()
    try:
        holder = Holder(
            Lock(NAME, backend=maker(topology), timeout=LEASE, auto_renew=False), retry_within=0
        )
        await asyncio.to_thread(holder.holding.wait, 10)
        assert holder.error is None, holder.error
        waiters_backend = maker(topology)
        others_backend = maker(topology)

        def sync_wait(backend: Backend) -> bool:
            return Lock(NAME, backend=backend, timeout=LEASE).acquire(blocking_timeout=WARM_WAIT)

        async def async_wait(backend: Backend) -> bool:
            lock = Lock(NAME, backend=backend, timeout=LEASE)
            return await lock.aacquire(blocking_timeout=WARM_WAIT)

        for backend in (waiters_backend, others_backend):  # connections left idle
            assert not await asyncio.to_thread(sync_wait, backend)
            assert not await async_wait(backend)
        await asyncio.to_thread(private_sentinel.wait_replica_in_sync)

        await asyncio.to_thread(private_sentinel.failover)  # SENTINEL FAILOVER + demotion

        outcomes: dict[str, tuple[object, float]] = {}

        async def attempt(what: str, call: Coroutine[Any, Any, bool]) -> bool:
            started = time.monotonic()
            try:
                got = await call
            except Exception as exc:
                outcomes[what] = (exc, time.monotonic() - started)
                return False
            outcomes[what] = (got, time.monotonic() - started)
            return got

        def sync_take(name: str) -> bool:
            lock = Lock(name, backend=others_backend, timeout=LEASE)
            got = lock.acquire(blocking=False)
            if got:
                lock.release()
            return got

        async def async_take(name: str) -> bool:
            lock = Lock(name, backend=others_backend, timeout=LEASE)
            got = await lock.aacquire(blocking=False)
            if got:
                await lock.arelease()
            return got

        # Free locks: the acquire script writes (a held lock is only read, and a replica
        # answers that too).
        await attempt("sync, not waiting", asyncio.to_thread(sync_take, f"{NAME}:sync"))
        await attempt("async, not waiting", async_take(f"{NAME}:async"))

        def sync_waiter() -> None:
            lock = Lock(NAME, backend=waiters_backend, timeout=LEASE)
            started = time.monotonic()
            try:
                got = lock.acquire(blocking_timeout=AFTER_FAILOVER_TIMEOUT)
            except Exception as exc:
                outcomes["sync, waiting"] = (exc, time.monotonic() - started)
                return
            outcomes["sync, waiting"] = (got, time.monotonic() - started)
            if got:
                time.sleep(HOLD_FOR)
                lock.release()

        async def async_waiter() -> None:
            lock = Lock(NAME, backend=waiters_backend, timeout=LEASE)
            waiting = lock.aacquire(blocking_timeout=AFTER_FAILOVER_TIMEOUT)
            if await attempt("async, waiting", waiting):
                await asyncio.sleep(HOLD_FOR)
                await lock.arelease()

        thread = threading.Thread(target=sync_waiter)
        thread.start()
        task = asyncio.create_task(async_waiter())
        try:
            probe = private_sentinel.primary.client()
            try:
                deadline = time.monotonic() + AFTER_FAILOVER_TIMEOUT
                while blocked_clients(probe) < 2 and time.monotonic() < deadline:
                    if "sync, waiting" in outcomes or "async, waiting" in outcomes:
                        break  # one of them raised
                    await asyncio.sleep(0.01)
            finally:
                probe.close()
            holder.release.set()
            await asyncio.to_thread(holder.thread.join, 15)
            await asyncio.wait_for(task, AFTER_FAILOVER_TIMEOUT + 5)
        finally:
            holder.release.set()
            await asyncio.to_thread(holder.thread.join, 15)
            await asyncio.to_thread(thread.join, AFTER_FAILOVER_TIMEOUT + 5)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        seen = {what: f"{got!r} after {waited:.3f}s" for what, (got, waited) in outcomes.items()}
        seen["holder's failed releases"] = repr(holder.failed_releases)
        assert holder.failed_releases == [], seen
        assert holder.error is None, seen
        assert {what: got for what, (got, _) in outcomes.items()} == {
            "sync, not waiting": True,
            "async, not waiting": True,
            "sync, waiting": True,
            "async, waiting": True,
        }, seen
        assert all(waited < AFTER_FAILOVER_TIMEOUT for _, waited in outcomes.values()), seen
    finally:
        await maker.aclose()


class Holder:
    """Holds ``lock`` in a thread of its own until :attr:`release` is set, then releases
    it once its backend reaches the new primary: a release that meets the demoted
    primary (a pooled connection) fails as unavailable and is tried again."""

    def __init__(self, lock: Lock, retry_within: float = 10.0) -> None:
        self.lock = lock
        self.retry_within = retry_within
        self.holding = threading.Event()
        self.release = threading.Event()
        self.released_at: float | None = None
        self.failed_releases: list[LockBackendUnavailable] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            if not self.lock.acquire(blocking=False):
                raise AssertionError("the holder did not get the lock")
            self.holding.set()
            self.release.wait(60)
            deadline = time.monotonic() + self.retry_within
            while True:
                try:
                    self.lock.release()
                except LockBackendUnavailable as exc:
                    self.failed_releases.append(exc)
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
                else:
                    self.released_at = time.monotonic()
                    return
        except BaseException as exc:
            self.error = exc
            self.holding.set()
