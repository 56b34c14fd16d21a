"""The protocol's steps, free of I/O: each operation is a generator that yields what it
needs done (:mod:`.ops`) and the drivers (:mod:`..transport.drivers`) carry it out.

What the steps share (their outcomes, the script calls on one hold, releasing, who a hold
is stored as), then :func:`acquire_steps` (one lock, every kind) and
:func:`acquire_many_steps` (several names at once, all or none): both wait, and undo their
wait, through one :class:`~.waiting.Waiter`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from ..exceptions import LockBackendUnavailable, LockError
from ..keys import EXCLUSIVE, LIMITED, SHARED, LockKeys, clean_label
from ..tuning import Tuning, ms
from .hold import HOSTNAME, Hold
from .ops import Call, Op, Pause, Replicated
from .replies import OtherKind, Taken, TakenMany, acquire_reply, many_reply, released_reply
from .scripts import (
    ACQUIRE,
    EXTEND,
    EXTEND_MANY,
    HOLDER_ACQUIRE,
    HOLDER_EXTEND,
    HOLDER_RELEASE,
    HOLDER_TTL,
    MANY_ACQUIRE,
    RELEASE,
    TTL,
)
from .waiting import RideOut, Waiter, wake_steps

__all__ = [
    "AcquireArgs",
    "Acquired",
    "AcquiredMany",
    "GroupRequest",
    "NotAcquired",
    "NotReplicated",
    "acknowledged",
    "acquire_many_steps",
    "acquire_steps",
    "after_release_of",
    "extend_call",
    "extend_many_call",
    "holder_member",
    "new_token",
    "owner_metadata",
    "release_call",
    "release_steps",
    "stored_mode",
    "ttl_call",
]


@dataclass(slots=True)
class Acquired:
    """The lock was taken: its fence, the server time it was taken at, and the local
    monotonic time the successful request was sent (the lease counts from there)."""

    fence: int
    acquired_at_us: int
    sent_at: float


@dataclass(slots=True)
class AcquiredMany:
    """Several locks were taken at once: their fences (in the order of the keys given),
    the server time they were taken at, and when the successful request was sent."""

    fences: list[int]
    acquired_at_us: int
    sent_at: float


@dataclass(slots=True)
class NotReplicated:
    """The lock was taken, then given back: only ``acknowledged`` of ``required``
    replicas confirmed it in time. ``name``: for a group, the name of the first lock of
    the script that was not confirmed (``""`` for one lock)."""

    acknowledged: int
    required: int
    timeout_ms: int
    name: str = ""


def acknowledged(
    reply: Any, replicas: tuple[int | str, int] | None
) -> tuple[Any, NotReplicated | None]:
    """An acquire script's reply, unwrapped from its :class:`~.ops.Replicated`, and a
    :class:`NotReplicated` when fewer replicas acknowledged it than it waited for."""
    if type(reply) is not Replicated:
        return reply, None
    if reply.acknowledged < reply.required and replicas is not None:
        return reply.reply, NotReplicated(reply.acknowledged, reply.required, replicas[1])
    return reply.reply, None


@dataclass(slots=True)
class NotAcquired:
    """The lock was not taken; ``retry_after`` is the holder's remaining lease in
    seconds (``None`` when unknown)."""

    retry_after: float | None


def stored_mode(mode: str, limit: int) -> str:
    """How the scripts store the mode of a lock held by several holders (its holders'
    ``#kind`` field): ``"shared"``, ``"limited N"``."""
    return SHARED if mode == SHARED else f"{LIMITED} {limit}"


def holder_member(name: str, token: str) -> str:
    """A shared or limited hold's entry in its bucket's index: ``name NUL token`` (names
    never hold NUL)."""
    return f"{name}\x00{token}"


def extend_call(hold: Hold, seconds: float, mode: str) -> Call:
    """The script call that changes ``hold``'s lease: ``mode`` ``"add"`` adds ``seconds``,
    ``"set"`` sets it to ``seconds``, ``"renew"`` raises it to at least ``seconds``."""
    keys = hold.keys
    if hold.mode != EXCLUSIVE:
        member = holder_member(hold.name, hold.token)
        return Call(
            HOLDER_EXTEND,
            (keys.lock, keys.holder_index, keys.holders),
            (hold.token, ms(seconds), member, mode),
        )
    return Call(EXTEND, (keys.lock, keys.index), (hold.token, ms(seconds), hold.name, mode))


def extend_many_call(holds: Sequence[Hold]) -> Call:
    """One script call renewing exclusive ``holds`` (of one bucket on a Cluster), each to
    at least its full lease (``"renew"``); its reply is a list of what
    :func:`extend_call`'s would be, in the order of ``holds``."""
    keys = tuple(key for hold in holds for key in (hold.keys.lock, hold.keys.index))
    args = tuple(arg for hold in holds for arg in (hold.token, ms(hold.lease), hold.name))
    return Call(EXTEND_MANY, keys, args)


def release_call(keys: LockKeys, token: str, liveness_ms: int, mode: str = EXCLUSIVE) -> Call:
    """The script call that releases the lock of ``keys`` if it still holds ``token``
    (held as ``mode``)."""
    if mode != EXCLUSIVE:
        member = holder_member(keys.name, token)
        return Call(HOLDER_RELEASE, keys.of_holders(), (token, member, liveness_ms))
    # KEYS[1..8]: a release never reads the holders or the waiting writers.
    return Call(RELEASE, keys.all()[:8], (token, keys.name, liveness_ms))


def release_steps(
    keys: LockKeys, token: str, liveness_ms: int, mode: str = EXCLUSIVE
) -> Generator[Op, Any, bool]:
    """Steps to release the lock of ``keys`` held with ``token`` (as ``mode``): ``True``
    when it was held and is released (a fair waiter whose turn it now is gets woken)."""
    released, head = released_reply(keys.name, (yield release_call(keys, token, liveness_ms, mode)))
    if head:
        yield from wake_steps(keys, head, liveness_ms)
    return released


def ttl_call(hold: Hold) -> Call:
    """The script call that reads ``hold``'s remaining lease (``-2``: not held)."""
    return Call(HOLDER_TTL if hold.mode != EXCLUSIVE else TTL, (hold.keys.lock,), (hold.token,))


def owner_metadata(*, thread: str, context: str, auto_renew: bool) -> str:
    """The JSON stored with the lock so that operators can tell who holds it."""
    return json.dumps(
        {
            "host": HOSTNAME,
            "pid": os.getpid(),
            "thread": clean_label(thread),
            "context": context,
            "auto_renew": auto_renew,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def new_token() -> str:
    """A 128-bit random token naming one acquisition.

    Tokens must be unique, not secret (whoever can read Redis can read them), so the
    fast PRNG is enough; ``random`` reseeds itself in forked children.
    """
    return f"{random.getrandbits(128):032x}"


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
    queue = keys if fair and blocking else None  # a fair waiter's attempts join its queue
    waiting = Waiter(waiter, RideOut(tuning, deadline), queue, holders=mode != EXCLUSIVE)
    script = ACQUIRE if mode == EXCLUSIVE else HOLDER_ACQUIRE

    def attempt(ending: LockKeys | None, registered: bool) -> Call:
        argv = dataclasses.replace(args, end_wait=ending is not None, registered=registered)
        return Call(script, waiting.keys_of(keys, own=ending is not None), argv.argv(), replicas)

    may_hold = failing = False  # may_hold: the acquire script may have run unseen
    try:
        while True:
            sent_at = time.monotonic()
            may_hold = True
            try:
                reply = yield from waiting.attempt(attempt)
            except LockBackendUnavailable as error:
                if not waiting.failover.primary_changed(error, blocking):
                    raise
                # The primary is changing: the same token again, once it settles (a request
                # that did run answers "taken" to its own token).
                yield Pause(tuning.failover_pause)
                continue
            reply, unreplicated = acknowledged(reply, replicas)
            answer = acquire_reply(name, reply)
            may_hold = type(answer) is Taken
            if type(answer) is OtherKind:
                raise LockError(_other_mode(name, mode, limit, answer.held_as), name=name)
            if type(answer) is Taken:
                if time.monotonic() - sent_at >= lease:
                    # The answer came after the lease it granted was over (a stalled server
                    # or connection): the lock may be another's by now. Give it back and
                    # try again (Redlock's rule: no hold whose validity is already spent).
                    yield from release_steps(keys, token, liveness_ms, mode)
                    may_hold = False
                    waiting.settle()
                    if not blocking or (deadline is not None and time.monotonic() >= deadline):
                        return NotAcquired(None)
                    continue
                if unreplicated is not None:
                    # Not on enough replicas: a failover now could forget it. Give it back.
                    yield from release_steps(keys, token, liveness_ms, mode)
                    may_hold = False
                    waiting.settle()
                    # A waiter tries again within its blocking_timeout (a planned failover:
                    # the old primary lost its replica first), for as long as a failover is
                    # ridden out.
                    if not waiting.failover.riding(blocking):
                        return unreplicated
                    yield Pause(tuning.failover_pause)
                    continue
                waiting.settle()
                if answer.also_wake:
                    # A shared hold or a free slot may let the next waiter in too.
                    yield from wake_steps(keys, answer.also_wake, liveness_ms)
                return Acquired(answer.fence, answer.acquired_at_us, sent_at)
            waiting.busy(keys, answer.writer)
            if answer.writer:
                args = dataclasses.replace(args, writer=True)
            if answer.head and answer.head not in (waiter, waiter.encode()):
                yield from wake_steps(keys, answer.head, liveness_ms)
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if not blocking or remaining <= 0:
                return NotAcquired(answer.wait_ms / 1000 if answer.wait_ms >= 0 else None)
            yield from waiting.wait(keys, sent_at, answer.wait_ms, remaining)
    except BaseException:
        failing = True
        if may_hold:
            # Only our own token is deleted, so this is safe even if the script never ran.
            try:
                yield from release_steps(keys, token, liveness_ms, mode)
            except LockError:
                if on_unreleased is not None:
                    on_unreleased()
        raise
    finally:
        yield from waiting.leave(failing=failing)


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
    registered: bool = False
    """An earlier attempt may have registered the caller among those who wait."""
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
            return (*head, *self.held_as, "1") if self.registered else (*head, *self.held_as)
        if self.writer:
            return (*head, "writer")
        return (*head, "waited") if self.registered else head


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


@dataclass(frozen=True, slots=True)
class GroupRequest:
    """What each group of one acquire is taken with: one token and lease for every name,
    the owner stored with them, whether (until when) to wait, and the replicas each
    group's script waits for (``(count, timeout_ms)`` as for one lock, ``None``: none)."""

    token: str
    lease: float
    owner: str
    blocking: bool
    deadline: float | None
    """Monotonic time to stop waiting at, ``None`` to wait forever."""
    tuning: Tuning
    replicas: tuple[int | str, int] | None = None


def acquire_many_steps(
    groups: list[list[LockKeys]], request: GroupRequest
) -> Generator[Op, Any, AcquiredMany | NotAcquired | NotReplicated]:
    """Steps to take the exclusive locks of ``groups`` with one token, all or none.

    Each group is taken by one script, atomically (a single server: one group; a
    cluster: a group per bucket, the keys of one script sharing a slot). Groups are
    taken in the order given, which every caller makes the same global order, and a
    group that stays busy past the deadline gives back the groups taken before it: no
    two callers can each hold what the other waits for, so nobody deadlocks. While a
    group is busy the caller holds none of *its* locks and waits, notified, for the one
    that was busy.

    With ``request.replicas`` each group's script is followed by its ``WAIT``, by the rule
    of one lock (:func:`acquire_steps`): a group fewer replicas acknowledged
    is given back at once; a waiter tries it again while it rides out a failover, else the
    groups taken before it are given back too (:class:`NotReplicated`).
    """
    token, lease, tuning = request.token, request.lease, request.tuning
    ride_out = RideOut(tuning, request.deadline)
    taken: list[list[LockKeys]] = []
    fences: list[int] = []
    acquired_at_us = 0
    sent_at = 0.0
    current: list[LockKeys] | None = None
    try:
        for group in groups:
            current = group
            outcome = yield from _acquire_group(group, request, ride_out)
            current = None
            if type(outcome) is NotAcquired or type(outcome) is NotReplicated:
                yield from _release_groups(taken, token, tuning)
                taken = []
                return outcome
            taken.append(group)
            group_fences, group_at, group_sent = outcome
            fences.extend(group_fences)
            acquired_at_us = acquired_at_us or group_at
            sent_at = sent_at or group_sent
        if time.monotonic() - sent_at >= lease:
            # Taken, but the lease was over by the time the answer came: give it back.
            yield from _release_groups(taken, token, tuning)
            taken = []
            return NotAcquired(None)
        return AcquiredMany(fences, acquired_at_us, sent_at)
    except BaseException:
        # Only our own token is deleted, so this is safe for a group never taken.
        with contextlib.suppress(LockError):
            yield from _release_groups([*taken, *([current] if current else [])], token, tuning)
        raise


def _release_groups(
    groups: list[list[LockKeys]], token: str, tuning: Tuning
) -> Generator[Op, Any, None]:
    for group in reversed(groups):
        for keys in group:
            yield from release_steps(keys, token, tuning.waiter_liveness_ms)


def _acquire_group(
    group: list[LockKeys], request: GroupRequest, failover: RideOut
) -> Generator[Op, Any, tuple[list[int], int, float] | NotAcquired | NotReplicated]:
    """Steps to take one group (one script); see :func:`acquire_many_steps`."""
    blocking, deadline, tuning, replicas = (
        request.blocking,
        request.deadline,
        request.tuning,
        request.replicas,
    )
    token = request.token
    waiter = token[:16] if blocking else ""
    liveness_ms = tuning.waiter_liveness_ms
    lock_keys = tuple(
        key
        for keys in group
        for key in (keys.lock, keys.fence, keys.waiters, keys.index, keys.writers)
    )
    names = tuple(keys.name for keys in group)
    base = (
        token,
        ms(request.lease),
        request.owner,
        tuning.fence_memory_ms,
        liveness_ms if waiter else "",
    )
    waiting = Waiter(waiter, failover)

    def attempt(ending: LockKeys | None, registered: bool) -> Call:
        last = group[0].lock if ending is None else ending.wake(waiter)
        argv = (*base, "" if ending is None else "1", waiter, "1" if registered else "", *names)
        return Call(MANY_ACQUIRE, (*lock_keys, last), argv, replicas)

    failing = False

    try:
        while True:
            sent_at = time.monotonic()
            try:
                reply = yield from waiting.attempt(attempt)
            except LockBackendUnavailable as error:
                if not failover.primary_changed(error, blocking):
                    raise
                # A request that did run answers "taken" to the same token.
                yield Pause(tuning.failover_pause)
                continue
            reply, unreplicated = acknowledged(reply, replicas)
            answer = many_reply(group[0].name, reply)
            if type(answer) is TakenMany and unreplicated is not None:
                # Not on enough replicas: a failover now could forget it. Give it back,
                # and try again as one lock would.
                yield from _release_groups([group], request.token, tuning)
                waiting.settle()
                if not failover.riding(blocking):
                    unreplicated.name = group[0].name
                    return unreplicated
                yield Pause(tuning.failover_pause)
                continue
            if type(answer) is TakenMany:
                waiting.settle()
                return answer.fences, answer.acquired_at_us, sent_at
            busy = group[answer.index]
            waiting.busy(busy, answer.writer)
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if not blocking or remaining <= 0:
                return NotAcquired(answer.wait_ms / 1000 if answer.wait_ms >= 0 else None)
            yield from waiting.wait(busy, sent_at, answer.wait_ms, remaining)
    except BaseException:
        failing = True
        raise
    finally:
        yield from waiting.leave(failing=failing)
