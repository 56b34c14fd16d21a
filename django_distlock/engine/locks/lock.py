"""The lock object users hold, :class:`Lock`, whole: its options, acquire and release,
the caller's acquisition (``fence``, ``token``, ``lost``, ``held``...) and its lease
(``extend``, ``reacquire``, ``ttl``, ``owned``), ``with``, and its use as a decorator;
sync methods beside their async twins. The protocol is :mod:`..protocol.steps`; what it
keeps of each owner's hold, and what an outcome does to a hold, :mod:`.holdings`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ParamSpec, Self, TypeVar, overload

from ..exceptions import LockError, LockNotAcquired
from ..keys import (
    LockKeys,
    validate_context,
    validate_limit,
    validate_name,
    validate_replicas,
    validate_seconds,
)
from ..protocol.hold import Hold, LostCause, current_task_or_thread, report_loss, running_task, tell
from ..protocol.ops import Call
from ..protocol.steps import (
    Acquired,
    NotAcquired,
    NotReplicated,
    acquire_steps,
    after_release_of,
    extend_call,
    new_token,
    release_steps,
    ttl_call,
)
from ..renewal.watchdog import loop_watchdog, thread_watchdog
from ..templates import NameTemplate
from ..transport.backend import Backend
from ..transport.drivers import AsyncDriver, SyncDriver
from .holdings import (
    UNSET,
    BackendSource,
    Holdings,
    LeavingWith,
    Releasing,
    acquire_failed,
    arole_or_none,
    backend_of,
    check_backend_source,
    check_bool,
    check_callable,
    contended,
    lost_error,
    mode_of,
    not_acquired,
    not_replicated,
    released,
    role_or_none,
    waiting_options,
)

__all__ = ["Lock"]


P = ParamSpec("P")


R = TypeVar("R")


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
        min_replicas: int | str | None = None,
        limit: int | None = None,
        shared: bool = False,
        reentrant: bool = False,
    ) -> None:
        self.name = validate_name(name)
        self.limit = None if limit is None else validate_limit(limit)
        self.shared = check_bool(shared, "shared")
        self.reentrant = check_bool(reentrant, "reentrant")
        self.mode = mode_of(self.limit, self.shared, self.reentrant)
        self._backend_source = check_backend_source(backend)
        self.timeout = None if timeout is None else validate_seconds(timeout, "timeout")
        self.blocking = check_bool(blocking, "blocking")
        self.blocking_timeout = (
            None
            if blocking_timeout is None
            else validate_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
        )
        self.auto_renew = check_bool(auto_renew, "auto_renew", optional=True)
        self.on_lost = check_callable(on_lost, "on_lost")
        self.context = validate_context(context)
        self.fair = check_bool(fair, "fair")
        self.raise_on_lost = check_bool(raise_on_lost, "raise_on_lost")
        self.min_replicas = (
            None if min_replicas is None else validate_replicas(min_replicas, "min_replicas")
        )
        self.retry_after: float | None = None
        """The holder's remaining lease (seconds) seen by the last failed acquire."""
        self._keys: tuple[str, LockKeys] | None = None
        self.holdings = Holdings(self._report_lost)
        """This object's acquisitions, by owner (what :class:`LockGroup` builds on)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

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
        if self.reentrant and self.holdings.reenter(self.backend, self.name, task):
            return True
        hold, steps = self._begin(blocking, blocking_timeout, owner, task, thread_watchdog)
        driver = SyncDriver(hold.backend, self.name)
        try:
            outcome = driver.run(steps)
        except LockError as error:
            acquire_failed(hold, error)
            raise
        if type(outcome) is NotReplicated:
            raise not_replicated(hold, outcome, role_or_none(driver.execute, hold.keys.lock))
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
        if self.reentrant and self.holdings.reenter(self.backend, self.name, owner):
            return True
        hold, steps = self._begin(blocking, blocking_timeout, owner, owner, loop_watchdog)
        hold.loop = asyncio.get_running_loop()
        driver = AsyncDriver(hold.backend, self.name)
        try:
            outcome = await driver.run(steps)
        except LockError as error:
            acquire_failed(hold, error)
            raise
        if type(outcome) is NotReplicated:
            raise not_replicated(hold, outcome, await arole_or_none(driver.execute, hold.keys.lock))
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
        stale = self.holdings.make_way(self.name, task, self._report_lost)
        source = self._backend_source
        backend = source if type(source) is Backend else self.backend
        hold = self.holdings.prepare(
            self, backend, owner, new_token(), self._keys_for(backend.prefix)
        )
        hold.blocking = blocking
        steps = acquire_steps(
            keys=hold.keys,
            name=self.name,
            token=hold.token,
            lease=hold.lease,
            owner=self.holdings.owner_metadata(self.context, hold),
            fair=self.fair,
            blocking=blocking,
            deadline=None if blocking_timeout is None else hold.started_mono + blocking_timeout,
            tuning=backend.tuning,
            replicas=backend.acknowledgement(self.min_replicas),
            mode=hold.mode,
            limit=hold.limit,
            on_unreleased=lambda: watchdog().give_back(hold),
        )
        if stale is not None:
            steps = after_release_of(stale, steps)
        return hold, steps

    def _settle(
        self,
        hold: Hold,
        outcome: Acquired | NotAcquired,
        owner: Any,
        watchdog: Callable[[], Any],
    ) -> bool:
        now = time.monotonic()
        if type(outcome) is NotAcquired:
            self.retry_after = outcome.retry_after
            cause = "timeout" if hold.blocking else "busy"
            contended(hold, outcome.retry_after, now - hold.started_mono, cause=cause)
            return False
        self.retry_after = None
        self.holdings.adopt(hold, outcome, owner, watchdog, now, reentrant=self.reentrant)
        return True

    # -- release --------------------------------------------------------------------

    def release(self) -> None:
        """Give the lock back. Raises ``LockNotOwned`` if the caller does not hold it and
        ``LockLost`` if it was lost meanwhile (the lock is then no longer held either)."""
        hold = self.holdings.owned(self.name, "release", running_task())
        if hold.depth > 1:
            hold.depth -= 1
            return
        with Releasing(hold):
            was_held = SyncDriver(hold.backend, self.name).run(self._release_steps(hold))
        released(hold, was_held, self._report_lost)

    def arelease(self) -> Coroutine[Any, Any, None]:
        """Async twin of :meth:`release`. A cancelled release still completes, and the
        hold is cleared only once Redis has confirmed."""
        return self._arelease(running_task())

    async def _arelease(self, owner: Any) -> None:
        task = running_task()
        hold = self.holdings.owned(self.name, "release", owner or task)
        if hold.depth > 1:
            hold.depth -= 1
            return
        cancels = 0 if task is None else task.cancelling()
        try:
            with Releasing(hold):
                driver = AsyncDriver(hold.backend, self.name, uncancellable=True)
                was_held = await driver.run(self._release_steps(hold))
            released(hold, was_held, self._report_lost)
        finally:
            # Cancelled meanwhile (the driver finished the release anyway): stay cancelled.
            if task is not None and task.cancelling() > cancels:
                raise asyncio.CancelledError

    @staticmethod
    def _release_steps(hold: Hold) -> Any:
        return release_steps(
            hold.keys, hold.token, hold.backend.tuning.waiter_liveness_ms, hold.mode
        )

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

    # -- with -----------------------------------------------------------------------

    def __enter__(self) -> Self:
        if not self.acquire():
            raise self._not_acquired()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self.holdings.find(running_task())
        if hold is not None:
            with LeavingWith(hold, exc, self.raise_on_lost, self._report_lost):
                self.release()

    async def __aenter__(self) -> Self:
        if not await self.aacquire():
            raise self._not_acquired()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self.holdings.find(running_task())
        if hold is not None:
            with LeavingWith(hold, exc, self.raise_on_lost, self._report_lost):
                await self.arelease()

    def _not_acquired(self) -> LockNotAcquired:
        return not_acquired(self.name, self.blocking, self.blocking_timeout, self.retry_after)

    # -- the caller's acquisition and its lease ------------------------------------

    @property
    def fence(self) -> int | None:
        """The fencing token of the current acquisition (``None`` when not held).

        Strictly increasing per lock name; pass it to storage so that a write made by a
        holder that lost the lock can be refused (see ``fenced_update``).
        """
        hold = self.holdings.find(running_task())
        return None if hold is None else hold.fence

    @property
    def token(self) -> str | None:
        """The random token identifying the current acquisition (``None`` when not held)."""
        hold = self.holdings.find(running_task())
        return None if hold is None else hold.token

    @property
    def lost(self) -> bool:
        """True when the caller's last acquisition was lost: a renewal found the lock gone
        or re-owned, or its lease ended without a confirmed renewal. It keeps describing
        that acquisition after it ended (an ``except LockLost`` handler can read it),
        until the next acquire."""
        hold = self.holdings.find(running_task(), live=False)
        return hold is not None and hold.is_lost()

    @property
    def lost_reason(self) -> str:
        """Why the caller's last acquisition was lost (``""`` when it was not)."""
        hold = self.holdings.find(running_task(), live=False)
        if hold is None or not hold.is_lost():
            return ""
        return hold.lost_reason or "its lease ended"

    @property
    def valid_until(self) -> float | None:
        """When the lease of the current acquisition ends, as ``time.time()`` seconds
        (a conservative local estimate), or ``None`` when not held."""
        hold = self.holdings.find(running_task())
        return None if hold is None else hold.valid_until

    @property
    def held(self) -> bool:
        """True while the caller holds an acquisition it has not lost."""
        hold = self.holdings.find(running_task())
        return hold is not None and not hold.is_lost()

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
        hold = self.holdings.owned(self.name, "reacquire", running_task())
        return self.extend(hold.lease, replace_ttl=True)

    def areacquire(self) -> Coroutine[Any, Any, float]:
        """Async twin of :meth:`reacquire`."""
        return self._areacquire(running_task())

    async def _areacquire(self, owner: Any) -> float:
        owner = owner or running_task()
        hold = self.holdings.owned(self.name, "reacquire", owner)
        return await self._aextend(owner, hold.lease, True)

    def _extend_call(self, seconds: Any, replace_ttl: Any, owner: Any) -> tuple[Hold, Call]:
        seconds = validate_seconds(seconds, "seconds")
        check_bool(replace_ttl, "replace_ttl")
        hold = self.holdings.owned(self.name, "extend", owner)
        if hold.is_lost():
            raise lost_error(hold)
        return hold, extend_call(hold, seconds, "set" if replace_ttl else "add")

    def _extended(self, hold: Hold, reply: Any, sent_at: float) -> float:
        if int(reply) < 0:
            hold.note_loss(LostCause.GONE, "its lease ended or another holder took it", first=False)
            self._report_lost(hold)
            raise lost_error(hold)
        hold.valid_until_mono = sent_at + int(reply) / 1000
        tell(hold, "extended")
        return hold.valid_until

    def ttl(self) -> float | None:
        """Seconds left on the lease of the current acquisition, from Redis (``None`` when
        the caller does not hold it)."""
        hold = self.holdings.find(running_task())
        if hold is None:
            return None
        return self._ttl_from(hold, SyncDriver(hold.backend, self.name).call(ttl_call(hold)))

    def attl(self) -> Coroutine[Any, Any, float | None]:
        """Async twin of :meth:`ttl`."""
        return self._attl(running_task())

    async def _attl(self, owner: Any) -> float | None:
        hold = self.holdings.find(owner or running_task())
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

    def _ttl_from(self, hold: Hold, reply: Any) -> float | None:
        pttl = int(reply)
        if pttl == -2:
            hold.note_loss(LostCause.GONE, "its lease ended or another holder took it")
            self._report_lost(hold)
            return None
        return None if pttl < 0 else pttl / 1000

    def _report_lost(self, hold: Hold) -> None:
        report_loss(hold, self.on_lost, self)

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
        clone.holdings = Holdings(clone._report_lost)
        return clone

    # -- helpers --------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend this lock talks to (resolved now if it was given as a callable)."""
        return backend_of(self._backend_source)

    def _keys_for(self, prefix: str) -> LockKeys:
        cached = self._keys
        if cached is None or cached[0] != prefix:
            cached = self._keys = (prefix, LockKeys.for_name(prefix, self.name))
        return cached[1]
