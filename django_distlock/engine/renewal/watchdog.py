"""Lease renewal at work: a scheduler thread per process for sync holders (with a lane
per backend), timers on the event loop for async ones; both renew at a third of the lease
on the decisions of :mod:`.decisions`. The holds they watch, and :func:`check_holds_now`
(a lock's holds checked at once rather than at their next renewal: a test that takes a
lock away wants its holder told at once)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import process
from ..exceptions import LockError
from ..protocol.hold import Hold
from ..transport.drivers import AsyncDriver, SyncDriver
from . import forcing
from .decisions import (
    Submit,
    after_renewals,
    end_lease,
    first_renewal,
    give_back_retry,
    on_grid,
    plan_renewals,
    settled,
)
from .notifier import notifier

__all__ = [
    "LoopWatchdog",
    "ThreadWatchdog",
    "check_holds_now",
    "loop_watchdog",
    "renew_now",
    "thread_watchdog",
    "watched_holds",
]


logger = logging.getLogger("django_distlock")

IDLE_WAIT = 60.0
LANE_IDLE = 10.0
"""Seconds a renewal lane's thread waits for work before it ends (a new one starts on
demand), so that backends that are gone leave no threads behind."""

RENEW = 0
DEADLINE = 1


def prepare_give_back(hold: Hold) -> None:
    """Mark ``hold`` (never adopted by its lock) for the watchdog to give back; its lease
    counts from when its acquire began."""
    hold.giving_back = True
    hold.valid_until_mono = hold.started_mono + hold.lease


def lane_of(hold: Hold) -> Any:
    """What a hold's renewals share a lane (a thread) with: the server its lock lives on,
    or its backend while a cluster's slot map is not read yet."""
    try:
        server = hold.backend.server_now(hold.keys.lock)
    except Exception:  # noqa: BLE001 - the slot map cannot say yet
        server = None
    return hold.backend if server is None else server


class _Lane:
    """Renews the due holds of one server (or backend), pipelined, on the connections of
    the server's bounded renewal pool."""

    def __init__(self, watchdog: ThreadWatchdog, name: str) -> None:
        self._watchdog = watchdog
        self._queue: queue.SimpleQueue[list[Hold]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, holds: list[Hold]) -> bool:
        """Queue ``holds`` for renewal; ``False`` if the lane has ended (use a new one)."""
        with self._lock:
            if self.closed:
                return False
            self._queue.put(holds)
            return True

    def _run(self) -> None:
        while True:
            try:
                holds = self._queue.get(timeout=LANE_IDLE)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self.closed = True
                        return
                continue
            while not self._queue.empty():
                holds.extend(self._queue.get_nowait())
            try:
                self._renew([hold for hold in holds if not settled(hold)])
            except Exception:  # the lane must outlive anything
                logger.exception("django-distlock: unexpected error in the renewal lane")

    def _renew(self, holds: list[Hold]) -> None:
        renew_now(holds, self._watchdog.notifier.submit, self._watchdog.schedule)


def renew_now(
    holds: list[Hold],
    submit: Submit,
    schedule: Callable[[Hold, float], None],
    within: float | None = None,
) -> None:
    """Renew ``holds`` (of one backend) from this thread, in one pipelined round trip (at
    most ``within`` seconds, else the renewals' own bound): losses go to ``submit``, the
    next renewal of each hold kept to ``schedule``."""
    if not holds:
        return
    sent_at = time.monotonic()
    plan = plan_renewals(holds, sent_at, submit)
    if not plan.holds:
        return
    driver = SyncDriver(plan.holds[0].backend, plan.name)
    timeout = plan.timeout if within is None else min(plan.timeout, within)
    try:
        replies: list[Any] = driver.call_many(plan.calls, timeout)
    except LockError as exc:
        replies = [exc] * len(plan.calls)
    wakes = after_renewals(plan, replies, sent_at, submit, schedule)
    if wakes:  # fair waiters whose turn came with a release: best effort
        with contextlib.suppress(LockError):
            driver.call_many(wakes, plan.timeout)


class ThreadWatchdog:
    """Renews the auto-renew holds of sync code.

    A scheduler thread keeps a heap of due times: renewals, which it hands to the lane of
    the hold's backend, and lease ends, where it reports the holds whose renewal has not
    been confirmed by then.

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
        self.notifier = notifier()
        self._condition = threading.Condition()
        self._heap: list[tuple[float, int, int, Hold]] = []
        self._incoming: collections.deque[tuple[float, int, Hold]] = collections.deque()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = -math.inf  # -inf while awake: it drains before sleeping again
        self._lanes: weakref.WeakKeyDictionary[Any, _Lane] = weakref.WeakKeyDictionary()

    def watch(self, hold: Hold) -> None:
        """Start renewing ``hold`` until it is released (and listening for its force
        release)."""
        self._add(first_renewal(hold), RENEW, hold)
        forcing.listen(hold.backend, watched_holds)

    def give_back(self, hold: Hold) -> None:
        """Release ``hold``, left by an acquire that failed, once Redis answers."""
        prepare_give_back(hold)
        if (due := give_back_retry(hold, time.monotonic())) is not None:
            self._add(due, RENEW, hold)

    def schedule(self, hold: Hold, due: float) -> None:
        """Renew ``hold`` again at monotonic time ``due``."""
        self._add(due, RENEW, hold)

    def holds(self) -> list[Hold]:
        """The holds it watches: due for renewal, being renewed, or just taken."""
        with self._condition:
            return [entry[-1] for entry in (*self._heap, *self._incoming)]

    def _add(self, due: float, kind: int, hold: Hold) -> None:
        self._incoming.append((due, kind, hold))
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
            due, kind, hold = incoming.popleft()
            if kind == RENEW:
                due = on_grid(hold, due)
            heapq.heappush(heap, (due, next(self._order), kind, hold))

    def _next_batch(self) -> list[tuple[float, int, int, Hold]]:
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
            by_lane: dict[Any, list[Hold]] = {}
            for _, _, kind, hold in self._next_batch():
                if settled(hold) or hold.generation != process.generation():
                    continue
                if kind == DEADLINE:
                    if hold.expired() and (report := end_lease(hold)) is not None:
                        self.notifier.submit(report, hold)
                    continue
                by_lane.setdefault(lane_of(hold), []).append(hold)
                if not hold.giving_back:  # nobody holds it: no loss to report
                    self._add(hold.valid_until_mono, DEADLINE, hold)
            for key, holds in by_lane.items():
                lane = self._lanes.get(key)
                if lane is None or not lane.submit(holds):
                    lane = self._lanes[key] = _Lane(self, "distlock-renew")
                    lane.submit(holds)


class _Batch(dict[Hold, None]):  # holds renewed at one time, kept by their timer alone
    __slots__ = ("__weakref__",)


class _Renewal(NamedTuple):  # a hold's place in its batch, cancelled by its release
    batch: _Batch
    hold: Hold

    def cancel(self) -> None:
        self.batch.pop(self.hold, None)


class LoopWatchdog:
    """Renews the auto-renew holds of async code on one event loop: the holds due at one
    time (on a grid) share one timer and one task, which renews them in one pipelined
    round trip per server (per backend, one after another), bounded by the attempt
    deadline of the batch."""

    def __init__(self) -> None:
        # No reference to the loop itself, nor to holds (which have one): this object is
        # the value of a dict weakly keyed by the loop, and must not keep it alive.
        self._tasks: set[asyncio.Task[None]] = set()
        self._due: weakref.WeakValueDictionary[float, _Batch] = weakref.WeakValueDictionary()

    def watch(self, hold: Hold) -> None:
        """Start renewing ``hold`` until it is released (and listening for its force
        release)."""
        self._schedule(hold, first_renewal(hold))
        forcing.listen(hold.backend, watched_holds)

    def give_back(self, hold: Hold) -> None:
        """Async twin of :meth:`ThreadWatchdog.give_back`."""
        prepare_give_back(hold)
        if (due := give_back_retry(hold, time.monotonic())) is not None:
            self._schedule(hold, due)

    def holds(self) -> list[Hold]:
        """The holds whose renewal is due on this loop."""
        return [hold for batch in list(self._due.values()) for hold in batch]

    def _schedule(self, hold: Hold, due: float) -> None:
        at = on_grid(hold, due)
        if (batch := self._due.get(at)) is None:
            batch = self._due[at] = _Batch()
            asyncio.get_running_loop().call_later(at - time.monotonic(), self._spawn, at, batch)
        batch[hold] = None
        hold.timer = _Renewal(batch, hold)

    def _spawn(self, at: float, batch: _Batch) -> None:
        self._due.pop(at, None)
        generation = process.generation()
        holds = [hold for hold in batch if not settled(hold) and hold.generation == generation]
        if not holds:
            return
        task = asyncio.get_running_loop().create_task(self._renew(holds))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _renew(self, holds: list[Hold]) -> None:
        by_backend: dict[Any, list[Hold]] = {}
        for hold in holds:
            by_backend.setdefault(hold.backend, []).append(hold)
        for backend_holds in by_backend.values():
            try:
                await self._renew_on(backend_holds)
            except Exception:  # the loop's renewals must outlive anything
                logger.exception("django-distlock: unexpected error renewing locks")

    async def _renew_on(self, holds: list[Hold]) -> None:
        sent_at = time.monotonic()
        submit = notifier().submit
        plan = plan_renewals(holds, sent_at, submit)
        if not plan.holds:
            return
        driver = AsyncDriver(plan.holds[0].backend, plan.name)
        try:
            replies: list[Any] = await driver.call_many(plan.calls, plan.timeout)
        except LockError as exc:
            replies = [exc] * len(plan.calls)
        wakes = after_renewals(plan, replies, sent_at, submit, self._schedule)
        if wakes:
            with contextlib.suppress(LockError):
                await driver.call_many(wakes, plan.timeout)


_thread_watchdogs = process.PerProcess(ThreadWatchdog)
_loop_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWatchdog] = (
    weakref.WeakKeyDictionary()
)


def thread_watchdog() -> ThreadWatchdog:
    """The process's watchdog for sync holders."""
    return _thread_watchdogs.get()


def loop_watchdog() -> LoopWatchdog:
    """The running event loop's watchdog for async holders."""
    loop = asyncio.get_running_loop()
    watchdog = _loop_watchdogs.get(loop)
    if watchdog is None:
        watchdog = _loop_watchdogs[loop] = LoopWatchdog()
    return watchdog


def watched_holds() -> list[Hold]:
    """Every hold this process's watchdogs renew, sync and async."""
    watchdogs = [*list(_loop_watchdogs.values()), *filter(None, [_thread_watchdogs.made])]
    return [hold for watchdog in watchdogs for hold in watchdog.holds()]


def _forget_after_fork() -> None:
    # A forked child holds none of its parent's locks and has none of its threads.
    global _loop_watchdogs
    _thread_watchdogs.forget()
    _loop_watchdogs = weakref.WeakKeyDictionary()


process.forget_after_fork(_forget_after_fork)


def check_holds_now(name: str, *, prefix: str | None = None, timeout: float = 5.0) -> int:
    """Renew at once, from this thread, every auto-renewed hold this process has of lock
    ``name`` (under key ``prefix``, or any), instead of at its next renewal; return once
    the holders found to have lost it were told (``lock.lost``, ``on_lost``, the ``lost``
    event; an async ``on_lost`` is started on its hold's loop), or ``timeout`` seconds
    passed. Returns how many holds were checked.

    A hold renewed here keeps its own renewal schedule. Holds without ``auto_renew`` are
    not watched, so not checked: their holders find out when they next use the lock.

    >>> check_holds_now("invoice:42", prefix="distlock:")  # doctest: +SKIP
    1
    """
    generation = process.generation()
    by_backend: dict[Any, dict[Hold, None]] = {}
    for hold in watched_holds():
        if hold.name != name or (prefix is not None and hold.backend.prefix != prefix):
            continue
        if not settled(hold) and not hold.giving_back and hold.generation == generation:
            by_backend.setdefault(hold.backend, {})[hold] = None
    for holds in by_backend.values():
        # A hold kept is renewed again when its own renewal comes: nothing to schedule.
        renew_now(list(holds), notifier().submit, lambda hold, due: None, timeout)
    notifier().wait_for_reports(timeout)
    return sum(len(holds) for holds in by_backend.values())
