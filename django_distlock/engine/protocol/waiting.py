"""The waiter: where one acquire (one lock, or a group's script) stands with the server's
waiting structures, and the one wait loop's pieces that change it: an attempt that ends
the outstanding wait in its round trip, the wait for a wake-up, and leaving (what must be
undone or handed on). Also how a fair waiter is woken and when a waiter re-checks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import LockBackendUnavailable, LockError
from ..keys import LockKeys
from ..tuning import Tuning
from .ops import AwaitWakeUp, Call, CallEndingWait, Op, StartWait, Wake, interrupted
from .replies import passed_on_reply
from .scripts import PASS_ON, WAKE

__all__ = ["RideOut", "Waiter", "wake_call", "wake_steps", "wake_time"]


def wake_call(keys: LockKeys, head: Any, liveness_ms: int) -> Call | None:
    """The call that wakes fair waiter ``head`` (a script's answer: ``b""`` when there is
    none, and then ``None``). Its list is not among the lock's keys, so it is pushed to
    apart from the script that named it."""
    if not head:
        return None
    waiter = head.decode() if isinstance(head, bytes) else str(head)
    return Call(WAKE, (keys.wake(waiter),), (liveness_ms,))


def wake_steps(keys: LockKeys, head: Any, liveness_ms: int) -> Generator[Op, Any, None]:
    """Wake fair waiter ``head`` (:func:`wake_call`); losing this push only makes the
    waiter notice at its next re-check."""
    call = wake_call(keys, head, liveness_ms)
    if call is not None:
        with contextlib.suppress(LockError):
            yield call


def wake_time(sent_at: float, wait_ms: int, remaining: float, tuning: Tuning) -> float:
    """When a waiter told ``busy`` re-checks at the latest (monotonic): once the obstacle's
    ``wait_ms`` is over (``-1``: unknown), within ``tuning.wait_cap`` and the ``remaining``
    seconds before its deadline."""
    # The PTTL counts from when the script ran, so the timer counts from when it was
    # sent; +1 ms because Redis keeps a key until its PTTL is strictly past.
    timer = tuning.wait_cap if wait_ms < 0 else (wait_ms + 1) / 1000
    return sent_at + min(timer, tuning.wait_cap, max(remaining, 0.0))


@dataclass(slots=True)
class RideOut:
    """How one acquire rides out a failover, the same for one lock and a group: an
    attempt the primary changed under (a planned failover unblocked its ``WAIT``, or the
    demoted primary refused it), a wait a failover ended, or a lock too few replicas
    acknowledged (the old primary lost its replica first) is tried again, every
    ``Tuning.failover_pause``, for up to ``Tuning.failover_ride_out`` seconds from the
    first, never past the acquire's deadline."""

    tuning: Tuning
    deadline: float | None
    """Monotonic time the acquire stops waiting at, ``None`` for never."""
    until: float | None = None
    """A ride-out runs: retries go on until then."""

    def start(self) -> None:
        """A failover was met (a wait it ended): ride it out from now."""
        until = time.monotonic() + self.tuning.failover_ride_out
        self.until = until if self.deadline is None else min(until, self.deadline)

    def riding(self, met: bool) -> bool:
        """Whether a failover is being ridden out now; ``met``: this attempt met one (the
        ride-out starts unless one runs already)."""
        if met and self.until is None:
            self.start()
        return self.until is not None and time.monotonic() < self.until

    def primary_changed(self, error: LockBackendUnavailable, blocking: bool) -> bool:
        """Whether to try again after ``error`` refused an attempt: a waiter (``blocking``)
        whose primary changed under it, while the ride-out lasts."""
        return self.riding(blocking and interrupted(error.__cause__))


@dataclass(slots=True)
class Waiter:
    """Where one acquire stands with the server's waiting structures, for one lock or a
    group (which waits on whichever of its locks was busy): what it must undo or hand on
    if it leaves without the lock (:meth:`leave`)."""

    waiter: str
    """Our waiter id, ``""`` when the acquire does not wait."""
    failover: RideOut
    """Riding out a failover."""
    queue: LockKeys | None = None
    """The lock whose fair queue our attempts join (a fair waiter), else ``None``."""
    holders: bool = False
    """The lock is taken shared or limited: its scripts take the holders' keys."""
    waiting_on: LockKeys | None = None
    """The lock on whose wake-up list our ``BLPOP`` is outstanding."""
    consumed_from: LockKeys | None = None
    """The lock of a wake-up that reached us and is not used yet (leaving hands it on)."""
    queued: bool = False
    """We are (or, an attempt sent, may be) on :attr:`queue`."""
    writer_of: list[LockKeys] = field(default_factory=list)
    """The locks held shared among whose waiting writers we wait."""
    registered_on: LockKeys | None = None
    """The lock among whose waiters (``:waiting:``) we registered last: taking the lock
    takes us off, leaving must (else a release would wake somebody for us)."""
    sent: bool = False
    """A waiting attempt was sent: it may have registered us, even if no reply came."""
    timer_fired: bool = False
    """The last wait ended by our own timer (the ``BLPOP`` stays outstanding)."""

    def keys_of(self, lock: LockKeys, *, own: bool = False) -> tuple[str, ...]:
        """``lock``'s keys for a script; ``own``: with our own wake-up list as ``KEYS[7]``
        (an attempt that ends our wait, and leaving). Plain attempts name the shared
        signal list there, so that their keys (and how they are packed) are the same each
        time."""
        waiter = self.waiter if own else ""
        return lock.of_holders(waiter) if self.holders else lock.all(waiter)

    def attempt(self, call: Callable[[LockKeys | None, bool], Call]) -> Generator[Op, Any, Any]:
        """Send an attempt, ``call(ending, registered)``, and return its reply: after our
        timer fired, ``ending`` is the lock whose ``BLPOP`` the attempt also ends, in the
        same round trip (else ``None``); ``registered``: an attempt before may have
        registered us as a waiter (the script takes us off as it takes the lock)."""
        # Once sent, a fair waiter's attempt may have queued it even if no reply comes.
        self.queued = self.queued or self.queue is not None
        registered, self.sent = self.sent, self.sent or bool(self.waiter)
        ending = self.waiting_on if self.timer_fired else None
        if ending is None:
            return (yield call(None, registered))
        self.waiting_on = None
        reply, woken = yield CallEndingWait(call(ending, registered))
        if woken:
            self.consumed_from = ending
        return reply

    def busy(self, lock: LockKeys, writer: bool) -> None:
        """An attempt found ``lock`` busy; ``writer``: we now wait among its writers
        (taking it, or leaving, takes us off)."""
        if writer and lock not in self.writer_of:
            self.writer_of.append(lock)
        if self.waiter:
            self.registered_on = lock

    def wait(
        self, lock: LockKeys, sent_at: float, wait_ms: int, remaining: float
    ) -> Generator[Op, Any, None]:
        """Block (a ``BLPOP`` on our wake-up list for ``lock``, opened once) until a
        release wakes us or the :func:`wake_time` of the attempt sent at ``sent_at``; at
        once when a wake-up reached us as our timer fired."""
        if self.consumed_from not in (None, lock):
            # A group woken by a release of one lock found another busy: it did not use
            # that wake-up, and it now waits elsewhere; the released lock's next waiter
            # gets it (if this is lost, at its own re-check).
            with contextlib.suppress(LockError):
                yield from self._pass_on(self.consumed_from, registered=True)
        if self.timer_fired and self.consumed_from is not None:
            self.timer_fired, self.consumed_from = False, None
            return
        if self.waiting_on is None:
            own = lock.wake(self.waiter)
            yield StartWait((own,) if self.queue is not None else (own, lock.signal))
            self.waiting_on, self.consumed_from = lock, None
        wake_at = wake_time(sent_at, wait_ms, remaining, self.failover.tuning)
        woke = yield AwaitWakeUp(max(0.0, wake_at - time.monotonic()))
        self.timer_fired = woke is Wake.TIMER
        if woke is not Wake.TIMER:
            self.waiting_on = None
        if woke is Wake.WOKEN:
            self.consumed_from = lock
        elif woke is Wake.INTERRUPTED:
            self.failover.start()  # a failover ended the wait: try again, riding it out

    def settle(self) -> None:
        """Nothing left to undo or hand on: the lock was taken (its script took us off the
        queue and the writers, and used a wake-up we consumed), or given back."""
        self.consumed_from, self.queued, self.registered_on = None, False, None
        self.writer_of.clear()

    def leave(self, *, failing: bool = False) -> Generator[Op, Any, None]:
        """Leaving without the lock (or on error): end the wait, leave the fair queue, the
        writers and those who wait, and hand on any wake-up we consumed, so that the next
        waiter is not left sleeping until its own timer. ``failing``: an error ends the
        acquire, and a registration with nothing else to undo on its lock is left to its
        deadline (an error path adds no round trip for it). A failure here is absorbed."""
        undoing = (self.waiting_on, self.consumed_from, *self.writer_of)
        if failing and self.registered_on not in (*undoing, self.queue if self.queued else None):
            self.registered_on = None
        with contextlib.suppress(LockError):
            if self.waiting_on is not None:
                lock, self.waiting_on = self.waiting_on, None
                if (yield from self._pass_on(lock, end_wait=True)):
                    self.consumed_from = lock
            while self.writer_of or self.consumed_from or self.queued or self.registered_on:
                lock = (
                    self.writer_of[-1]
                    if self.writer_of
                    else self.consumed_from or (self.queue if self.queued else self.registered_on)
                )
                assert lock is not None
                yield from self._pass_on(lock)

    def _pass_on(
        self, lock: LockKeys, *, end_wait: bool = False, registered: bool = False
    ) -> Generator[Op, Any, bool]:
        """One ``PASS_ON`` undoing all we left on ``lock``; ``end_wait``: it ends our
        ``BLPOP`` too, and we return whether that ``BLPOP`` had consumed a wake-up;
        ``registered``: we may be among its waiters even if we registered elsewhere since."""
        queued = self.queued and lock == self.queue
        writer = lock in self.writer_of
        handed_on = self.consumed_from == lock
        registered = registered or self.registered_on == lock
        self.queued = self.queued and not queued
        if self.registered_on == lock:
            self.registered_on = None
        if writer:
            self.writer_of.remove(lock)
        if handed_on:
            self.consumed_from = None
        liveness_ms = self.failover.tuning.waiter_liveness_ms
        args = (
            self.waiter if queued else "",
            liveness_ms,
            "1" if handed_on else "0",
            "1" if end_wait else "",
            self.waiter if writer else "",
            self.waiter if registered else "",
        )
        call = Call(PASS_ON, self.keys_of(lock, own=True), args)
        reply, woken = (yield CallEndingWait(call)) if end_wait else ((yield call), False)
        yield from wake_steps(lock, passed_on_reply(lock.name, reply).head, liveness_ms)
        return woken
