"""Lease renewal at work, its threads: a scheduler thread per process for sync holders (with a lane
per backend), timers on the event loop for async ones; both renew at a third of the lease
on the decisions of :mod:`.decisions`. The holds they watch, and :func:`check_holds_now`
(a lock's holds checked at once rather than at their next renewal: a test that takes a
lock away wants its holder told at once).

A force release (:func:`~..listing.query.force_release`) publishes a notice on one
channel per key prefix. Every process that holds auto-renewed locks of a backend keeps
one subscription to that channel (:func:`listen`, started when the watchdog first
watches a hold of that backend), and tells the holder of the named token at once.
Nothing is sent or kept per held lock, and nothing is sent at all while nobody
force-releases. On a Redis Cluster a ``PUBLISH`` reaches the subscribers of every node,
so one subscription on any primary hears every slot's notices (a sharded ``SPUBLISH``
would need a subscription per shard holding a lock, for messages that are rare by
nature). A notice missed (the subscription reconnecting after a failover) is not lost
for good: the holder's next renewal finds the lock gone.

Telling holders happens off the renewal path: one :class:`Notifier` thread per process
runs the loss reports (``on_lost``, the ``lost`` event, signals) and the watchdog's
events, in order, so that a slow callback or observer never delays a renewal or an event
loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import heapq
import itertools
import json
import logging
import math
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import process
from ..background import BackgroundWorker
from ..exceptions import LockError
from ..keys import FORCED_CHANNEL
from ..protocol.hold import Hold, LostCause
from ..transport.backend import Backend
from ..transport.drivers import AsyncDriver, SyncDriver
from .decisions import (
    Submit,
    after_renewals,
    end_lease,
    first_renewal,
    give_back_retry,
    mark_lost,
    on_grid,
    plan_renewals,
    settled,
    tell_holder,
)

__all__ = [
    "LoopWatchdog",
    "Notifier",
    "ThreadWatchdog",
    "check_holds_now",
    "forced_reason",
    "listen",
    "listening",
    "loop_watchdog",
    "notifier",
    "renew_now",
    "subscriptions",
    "thread_watchdog",
    "watched_holds",
    "watching",
]


NOTIFIER_IDLE = 60.0


"""Seconds the notifier's thread waits for a report before it looks again."""


class Notifier:
    """Runs loss reports of sync holders on a daemon thread of its own, in order, so
    that a slow ``on_lost`` or observer never delays a renewal."""

    def __init__(self) -> None:
        self._worker: BackgroundWorker[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            BackgroundWorker("distlock-notifier", _run_each, interval=NOTIFIER_IDLE, batch=1)
        )

    def submit(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` on the notifier thread."""
        self._worker.put((function, args))

    def wait_for_reports(self, timeout: float) -> bool:
        """Wait until every report submitted so far has run (they run in order); ``False``
        if they had not within ``timeout`` seconds. None submitted yet: at once, without
        starting the thread."""
        if not self._worker.started:
            return True
        done = threading.Event()
        self.submit(done.set)
        return done.wait(timeout)


def _run_each(reports: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    while reports:
        function, args = reports.popleft()
        try:
            function(*args)
        except Exception:  # the notifier thread must not die
            logger.exception("django-distlock: reporting a lost lock failed")


_notifiers = process.PerProcess(Notifier)


def notifier() -> Notifier:
    """The process's notifier, which tells holders of losses."""
    return _notifiers.get()


# A forked child has none of its parent's threads.
process.forget_after_fork(_notifiers.forget)


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
    backend = holds[0].backend
    plan = plan_renewals(holds, sent_at, submit, by_bucket=backend.routes().is_cluster)
    if not plan.holds:
        return
    driver = SyncDriver(backend, plan.name)
    timeout = plan.timeout if within is None else min(plan.timeout, within)
    try:
        replies: list[Any] = plan.replies(driver.call_many(plan.calls, timeout))
    except LockError as exc:
        replies = [exc] * len(plan.holds)
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
        listen(hold.backend)

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

    def watches(self, backend: Backend) -> bool:
        """Whether one of :meth:`holds` is of ``backend`` and not settled (released, lost);
        the look stops at the first."""
        with self._condition:
            holds = (entry[-1] for entry in itertools.chain(self._heap, self._incoming))
            return any(hold.backend is backend and not settled(hold) for hold in holds)

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
        listen(hold.backend)

    def give_back(self, hold: Hold) -> None:
        """Async twin of :meth:`ThreadWatchdog.give_back`."""
        prepare_give_back(hold)
        if (due := give_back_retry(hold, time.monotonic())) is not None:
            self._schedule(hold, due)

    def holds(self) -> list[Hold]:
        """The holds whose renewal is due on this loop."""
        return [hold for batch in list(self._due.values()) for hold in batch]

    def watches(self, backend: Backend) -> bool:
        """Async twin of :meth:`ThreadWatchdog.watches`."""
        holds = (hold for batch in list(self._due.values()) for hold in batch)
        return any(hold.backend is backend and not settled(hold) for hold in holds)

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
        backend = holds[0].backend
        plan = plan_renewals(holds, sent_at, submit, by_bucket=await _on_cluster(backend))
        if not plan.holds:
            return
        driver = AsyncDriver(backend, plan.name)
        try:
            replies: list[Any] = plan.replies(await driver.call_many(plan.calls, plan.timeout))
        except LockError as exc:
            replies = [exc] * len(plan.holds)
        wakes = after_renewals(plan, replies, sent_at, submit, self._schedule)
        if wakes:
            with contextlib.suppress(LockError):
                await driver.call_many(wakes, plan.timeout)


async def _on_cluster(backend: Backend) -> bool:
    """Whether the running loop's routes of ``backend`` are a Cluster's (where a script
    renews the holds of one bucket only); when they cannot be had, as if they were, which
    is right on every topology."""
    try:
        return (await backend.aroutes()).is_cluster
    except Exception:  # noqa: BLE001 - the renewals then say what failed
        return True


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


def _watchdogs() -> list[ThreadWatchdog | LoopWatchdog]:
    return [*list(_loop_watchdogs.values()), *filter(None, [_thread_watchdogs.made])]


def watched_holds() -> list[Hold]:
    """Every hold this process's watchdogs renew, sync and async."""
    return [hold for watchdog in _watchdogs() for hold in watchdog.holds()]


def watching(backend: Backend) -> bool:
    """Whether this process's watchdogs renew a hold of ``backend``: what a force-release
    listener asks every second, at the cost of finding one such hold, not of listing
    every hold (a quarter of the watchdog's CPU at 50,000 holds)."""
    return any(watchdog.watches(backend) for watchdog in _watchdogs())


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


LISTEN_IDLE = 10.0


"""Seconds a subscription is kept after its backend's last watched hold ended."""


POLL = 1.0


"""Seconds a listener waits for a notice before it looks whether it is still needed."""


RECONNECT = 0.5


"""Seconds between attempts to subscribe again after the connection failed."""


def forced_reason(by: str) -> str:
    """How a hold's loss to a force release is told (``LockLost``, ``on_lost``'s
    ``lock.lost_reason``, the ``lost`` event's reason)."""
    return f"it was force-released by {by or 'an operator'}"


class _Listener:
    """One subscription to a backend's force-release channel, on a daemon thread; it
    ends once the process has watched no hold of that backend for ``LISTEN_IDLE``
    seconds."""

    def __init__(self, backend: Backend) -> None:
        self._backend = weakref.ref(backend)
        self._channel = backend.prefix + FORCED_CHANNEL
        self.closed = False
        self.subscribed = threading.Event()
        self._subscriber: Any = None
        self.subscriptions = 0
        """How many times it subscribed (again after a connection was lost)."""
        self._thread = threading.Thread(target=self._run, name="distlock-forced", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the subscription (its backend is closed); the thread ends with it."""
        self.closed = True
        _close(self._subscriber)

    def _run(self) -> None:
        idle_since: float | None = None
        attempt = 0
        while not self.closed:
            subscriber = self._subscribe(attempt)
            attempt += 1
            if subscriber is None:
                time.sleep(RECONNECT)
                if not self._needed():
                    self.closed = True
                continue
            self._subscriber = subscriber
            if self.closed:  # stopped while it subscribed
                _close(subscriber)
                return
            try:
                while not self.closed:
                    message = subscriber.get_message(timeout=POLL)
                    if message is not None and message.get("type") == "message":
                        self._heard(message["data"])
                        continue
                    if self._needed():
                        idle_since = None
                    elif idle_since is None:
                        idle_since = time.monotonic()
                    elif time.monotonic() - idle_since > LISTEN_IDLE:
                        self.closed = True
                        return
            except Exception as exc:  # noqa: BLE001 - resubscribe, whatever broke
                if not self.closed:
                    logger.info("django-distlock: force-release notices interrupted: %s", exc)
            finally:
                self.subscribed.clear()
                _close(subscriber)

    def _subscribe(self, attempt: int) -> Any:
        backend = self._backend()
        if backend is None:
            self.closed = True
            return None
        subscriber = None
        try:
            routes = backend.routes()
            if attempt:
                routes.refresh()
            primaries = routes.primaries()
            subscriber = primaries[attempt % len(primaries)].subscriber()
            subscriber.subscribe(self._channel)
            # The confirmation proves the subscription is active on the server.
            deadline = time.monotonic() + 5.0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no confirmation of the subscription")
                message = subscriber.get_message(timeout=left)
                if message is not None and message.get("type") == "subscribe":
                    break
        except Exception as exc:  # noqa: BLE001 - retried while holds are watched
            logger.info("django-distlock: cannot subscribe to force-release notices: %s", exc)
            _close(subscriber)
            return None
        self.subscriptions += 1
        self.subscribed.set()
        return subscriber

    def _needed(self) -> bool:
        backend = self._backend()
        return backend is not None and watching(backend)

    def _holds(self) -> list[Hold]:
        backend = self._backend()
        return [hold for hold in watched_holds() if hold.backend is backend]

    def _heard(self, data: Any) -> None:
        try:
            notice = json.loads(data)
            token, by = str(notice["token"]), str(notice.get("by", ""))
        except (ValueError, TypeError, KeyError):
            logger.warning("django-distlock: ignored a malformed force-release notice %r", data)
            return
        for hold in self._holds():
            if hold.token != token or hold.giving_back or settled(hold):
                continue
            hold.note_loss(LostCause.FORCED, forced_reason(by))
            if mark_lost(hold):
                notifier().submit(tell_holder, hold)


def _close(subscriber: Any) -> None:
    if subscriber is None:
        return
    try:
        subscriber.close()
        subscriber.connection_pool.disconnect()
    except Exception:  # noqa: BLE001, S110 - closing what already failed
        pass


_listeners: weakref.WeakKeyDictionary[Backend, _Listener] = weakref.WeakKeyDictionary()


_stopped_on_close: weakref.WeakSet[Backend] = weakref.WeakSet()


_listeners_lock = threading.Lock()


def listen(backend: Backend) -> None:
    """Keep this process subscribed to ``backend``'s force-release notices while the
    watchdogs renew holds of it (:func:`watching`); a dictionary look-up when it
    is already. A backend without a sync client is not listened to (its holders learn
    of a force release at their next renewal)."""
    listener = _listeners.get(backend)
    if listener is not None and not listener.closed:
        return
    try:
        backend.routes()
    except LockError:
        return  # no sync client
    with _listeners_lock:
        listener = _listeners.get(backend)
        if listener is None or listener.closed:
            _listeners[backend] = _Listener(backend)
            if backend not in _stopped_on_close:
                _stopped_on_close.add(backend)
                backend.on_close(functools.partial(_stop_listening, weakref.ref(backend)))


def _stop_listening(backend_ref: weakref.ref[Backend]) -> None:
    backend = backend_ref()
    if backend is None:
        return
    _stopped_on_close.discard(backend)
    listener = _listeners.get(backend)
    if listener is not None:
        listener.stop()


def subscriptions(backend: Backend) -> int:
    """How many times this process's current listener of ``backend`` subscribed (1, then
    one more after each lost connection). For tests and diagnostics."""
    listener = _listeners.get(backend)
    return 0 if listener is None else listener.subscriptions


def listening(backend: Backend, timeout: float = 0.0) -> bool:
    """True once this process is subscribed to ``backend``'s force-release notices
    (waiting up to ``timeout`` seconds): from then on a force release is told to its
    holder here at once. For tests and diagnostics."""
    listener = _listeners.get(backend)
    return listener is not None and listener.subscribed.wait(timeout)


def _forget_listeners_after_fork() -> None:
    # A forked child holds none of its parent's locks and has none of its threads.
    global _listeners, _listeners_lock, _stopped_on_close
    _listeners = weakref.WeakKeyDictionary()
    _stopped_on_close = weakref.WeakSet()
    _listeners_lock = threading.Lock()


process.forget_after_fork(_forget_listeners_after_fork)
