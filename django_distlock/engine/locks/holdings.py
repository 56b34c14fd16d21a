"""What a lock object keeps and decides of its holds, for :class:`~.lock.Lock` and
:class:`~.group.LockGroup` alike: the checks of their options that are not names,
contexts or durations (those are :mod:`..keys`: flags, callbacks, the kind, the backend,
the waiting options of one acquire); :class:`Holdings`, the acquisitions of one lock
object by owner (thread or task: finding the caller's, taking a re-entrant one again,
preparing a hold for an acquire and adopting it once Redis has answered); and what the
outcome of an operation does to its hold and tells the backend's observer (an acquire
that stayed busy, failed or was not replicated; a release that failed, went through, or
found the lock lost; leaving ``with`` when the release failed).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from .. import process
from ..exceptions import LockError, LockLost, LockNotAcquired, LockNotOwned, LockNotReplicated
from ..keys import EXCLUSIVE, LIMITED, SHARED, LockKeys, validate_seconds
from ..protocol.hold import REPORTING, Hold, LostCause, owner_name, tell, tell_attempt
from ..protocol.replies import replication_report
from ..protocol.steps import Acquired, NotReplicated, owner_metadata
from ..transport.backend import Backend

__all__ = [
    "UNSET",
    "BackendSource",
    "Holdings",
    "LeavingWith",
    "LockOptions",
    "Releasing",
    "acquire_failed",
    "arole_or_none",
    "backend_of",
    "check_backend_source",
    "check_bool",
    "check_callable",
    "contended",
    "lost_error",
    "mode_of",
    "not_acquired",
    "not_replicated",
    "released",
    "role_or_none",
    "waiting_options",
]


BackendSource = Backend | Callable[[], Backend]


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


"""The default of an argument whose ``None`` means something (``blocking_timeout=None``:
wait forever)."""


def check_callable(value: Any, argument: str) -> Any:
    """``value``, if it is callable or ``None``."""
    if value is not None and not callable(value):
        raise TypeError(f"{argument} must be callable or None, not {type(value).__name__}")
    return value


def check_bool(value: Any, argument: str, *, optional: bool = False) -> Any:
    """``value``, if it is a bool (or ``None``, when ``optional``)."""
    if (value is None and optional) or isinstance(value, bool):
        return value
    raise TypeError(f"{argument} must be a bool, not {type(value).__name__}")


def mode_of(limit: int | None, shared: bool, reentrant: bool) -> str:
    """The mode a lock of these (checked) kind options is held in; at most one kind is
    chosen (``limit=1`` is the plain exclusive lock)."""
    kinds = {"limit": limit is not None, "shared": shared, "reentrant": reentrant}
    chosen = [option for option, on in kinds.items() if on]
    if len(chosen) > 1:
        raise ValueError(
            f"{' and '.join(chosen)} cannot be combined: a lock is limited, shared or "
            "re-entrant, or none of these"
        )
    if shared:
        return SHARED
    if limit is not None and limit > 1:
        return LIMITED
    return EXCLUSIVE


def check_backend_source(source: Any) -> BackendSource:
    """``source``, if it is a :class:`Backend` or a callable that returns one."""
    if not isinstance(source, Backend) and not callable(source):
        raise TypeError(
            f"backend must be a Backend or a callable returning one, not {type(source).__name__}"
        )
    return source


def backend_of(source: BackendSource) -> Backend:
    """The backend ``source`` names (called now if it is a callable)."""
    backend = source if isinstance(source, Backend) else source()
    if not isinstance(backend, Backend):
        raise TypeError(f"backend callable returned {type(backend).__name__}, not Backend")
    return backend


def waiting_options(
    blocking: Any, blocking_timeout: Any, default_blocking: bool, default_timeout: float | None
) -> tuple[bool, float | None]:
    """An acquire's ``blocking`` and ``blocking_timeout`` arguments, checked, with the
    defaults of its lock (or group) filled in; a zero timeout does not wait."""
    if blocking is None:
        blocking = default_blocking
    else:
        check_bool(blocking, "blocking")
    if blocking_timeout is UNSET:
        blocking_timeout = default_timeout
    elif blocking_timeout is not None:
        blocking_timeout = validate_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
    if blocking_timeout == 0:
        blocking = False
    return blocking, blocking_timeout


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
        """What Redis stores of who takes ``hold`` (:func:`~..protocol.steps.owner_metadata`)."""
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


def lost_error(hold: Hold, *, before_release: bool = False) -> LockLost:
    """The :class:`LockLost` telling ``hold``'s owner why it was lost."""
    when = " before release" if before_release else ""
    return LockLost(f"lock {hold.name!r} was lost{when}: {hold.lost_reason}", name=hold.name)


def contended(hold: Hold, retry_after: float | None, waited: float, **details: Any) -> None:
    """Tell the observer that the acquire ``hold`` was prepared for stayed busy."""
    tell_attempt(hold, "contended", waited=waited, retry_after=retry_after, **details)


def acquire_failed(hold: Hold, error: LockError) -> None:
    """Tell the observer that the acquire ``hold`` was prepared for raised ``error``."""
    waited = time.monotonic() - hold.started_mono
    tell_attempt(hold, "error", waited=waited, cause=type(error).__name__, reason=str(error))


def not_acquired(
    name: str, blocking: bool, blocking_timeout: float | None, retry_after: float | None
) -> LockNotAcquired:
    """The error of entering ``with`` on lock ``name`` (its default ``blocking`` and
    ``blocking_timeout``) when it stayed busy."""
    how = (
        "it is held by someone else"
        if not blocking or blocking_timeout == 0
        else f"not within {blocking_timeout}s"
        if blocking_timeout is not None
        else "it is held by someone else"
    )
    return LockNotAcquired(
        f"could not acquire lock {name!r}: {how}", name=name, retry_after=retry_after
    )


def role_or_none(execute: Callable[..., Any], key: str) -> Any:
    """``ROLE`` of the node holding ``key``, to explain a lock not replicated; ``None``
    when it cannot be read."""
    try:
        return execute(key, "ROLE")
    except LockError:
        return None


async def arole_or_none(execute: Callable[..., Any], key: str) -> Any:
    """Async twin of :func:`role_or_none`."""
    try:
        return await execute(key, "ROLE")
    except LockError:
        return None


def not_replicated(hold: Hold, outcome: NotReplicated, role: Any) -> LockNotReplicated:
    """Tell the observer that ``hold`` was taken and given back for want of replicas; the
    error to raise, with what the primary's ``role`` says of them."""
    tell_attempt(
        hold,
        "not_replicated",
        waited=time.monotonic() - hold.started_mono,
        reason=f"{outcome.acknowledged} of {outcome.required} replicas acknowledged",
    )
    return LockNotReplicated(
        f"lock {hold.name!r} was taken on the primary, but only {outcome.acknowledged} "
        f"of the {outcome.required} replicas it needs (min_replicas) acknowledged it "
        f"within {outcome.timeout_ms} ms, so it was given back{replication_report(role)}. "
        "Check the replicas' link and lag, raise replica_timeout, or lower min_replicas.",
        name=hold.name,
        acknowledged=outcome.acknowledged,
        required=outcome.required,
    )


class Releasing:
    """Around a release's round trips: the watchdog leaves the hold alone meanwhile, and a
    release that fails (Redis refused or could not be reached, or ``KeyboardInterrupt``
    cut it short) is reported and remembered: the watchdog renews the hold no more but
    gives its token back once Redis answers, and the next acquire by the same owner gives
    it back first (:func:`~..renewal.decisions.plan_renewals`)."""

    __slots__ = ("hold",)

    def __init__(self, hold: Hold) -> None:
        self.hold = hold

    def __enter__(self) -> None:
        self.hold.releasing = True

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        hold = self.hold
        try:
            if error is not None:
                hold.release_failed = True
                cause, reason = type(error).__name__, str(error)
                tell(hold, "release_failed", held=hold.held_for, cause=cause, reason=reason)
        finally:
            hold.releasing = False


def released(hold: Hold, was_held: bool, report_lost: Callable[[Hold], Any]) -> None:
    """``hold`` is released, as Redis answered: reported ``released`` if its token was
    still there (``was_held``), else lost (:class:`LockLost`)."""
    hold.released = True
    hold.depth = 0
    timer = hold.timer
    if timer is not None:
        timer.cancel()
    # Our token was still there, so nobody else held the lock meanwhile: a clean
    # release, whatever a renewal racing with it concluded.
    if was_held:
        tell(hold, "released", held=hold.held_for)
        return
    hold.note_loss(LostCause.GONE, "its lease ended or another holder took it before release")
    report_lost(hold)
    raise lost_error(hold, before_release=True)


class LeavingWith:
    """Around the release made when leaving ``with`` (the body raised ``body_error``, or
    ``None``): a lost lock raises ``LockLost`` (unless the body raised or
    ``raise_on_lost`` is off); Redis unreachable is a lost lock if the lease is over,
    else the error itself. The body's own exception always wins."""

    __slots__ = ("body_failed", "hold", "raise_on_lost", "report_lost")

    def __init__(
        self,
        hold: Hold,
        body_error: BaseException | None,
        raise_on_lost: bool,
        report_lost: Callable[[Hold], Any],
    ) -> None:
        self.hold = hold
        self.body_failed = body_error is not None
        self.raise_on_lost = raise_on_lost
        self.report_lost = report_lost

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        if not isinstance(error, LockError):
            return False
        raising = not self.body_failed and self.raise_on_lost
        if isinstance(error, LockLost):
            return not raising
        hold = self.hold
        hold.auto_renew = False  # at least let the lease run out
        if hold.is_lost():
            # The lease is over anyway: the holder has lost the lock, and is told so.
            hold.note_loss(
                LostCause.EXPIRED, f"the lease ended while Redis could not be reached ({error})"
            )
            self.report_lost(hold)
            hold.released = True
            if raising:
                raise lost_error(hold) from error
            return True
        return self.body_failed
