"""A hold and its owner: what the owner of one acquisition knows of it (token, fence,
lease, what became of it), who the owner is (the thread that took it with the sync API,
the task that took it with the async API), and how the owner and the backend's observer
are told (the :class:`Event`, and the one place a lost hold is reported)."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import inspect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import process
from ..keys import EXCLUSIVE, LIMITED, LockKeys, clean_label

__all__ = [
    "HOSTNAME",
    "REPORTING",
    "Event",
    "Hold",
    "LostCause",
    "Observer",
    "attempt_event",
    "current_task_or_thread",
    "hold_event",
    "owner_name",
    "report_loss",
    "run_on_loop_of",
    "running_task",
    "tell",
    "tell_attempt",
]


logger = logging.getLogger("django_distlock")

HOSTNAME = clean_label(socket.gethostname())
"""This machine's name, as holds and events name it."""


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened to a lock, as told to a backend's observer.

    ``kind``: ``acquired released extended contended lost not_replicated`` (what a
    holder or an operator is told), or, for metrics, ``error`` (an acquire raised),
    ``release_failed``, ``renewed`` and ``renew_failed``. ``waited``/``held`` are
    seconds (``None`` where they do not apply), ``at`` epoch seconds. ``template``: the
    name template the name was filled from (``""`` for a name given as is). ``cause``:
    ``busy``/``timeout`` for ``contended``; ``gone``/``expired``/``abandoned``/``forced``
    for ``lost`` (:class:`~.hold.LostCause`); ``error``/``gone`` for ``renew_failed``;
    the exception's class name for ``error`` and ``release_failed``. ``mode``:
    ``"exclusive"``, ``"shared"`` or ``"limited"`` (``limit``: N, else ``None``).
    Taking a re-entrant lock again, and releasing it but the last time, are no events.
    """

    kind: str
    name: str
    fence: int | None
    context: str
    host: str
    pid: int
    thread: str
    waited: float | None = None
    held: float | None = None
    retry_after: float | None = None
    reason: str = ""
    at: float = 0.0
    template: str = ""
    cause: str = ""
    mode: str = EXCLUSIVE
    limit: int | None = None


Observer = Callable[[Event], None]


class LostCause(enum.StrEnum):
    """Why a hold ended without its holder releasing it: the ``cause`` of a ``lost``
    event, the label of the lost-locks metric."""

    GONE = "gone"
    """Redis says the lock is no longer ours: its lease ended there, another holder
    took it, or an operator force-released it and the notice was missed."""
    EXPIRED = "expired"
    """Its lease ended before Redis confirmed a renewal (Redis unreachable or too slow)."""
    ABANDONED = "abandoned"
    """Its owner (thread or task) ended, or its lock object was dropped, without
    releasing it."""
    FORCED = "forced"
    """An operator force-released it (the reason names who): its process was told by
    the force release's notice, before any renewal."""


@dataclass(eq=False, slots=True)
class Hold:
    """One successful acquisition: what its owner (a thread or a task) knows of it."""

    name: str
    token: str
    lease: float
    backend: Any
    keys: LockKeys
    auto_renew: bool
    context: str
    thread: str
    """The owner's name, as stored with the lock and shown to operators."""
    started_mono: float
    """Local monotonic time the lock was taken (the acquire began, until it succeeds)."""
    owner: Callable[[], Any] = field(default=lambda: None, repr=False)
    """A weak reference to the owning thread or task (see :func:`owner_alive`)."""
    generation: int = field(default_factory=process.generation)
    """The process generation it was taken in: a forked child does not hold it."""
    report_lost: Callable[[], Callable[[Hold], Any] | None] = field(
        default=lambda: None, repr=False
    )
    """A weak reference to what tells the holder that the lock was lost."""
    mode: str = "exclusive"
    """``"exclusive"``, ``"shared"`` or ``"limited"`` (see :mod:`..keys`)."""
    limit: int = 1
    """How many may hold the lock at once (``0`` for a shared hold: any number)."""
    depth: int = 1
    """How many times its owner has taken it (re-entrant locks); released at 0."""
    fence: int = 0
    acquired_at: float = 0.0
    """Server time (epoch seconds) the lock was taken."""
    valid_until_mono: float = 0.0
    """Local monotonic time the lease ends at, counted from when the request was sent."""
    waited: float = 0.0
    template: str = ""
    """The name template the lock's name was filled from (``""`` if none), for events."""
    blocking: bool = False
    """The acquire was willing to wait (a failure is then a timeout, not "busy")."""
    timer: Any = field(default=None, repr=False)
    """The async watchdog's pending renewal (cancelled on release)."""
    loop: Any = field(default=None, repr=False)
    """The event loop an async hold was taken on (``None`` for sync holds)."""
    lost: bool = False
    lost_cause: LostCause = LostCause.EXPIRED
    """Why it was lost (see :meth:`note_loss`); a lease that ran out unnoticed expired."""
    lost_reason: str = ""
    """The same, in words for people (messages, logs, events)."""
    renewal_error: str = ""
    """Why the last renewal attempt failed (``""`` once one succeeds)."""
    released: bool = False
    release_failed: bool = False
    """A release could not reach Redis: the lock may still be held with this token (the
    next acquire by the same owner gives it back first)."""
    releasing: bool = False
    """A release is in flight: a renewal finding the lock gone proves nothing."""
    lost_reported: bool = field(default=False, repr=False)
    giving_back: bool = False
    """An acquire that failed may have left the lock held with this token (its reply was
    lost, and so was its clean-up): the watchdog releases it once Redis answers."""

    def note_loss(self, cause: LostCause, reason: str, *, first: bool = True) -> None:
        """Record why the hold is lost; with ``first`` the first explanation recorded
        stays (a later one is a consequence of it)."""
        if not (first and self.lost_reason):
            self.lost_cause, self.lost_reason = cause, reason

    def expired(self, now: float | None = None) -> bool:
        """True once the lease has run out without a confirmed renewal."""
        return (time.monotonic() if now is None else now) >= self.valid_until_mono

    def is_lost(self) -> bool:
        """True when the holder must assume someone else may hold the lock."""
        return self.lost or (not self.released and self.expired())

    def owner_alive(self) -> bool:
        """False once the owning thread has ended or the owning task is done."""
        owner = self.owner()
        if owner is None:
            return False
        done = getattr(owner, "done", None)
        if done is not None:
            return not done()
        return bool(owner.is_alive())

    @property
    def valid_until(self) -> float:
        """The end of the lease as a local wall-clock time (``time.time()`` scale)."""
        return time.time() + (self.valid_until_mono - time.monotonic())

    @property
    def held_for(self) -> float:
        """Seconds since the lock was taken (local clock)."""
        return time.monotonic() - self.started_mono


def running_task() -> asyncio.Task[Any] | None:
    """The task running in this thread, if any."""
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop runs in this thread
        return None


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def current_task_or_thread() -> Any:
    """The running task, else the current thread."""
    task = running_task()
    return task if task is not None else threading.current_thread()


_callback_tasks: set[Any] = set()


def run_on_loop_of(hold: Hold, awaitable: Any) -> None:
    """Run the awaitable an async ``on_lost`` returned: here if a loop runs in this
    thread, else on the loop the hold was taken on (losses are reported off the loop)."""
    if _loop_running():
        task = asyncio.ensure_future(awaitable)
        _callback_tasks.add(task)
        task.add_done_callback(_callback_tasks.discard)
        return
    loop = hold.loop
    if loop is None or loop.is_closed():
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        logger.warning("django-distlock: on_lost of %r is async but its loop is gone", hold.name)
        return
    asyncio.run_coroutine_threadsafe(_awaited(awaitable), loop)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def owner_name(owner: Any) -> str:
    """The name of a thread or task, as a hold stores it (made storable)."""
    get_name = getattr(owner, "get_name", None)
    return clean_label(get_name() if get_name is not None else owner.name)


REPORTING: contextvars.ContextVar[Hold | None] = contextvars.ContextVar(
    "distlock_reporting", default=None
)
"""The hold whose loss ``on_lost`` is being told: the callback runs on the watchdog's
thread (or its hold's loop), and its lock's properties describe that hold there."""


def hold_event(hold: Hold, kind: str, **details: Any) -> Event:
    """An event about ``hold``, for its backend's observer."""
    return _event(hold, kind, fence=hold.fence, at=time.time(), **details)


def attempt_event(hold: Hold, kind: str, **details: Any) -> Event:
    """An event about an acquire that did not take the lock (``hold`` was prepared for
    it): no fence."""
    return _event(hold, kind, fence=None, **details)


def tell(hold: Hold, kind: str, **details: Any) -> None:
    """Tell ``hold``'s backend's observer, if it has one, the :func:`hold_event`."""
    if hold.backend.observer is not None:
        hold.backend.emit(hold_event(hold, kind, **details))


def tell_attempt(hold: Hold, kind: str, **details: Any) -> None:
    """Tell ``hold``'s backend's observer, if it has one, the :func:`attempt_event`."""
    if hold.backend.observer is not None:
        hold.backend.emit(attempt_event(hold, kind, **details))


def _event(hold: Hold, kind: str, **details: Any) -> Event:
    return Event(
        kind=kind,
        name=hold.name,
        context=hold.context,
        host=HOSTNAME,
        pid=os.getpid(),
        thread=hold.thread,
        template=hold.template,
        mode=hold.mode,
        limit=hold.limit if hold.mode == LIMITED else None,
        **details,
    )


def report_loss(hold: Hold, on_lost: Callable[[Any], Any] | None = None, lock: Any = None) -> None:
    """Report, once, that ``hold`` was lost: its ``lost`` event (cause and reason as
    recorded on it), then ``on_lost(lock)`` if its lock object still has one (an async
    callback runs on the hold's event loop)."""
    hold.lost = True
    if hold.lost_reported:
        return
    hold.lost_reported = True
    tell(hold, "lost", held=hold.held_for, reason=hold.lost_reason, cause=hold.lost_cause.value)
    if on_lost is None:
        return
    reporting = REPORTING.set(hold)
    try:
        outcome = on_lost(lock)
        if inspect.isawaitable(outcome):
            run_on_loop_of(hold, _reporting(hold, outcome))
    except Exception:
        logger.exception("django-distlock: on_lost callback of %r failed", hold.name)
    finally:
        REPORTING.reset(reporting)


async def _reporting(hold: Hold, awaitable: Any) -> Any:
    reporting = REPORTING.set(hold)
    try:
        return await awaitable
    finally:
        REPORTING.reset(reporting)
