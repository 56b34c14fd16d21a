"""The steps taking several locks at once, all or none (``distlock_many``), written once
and free of I/O like those of one lock (:mod:`.core`), whose wait and hand-on rules they
follow."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from .core import (
    AcquiredMany,
    NotAcquired,
    NotReplicated,
    RideOut,
    acknowledged,
    release_steps,
    wake_steps,
    wake_time,
)
from .exceptions import LockBackendUnavailable, LockError
from .keys import LockKeys
from .ops import AwaitWakeUp, Call, CallEndingWait, Op, Pause, StartWait, Wake
from .replies import reply_tag, unexpected
from .scripts import MANY_ACQUIRE, PASS_ON
from .tuning import Tuning, ms

__all__ = ["GroupRequest", "acquire_many_steps"]


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
    of one lock (:func:`~.lock_steps.acquire_steps`): a group fewer replicas acknowledged
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
    timer_fired = False
    try:
        while True:
            sent_at = time.monotonic()
            try:
                if waited_on is not None and timer_fired:
                    ending, waited_on = waited_on, None
                    call = Call(
                        MANY_ACQUIRE,
                        (*lock_keys, ending.wake(waiter)),
                        (*base, "1", waiter, *names),
                        replicas,
                    )
                    reply, woken = yield CallEndingWait(call)
                    if woken:
                        consumed_from = ending
                else:
                    reply = yield Call(
                        MANY_ACQUIRE,
                        (*lock_keys, group[0].lock),
                        (*base, "", waiter, *names),
                        replicas,
                    )
            except LockBackendUnavailable as error:
                if not failover.primary_changed(error, blocking):
                    raise
                # A request that did run answers "taken" to the same token.
                yield Pause(tuning.failover_pause)
                continue
            reply, unreplicated = acknowledged(reply, replicas)
            tag = reply_tag(reply)
            if tag == "taken" and unreplicated is not None:
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
            if tag == "taken":
                consumed_from = None
                writer_of = []  # the script took us off every lock's writers
                return [int(fence) for fence in reply[2:]], int(reply[1]), sent_at
            if tag != "busy":
                raise unexpected(group[0].name, "an acquire", reply)
            wait_ms = int(reply[1])
            busy = group[int(reply[2]) - 1]
            if reply[3] in (b"1", "1") and busy not in writer_of:
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
    finally:
        # Leaving without the group: end the wait, leave the writers we joined, and hand
        # on a wake-up we consumed.
        try:
            if waited_on is not None:
                keys, waited_on = waited_on, None
                writer_id = waiter if keys in writer_of else ""
                reply, woken = yield CallEndingWait(
                    Call(PASS_ON, keys.all(waiter), ("", liveness_ms, "0", "1", writer_id))
                )
                if writer_id:
                    writer_of.remove(keys)
                    yield from wake_steps(keys, reply[1], liveness_ms)
                if woken:
                    consumed_from = keys
            while writer_of:
                keys = writer_of.pop()
                reply = yield Call(PASS_ON, keys.all(), ("", liveness_ms, "0", "", waiter))
                yield from wake_steps(keys, reply[1], liveness_ms)
            if consumed_from is not None:
                keys, consumed_from = consumed_from, None
                reply = yield Call(PASS_ON, keys.all(), ("", liveness_ms, "1", "", ""))
                yield from wake_steps(keys, reply[1], liveness_ms)
        except LockError:
            pass
