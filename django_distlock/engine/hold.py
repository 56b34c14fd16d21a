"""What the owner of one acquisition knows of it: its token, fence and lease, who owns
it, and what became of it (released, lost and why)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import process
from .keys import LockKeys

if TYPE_CHECKING:
    from .backend import Backend

__all__ = ["Hold", "LostCause"]


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
    backend: Backend
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
    """``"exclusive"``, ``"shared"`` or ``"limited"`` (see :mod:`.core`)."""
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
