"""What a renewal decides, the same for the thread and the loop watchdogs: when to renew,
how long an attempt may wait, what an answer or a failure means, when a hold is
abandoned or lost, how its holder is told, and the events the watchdog reports. No
threads, timers or I/O here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..exceptions import LockError
from ..keys import EXCLUSIVE
from ..protocol.hold import Event, Hold, LostCause, hold_event, report_loss
from ..protocol.ops import Call
from ..protocol.replies import released_reply
from ..protocol.steps import extend_call, extend_many_call, release_call
from ..protocol.waiting import wake_call

__all__ = [
    "GIVE_BACK",
    "RELEASE_AGAIN",
    "RENEWALS_PER_CALL",
    "RenewalPlan",
    "abandoned_reason",
    "abandoned_release_call",
    "after_failure",
    "after_renewal",
    "after_renewals",
    "attempt_timeout",
    "end_lease",
    "expired_abandoned",
    "first_renewal",
    "give_back_retry",
    "lease_end_reason",
    "mark_lost",
    "on_grid",
    "plan_renewals",
    "release_again",
    "released_abandoned",
    "renewal_call",
    "renewal_event",
    "settled",
    "tell_holder",
    "wake_calls",
]

logger = logging.getLogger("django_distlock")

_OBJECT_DROPPED = "its lock object was garbage-collected while it held the lock"


def renewal_call(hold: Hold) -> Call:
    """The script call that renews ``hold`` to at least its full lease."""
    return extend_call(hold, hold.lease, "renew")


def abandoned_release_call(hold: Hold) -> Call:
    """The script call that releases a hold nobody will release any more."""
    return release_call(hold.keys, hold.token, hold.backend.tuning.waiter_liveness_ms, hold.mode)


def wake_calls(hold: Hold, reply: Any) -> list[Call]:
    """The calls that wake the fair waiter a release named (none when it did not, or
    when its reply is of no known shape: the waiter then notices at its next re-check)."""
    try:
        head = released_reply(hold.name, reply).head
    except LockError:
        return []
    call = wake_call(hold.keys, head, hold.backend.tuning.waiter_liveness_ms)
    return [] if call is None else [call]


def first_renewal(hold: Hold) -> float:
    """Monotonic time of the first renewal of a fresh hold."""
    return hold.valid_until_mono - hold.lease * 2 / 3


def on_grid(hold: Hold, due: float) -> float:
    """``due`` rounded up to a grid of at most 50 ms (a thirtieth of the lease when
    shorter): renewals due at about the same time are made together, so the watchdogs
    wake a bounded number of times per second however many locks come and go."""
    grid = min(0.05, hold.lease / 30)
    return math.ceil(due / grid) * grid


def attempt_timeout(hold: Hold, now: float) -> float:
    """How long one renewal attempt of ``hold`` may wait for its answer (0 or less: the
    lease is over): ``Tuning.renewal_attempt`` at most, and half of what is left of the
    lease, so that an attempt that gets no answer leaves time to try again on a fresh
    connection."""
    left = hold.valid_until_mono - now
    return min(hold.backend.tuning.renewal_attempt, left / 2 if left > 0 else left)


def abandoned_reason(hold: Hold) -> str:
    """Why nobody will release ``hold`` any more, or ``""`` while someone may."""
    if hold.report_lost() is None:
        return _OBJECT_DROPPED
    if not hold.owner_alive():
        return f"its owner {hold.thread!r} ended without releasing it"
    return ""


def after_renewal(hold: Hold, reply: Any, sent_at: float) -> float | None:
    """Record a renewal's answer (a reply or a :class:`LockError`); return when to renew
    next, ``None`` when the lock is lost."""
    if isinstance(reply, LockError):
        return after_failure(hold, reply)
    if reply is None or int(reply) < 0:
        hold.note_loss(
            LostCause.GONE, "the lock was released or taken by another holder", first=False
        )
        return None
    hold.valid_until_mono = sent_at + int(reply) / 1000
    hold.renewal_error = ""
    return sent_at + hold.lease / 3


def after_failure(hold: Hold, exc: BaseException) -> float | None:
    """Record a failed renewal; return when to retry, or ``None`` if the lease is over."""
    now = time.monotonic()
    hold.renewal_error = str(exc)
    if hold.expired(now):
        hold.note_loss(LostCause.EXPIRED, lease_end_reason(hold), first=False)
        return None
    logger.warning("django-distlock: renewing lock %r failed, will retry: %s", hold.name, exc)
    return min(now + max(hold.lease / 20, 0.001), hold.valid_until_mono)


def lease_end_reason(hold: Hold) -> str:
    """Why a hold whose lease ended without a confirmed renewal is lost."""
    if hold.renewal_error:
        return f"the lease ended while Redis could not be reached ({hold.renewal_error})"
    return "the lease ended before Redis confirmed a renewal"


def end_lease(hold: Hold) -> Callable[[Hold], None] | None:
    """Mark ``hold``, whose lease ended before a renewal was confirmed, lost; return how
    the loss is to be told (on the notifier), ``None`` if it needs no report. An abandoned
    hold is reported as abandoned, the cause, even when its lease ran out first (a renewal
    lane too late on a loaded machine)."""
    abandoned = abandoned_reason(hold)
    if abandoned:
        if not mark_lost(hold, LostCause.ABANDONED, abandoned):
            return None
    elif not mark_lost(hold, LostCause.EXPIRED, lease_end_reason(hold)):
        return None
    return expired_abandoned if abandoned else tell_holder


def settled(hold: Hold) -> bool:
    """True when the watchdog has nothing more to do for ``hold``."""
    if hold.giving_back:
        return hold.released
    return hold.released or hold.releasing or hold.lost or not hold.auto_renew


def give_back_retry(hold: Hold, now: float) -> float | None:
    """When to try giving back ``hold`` again after a failed attempt at ``now``; ``None``
    once its lease is over (Redis has let it go by itself)."""
    if hold.expired(now):
        hold.released = True
        return None
    return min(now + max(hold.lease / 20, 0.05), hold.valid_until_mono)


def mark_lost(hold: Hold, cause: LostCause | None = None, reason: str = "") -> bool:
    """Mark ``hold`` lost (for ``cause``, unless a cause is recorded already); ``False``
    if it needs no report (released meanwhile, or already reported)."""
    if hold.released or hold.releasing or hold.lost:
        return False
    if cause is not None:
        hold.note_loss(cause, reason)
    hold.lost = True
    return True


def renewal_event(hold: Hold, reply: Any, due: float | None) -> Event | None:
    """The event a renewal attempt makes, given its ``reply`` and what
    :func:`after_renewal` concluded (``due``): ``renewed``, or ``renew_failed`` with cause
    ``"error"`` (no answer: retried while the lease lasts) or ``"gone"`` (the lock is no
    longer ours: a ``lost`` event follows). ``None`` when nobody observes the backend."""
    if hold.backend.observer is None:
        return None
    if isinstance(reply, LockError):
        return hold_event(hold, "renew_failed", cause="error", reason=str(reply))
    if due is None:
        return hold_event(hold, "renew_failed", cause="gone", reason=hold.lost_reason)
    return hold_event(hold, "renewed")


def tell_holder(hold: Hold) -> None:
    """Tell whoever holds ``hold`` that it was lost (``on_lost``, events, signals); with
    its lock object gone, only the backend's observer is told."""
    report = hold.report_lost()
    if report is not None:
        report(hold)
    else:
        report_loss(hold)


def expired_abandoned(hold: Hold) -> None:
    """Log that an abandoned hold's lease ended before the watchdog released it, then
    report it."""
    logger.warning(
        "django-distlock: lock %r held by %s: %s; its lease ended before it was released",
        hold.name,
        hold.thread,
        hold.lost_reason,
    )
    tell_holder(hold)


def released_abandoned(hold: Hold, reply: Any) -> None:
    """Log that an abandoned hold was released (or could not be), then report it."""
    if isinstance(reply, BaseException):
        logger.warning(
            "django-distlock: lock %r held by %s: %s; releasing it failed (%s), it expires "
            "at its lease end",
            hold.name,
            hold.thread,
            hold.lost_reason,
            reply,
        )
    else:
        logger.warning(
            "django-distlock: released lock %r held by %s: %s",
            hold.name,
            hold.thread,
            hold.lost_reason,
        )
    tell_holder(hold)


GIVE_BACK = "the acquire that took it failed"
"""A :class:`RenewalPlan` entry releasing a hold of a failed acquire (``giving_back``)."""

RELEASE_AGAIN = "its release failed"
"""A :class:`RenewalPlan` entry releasing a hold whose owner's release failed
(``release_failed``): it is never renewed again."""

Submit = Callable[..., None]
"""Runs a report off the renewal path: ``submit(function, *args)`` (the notifier)."""


RENEWALS_PER_CALL = 100
"""Renewals of exclusive holds that share one script call at most: the server runs them
without another command in between (a few µs each)."""


@dataclass(slots=True)
class RenewalPlan:
    """What one renewal round trip sends for holds due together: the calls (a release
    of a hold nobody will release any more, a renewal, or the renewals of several
    exclusive holds in one call), which of :attr:`holds` each answers, why
    each abandoned hold is, and how long the round trip may take."""

    holds: list[Hold]
    calls: list[Call]
    answers: list[tuple[int, ...]]
    """For each call, the indexes in :attr:`holds` it answers, in its reply's order."""
    abandoned: list[str]
    timeout: float

    @property
    def name(self) -> str | None:
        """The lock name errors should carry (``None`` for several)."""
        return self.holds[0].name if len(self.holds) == 1 else None

    def replies(self, replies: list[Any]) -> list[Any]:
        """The reply for each of :attr:`holds`, from the ``replies`` to :attr:`calls` (a
        reply or a :class:`LockError` each): a batched renewal's list is spread over its
        holds, its error given to each."""
        spread: list[Any] = [None] * len(self.holds)
        for reply, answered in zip(replies, self.answers, strict=True):
            if len(answered) == 1:  # a call of its own: a batch answers two or more
                spread[answered[0]] = reply
                continue
            if not isinstance(reply, list) or len(reply) != len(answered):
                if not isinstance(reply, LockError):
                    reply = LockError(f"unexpected reply to a batched renewal: {reply!r}")
                reply = [reply] * len(answered)
            for index, part in zip(answered, reply, strict=True):
                spread[index] = part
        return spread


def plan_renewals(holds: list[Hold], now: float, submit: Submit, *, by_bucket: bool) -> RenewalPlan:
    """The round trip renewing ``holds`` (of one server) at monotonic ``now``. A hold
    whose lease is already over is not sent: it is marked lost and its holder told
    (``submit``). Exclusive holds are renewed together, :data:`RENEWALS_PER_CALL` a call;
    ``by_bucket`` (a Cluster, where a script touches one slot): those of one bucket."""
    sent: list[Hold] = []
    calls: list[Call] = []
    answers: list[tuple[int, ...]] = []
    abandoned: list[str] = []
    together: dict[int, list[int]] = {}
    timeout = math.inf
    for hold in holds:
        if hold.giving_back:
            if hold.expired(now):
                hold.released = True  # its lease is over: nothing left to give back
                continue
            answers.append((len(sent),))
            sent.append(hold)
            abandoned.append(GIVE_BACK)
            calls.append(abandoned_release_call(hold))
            timeout = min(timeout, attempt_timeout(hold, now))
            continue
        reason = abandoned_reason(hold)
        left = attempt_timeout(hold, now)
        if left <= 0 and not reason:
            if (report := end_lease(hold)) is not None:
                submit(report, hold)
            continue
        if hold.release_failed and not reason:
            reason = RELEASE_AGAIN
        if not reason and hold.mode == EXCLUSIVE:
            together.setdefault(hold.keys.bucket if by_bucket else 0, []).append(len(sent))
        else:
            answers.append((len(sent),))
            calls.append(abandoned_release_call(hold) if reason else renewal_call(hold))
        sent.append(hold)
        abandoned.append(reason)
        timeout = min(timeout, left)
    for indexes in together.values():
        for start in range(0, len(indexes), RENEWALS_PER_CALL):
            batch = tuple(indexes[start : start + RENEWALS_PER_CALL])
            answers.append(batch)
            batched = [sent[index] for index in batch]
            calls.append(renewal_call(batched[0]) if len(batch) == 1 else extend_many_call(batched))
    return RenewalPlan(sent, calls, answers, abandoned, max(timeout, 0.001) if sent else 0.0)


def after_renewals(
    plan: RenewalPlan,
    replies: list[Any],
    sent_at: float,
    submit: Submit,
    schedule: Callable[[Hold, float], None],
) -> list[Call]:
    """Record the ``replies`` to ``plan`` (a reply or a :class:`LockError` each): schedule
    the next renewal of each hold kept, tell the holders of those lost; returns the calls
    that wake the fair waiters the released abandoned holds named."""
    wakes: list[Call] = []
    for hold, reply, reason in zip(plan.holds, replies, plan.abandoned, strict=True):
        if reason is GIVE_BACK:
            if isinstance(reply, LockError):
                if (due := give_back_retry(hold, time.monotonic())) is not None:
                    schedule(hold, due)
                continue
            hold.released = True
            wakes += wake_calls(hold, reply)
            logger.info("django-distlock: gave back lock %r after a failed acquire", hold.name)
            continue
        if reason is RELEASE_AGAIN:
            wakes += release_again(hold, reply, submit, schedule)
            continue
        if reason:
            wakes += wake_calls(hold, reply)
            if mark_lost(hold, LostCause.ABANDONED, reason):
                submit(released_abandoned, hold, reply)
            continue
        if hold.released or hold.releasing:
            continue  # released while the renewal was in flight: its answer means nothing
        due = after_renewal(hold, reply, sent_at)
        event = renewal_event(hold, reply, due)
        if event is not None:
            submit(hold.backend.emit, event)
        if due is None:
            if mark_lost(hold):
                submit(tell_holder, hold)
        else:
            schedule(hold, due)
    return wakes


def release_again(
    hold: Hold, reply: Any, submit: Submit, schedule: Callable[[Hold, float], None]
) -> list[Call]:
    """Record the answer to the watchdog's release of ``hold`` after its owner's release
    failed; returns the calls waking the fair waiter it names. Refused again, it is tried
    again while the lease lasts; at the lease end its holder is told it lost the lock."""
    if hold.released or hold.releasing:
        return []  # the owner released it meanwhile
    if isinstance(reply, LockError):
        hold.renewal_error = str(reply)
        now = time.monotonic()
        if hold.expired(now):
            if mark_lost(hold, LostCause.EXPIRED, lease_end_reason(hold)):
                submit(tell_holder, hold)
            return []
        schedule(hold, min(now + max(hold.lease / 20, 0.05), hold.valid_until_mono))
        return []
    hold.released = True
    logger.info("django-distlock: released lock %r after its release failed", hold.name)
    return wake_calls(hold, reply)
