"""The protocol's steps, free of I/O: each operation is a generator that yields what it
needs done (:mod:`.ops`) and the drivers (:mod:`..transport.drivers`) carry it out.

What the steps share (their outcomes, the script calls on one hold, releasing and waking
a fair waiter, who a hold is stored as), then :func:`acquire_steps` (one lock, every
kind: the attempt, the fair queue, the wait and its clean-up) and
:func:`acquire_many_steps` (several names at once, all or none, on the same wait and
hand-on rules)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from ..exceptions import LockBackendUnavailable, LockError
from ..keys import EXCLUSIVE, LIMITED, SHARED, LockKeys, clean_label
from ..tuning import Tuning, ms
from .hold import HOSTNAME, Hold
from .ops import (
    AwaitWakeUp,
    Call,
    CallEndingWait,
    Op,
    Pause,
    Replicated,
    StartWait,
    Wake,
    interrupted,
)
from .replies import (
    OtherKind,
    Taken,
    TakenMany,
    acquire_reply,
    many_reply,
    passed_on_reply,
    released_reply,
)
from .scripts import (
    ACQUIRE,
    EXTEND,
    HOLDER_ACQUIRE,
    HOLDER_EXTEND,
    HOLDER_RELEASE,
    HOLDER_TTL,
    MANY_ACQUIRE,
    PASS_ON,
    RELEASE,
    TTL,
    WAKE,
    Script,
)

__all__ = [
    "AcquireArgs",
    "Acquired",
    "AcquiredMany",
    "GroupRequest",
    "NotAcquired",
    "NotReplicated",
    "RideOut",
    "acknowledged",
    "acquire_many_steps",
    "acquire_steps",
    "after_release_of",
    "extend_call",
    "holder_member",
    "new_token",
    "owner_metadata",
    "release_call",
    "release_steps",
    "stored_mode",
    "ttl_call",
    "wake_call",
    "wake_steps",
    "wake_time",
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
class RideOut:
    """How one acquire rides out a failover, the same for one lock and a group: an
    attempt the primary changed under (a planned failover unblocked its ``WAIT``, or the
    demoted primary refused it), a wait a failover ended, or a lock too few replicas
    acknowledged (the old primary lost its replica first) is tried again, every
    ``Tuning.failover_pause``, for up to ``Tuning.failover_ride_out`` seconds from the
    first, never past the acquire's deadline."""

    tuning: Tuning
    deadline: float | None
    """Monotonic time the acquire stops waiting at, ``None`` for never."""
    until: float | None = None
    """A ride-out runs: retries go on until then."""

    def start(self) -> None:
        """A failover was met (a wait it ended): ride it out from now."""
        until = time.monotonic() + self.tuning.failover_ride_out
        self.until = until if self.deadline is None else min(until, self.deadline)

    def riding(self, met: bool) -> bool:
        """Whether a failover is being ridden out now; ``met``: this attempt met one (the
        ride-out starts unless one runs already)."""
        if met and self.until is None:
            self.start()
        return self.until is not None and time.monotonic() < self.until

    def primary_changed(self, error: LockBackendUnavailable, blocking: bool) -> bool:
        """Whether to try again after ``error`` refused an attempt: a waiter (``blocking``)
        whose primary changed under it, while the ride-out lasts."""
        return self.riding(blocking and interrupted(error.__cause__))


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


def wake_call(keys: LockKeys, head: Any, liveness_ms: int) -> Call | None:
    """The call that wakes fair waiter ``head`` (a script's answer: ``b""`` when there is
    none, and then ``None``). Its list is not among the lock's keys, so it is pushed to
    apart from the script that named it."""
    if not head:
        return None
    waiter = head.decode() if isinstance(head, bytes) else str(head)
    return Call(WAKE, (keys.wake(waiter),), (liveness_ms,))


def wake_steps(keys: LockKeys, head: Any, liveness_ms: int) -> Generator[Op, Any, None]:
    """Wake fair waiter ``head`` (:func:`wake_call`); losing this push only makes the
    waiter notice at its next re-check."""
    call = wake_call(keys, head, liveness_ms)
    if call is not None:
        with contextlib.suppress(LockError):
            yield call


def wake_time(sent_at: float, wait_ms: int, remaining: float, tuning: Tuning) -> float:
    """When a waiter told ``busy`` re-checks at the latest (monotonic): once the obstacle's
    ``wait_ms`` is over (``-1``: unknown), within ``tuning.wait_cap`` and the ``remaining``
    seconds before its deadline."""
    # The PTTL counts from when the script ran, so the timer counts from when it was
    # sent; +1 ms because Redis keeps a key until its PTTL is strictly past.
    timer = tuning.wait_cap if wait_ms < 0 else (wait_ms + 1) / 1000
    return sent_at + min(timer, tuning.wait_cap, max(remaining, 0.0))


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
    wait = _Waiting(keys, waiter, fair, mode, RideOut(tuning, deadline))
    script = ACQUIRE if mode == EXCLUSIVE else HOLDER_ACQUIRE
    attempt_keys = wait.attempt_keys()
    attempted = failing = False
    try:
        while True:
            if attempted and blocking and not args.registered:
                # The attempt before may have registered us among those who wait: taking
                # the lock (or leaving) takes us off.
                args = dataclasses.replace(args, registered=True)
                wait.registered = True
            attempted = True
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
            answer = acquire_reply(name, reply)
            wait.may_hold = False
            if type(answer) is OtherKind:
                raise LockError(_other_mode(name, mode, limit, answer.held_as), name=name)
            if type(answer) is Taken:
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
                if answer.also_wake:
                    # A shared hold or a free slot may let the next waiter in too.
                    yield from wake_steps(keys, answer.also_wake, liveness_ms)
                return Acquired(answer.fence, answer.acquired_at_us, sent_at)
            wait_ms = answer.wait_ms
            if not wait.writer and answer.writer:
                # Waiting among the writers of a lock held shared: taking it (or leaving)
                # takes us off that list.
                wait.writer = True
                args = dataclasses.replace(args, writer=True)
            if answer.head and answer.head not in (waiter, waiter.encode()):
                yield from wake_steps(keys, answer.head, liveness_ms)
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
        failing = True
        if wait.may_hold:
            # Only our own token is deleted, so this is safe even if the script never ran.
            try:
                yield from release_steps(keys, token, liveness_ms, mode)
            except LockError:
                if on_unreleased is not None:
                    on_unreleased()
        raise
    finally:
        # Leaving those who wait is left to the deadline when an error ends the acquire:
        # an error path adds no round trip for it.
        if wait.left_behind() or (wait.registered and not failing):
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
    registered: bool = False
    """An attempt may have registered us among those who wait (``KEYS[3]``)."""
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
        self.consumed = self.enqueued = self.writer = self.registered = False

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
    """Leaving without the lock (or on error): end the wait, leave the fair queue, those
    who wait and the writers, and hand on any wake-up we consumed, so that the next
    waiter is not left sleeping until its own timer."""
    queued_as = wait.waiter if wait.fair else ""
    writer_id = wait.waiter if wait.writer else ""
    registered_as = wait.waiter if wait.registered else ""
    keys = wait.keys
    if wait.waiting:
        wait.waiting = False
        handed_on = "1" if wait.consumed else "0"
        reply, woken = yield CallEndingWait(
            Call(
                PASS_ON,
                wait.own_keys(),
                (queued_as, liveness_ms, handed_on, "1", writer_id, registered_as),
            )
        )
        yield from wake_steps(keys, passed_on_reply(keys.name, reply).head, liveness_ms)
        if woken:
            reply = yield Call(PASS_ON, wait.own_keys(), ("", liveness_ms, "1", "", "", ""))
            yield from wake_steps(keys, passed_on_reply(keys.name, reply).head, liveness_ms)
    else:
        handed_on = "1" if wait.consumed else "0"
        reply = yield Call(
            PASS_ON,
            wait.own_keys(),
            (queued_as, liveness_ms, handed_on, "", writer_id, registered_as),
        )
        yield from wake_steps(keys, passed_on_reply(keys.name, reply).head, liveness_ms)


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
    waited_on: LockKeys | None = None  # whose BLPOP is outstanding
    consumed_from: LockKeys | None = None  # a wake-up we consumed and did not use
    writer_of: list[LockKeys] = []  # locks held shared whose writers we wait among
    registered_on: LockKeys | None = None  # the last busy lock: we are among its waiters
    registered = ""  # "1": an attempt before may have registered us as a waiter
    timer_fired = failing = False
    try:
        while True:
            sent_at = time.monotonic()
            try:
                if waited_on is not None and timer_fired:
                    ending, waited_on = waited_on, None
                    call = Call(
                        MANY_ACQUIRE,
                        (*lock_keys, ending.wake(waiter)),
                        (*base, "1", waiter, registered, *names),
                        replicas,
                    )
                    reply, woken = yield CallEndingWait(call)
                    if woken:
                        consumed_from = ending
                else:
                    reply = yield Call(
                        MANY_ACQUIRE,
                        (*lock_keys, group[0].lock),
                        (*base, "", waiter, registered, *names),
                        replicas,
                    )
            except LockBackendUnavailable as error:
                if not failover.primary_changed(error, blocking):
                    raise
                # A request that did run answers "taken" to the same token.
                registered = "1" if blocking else ""
                yield Pause(tuning.failover_pause)
                continue
            registered = "1" if blocking else ""
            reply, unreplicated = acknowledged(reply, replicas)
            answer = many_reply(group[0].name, reply)
            if type(answer) is TakenMany and unreplicated is not None:
                # Not on enough replicas: a failover now could forget it. Give it back,
                # and try again as one lock would.
                yield from _release_groups([group], request.token, tuning)
                consumed_from = None
                writer_of = []
                if not failover.riding(blocking):
                    unreplicated.name = group[0].name
                    return unreplicated
                yield Pause(tuning.failover_pause)
                continue
            if type(answer) is TakenMany:
                consumed_from = registered_on = None
                writer_of = []  # the script took us off every lock's writers and waiters
                return answer.fences, answer.acquired_at_us, sent_at
            wait_ms = answer.wait_ms
            busy = group[answer.index]
            registered_on = busy if blocking else None
            if answer.writer and busy not in writer_of:
                writer_of.append(busy)
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if not blocking or remaining <= 0:
                return NotAcquired(wait_ms / 1000 if wait_ms >= 0 else None)
            if timer_fired and consumed_from is not None:
                timer_fired = False  # woken as the timer fired: try again at once
                consumed_from = None
                continue
            yield StartWait((busy.wake(waiter), busy.signal))
            waited_on = busy
            wake_at = wake_time(sent_at, wait_ms, remaining, tuning)
            woke = yield AwaitWakeUp(max(0.0, wake_at - time.monotonic()))
            timer_fired = woke is Wake.TIMER
            if woke is not Wake.TIMER:
                waited_on = None  # the wait is over
            if woke is Wake.WOKEN:
                consumed_from = busy
            elif woke is Wake.INTERRUPTED:
                failover.start()  # a failover ended the wait: try again, riding it out
    except BaseException:
        failing = True
        raise
    finally:
        # Leaving without the group: end the wait, leave the writers we joined, and hand
        # on a wake-up we consumed.
        try:
            if waited_on is not None:
                keys, waited_on = waited_on, None
                writer_id = waiter if keys in writer_of else ""
                reply, woken = yield CallEndingWait(
                    Call(PASS_ON, keys.all(waiter), ("", liveness_ms, "0", "1", writer_id, waiter))
                )
                registered_on = None if keys is registered_on else registered_on
                if writer_id:
                    writer_of.remove(keys)
                    yield from wake_steps(keys, passed_on_reply(keys.name, reply).head, liveness_ms)
                if woken:
                    consumed_from = keys
            while writer_of:
                keys = writer_of.pop()
                reply = yield Call(PASS_ON, keys.all(), ("", liveness_ms, "0", "", waiter, waiter))
                registered_on = None if keys is registered_on else registered_on
                yield from wake_steps(keys, passed_on_reply(keys.name, reply).head, liveness_ms)
            if consumed_from is not None:
                keys, consumed_from = consumed_from, None
                mine = waiter if keys is registered_on else ""
                registered_on = None if mine else registered_on
                reply = yield Call(PASS_ON, keys.all(), ("", liveness_ms, "1", "", "", mine))
                yield from wake_steps(keys, passed_on_reply(keys.name, reply).head, liveness_ms)
            if registered_on is not None and not failing:  # on error: left to its deadline
                keys, registered_on = registered_on, None
                yield Call(PASS_ON, keys.all(), ("", liveness_ms, "0", "", "", waiter))
        except LockError:
            pass
