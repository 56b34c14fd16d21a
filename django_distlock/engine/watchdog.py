"""Lease renewal: one daemon thread per process for sync holders, timers on the event
loop for async ones. Both renew at a third of the lease and share the decision logic.

A holder learns it lost the lock when a renewal finds the lock gone or re-owned, and in
any case no later than its lease end: a renewal is bounded by the time left on the
lease, and ``Hold.is_lost()`` turns true at the lease end by itself.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .core import Call, Hold
from .exceptions import LockBackendUnavailable
from .io import AsyncDriver, SyncDriver
from .scripts import EXTEND

if TYPE_CHECKING:
    from .lock import Lock

__all__ = ["LoopWatchdog", "ThreadWatchdog", "loop_watchdog", "thread_watchdog"]

logger = logging.getLogger("django_distlock")

IDLE_WAIT = 60.0


def renewal_call(hold: Hold) -> Call:
    """The script call that renews ``hold`` to at least its full lease."""
    keys = hold.keys
    return Call(
        EXTEND,
        (keys.lock, keys.index),
        (hold.token, max(1, math.ceil(hold.lease * 1000)), hold.name, "renew"),
    )


def first_renewal(hold: Hold) -> float:
    """Monotonic time of the first renewal of a fresh hold."""
    return hold.valid_until_mono - hold.lease * 2 / 3


def after_renewal(hold: Hold, reply: Any, sent_at: float) -> float | None:
    """Record a renewal reply; return when to renew next, or ``None`` if lost."""
    if reply is None or int(reply) < 0:
        hold.lost_reason = "the lock was released or taken by another holder"
        return None
    hold.valid_until_mono = sent_at + int(reply) / 1000
    return sent_at + hold.lease / 3


def after_failure(hold: Hold, exc: BaseException) -> float | None:
    """Record a failed renewal; return when to retry, or ``None`` if the lease is over."""
    now = time.monotonic()
    if hold.expired(now):
        hold.lost_reason = f"the lease ended while Redis could not be reached ({exc})"
        return None
    logger.warning("django-distlock: renewing lock %r failed, will retry: %s", hold.name, exc)
    return min(now + max(hold.lease / 10, 0.001), hold.valid_until_mono)


def _check_not_expired(hold: Hold, now: float) -> None:
    if hold.expired(now):
        raise LockBackendUnavailable("no renewal confirmed in time", name=hold.name)


def _conclude(
    hold: Hold,
    lock_ref: Callable[[], Lock | None],
    next_due: float | None,
    schedule: Callable[[Hold, Callable[[], Lock | None], float], None],
) -> None:
    """After a renewal attempt: report the lock lost, or schedule the next renewal."""
    if hold.released or hold.releasing:
        return  # released while the renewal was in flight: its answer means nothing
    if next_due is None:
        _report_lost(hold, lock_ref)
    else:
        schedule(hold, lock_ref, next_due)


def _report_lost(hold: Hold, lock_ref: Callable[[], Lock | None]) -> None:
    hold.lost = True
    lock = lock_ref()
    if lock is not None:
        lock._report_lost(hold)


class ThreadWatchdog:
    """Renews the auto-renew holds of sync code from one daemon thread.

    Registering a hold is on every acquire's path, so it takes no lock: the hold is
    appended to ``_incoming`` and the thread is notified only if it sleeps past the new
    hold's first renewal. The thread publishes when it will wake (``_wake_at``) *before*
    draining ``_incoming``, so a hold appended after the drain is always compared with a
    wake-up time no earlier than the real one, and is never left unscheduled.

    Renewal times are rounded up to a small grid so that the thread wakes a bounded
    number of times per second however many locks come and go; holds released before
    their renewal are skipped when their time comes.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._heap: list[tuple[float, int, Hold, Callable[[], Lock | None]]] = []
        self._incoming: collections.deque[tuple[float, Hold, Callable[[], Lock | None]]] = (
            collections.deque()
        )
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = -math.inf  # -inf while awake: it drains before sleeping again

    def watch(self, hold: Hold, lock: Lock) -> None:
        """Start renewing ``hold`` (acquired through ``lock``) until it is released."""
        self._add(hold, weakref.ref(lock), first_renewal(hold))

    def _add(self, hold: Hold, lock_ref: Callable[[], Lock | None], due: float) -> None:
        self._incoming.append((due, hold, lock_ref))
        if self._thread is None or due < self._wake_at:
            with self._condition:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="distlock-watchdog", daemon=True
                    )
                    self._thread.start()
                self._condition.notify()

    def _drain(self) -> None:
        incoming, heap = self._incoming, self._heap
        while incoming:
            due, hold, lock_ref = incoming.popleft()
            grid = min(0.05, hold.lease / 30)
            heapq.heappush(heap, (math.ceil(due / grid) * grid, next(self._order), hold, lock_ref))

    def _next_batch(self) -> list[tuple[float, int, Hold, Callable[[], Lock | None]]]:
        heap = self._heap
        with self._condition:
            while True:
                now = time.monotonic()
                self._wake_at = heap[0][0] if heap else now + IDLE_WAIT
                self._drain()
                if heap and heap[0][0] <= now:
                    break
                self._wake_at = heap[0][0] if heap else now + IDLE_WAIT
                self._condition.wait(self._wake_at - now)
            self._wake_at = -math.inf
            due = []
            while heap and heap[0][0] <= now:
                due.append(heapq.heappop(heap))
            return due

    def _run(self) -> None:
        while True:
            for _, _, hold, lock_ref in self._next_batch():
                if not hold.released and not hold.lost and hold.auto_renew:
                    self._renew(hold, lock_ref)

    def _schedule(self, hold: Hold, lock_ref: Callable[[], Lock | None], due: float) -> None:
        self._add(hold, lock_ref, due)

    def _renew(self, hold: Hold, lock_ref: Callable[[], Lock | None]) -> None:
        if lock_ref() is None:
            return  # nobody can release it any more: let the lease run out
        sent_at = time.monotonic()
        driver = SyncDriver(hold.backend, hold.name)
        try:
            _check_not_expired(hold, sent_at)
            reply = driver.call_within(renewal_call(hold), hold.valid_until_mono - sent_at)
            next_due = after_renewal(hold, reply, sent_at)
        except LockBackendUnavailable as exc:
            next_due = after_failure(hold, exc)
        except Exception as exc:  # the watchdog thread must not die
            logger.exception("django-distlock: unexpected error renewing %r", hold.name)
            next_due = after_failure(hold, exc)
        _conclude(hold, lock_ref, next_due, self._schedule)


class LoopWatchdog:
    """Renews the auto-renew holds of async code with timers on one event loop."""

    def __init__(self) -> None:
        # No reference to the loop itself: this object is the value of a dict weakly
        # keyed by the loop, and must not keep it alive.
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(self, hold: Hold, lock: Lock) -> None:
        """Start renewing ``hold`` (acquired through ``lock``) until it is released."""
        self._schedule(hold, weakref.ref(lock), first_renewal(hold))

    def _schedule(self, hold: Hold, lock_ref: Callable[[], Lock | None], due: float) -> None:
        delay = max(0.0, due - time.monotonic())
        hold.timer = asyncio.get_running_loop().call_later(delay, self._spawn, hold, lock_ref)

    def _spawn(self, hold: Hold, lock_ref: Callable[[], Lock | None]) -> None:
        if hold.released or hold.lost or not hold.auto_renew or lock_ref() is None:
            return
        task = asyncio.get_running_loop().create_task(self._renew(hold, lock_ref))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew(self, hold: Hold, lock_ref: Callable[[], Lock | None]) -> None:
        sent_at = time.monotonic()
        driver = AsyncDriver(hold.backend, hold.name)
        try:
            _check_not_expired(hold, sent_at)
            reply = await asyncio.wait_for(
                driver.call(renewal_call(hold)), hold.valid_until_mono - sent_at
            )
            next_due = after_renewal(hold, reply, sent_at)
        except (LockBackendUnavailable, TimeoutError) as exc:
            next_due = after_failure(hold, exc)
        except Exception as exc:
            logger.exception("django-distlock: unexpected error renewing %r", hold.name)
            next_due = after_failure(hold, exc)
        _conclude(hold, lock_ref, next_due, self._schedule)


_thread_watchdog: ThreadWatchdog | None = None
_thread_watchdog_lock = threading.Lock()
_loop_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWatchdog] = (
    weakref.WeakKeyDictionary()
)


def thread_watchdog() -> ThreadWatchdog:
    """The process's watchdog for sync holders."""
    global _thread_watchdog
    if _thread_watchdog is None:
        with _thread_watchdog_lock:
            if _thread_watchdog is None:
                _thread_watchdog = ThreadWatchdog()
    return _thread_watchdog


def loop_watchdog() -> LoopWatchdog:
    """The running event loop's watchdog for async holders."""
    loop = asyncio.get_running_loop()
    watchdog = _loop_watchdogs.get(loop)
    if watchdog is None:
        watchdog = _loop_watchdogs[loop] = LoopWatchdog()
    return watchdog


def _forget_after_fork() -> None:
    # A forked child holds none of its parent's locks and has none of its threads.
    global _thread_watchdog
    _thread_watchdog = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
