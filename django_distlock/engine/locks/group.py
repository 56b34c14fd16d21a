""":class:`LockGroup` takes several exclusive locks together, all or none, without
deadlock. On a single server (or a Sentinel's primary) one script takes every lock at
once or none of them: a caller never holds some of the names while it waits for the
others. On a Cluster the names are grouped by bucket (the keys of a script share one
slot); each group is taken at once, the groups in one global order (bucket, then name),
and a group that stays busy past the deadline gives back the groups taken before it. A
caller may then hold the names of earlier groups while it waits for a later one, but
since every caller takes them in the same order, no two callers wait for each other.
After the acquisition each name is an ordinary exclusive hold with the same token: its
own fence, lease renewal, loss report and events.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from types import TracebackType
from typing import Any, Self

from ..exceptions import LockError, LockNotAcquired, LockNotOwned
from ..keys import LockKeys
from ..protocol.hold import Hold, current_task_or_thread, running_task
from ..protocol.steps import (
    Acquired,
    AcquiredMany,
    GroupRequest,
    NotAcquired,
    NotReplicated,
    acquire_many_steps,
    new_token,
)
from ..renewal.watchdog import loop_watchdog, thread_watchdog
from ..transport.backend import Backend
from ..transport.drivers import AsyncDriver, SyncDriver
from .holdings import (
    UNSET,
    BackendSource,
    arole_or_none,
    contended,
    not_replicated,
    role_or_none,
    waiting_options,
)
from .lock import Lock

__all__ = ["LockGroup"]


MAX_NAMES = 1000


"""The most names one :class:`LockGroup` may take (one script's keys stay bounded)."""


class LockGroup:
    """Exclusive locks on several names, taken all or none (``distlock_many``).

    >>> with LockGroup(["account:1", "account:2"], backend=backend) as group:  # doctest: +SKIP
    ...     transfer(amount, fences=group.fences)

    The names may come in any order and are taken in one global order, so callers
    passing the same names in different orders never deadlock. Options are those of
    :class:`Lock` that make sense for several names (each name gets them;
    ``min_replicas``: each of the group's scripts waits for replicas as one lock's
    acquire does, and a group too few acknowledged is given back whole). Every name
    is an ordinary exclusive hold once taken: ``group.locks[name]`` is its
    :class:`Lock` (fence, ``lost``, ``ttl()``...), and it can be waited on by a plain
    ``Lock`` of the same name.
    """

    def __init__(
        self,
        names: Iterable[str],
        *,
        backend: BackendSource,
        timeout: float | None = None,
        blocking: bool = True,
        blocking_timeout: float | None = None,
        auto_renew: bool | None = None,
        on_lost: Callable[[Lock], Any] | None = None,
        context: str = "",
        raise_on_lost: bool = True,
        min_replicas: int | str | None = None,
    ) -> None:
        if isinstance(names, str | bytes) or not isinstance(names, Iterable):
            raise TypeError(f"names must be an iterable of lock names, not {type(names).__name__}")
        names = list(names)
        if not names:
            raise ValueError("names must not be empty")
        if len(names) > MAX_NAMES:
            raise ValueError(
                f"at most {MAX_NAMES:,} names can be taken at once, not {len(names):,}"
            )
        options = {
            "backend": backend,
            "timeout": timeout,
            "blocking": blocking,
            "blocking_timeout": blocking_timeout,
            "auto_renew": auto_renew,
            "on_lost": on_lost,
            "context": context,
            "raise_on_lost": raise_on_lost,
            "min_replicas": min_replicas,
        }
        locks = [Lock(name, **options) for name in names]
        self.locks: dict[str, Lock] = {}
        """Each name's :class:`Lock`, in the order the names were given."""
        for lock in locks:
            if lock.name in self.locks:
                raise ValueError(f"name {lock.name!r} is given twice")
            self.locks[lock.name] = lock
        first = locks[0]
        self.blocking = first.blocking
        self.blocking_timeout = first.blocking_timeout
        self.retry_after: float | None = None
        """The busy holder's remaining lease (seconds) seen by the last failed acquire."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {list(self.locks)!r}>"

    # -- state --------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """The names, in the order given."""
        return list(self.locks)

    @property
    def held(self) -> bool:
        """True while the caller holds every name and has lost none."""
        return all(lock.held for lock in self.locks.values())

    @property
    def lost(self) -> bool:
        """True when one of the names of the caller's last acquisition was lost."""
        return any(lock.lost for lock in self.locks.values())

    @property
    def fences(self) -> dict[str, int | None]:
        """Each name's fencing token in the current acquisition (``None`` when not held)."""
        return {name: lock.fence for name, lock in self.locks.items()}

    # -- acquire --------------------------------------------------------------------------

    def acquire(
        self, blocking: bool | None = None, *, blocking_timeout: float | None = UNSET
    ) -> bool:
        """Take every name; ``True`` on success, ``False`` if one stayed busy (then none
        is held). Raises ``LockBackendUnavailable`` if Redis cannot be reached and
        ``LockError`` if the caller already holds them."""
        owner = threading.current_thread()
        backend = self._backend
        on_cluster = backend.routes().is_cluster
        holds, steps = self._begin(
            blocking, blocking_timeout, owner, running_task(), backend, on_cluster
        )
        driver = SyncDriver(backend, self._first_name)
        outcome = driver.run(steps)
        if type(outcome) is NotReplicated:
            hold = _hold_of(holds, outcome.name)
            raise not_replicated(hold, outcome, role_or_none(driver.execute, hold.keys.lock))
        return self._settle(holds, outcome, owner, thread_watchdog)

    def aacquire(
        self, blocking: bool | None = None, *, blocking_timeout: float | None = UNSET
    ) -> Coroutine[Any, Any, bool]:
        """Async twin of :meth:`acquire` (the names go to the task that called it)."""
        return self._aacquire(running_task(), blocking, blocking_timeout)

    async def _aacquire(self, owner: Any, blocking: Any, blocking_timeout: Any) -> bool:
        if owner is None:
            owner = current_task_or_thread()
        backend = self._backend
        on_cluster = (await backend.aroutes()).is_cluster
        holds, steps = self._begin(blocking, blocking_timeout, owner, owner, backend, on_cluster)
        loop = asyncio.get_running_loop()
        for _lock, hold in holds:
            hold.loop = loop
        driver = AsyncDriver(backend, self._first_name)
        outcome = await driver.run(steps)
        if type(outcome) is NotReplicated:
            hold = _hold_of(holds, outcome.name)
            raise not_replicated(hold, outcome, await arole_or_none(driver.execute, hold.keys.lock))
        return self._settle(holds, outcome, owner, loop_watchdog)

    @property
    def _first_name(self) -> str:
        return next(iter(self.locks))

    @property
    def _backend(self) -> Backend:
        return next(iter(self.locks.values())).backend

    def _begin(
        self,
        blocking: Any,
        blocking_timeout: Any,
        owner: Any,
        task: Any,
        backend: Backend,
        on_cluster: bool,
    ) -> tuple[list[tuple[Lock, Hold]], Any]:
        """The holds to take and the steps taking them on ``backend`` (the first name's,
        resolved once; ``on_cluster``: as its routes say)."""
        blocking, blocking_timeout = waiting_options(
            blocking, blocking_timeout, self.blocking, self.blocking_timeout
        )
        for lock in self.locks.values():
            current = lock.holdings.find(task)
            if current is not None and not current.is_lost() and not current.release_failed:
                raise LockError(
                    f"lock group {self.names!r} is already held by this thread or task",
                    name=lock.name,
                )
        first = next(iter(self.locks.values()))
        token = new_token()
        keyed = sorted(
            ((LockKeys.for_name(backend.prefix, lock.name), lock) for lock in self.locks.values()),
            key=_order,
        )
        holds = [
            (lock, lock.holdings.prepare(lock, backend, owner, token, keys)) for keys, lock in keyed
        ]
        started = holds[0][1].started_mono
        request = GroupRequest(
            token=token,
            lease=max(hold.lease for _lock, hold in holds),
            owner=first.holdings.owner_metadata(first.context, holds[0][1]),
            blocking=blocking,
            deadline=None if blocking_timeout is None else started + blocking_timeout,
            tuning=backend.tuning,
            replicas=backend.acknowledgement(first.min_replicas),
        )
        steps = acquire_many_steps(
            _groups([hold.keys for _lock, hold in holds], on_cluster), request
        )
        return holds, steps

    def _settle(
        self,
        holds: list[tuple[Lock, Hold]],
        outcome: AcquiredMany | NotAcquired,
        owner: Any,
        watchdog: Callable[[], Any],
    ) -> bool:
        now = time.monotonic()
        if type(outcome) is NotAcquired:
            self.retry_after = outcome.retry_after
            hold = holds[0][1]
            contended(hold, outcome.retry_after, now - hold.started_mono)
            return False
        self.retry_after = None
        for (lock, hold), fence in zip(holds, outcome.fences, strict=True):
            earlier = lock.holdings.find(owner)
            if earlier is not None:
                earlier.released = True  # lost, or its release failed: replaced
            lock.retry_after = None
            acquired = Acquired(fence, outcome.acquired_at_us, outcome.sent_at)
            lock.holdings.adopt(hold, acquired, owner, watchdog, now, reentrant=lock.reentrant)
        return True

    # -- release --------------------------------------------------------------------------

    def release(self) -> None:
        """Give every name back (each one even if another fails). Raises the first
        error afterwards: ``LockNotOwned`` if the caller holds none of them, ``LockLost``
        if one was lost meanwhile."""
        _each(lock.release for lock in self._held_locks(running_task()))

    async def arelease(self) -> None:
        """Async twin of :meth:`release`."""
        await _aeach(lock.arelease for lock in self._held_locks(running_task()))

    def _held_locks(self, task: Any) -> list[Lock]:
        locks = [
            lock for lock in reversed(self.locks.values()) if lock.holdings.find(task) is not None
        ]
        if not locks:
            raise LockNotOwned(
                f"cannot release lock group {self.names!r}: not held by this thread or task",
                name=self._first_name,
            )
        return locks

    # -- with -----------------------------------------------------------------------------

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
        _each(
            functools.partial(lock.__exit__, exc_type, exc, tb)
            for lock in reversed(self.locks.values())
        )

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
        await _aeach(
            functools.partial(lock.__aexit__, exc_type, exc, tb)
            for lock in reversed(self.locks.values())
        )

    def _not_acquired(self) -> LockNotAcquired:
        how = (
            f"not within {self.blocking_timeout}s"
            if self.blocking and self.blocking_timeout
            else "one of them is held by someone else"
        )
        return LockNotAcquired(
            f"could not acquire locks {self.names!r}: {how}",
            name=self._first_name,
            retry_after=self.retry_after,
        )


def _hold_of(holds: list[tuple[Lock, Hold]], name: str) -> Hold:
    """The hold of lock ``name`` among ``holds`` (the first one if none is)."""
    return next((hold for _lock, hold in holds if hold.name == name), holds[0][1])


def _order(keyed: tuple[LockKeys, Lock]) -> tuple[int, bytes]:
    """The global order names are taken in: bucket, then name (UTF-8 bytes)."""
    keys, lock = keyed
    return keys.bucket, lock.name.encode("utf-8", "surrogatepass")


def _groups(keys: list[LockKeys], on_cluster: bool) -> list[list[LockKeys]]:
    """One group for a single server; a group per bucket (one slot each) on a cluster
    (as the routes the group is sent on say: a factory's client is known once made)."""
    if not on_cluster:
        return [keys]
    groups: list[list[LockKeys]] = []
    for item in keys:
        if groups and groups[-1][0].bucket == item.bucket:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _each(calls: Iterable[Callable[[], Any]]) -> None:
    """Make every call, whatever one raised (``KeyboardInterrupt`` too); then raise the
    first interruption, else the first :class:`LockError`."""
    errors: list[BaseException] = []
    for call in calls:
        try:
            call()
        except BaseException as error:  # noqa: BLE001 - raised once every name is given back
            errors.append(error)
    _raise_first(errors)


async def _aeach(calls: Iterable[Callable[[], Awaitable[Any]]]) -> None:
    """Async twin of :func:`_each`: a cancellation (an ``asyncio.timeout``, a failing
    ``TaskGroup`` sibling) while one name is released stops none of the others, and the
    task stays cancelled."""
    errors: list[BaseException] = []
    for call in calls:
        try:
            await call()
        except BaseException as error:  # noqa: BLE001 - raised once every name is given back
            errors.append(error)
    _raise_first(errors)


def _raise_first(errors: list[BaseException]) -> None:
    """Raise the first interruption (anything but a :class:`LockError`) among
    ``errors``, else the first error."""
    interruption = next((error for error in errors if not isinstance(error, LockError)), None)
    if interruption is not None:
        raise interruption
    if errors:
        raise errors[0]
