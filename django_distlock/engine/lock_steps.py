"""The steps taking one lock (every kind), free of I/O: :func:`acquire_steps` yields
what it needs done and the drivers (:mod:`.io`, :mod:`.aio`) carry it out. Several names at
once are :mod:`.group_steps`; releasing and waking, which both follow, are :mod:`.core`."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from .core import (
    Acquired,
    NotAcquired,
    NotReplicated,
    RideOut,
    acknowledged,
    holder_member,
    release_steps,
    stored_mode,
    wake_steps,
    wake_time,
)
from .exceptions import LockBackendUnavailable, LockError
from .hold import Hold
from .keys import LockKeys
from .modes import EXCLUSIVE, LIMITED, SHARED
from .ops import AwaitWakeUp, Call, CallEndingWait, Op, Pause, StartWait, Wake
from .replies import reply_tag, taken_reply
from .scripts import ACQUIRE, HOLDER_ACQUIRE, PASS_ON, Script
from .tuning import Tuning, ms

__all__ = ["AcquireArgs", "acquire_steps", "after_release_of"]


def acquire_steps(
    *,
    keys: LockKeys,
    name: str,
    token: str,
    lease: float,
    owner: str,
    fair: bool,
    blocking: bool,
    deadline: float | None,
    tuning: Tuning,
    replicas: tuple[int | str, int] | None = None,
    mode: str = EXCLUSIVE,
    limit: int = 1,
    on_unreleased: Callable[[], None] | None = None,
) -> Generator[Op, Any, Acquired | NotAcquired | NotReplicated]:
    """Steps to take a lock, waiting (until the monotonic ``deadline``, or forever when
    it is ``None``) if ``blocking``.

    With ``replicas`` (``(count, timeout_ms)``, the count an int or ``"auto"``), every
    attempt is followed by a ``WAIT`` in the same round trip (under ``"auto"``, where the
    server has a replica); a lock taken but acknowledged by fewer replicas is given back
    at once (:class:`NotReplicated`).

    A waiter blocks on a wake-up list that every release pushes to, and re-checks no
    later than the holder's lease end, so both a release and a crashed holder are
    noticed within about one round trip. If the steps are interrupted (an error, a
    cancelled task, ``KeyboardInterrupt``) at any point after the acquire script may have
    run, the lock is given back before the interruption propagates.

    ``mode`` :data:`SHARED` takes a shared hold, :data:`LIMITED` one of ``limit``; a lock
    held as another kind raises ``LockError``.

    ``on_unreleased()`` is called when that give-back itself fails (Redis unreachable):
    the caller keeps trying it until the lease would have ended.
    """
    waiter = token[:16] if blocking else ""
    liveness_ms = tuning.waiter_liveness_ms
    args = AcquireArgs(
        token=token,
        lease_ms=ms(lease),
        owner=owner,
        member=name if mode == EXCLUSIVE else holder_member(name, token),
        fence_memory_ms=tuning.fence_memory_ms,
        waiter=waiter,
        liveness_ms=liveness_ms,
        fair=fair,
        held_as=() if mode == EXCLUSIVE else (stored_mode(mode, limit), limit * (mode == LIMITED)),
    )
    wait = _Waiting(keys, waiter, fair, mode, RideOut(tuning, deadline))
    script = ACQUIRE if mode == EXCLUSIVE else HOLDER_ACQUIRE
    attempt_keys = wait.attempt_keys()
    try:
        while True:
            sent_at = time.monotonic()
            wait.may_hold = True
            # A fair waiter's attempt queues it if the lock is busy: once sent, it may be
            # queued even if the reply never comes (leaving takes it off the queue).
            wait.enqueued = wait.enqueued or (blocking and fair)
            try:
                if wait.waiting and wait.timer_fired:
                    reply = yield from _attempt_ending_wait(wait, script, args, replicas)
                else:
                    reply = yield Call(script, attempt_keys, args.argv(), replicas)
            except LockBackendUnavailable as error:
                if not wait.failover.primary_changed(error, blocking):
                    raise
                # The primary is changing: the same token again, once it settles (a request
                # that did run answers "taken" to its own token).
                yield Pause(tuning.failover_pause)
                continue
            reply, unreplicated = acknowledged(reply, replicas)
            taken = taken_reply(name, reply)
            wait.may_hold = False
            if taken is None and reply_tag(reply) == "kind":
                raise LockError(_other_mode(name, mode, limit, reply[1]), name=name)
            if taken is not None:
                wait.may_hold = True
                if time.monotonic() - sent_at >= lease:
                    # The answer came after the lease it granted was over (a stalled server
                    # or connection): the lock may be another's by now. Give it back and
                    # try again (Redlock's rule: no hold whose validity is already spent).
                    yield from release_steps(keys, token, liveness_ms, mode)
                    wait.settle()
                    if not blocking or (deadline is not None and time.monotonic() >= deadline):
                        return NotAcquired(None)
                    continue
                if unreplicated is not None:
                    # Not on enough replicas: a failover now could forget it. Give it back.
                    yield from release_steps(keys, token, liveness_ms, mode)
                    wait.settle()
                    # A waiter tries again within its blocking_timeout (a planned failover:
                    # the old primary lost its replica first), for as long as a failover is
                    # ridden out.
                    if not wait.failover.riding(blocking):
                        return unreplicated
                    yield Pause(tuning.failover_pause)
                    continue
                # No wait is outstanding here (a re-check after the timer ends it in the
                # same step), the acquire script took us off the queue, and a wake-up we
                # consumed was used: nothing to clean up or hand on.
                wait.settle(holding=True)
                if isinstance(reply, list) and len(reply) > 3 and reply[3]:
                    # A shared hold or a free slot may let the next waiter in too.
                    yield from wake_steps(keys, reply[3], liveness_ms)
                return Acquired(taken[0], taken[1], sent_at)
            wait_ms = int(reply[1])
            if not wait.writer and len(reply) > 3 and reply[3] in (b"1", "1"):
                # Waiting among the writers of a lock held shared: taking it (or leaving)
                # takes us off that list.
                wait.writer = True
                args = dataclasses.replace(args, writer=True)
            if reply[2] and reply[2] not in (waiter, waiter.encode()):
                yield from wake_steps(keys, reply[2], liveness_ms)
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if not blocking or remaining <= 0:
                return NotAcquired(wait_ms / 1000 if wait_ms >= 0 else None)
            if wait.timer_fired and wait.consumed:
                # A release woke us as the timer fired: try again at once.
                wait.timer_fired = wait.consumed = False
                continue
            yield from _wait_for_wake_up(wait, wake_time(sent_at, wait_ms, remaining, tuning))
            if wait.interrupted:
                wait.interrupted = False
                wait.failover.start()
    except BaseException:
        if wait.may_hold:
            # Only our own token is deleted, so this is safe even if the script never ran.
            try:
                yield from release_steps(keys, token, liveness_ms, mode)
            except LockError:
                if on_unreleased is not None:
                    on_unreleased()
        raise
    finally:
        if wait.left_behind():
            with contextlib.suppress(LockError):
                yield from _leave(wait, liveness_ms)


@dataclass(slots=True)
class AcquireArgs:
    """The ``ARGV`` of :data:`~.scripts.ACQUIRE` and :data:`~.scripts.HOLDER_ACQUIRE`, by
    name (the scripts' headers say what each means)."""

    token: str
    lease_ms: int
    owner: str
    member: str
    """The listing index's member: the name, or ``name NUL token`` for a holder."""
    fence_memory_ms: int
    waiter: str
    """The waiter's id, ``""`` when the caller will not wait."""
    liveness_ms: int
    fair: bool
    end_wait: bool = False
    """End the caller's outstanding ``BLPOP`` in the same script."""
    writer: bool = False
    """The caller waits among the writers of a lock held shared (exclusive only)."""
    held_as: tuple[str, int] | tuple[()] = ()
    """Shared and limited holds: how the scripts store the mode (``"shared"``,
    ``"limited N"``) and the limit (0 for shared)."""

    def argv(self) -> tuple[str | int, ...]:
        head = (
            self.token,
            self.lease_ms,
            self.owner,
            self.member,
            self.fence_memory_ms,
            self.waiter,
            self.liveness_ms,
            "1" if self.fair else "0",
            "1" if self.end_wait else "",
        )
        if self.held_as:
            return (*head, *self.held_as)
        return (*head, "1") if self.writer else head


@dataclass(slots=True)
class _Waiting:
    """Where one acquire stands with the server's waiting structures: what it must undo
    or hand on if it leaves without the lock (:func:`_leave`)."""

    keys: LockKeys
    waiter: str
    fair: bool
    mode: str
    failover: RideOut
    """Riding out a failover (the same rule as a group's)."""
    waiting: bool = False
    """A ``BLPOP`` on our wake-up list is outstanding."""
    consumed: bool = False
    """A wake-up reached us that we did not turn into the lock."""
    enqueued: bool = False
    """We are (or, an attempt sent, may be) on the fair queue."""
    writer: bool = False
    """We wait among the writers of a lock held shared."""
    may_hold: bool = False
    """The acquire script may have run without us seeing its reply."""
    timer_fired: bool = False
    """The last wait ended by our own timer (the ``BLPOP`` stays outstanding)."""
    interrupted: bool = False
    """The last wait was ended by the server (``UNBLOCKED``: a failover)."""

    def left_behind(self) -> bool:
        """Whether leaving without the lock has something to undo or hand on."""
        return self.waiting or self.consumed or self.enqueued or self.writer

    def settle(self, *, holding: bool = False) -> None:
        """Nothing left to clean up (the lock was taken, or given back)."""
        self.may_hold = holding
        self.consumed = self.enqueued = self.writer = False

    def own_keys(self) -> tuple[str, ...]:
        """The keys of the calls that end our wait or take us off the queue: with our own
        wake-up list as ``KEYS[7]``. Plain attempts name the shared signal list there
        instead, so that their keys (and how they are packed) are the same each time."""
        keys = self.keys
        if self.mode == EXCLUSIVE:
            return keys.all(self.waiter) if self.waiter else keys.all()
        return keys.of_holders(self.waiter) if self.waiter else keys.of_holders()

    def attempt_keys(self) -> tuple[str, ...]:
        return self.keys.all() if self.mode == EXCLUSIVE else self.keys.of_holders()


def _attempt_ending_wait(
    wait: _Waiting, script: Script, args: AcquireArgs, replicas: tuple[int | str, int] | None
) -> Generator[Op, Any, Any]:
    """An acquire attempt (``script``) after our timer fired: it also ends the
    outstanding ``BLPOP``, in the same round trip."""
    wait.waiting = False
    ending = dataclasses.replace(args, end_wait=True).argv()
    reply, woken = yield CallEndingWait(Call(script, wait.own_keys(), ending, replicas))
    wait.consumed = wait.consumed or woken
    return reply


def _wait_for_wake_up(wait: _Waiting, wake_at: float) -> Generator[Op, Any, None]:
    """Block (a ``BLPOP`` on our wake-up list, opened once) until a release wakes us or
    monotonic ``wake_at``."""
    if not wait.waiting:
        own = wait.keys.wake(wait.waiter)
        yield StartWait((own,) if wait.fair else (own, wait.keys.signal))
        wait.waiting = True
        wait.consumed = False
    woke = yield AwaitWakeUp(max(0.0, wake_at - time.monotonic()))
    wait.timer_fired = woke is Wake.TIMER
    if woke is Wake.WOKEN:
        wait.waiting = False
        wait.consumed = True
    elif woke is Wake.INTERRUPTED:
        wait.waiting = False
        wait.interrupted = True


def _leave(wait: _Waiting, liveness_ms: int) -> Generator[Op, Any, None]:
    """Leaving without the lock (or on error): end the wait, leave the fair queue and
    the writers, and hand on any wake-up we consumed, so that the next waiter is not left
    sleeping until its own timer."""
    queued_as = wait.waiter if wait.fair else ""
    writer_id = wait.waiter if wait.writer else ""
    keys = wait.keys
    if wait.waiting:
        wait.waiting = False
        handed_on = "1" if wait.consumed else "0"
        reply, woken = yield CallEndingWait(
            Call(PASS_ON, wait.own_keys(), (queued_as, liveness_ms, handed_on, "1", writer_id))
        )
        yield from wake_steps(keys, reply[1], liveness_ms)
        if woken:
            reply = yield Call(PASS_ON, wait.own_keys(), ("", liveness_ms, "1", "", ""))
            yield from wake_steps(keys, reply[1], liveness_ms)
    elif wait.left_behind():
        handed_on = "1" if wait.consumed else "0"
        reply = yield Call(
            PASS_ON, wait.own_keys(), (queued_as, liveness_ms, handed_on, "", writer_id)
        )
        yield from wake_steps(keys, reply[1], liveness_ms)


def _other_mode(name: str, mode: str, limit: int, held_as: Any) -> str:
    """Why a lock held as another kind cannot be taken as ``mode``."""
    held = held_as.decode() if isinstance(held_as, bytes) else str(held_as)
    wanted = {EXCLUSIVE: "exclusively", SHARED: "shared"}.get(mode, f"with limit={limit}")
    if held.startswith(LIMITED):
        held = f"a limited lock (limit={held.split()[-1]})"
    elif held in (SHARED, EXCLUSIVE):
        held = "shared" if held == SHARED else "an exclusive lock"
    else:
        held = f"a Redis {held}, not by this package"
    return (
        f"lock {name!r} is held as {held}; it cannot be taken {wanted}: one name is used "
        "with one kind (shared and exclusive holds of the same name are the exception)"
    )


def after_release_of(stale: Hold, steps: Any) -> Any:
    """``steps``, after giving back ``stale``'s token (a failed release, retried; if it
    fails again the lease runs out, and the acquire says whether Redis answers)."""
    with contextlib.suppress(LockError):
        yield from release_steps(
            stale.keys, stale.token, stale.backend.tuning.waiter_liveness_ms, stale.mode
        )
    return (yield from steps)
