"""A planned Sentinel failover (``SENTINEL FAILOVER``) while waiters are blocked on a
lock: the old primary, turned into a replica, answers every blocked ``BLPOP`` with
``-UNBLOCKED``. That is a topology change, not an error of the lock: the waiters must
keep waiting (on the new primary) and get the lock when the holder releases it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from django_distlock.engine import Lock, LockBackendUnavailable
from tests.support.engine import blocked_clients
from tests.support.probe import SENTINEL, BackendMaker, Topology

NAME = "failing-over"
LEASE = 10.0
BLOCKING_TIMEOUT = 20.0
HOLD_FOR = 0.2


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
