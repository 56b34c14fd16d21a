"""What the outcome of a lock operation does to its hold, and what the backend's observer
is told of it: an acquire that stayed busy, failed or was not replicated; a release that
failed, went through, or found the lock lost; leaving ``with`` when the release failed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..exceptions import LockError, LockLost, LockNotAcquired, LockNotReplicated
from ..protocol.hold import Hold, LostCause, tell, tell_attempt
from ..protocol.replies import replication_report
from ..protocol.steps import NotReplicated

__all__ = [
    "LeavingWith",
    "Releasing",
    "acquire_failed",
    "arole_or_none",
    "contended",
    "lost_error",
    "not_acquired",
    "not_replicated",
    "released",
    "role_or_none",
]


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
    it back first (:func:`~.renewal.plan_renewals`)."""

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
