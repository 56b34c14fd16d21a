"""The acquisitions of one lock object, by owner (thread or task): finding the caller's,
taking a re-entrant one again, preparing a hold for an acquire and adopting it once
Redis has answered. :class:`~.lock.Lock` keeps one :class:`Holdings`, and
:class:`~.many.LockGroup` builds on the same methods for each of its names."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from .. import process
from ..exceptions import LockError, LockNotOwned
from ..keys import SHARED, LockKeys
from ..protocol.hold import REPORTING, Hold, owner_name, tell
from ..protocol.steps import Acquired, owner_metadata
from ..transport.backend import Backend

__all__ = ["Holdings", "LockOptions"]


class LockOptions(Protocol):
    """What a hold is made from: the options of the lock object it belongs to."""

    name: str
    timeout: float | None
    auto_renew: bool | None
    context: str
    mode: str
    limit: int | None
    template: str


_reentered: weakref.WeakKeyDictionary[Any, dict[tuple[int, str, str], Hold]] = (
    weakref.WeakKeyDictionary()
)
"""The re-entrant holds of each owner (thread or task), by backend and name."""


def _reentry_key(backend: Backend, name: str) -> tuple[int, str, str]:
    return (id(backend), backend.prefix, name)


class Holdings:
    """The acquisitions of one lock object: each owner's latest hold.

    ``report_lost(hold)`` is what tells the lock object's user that a hold was lost; the
    holds keep only a weak reference to it, so that a dropped lock object is not kept
    alive by the watchdog.
    """

    def __init__(self, report_lost: Callable[[Hold], Any]) -> None:
        self._by_owner: weakref.WeakKeyDictionary[Any, Hold] = weakref.WeakKeyDictionary()
        self._report_ref = weakref.WeakMethod(report_lost)
        self._owner_cache: tuple[tuple[int, str, bool], str] | None = None

    def find(self, task: Any, *, live: bool = True) -> Hold | None:
        """The acquisition of ``task``, else of the current thread (with ``live``, only
        one not yet released; else also the last one, for what became of it)."""
        holds = self._by_owner
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

    def owned(self, name: str, action: str, task: Any) -> Hold:
        """The caller's live acquisition of lock ``name``, which it is about to
        ``action``; :class:`LockNotOwned` when there is none."""
        hold = self.find(task)
        if hold is None:
            raise LockNotOwned(
                f"cannot {action} lock {name!r}: not held by this thread or task", name=name
            )
        return hold

    def reenter(self, backend: Backend, name: str, task: Any) -> bool:
        """Take a re-entrant lock again if the caller (``task``, else the thread) holds
        it already, through this or another lock object of the same name and backend."""
        key = _reentry_key(backend, name)
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
            self._by_owner[owner] = hold
            return True
        return False

    def make_way(self, name: str, task: Any, report_lost: Callable[[Hold], Any]) -> Hold | None:
        """Before the caller (``task``, else the thread) takes lock ``name`` again: its
        hold is returned if its release failed (the new acquire gives that token back
        first), reported lost and dropped if it was lost; one still held raises
        :class:`LockError`."""
        current = self.find(task)
        if current is None:
            return None
        if current.release_failed:
            # Its release could not reach Redis: give the old token back before taking a
            # new one (the lease would otherwise keep this very owner waiting).
            current.released = True
            return current
        if not current.is_lost():
            raise LockError(
                f"lock {name!r} is already held by this thread or task "
                "(pass reentrant=True to take it again)",
                name=name,
            )
        report_lost(current)
        current.released = True
        return None

    def prepare(
        self, lock: LockOptions, backend: Backend, owner: Any, token: str, keys: LockKeys
    ) -> Hold:
        """A hold of ``lock`` for ``owner``, filled in by :meth:`adopt` once Redis has
        answered."""
        return Hold(
            name=lock.name,
            token=token,
            lease=lock.timeout if lock.timeout is not None else backend.timeout,
            backend=backend,
            keys=keys,
            auto_renew=lock.auto_renew if lock.auto_renew is not None else backend.auto_renew,
            context=lock.context,
            thread=owner_name(owner),
            started_mono=time.monotonic(),
            owner=weakref.ref(owner),
            report_lost=self._report_ref,
            mode=lock.mode,
            limit=0 if lock.mode == SHARED else lock.limit or 1,
            template=lock.template,
        )

    def owner_metadata(self, context: str, hold: Hold) -> str:
        """What Redis stores of who takes ``hold`` (:func:`~.core.owner_metadata`)."""
        key = (process.generation(), hold.thread, hold.auto_renew)
        cached = self._owner_cache
        if cached is None or cached[0] != key:
            stored = owner_metadata(thread=hold.thread, context=context, auto_renew=hold.auto_renew)
            cached = self._owner_cache = (key, stored)
        return cached[1]

    def adopt(
        self,
        hold: Hold,
        outcome: Acquired,
        owner: Any,
        watchdog: Callable[[], Any],
        now: float,
        *,
        reentrant: bool,
    ) -> None:
        """Make ``hold`` (just taken, per ``outcome``) the acquisition of ``owner``: renewed
        by ``watchdog()`` if it renews, reported ``acquired``."""
        waited = now - hold.started_mono
        hold.fence = outcome.fence
        hold.acquired_at = outcome.acquired_at_us / 1_000_000
        hold.valid_until_mono = outcome.sent_at + hold.lease
        hold.waited = waited
        hold.started_mono = now
        self._by_owner[owner] = hold
        if reentrant:
            _reentered.setdefault(owner, {})[_reentry_key(hold.backend, hold.name)] = hold
        if hold.auto_renew:
            watchdog().watch(hold)
        tell(hold, "acquired", waited=waited)
