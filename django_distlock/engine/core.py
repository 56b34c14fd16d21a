"""What the lock's steps share, free of I/O: their outcomes, the script calls on one hold
(release, extend, TTL), releasing and waking a fair waiter, and who a hold is stored as.

The steps of an operation are generators that *yield* what they need done (run a
script, start or await a blocking wait) and receive the result. A sync driver and an
async driver (:mod:`django_distlock.engine.io`) carry the steps out, so both worlds run
the same logic and differ only in how they talk to Redis. Taking one lock is
:mod:`.lock_steps`, several at once :mod:`.group_steps`; the replies are read back by
:mod:`.replies`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from .exceptions import LockBackendUnavailable, LockError
from .hold import Hold
from .keys import LockKeys, clean_label
from .modes import EXCLUSIVE, LIMITED, SHARED
from .ops import Call, Op, Replicated
from .replies import released_reply
from .requests import interrupted
from .scripts import (
    EXTEND,
    HOLDER_EXTEND,
    HOLDER_RELEASE,
    HOLDER_TTL,
    RELEASE,
    TTL,
    WAKE,
)
from .tuning import Tuning, ms

__all__ = [
    "HOSTNAME",
    "Acquired",
    "AcquiredMany",
    "NotAcquired",
    "NotReplicated",
    "RideOut",
    "acknowledged",
    "extend_call",
    "holder_member",
    "new_token",
    "owner_metadata",
    "release_call",
    "release_steps",
    "stored_mode",
    "ttl_call",
    "wake_steps",
    "wake_time",
]

HOSTNAME = clean_label(socket.gethostname())


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


def wake_steps(keys: LockKeys, head: Any, liveness_ms: int) -> Generator[Op, Any, None]:
    """Wake fair waiter ``head`` (a script's answer: ``b""`` when there is none). Its list
    is not among the lock's keys, so it is pushed to here; losing this push only makes
    the waiter notice at its next re-check."""
    if head:
        waiter = head.decode() if isinstance(head, bytes) else str(head)
        with contextlib.suppress(LockError):
            yield Call(WAKE, (keys.wake(waiter),), (liveness_ms,))


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
