"""The lock object users hold: one class for sync and async code.

Why this module is long: it is one public class whose methods come in pairs, a sync
method and its async twin (``acquire``/``aacquire``, ``release``/``arelease``, ...), each
a few lines of I/O around helpers the pair shares; the protocol itself is in
:mod:`.core`, ownership in :mod:`.ownership`, name templates in :mod:`.templates`.
Splitting the class across modules would separate each method from its twin, which is
how sync and async lock code drifts apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, NoReturn, ParamSpec, TypeVar, overload

from . import process
from .aio import AsyncDriver
from .backend import Backend, Event
from .core import (
    HOSTNAME,
    Acquired,
    NotAcquired,
    NotReplicated,
    acquire_steps,
    extend_call,
    new_token,
    owner_metadata,
    release_steps,
    replication_report,
    ttl_call,
)
from .exceptions import LockError, LockLost, LockNotAcquired, LockNotOwned, LockNotReplicated
from .hold import Hold, LostCause
from .io import SyncDriver
from .keys import (
    LockKeys,
    validate_context,
    validate_limit,
    validate_name,
    validate_replicas,
    validate_seconds,
)
from .losses import REPORTING, hold_event, report_loss
from .modes import EXCLUSIVE, LIMITED, SHARED
from .ops import Call
from .ownership import current_task_or_thread, owner_name, running_task
from .templates import NameTemplate
from .tuning import ms
from .watchdog import loop_watchdog, thread_watchdog

__all__ = ["BackendSource", "Lock"]

P = ParamSpec("P")
R = TypeVar("R")

BackendSource = Backend | Callable[[], Backend]


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


def _after_release_of(stale: Hold, steps: Any) -> Any:
    """``steps``, after giving back ``stale``'s token (a failed release, retried; if it
    fails again the lease runs out, and the acquire says whether Redis answers)."""
    with contextlib.suppress(LockError):
        yield from release_steps(
            stale.keys, stale.token, stale.backend.tuning.waiter_liveness_ms, stale.mode
        )
    return (yield from steps)


def _role_or_none(execute: Callable[..., Any], key: str) -> Any:
    """``ROLE`` of the node holding ``key``, to explain a lock not replicated; ``None``
    when it cannot be read."""
    try:
        return execute(key, "ROLE")
    except LockError:
        return None


async def _arole_or_none(execute: Callable[..., Any], key: str) -> Any:
    try:
        return await execute(key, "ROLE")
    except LockError:
        return None


def waiting_options(
    blocking: Any, blocking_timeout: Any, default_blocking: bool, default_timeout: float | None
) -> tuple[bool, float | None]:
    """An acquire's ``blocking`` and ``blocking_timeout`` arguments, checked, with the
    defaults of its lock (or group) filled in; a zero timeout does not wait."""
    if blocking is None:
        blocking = default_blocking
    else:
        _check_bool(blocking, "blocking")
    if blocking_timeout is UNSET:
        blocking_timeout = default_timeout
    elif blocking_timeout is not None:
        blocking_timeout = validate_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
    if blocking_timeout == 0:
        blocking = False
    return blocking, blocking_timeout


def _check_callable(value: Any, argument: str) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{argument} must be callable or None, not {type(value).__name__}")
    return value


def _check_bool(value: Any, argument: str, *, optional: bool = False) -> Any:
    if (value is None and optional) or isinstance(value, bool):
        return value
    raise TypeError(f"{argument} must be a bool, not {type(value).__name__}")


_reentered: weakref.WeakKeyDictionary[Any, dict[tuple[int, str, str], Hold]] = (
    weakref.WeakKeyDictionary()
)
"""The re-entrant holds of each owner (thread or task), by backend and name."""


def _reentry_key(backend: Backend, name: str) -> tuple[int, str, str]:
    return (id(backend), backend.prefix, name)


class Lock:
    """A distributed lock on one Redis key, usable from sync and async code.

    >>> lock = Lock("invoice:42", backend=backend)            # doctest: +SKIP
    >>> with lock:                                            # doctest: +SKIP
    ...     charge(invoice, fence=lock.fence)

    ``timeout`` is the lease in seconds (default: the backend's); with ``auto_renew``
    (default: the backend's) a watchdog renews it while held, so it only bounds how long
    a crashed holder blocks others. ``blocking``/``blocking_timeout`` are the defaults of
    :meth:`acquire` (``blocking_timeout=None`` waits forever, ``0`` does not wait).
    ``fair=True`` serves waiters in arrival order. ``on_lost(lock)`` is called (from
    the watchdog) when the lock is found lost; leaving ``with`` then raises
    :class:`LockLost` unless ``raise_on_lost=False``. ``context`` is a free label stored
    with the lock for operators.

    An acquisition belongs to whoever took it, in this process: the thread that called
    ``acquire()`` or entered ``with``, the task that called ``aacquire()`` or entered
    ``async with``. Releasing, extending and the queries act on the calling task's
    acquisition, else the calling thread's. Another
    thread or task using the same object (a task created inside the block, a forked
    child) neither sees nor releases it; ``asyncio.wait_for``, ``gather``, ``shield``
    or ``create_task`` around ``aacquire()`` give it to the task that called
    ``aacquire()``. A hold whose owner ends without releasing it is released by the
    watchdog and reported lost.

    Kinds (at most one of these; see docs/kinds.md): ``limit=N`` lets up to N holders
    in at once, each with its own token, fence and lease (``limit=1`` is the plain
    exclusive lock); ``shared=True`` takes a shared (read) hold, which excludes and is
    excluded by exclusive holds of the same name, a waiting exclusive holder going
    before new shared ones; ``reentrant=True`` lets the owner take it again (any
    ``Lock`` of the same name and backend), freed once released as many times.
    """

    template: str = ""
    """The name template this lock's name was filled from (``"report:{day}"`` for the
    locks a decorator makes, see :meth:`renamed`), ``""`` when the name was given as is.
    Events carry it, so that metrics can label a lock by its template rather than by its
    unbounded names."""

    def __init__(
        self,
        name: str,
        *,
        backend: BackendSource,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        on_lost: Callable[[Lock], Any] | None = None,
        context: str = "",
        fair: bool = False,
        raise_on_lost: bool = True,
        min_replicas: int | None = None,
        limit: int | None = None,
        shared: bool = False,
        reentrant: bool = False,
    ) -> None:
        self.name = validate_name(name)
        self.limit = None if limit is None else validate_limit(limit)
        self.shared = _check_bool(shared, "shared")
        self.reentrant = _check_bool(reentrant, "reentrant")
        kinds = {"limit": limit is not None, "shared": shared, "reentrant": reentrant}
        chosen = [option for option, on in kinds.items() if on]
        if len(chosen) > 1:
            raise ValueError(
                f"{' and '.join(chosen)} cannot be combined: a lock is limited, shared or "
                "re-entrant, or none of these"
            )
        self.mode = EXCLUSIVE
        if self.shared:
            self.mode = SHARED
        elif self.limit is not None and self.limit > 1:
            self.mode = LIMITED
        if not isinstance(backend, Backend) and not callable(backend):
            raise TypeError(
                f"backend must be a Backend or a callable returning one, "
                f"not {type(backend).__name__}"
            )
        self.timeout = None if timeout is None else validate_seconds(timeout, "timeout")
        self.blocking = _check_bool(blocking, "blocking")
        self.blocking_timeout = (
            None
            if blocking_timeout is None
            else validate_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
        )
        self.auto_renew = _check_bool(auto_renew, "auto_renew", optional=True)
        self.on_lost = _check_callable(on_lost, "on_lost")
        self.context = validate_context(context)
        self.fair = _check_bool(fair, "fair")
        self.raise_on_lost = _check_bool(raise_on_lost, "raise_on_lost")
        self.min_replicas = (
            None if min_replicas is None else validate_replicas(min_replicas, "min_replicas")
        )
        self.retry_after: float | None = None
        """The holder's remaining lease (seconds) seen by the last failed acquire."""
        self._backend_source = backend
        self._keys: tuple[str, LockKeys] | None = None
        self._owner_cache: tuple[tuple[int, str, bool], str] | None = None
        self._holds: weakref.WeakKeyDictionary[Any, Hold] = weakref.WeakKeyDictionary()
        self._report_ref = weakref.WeakMethod(self._report_lost)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # -- state of the current thread or task ------------------------------------------

    @property
    def fence(self) -> int | None:
        """The fencing token of the current acquisition (``None`` when not held).

        Strictly increasing per lock name; pass it to storage so that a write made by a
        holder that lost the lock can be refused (see ``fenced_update``).
        """
        hold = self._find(running_task())
        return None if hold is None else hold.fence

    @property
    def token(self) -> str | None:
        """The random token identifying the current acquisition (``None`` when not held)."""
        hold = self._find(running_task())
        return None if hold is None else hold.token

    @property
    def lost(self) -> bool:
        """True when the caller's last acquisition was lost: a renewal found the lock gone
        or re-owned, or its lease ended without a confirmed renewal. It keeps describing
        that acquisition after it ended (an ``except LockLost`` handler can read it),
        until the next acquire."""
        hold = self._find(running_task(), live=False)
        return hold is not None and hold.is_lost()

    @property
    def lost_reason(self) -> str:
        """Why the caller's last acquisition was lost (``""`` when it was not)."""
        hold = self._find(running_task(), live=False)
        if hold is None or not hold.is_lost():
            return ""
        return hold.lost_reason or "its lease ended"

    @property
    def valid_until(self) -> float | None:
        """When the lease of the current acquisition ends, as ``time.time()`` seconds
        (a conservative local estimate), or ``None`` when not held."""
        hold = self._find(running_task())
        return None if hold is None else hold.valid_until

    @property
    def held(self) -> bool:
        """True while the caller holds an acquisition it has not lost."""
        hold = self._find(running_task())
        return hold is not None and not hold.is_lost()

    def _find(self, task: Any, *, live: bool = True) -> Hold | None:
        """The acquisition of ``task``, else of the current thread (with ``live``, only
        one not yet released; else also the last one, for what became of it)."""
        holds = self._holds
        if not holds:
            return None
        reporting = REPORTING.get()
        if reporting is not None and any(hold is reporting for hold in holds.values()):
            # Inside this lock's on_lost, on the watchdog's thread or the hold's loop.
            return reporting
        generation = process.generation()
        if task is not None:
            hold = holds.get(task)
            if hold is not None and hold.generation == generation and not (live and hold.released):
                return hold
        hold = holds.get(threading.current_thread())
        if hold is not None and hold.generation == generation and not (live and hold.released):
            return hold
        return None

    def _reenter(self, task: Any) -> bool:
        """Take a re-entrant lock again if the caller (``task``, else the thread) holds
        it already, through this or another ``Lock`` of the same name and backend."""
        key = _reentry_key(self.backend, self.name)
        generation = process.generation()
        for owner in (task, threading.current_thread()):
            if owner is None:
                continue
            hold = _reentered.get(owner, {}).get(key)
            if hold is None or hold.generation != generation:
                continue
            if hold.released or hold.is_lost() or hold.release_failed:
                # A hold whose release failed is not taken again: the acquire gives its
                # token back and takes a new one (its release would only count down).
                del _reentered[owner][key]
                continue
            hold.depth += 1
            self._holds[owner] = hold
            return True
        return False

    def _owned_hold(self, action: str, task: Any) -> Hold:
        hold = self._find(task)
        if hold is None:
            raise LockNotOwned(
                f"cannot {action} lock {self.name!r}: not held by this thread or task",
                name=self.name,
            )
        return hold

    # -- acquire --------------------------------------------------------------------

    def acquire(
        self, blocking: bool | None = None, *, blocking_timeout: float | None = UNSET
    ) -> bool:
        """Take the lock; ``True`` on success, ``False`` if it stayed busy (``blocking``
        false, or ``blocking_timeout`` seconds elapsed).

        Raises ``LockBackendUnavailable`` if Redis cannot be reached, even when waiting
        forever, and ``LockError`` if the caller already holds it.
        """
        owner = threading.current_thread()
        task = running_task()
        if self.reentrant and self._reenter(task):
            return True
        hold, steps = self._begin(blocking, blocking_timeout, owner, task, thread_watchdog)
        driver = SyncDriver(hold.backend, self.name)
        try:
            outcome = driver.run(steps)
        except LockError as error:
            self._report_failure(hold, error, acquiring=True)
            raise
        if type(outcome) is NotReplicated:
            self._not_replicated(hold, outcome, _role_or_none(driver.execute, hold.keys.lock))
        return self._settle(hold, outcome, owner, thread_watchdog)

    def aacquire(
        self, blocking: bool | None = None, *, blocking_timeout: float | None = UNSET
    ) -> Coroutine[Any, Any, bool]:
        """Async twin of :meth:`acquire`. The lock goes to the task that called
        ``aacquire()`` (even when another task awaits it, as ``asyncio.wait_for`` does on
        Python 3.11). If the task is cancelled while waiting or while the request is in
        flight, any lock it may have got is given back before the cancellation
        propagates."""
        return self._aacquire(running_task(), blocking, blocking_timeout)

    async def _aacquire(self, owner: Any, blocking: Any, blocking_timeout: Any) -> bool:
        if owner is None:
            owner = current_task_or_thread()
        if self.reentrant and self._reenter(owner):
            return True
        hold, steps = self._begin(blocking, blocking_timeout, owner, owner, loop_watchdog)
        hold.loop = asyncio.get_running_loop()
        driver = AsyncDriver(hold.backend, self.name)
        try:
            outcome = await driver.run(steps)
        except LockError as error:
            self._report_failure(hold, error, acquiring=True)
            raise
        if type(outcome) is NotReplicated:
            role = await _arole_or_none(driver.execute, hold.keys.lock)
            self._not_replicated(hold, outcome, role)
        return self._settle(hold, outcome, owner, loop_watchdog)

    def _begin(
        self,
        blocking: Any,
        blocking_timeout: Any,
        owner: Any,
        task: Any,
        watchdog: Callable[[], Any],
    ) -> tuple[Hold, Any]:
        blocking, blocking_timeout = waiting_options(
            blocking, blocking_timeout, self.blocking, self.blocking_timeout
        )
        current = self._find(task)
        stale: Hold | None = None
        if current is not None and current.release_failed:
            # Its release could not reach Redis: give the old token back before taking a
            # new one (the lease would otherwise keep this very owner waiting).
            current.released = True
            stale, current = current, None
        if current is not None:
            if not current.is_lost():
                raise LockError(
                    f"lock {self.name!r} is already held by this thread or task "
                    "(pass reentrant=True to take it again)",
                    name=self.name,
                )
            self._report_lost(current)
            current.released = True
        source = self._backend_source
        backend = source if type(source) is Backend else self.backend
        hold = self._new_hold(backend, owner, new_token())
        hold.blocking = blocking
        steps = acquire_steps(
            keys=hold.keys,
            name=self.name,
            token=hold.token,
            lease=hold.lease,
            owner=self._owner(hold.thread, hold.auto_renew),
            fair=self.fair,
            blocking=blocking,
            deadline=None if blocking_timeout is None else hold.started_mono + blocking_timeout,
            tuning=backend.tuning,
            replicas=self._replicas(backend),
            mode=hold.mode,
            limit=hold.limit,
            on_unreleased=lambda: watchdog().give_back(hold),
        )
        if stale is not None:
            steps = _after_release_of(stale, steps)
        return hold, steps

    def _new_hold(self, backend: Backend, owner: Any, token: str) -> Hold:
        """A hold of this lock for ``owner``, filled in by :meth:`_adopt` once Redis has
        answered."""
        return Hold(
            name=self.name,
            token=token,
            lease=self.timeout if self.timeout is not None else backend.timeout,
            backend=backend,
            keys=self._keys_for(backend.prefix),
            auto_renew=self.auto_renew if self.auto_renew is not None else backend.auto_renew,
            context=self.context,
            thread=owner_name(owner),
            started_mono=time.monotonic(),
            owner=weakref.ref(owner),
            report_lost=self._report_ref,
            mode=self.mode,
            limit=0 if self.mode == SHARED else self.limit or 1,
            template=self.template,
        )

    def _replicas(self, backend: Backend) -> tuple[int, int] | None:
        count = self.min_replicas if self.min_replicas is not None else backend.min_replicas
        return (count, ms(backend.replica_timeout)) if count else None

    def _not_replicated(self, hold: Hold, outcome: NotReplicated, role: Any) -> NoReturn:
        self._emit(
            hold.backend,
            "not_replicated",
            None,
            hold.thread,
            waited=time.monotonic() - hold.started_mono,
            reason=f"{outcome.acknowledged} of {outcome.required} replicas acknowledged",
        )
        raise LockNotReplicated(
            f"lock {self.name!r} was taken on the primary, but only {outcome.acknowledged} "
            f"of the {outcome.required} replicas it needs (min_replicas) acknowledged it "
            f"within {outcome.timeout_ms} ms, so it was given back{replication_report(role)}. "
            "Check the replicas' link and lag, raise replica_timeout, or lower min_replicas.",
            name=self.name,
            acknowledged=outcome.acknowledged,
            required=outcome.required,
        )

    def _owner(self, thread: str, auto_renew: bool) -> str:
        key = (process.generation(), thread, auto_renew)
        cached = self._owner_cache
        if cached is None or cached[0] != key:
            owner = owner_metadata(thread=thread, context=self.context, auto_renew=auto_renew)
            cached = self._owner_cache = (key, owner)
        return cached[1]

    def _settle(
        self,
        hold: Hold,
        outcome: Acquired | NotAcquired,
        owner: Any,
        watchdog: Callable[[], Any],
    ) -> bool:
        now = time.monotonic()
        waited = now - hold.started_mono
        if type(outcome) is NotAcquired:
            self.retry_after = outcome.retry_after
            self._emit(
                hold.backend,
                "contended",
                None,
                hold.thread,
                waited=waited,
                retry_after=outcome.retry_after,
                cause="timeout" if hold.blocking else "busy",
            )
            return False
        self._adopt(hold, outcome, owner, watchdog, now)
        return True

    def _adopt(
        self, hold: Hold, outcome: Acquired, owner: Any, watchdog: Callable[[], Any], now: float
    ) -> None:
        """Make ``hold`` (just taken, per ``outcome``) the acquisition of ``owner``."""
        waited = now - hold.started_mono
        hold.fence = outcome.fence
        hold.acquired_at = outcome.acquired_at_us / 1_000_000
        hold.valid_until_mono = outcome.sent_at + hold.lease
        hold.waited = waited
        hold.started_mono = now
        self.retry_after = None
        self._holds[owner] = hold
        if self.reentrant:
            _reentered.setdefault(owner, {})[_reentry_key(hold.backend, self.name)] = hold
        if hold.auto_renew:
            watchdog().watch(hold)
        if hold.backend.observer is not None:
            self._emit(hold.backend, "acquired", hold, hold.thread, waited=waited)

    # -- release --------------------------------------------------------------------

    def release(self) -> None:
        """Give the lock back. Raises ``LockNotOwned`` if the caller does not hold it and
        ``LockLost`` if it was lost meanwhile (the lock is then no longer held either)."""
        hold = self._owned_hold("release", running_task())
        if hold.depth > 1:
            hold.depth -= 1
            return
        with self._releasing(hold):
            released = SyncDriver(hold.backend, self.name).run(self._release_steps(hold))
        self._released(hold, released)

    def arelease(self) -> Coroutine[Any, Any, None]:
        """Async twin of :meth:`release`. A cancelled release still completes, and the
        hold is cleared only once Redis has confirmed."""
        return self._arelease(running_task())

    async def _arelease(self, owner: Any) -> None:
        task = running_task()
        hold = self._owned_hold("release", owner or task)
        if hold.depth > 1:
            hold.depth -= 1
            return
        cancels = 0 if task is None else task.cancelling()
        try:
            with self._releasing(hold):
                driver = AsyncDriver(hold.backend, self.name, uncancellable=True)
                released = await driver.run(self._release_steps(hold))
            self._released(hold, released)
        finally:
            # Cancelled meanwhile (the driver finished the release anyway): stay cancelled.
            if task is not None and task.cancelling() > cancels:
                raise asyncio.CancelledError

    def _releasing(self, hold: Hold) -> _Releasing:
        """Around a release's round trips: the watchdog leaves ``hold`` alone meanwhile,
        and a release that fails is reported and remembered (the next acquire gives the
        old token back first)."""
        return _Releasing(self, hold)

    @staticmethod
    def _release_steps(hold: Hold) -> Any:
        return release_steps(
            hold.keys, hold.token, hold.backend.tuning.waiter_liveness_ms, hold.mode
        )

    def _released(self, hold: Hold, released: bool) -> None:
        hold.released = True
        hold.depth = 0
        timer = hold.timer
        if timer is not None:
            timer.cancel()
        # Our token was still there, so nobody else held the lock meanwhile: a clean
        # release, whatever a renewal racing with it concluded.
        if released:
            self._emit(hold.backend, "released", hold, hold.thread, held=hold.held_for)
            return
        hold.note_loss(LostCause.GONE, "its lease ended or another holder took it before release")
        self._report_lost(hold)
        raise LockLost(
            f"lock {self.name!r} was lost before release: {hold.lost_reason}", name=self.name
        )

    # -- extend, queries ------------------------------------------------------------

    def extend(self, seconds: float, replace_ttl: bool = False) -> float:
        """Add ``seconds`` to the lease (or set it to ``seconds`` with ``replace_ttl``);
        return the new end of the lease as ``time.time()`` seconds."""
        hold, call = self._extend_call(seconds, replace_ttl, running_task())
        sent_at = time.monotonic()
        return self._extended(hold, SyncDriver(hold.backend, self.name).call(call), sent_at)

    def aextend(self, seconds: float, replace_ttl: bool = False) -> Coroutine[Any, Any, float]:
        """Async twin of :meth:`extend`."""
        return self._aextend(running_task(), seconds, replace_ttl)

    async def _aextend(self, owner: Any, seconds: Any, replace_ttl: Any) -> float:
        hold, call = self._extend_call(seconds, replace_ttl, owner or running_task())
        sent_at = time.monotonic()
        reply = await AsyncDriver(hold.backend, self.name).call(call)
        return self._extended(hold, reply, sent_at)

    def reacquire(self) -> float:
        """Reset the lease to the lock's full timeout; return its new end."""
        hold = self._owned_hold("reacquire", running_task())
        return self.extend(hold.lease, replace_ttl=True)

    def areacquire(self) -> Coroutine[Any, Any, float]:
        """Async twin of :meth:`reacquire`."""
        return self._areacquire(running_task())

    async def _areacquire(self, owner: Any) -> float:
        owner = owner or running_task()
        hold = self._owned_hold("reacquire", owner)
        return await self._aextend(owner, hold.lease, True)

    def _extend_call(self, seconds: Any, replace_ttl: Any, owner: Any) -> tuple[Hold, Call]:
        seconds = validate_seconds(seconds, "seconds")
        _check_bool(replace_ttl, "replace_ttl")
        hold = self._owned_hold("extend", owner)
        if hold.is_lost():
            raise LockLost(f"lock {self.name!r} was lost: {hold.lost_reason}", name=self.name)
        return hold, extend_call(hold, seconds, "set" if replace_ttl else "add")

    def _extended(self, hold: Hold, reply: Any, sent_at: float) -> float:
        if int(reply) < 0:
            hold.note_loss(LostCause.GONE, "its lease ended or another holder took it", first=False)
            self._report_lost(hold)
            raise LockLost(f"lock {self.name!r} was lost: {hold.lost_reason}", name=self.name)
        hold.valid_until_mono = sent_at + int(reply) / 1000
        self._emit(hold.backend, "extended", hold, hold.thread)
        return hold.valid_until

    def ttl(self) -> float | None:
        """Seconds left on the lease of the current acquisition, from Redis (``None`` when
        the caller does not hold it)."""
        hold = self._find(running_task())
        if hold is None:
            return None
        return self._ttl_from(hold, SyncDriver(hold.backend, self.name).call(ttl_call(hold)))

    def attl(self) -> Coroutine[Any, Any, float | None]:
        """Async twin of :meth:`ttl`."""
        return self._attl(running_task())

    async def _attl(self, owner: Any) -> float | None:
        hold = self._find(owner or running_task())
        if hold is None:
            return None
        reply = await AsyncDriver(hold.backend, self.name).call(ttl_call(hold))
        return self._ttl_from(hold, reply)

    def owned(self) -> bool:
        """True if Redis confirms the caller holds the lock."""
        return self.ttl() is not None

    def aowned(self) -> Coroutine[Any, Any, bool]:
        """Async twin of :meth:`owned`."""
        return self._aowned(running_task())

    async def _aowned(self, owner: Any) -> bool:
        return (await self._attl(owner)) is not None

    def locked(self) -> bool:
        """True if anyone holds the lock."""
        backend = self.backend
        key = self._keys_for(backend.prefix).lock
        return bool(SyncDriver(backend, self.name).execute(key, "EXISTS", key))

    async def alocked(self) -> bool:
        """Async twin of :meth:`locked`."""
        backend = self.backend
        key = self._keys_for(backend.prefix).lock
        return bool(await AsyncDriver(backend, self.name).execute(key, "EXISTS", key))

    def _ttl_from(self, hold: Hold, reply: Any) -> float | None:
        pttl = int(reply)
        if pttl == -2:
            hold.note_loss(LostCause.GONE, "its lease ended or another holder took it")
            self._report_lost(hold)
            return None
        return None if pttl < 0 else pttl / 1000

    # -- context managers -------------------------------------------------------------

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._not_acquired()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._find(running_task())
        if hold is None:
            return
        try:
            self.release()
        except LockError as error:
            self._release_failed_on_exit(hold, error, body_failed=exc is not None)

    async def __aenter__(self) -> Lock:
        if not await self.aacquire():
            raise self._not_acquired()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._find(running_task())
        if hold is None:
            return
        try:
            await self.arelease()
        except LockError as error:
            self._release_failed_on_exit(hold, error, body_failed=exc is not None)

    def _release_failed_on_exit(self, hold: Hold, error: LockError, *, body_failed: bool) -> None:
        """Leaving ``with`` when the release failed: a lost lock raises ``LockLost`` (unless
        the body raised or ``raise_on_lost`` is off); Redis unreachable is a lost lock if
        the lease is over, else ``error`` itself. The body's own exception always wins."""
        if isinstance(error, LockLost):
            if not body_failed and self.raise_on_lost:
                raise error
            return
        hold.auto_renew = False  # at least let the lease run out
        if hold.is_lost():
            # The lease is over anyway: the holder has lost the lock, and is told so.
            hold.note_loss(
                LostCause.EXPIRED, f"the lease ended while Redis could not be reached ({error})"
            )
            self._report_lost(hold)
            hold.released = True
            if not body_failed and self.raise_on_lost:
                raise LockLost(
                    f"lock {self.name!r} was lost: {hold.lost_reason}", name=self.name
                ) from error
            return
        if not body_failed:
            raise error

    def _not_acquired(self) -> LockNotAcquired:
        how = (
            "it is held by someone else"
            if not self.blocking or self.blocking_timeout == 0
            else f"not within {self.blocking_timeout}s"
            if self.blocking_timeout is not None
            else "it is held by someone else"
        )
        return LockNotAcquired(
            f"could not acquire lock {self.name!r}: {how}",
            name=self.name,
            retry_after=self.retry_after,
        )

    # -- decorator ------------------------------------------------------------------

    @overload
    def __call__(self, func: Callable[P, R]) -> Callable[P, R]: ...
    @overload
    def __call__(self, func: Any) -> Any: ...

    def __call__(self, func: Any) -> Any:
        """Use the lock as a decorator: each call runs under its own acquisition, named
        from the template filled with the call's arguments (``"report:{day}"``)."""
        if not callable(func):
            raise TypeError(f"distlock decorates callables, not {type(func).__name__}")
        name_for = self._namer(func)
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with self.renamed(name_for(args, kwargs)):
                    return await func(*args, **kwargs)

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self.renamed(name_for(args, kwargs)):
                return func(*args, **kwargs)

        return wrapper

    def _namer(self, func: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], str]:
        template = NameTemplate(self.name)
        if template.is_constant:  # any callable, even one without a signature
            return lambda args, kwargs: self.name
        return template.namer(inspect.signature(func), f"{func.__qualname__}()")

    def renamed(self, name: str) -> Lock:
        """A new lock with the same options under another name; its :attr:`template` is
        this lock's name (or this lock's own template)."""
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.name = validate_name(name)
        clone.template = self.template or self.name
        clone.retry_after = None
        clone._keys = None
        clone._owner_cache = None
        clone._holds = weakref.WeakKeyDictionary()
        clone._report_ref = weakref.WeakMethod(clone._report_lost)
        return clone

    # -- helpers --------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend this lock talks to (resolved now if it was given as a callable)."""
        source = self._backend_source
        backend = source if isinstance(source, Backend) else source()
        if not isinstance(backend, Backend):
            raise TypeError(f"backend callable returned {type(backend).__name__}, not Backend")
        return backend

    def _keys_for(self, prefix: str) -> LockKeys:
        cached = self._keys
        if cached is None or cached[0] != prefix:
            cached = self._keys = (prefix, LockKeys.for_name(prefix, self.name))
        return cached[1]

    def _emit(
        self,
        backend: Backend,
        kind: str,
        hold: Hold | None,
        thread: str,
        **extra: Any,
    ) -> None:
        if backend.observer is None:
            return
        if hold is not None:
            backend.emit(hold_event(hold, kind, **extra))
            return
        mode = self.mode
        backend.emit(
            Event(
                kind=kind,
                name=self.name,
                fence=None,
                context=self.context,
                host=HOSTNAME,
                pid=os.getpid(),
                thread=thread,
                template=self.template,
                mode=mode,
                limit=self.limit if mode == LIMITED else None,
                **extra,
            )
        )

    def _report_failure(self, hold: Hold, error: LockError, *, acquiring: bool) -> None:
        """Tell the observer that an acquire (``error``) or a release (``release_failed``)
        raised ``error``."""
        if hold.backend.observer is None:
            return
        cause, reason = type(error).__name__, str(error)
        if acquiring:
            waited = time.monotonic() - hold.started_mono
            self._emit(
                hold.backend, "error", None, hold.thread, waited=waited, cause=cause, reason=reason
            )
        else:
            self._emit(
                hold.backend,
                "release_failed",
                hold,
                hold.thread,
                held=hold.held_for,
                cause=cause,
                reason=reason,
            )

    def _report_lost(self, hold: Hold) -> None:
        report_loss(hold, self.on_lost, self)


class _Releasing:
    """:meth:`Lock._releasing` (a class: a generator context manager costs a few
    microseconds more per release)."""

    __slots__ = ("hold", "lock")

    def __init__(self, lock: Lock, hold: Hold) -> None:
        self.lock = lock
        self.hold = hold

    def __enter__(self) -> None:
        self.hold.releasing = True

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        hold = self.hold
        try:
            if isinstance(error, LockError):
                hold.release_failed = True
                self.lock._report_failure(hold, error, acquiring=False)
        finally:
            hold.releasing = False
