"""The lock algorithm, written once and free of I/O.

The steps of an operation are generators that *yield* what they need done (run a
script, start or await a blocking wait) and receive the result. A sync driver and an
async driver (:mod:`django_distlock.engine.io`) carry the steps out, so both worlds run
the same logic and differ only in how they talk to Redis.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import socket
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from .exceptions import LockBackendUnavailable, LockError
from .hold import Hold
from .keys import LockKeys, clean_label, legacy_index_key
from .scripts import ACQUIRE, CLAIM_LAYOUT, EXTEND, PASS_ON, RELEASE, TTL, WAKE, Script
from .tuning import Tuning, ms

__all__ = [
    "LAYOUT_MARKER",
    "Acquired",
    "AwaitWait",
    "Call",
    "CallEndingWait",
    "NotAcquired",
    "NotReplicated",
    "Op",
    "Replicated",
    "StartWait",
    "Tuning",
    "acquire_steps",
    "claim_layout_steps",
    "extend_call",
    "new_token",
    "owner_metadata",
    "release_call",
    "release_steps",
    "replication_report",
    "ttl_call",
]

HOSTNAME = clean_label(socket.gethostname())


@dataclass(slots=True)
class Call:
    """Run ``script`` with ``keys`` and ``args``; the driver sends back the reply.

    With ``replicas`` (a count and a timeout in ms), a ``WAIT`` follows the script on the
    same connection, in the same round trip, and the driver sends back
    ``Replicated(reply, acknowledged)``.
    """

    script: Script
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    replicas: tuple[int, int] | None = None


@dataclass(slots=True)
class Replicated:
    """A script's reply, and how many replicas acknowledged its writes (``WAIT``)."""

    reply: Any
    acknowledged: int


@dataclass(slots=True)
class StartWait:
    """Send ``BLPOP keys...`` on a dedicated connection without waiting for the answer.

    The first key is the waiter's own wake-up list: ending the wait pushes to it (see
    :class:`CallEndingWait`), so a ``BLPOP`` still in flight ends as surely as one
    already blocked.
    """

    keys: tuple[str, ...]


@dataclass(slots=True)
class AwaitWait:
    """Wait up to ``timeout`` seconds for the outstanding ``BLPOP`` to answer.

    The driver sends back ``True`` when it answered with a wake-up (the wait is over)
    and ``False`` when the time ran out first (the ``BLPOP`` stays outstanding). An
    answer that is a leftover end-of-wait mark is not a wake-up: the driver sends the
    ``BLPOP`` again and keeps waiting. Timing this on the client matters: servers time
    out blocked clients only on their ``hz`` tick, up to 100 ms late, which would make
    waiters notice an expired holder late.
    """

    timeout: float


@dataclass(slots=True)
class CallEndingWait:
    """Run ``call``, a script that ends the outstanding ``BLPOP`` by pushing to the
    waiter's own list, then read that ``BLPOP``'s answer: ending a wait costs no round
    trip of its own and cannot race with a ``BLPOP`` still in flight. The driver sends
    back ``(reply, woken)``, ``woken`` being ``True`` when the ``BLPOP`` had consumed a
    wake-up (or may have: a wait whose connection failed)."""

    call: Call


Op = Call | StartWait | AwaitWait | CallEndingWait


@dataclass(slots=True)
class Acquired:
    """The lock was taken: its fence, the server time it was taken at, and the local
    monotonic time the successful request was sent (the lease counts from there)."""

    fence: int
    acquired_at_us: int
    sent_at: float


@dataclass(slots=True)
class NotReplicated:
    """The lock was taken, then given back: only ``acknowledged`` of ``required``
    replicas confirmed it in time."""

    acknowledged: int
    required: int
    timeout_ms: int


@dataclass(slots=True)
class NotAcquired:
    """The lock was not taken; ``retry_after`` is the holder's remaining lease in
    seconds (``None`` when unknown)."""

    retry_after: float | None


def extend_call(hold: Hold, seconds: float, mode: str) -> Call:
    """The script call that changes ``hold``'s lease: ``mode`` ``"add"`` adds ``seconds``,
    ``"set"`` sets it to ``seconds``, ``"renew"`` raises it to at least ``seconds``."""
    keys = hold.keys
    return Call(EXTEND, (keys.lock, keys.index), (hold.token, ms(seconds), hold.name, mode))


def release_call(keys: LockKeys, token: str, liveness_ms: int) -> Call:
    """The script call that releases the lock of ``keys`` if it still holds ``token``."""
    return Call(RELEASE, keys.all(), (token, keys.name, liveness_ms))


def release_steps(keys: LockKeys, token: str, liveness_ms: int) -> Generator[Op, Any, bool]:
    """Steps to release the lock of ``keys`` held with ``token``: ``True`` when it was
    held and is released (a fair waiter whose turn it now is gets woken)."""
    reply = yield release_call(keys, token, liveness_ms)
    yield from _wake(keys, reply[1], liveness_ms)
    return int(reply[0]) == 1


def _wake(keys: LockKeys, head: Any, liveness_ms: int) -> Generator[Op, Any, None]:
    """Wake fair waiter ``head`` (a script's answer: ``b""`` when there is none). Its list
    is not among the lock's keys, so it is pushed to here; losing this push only makes
    the waiter notice at its next re-check."""
    if head:
        waiter = head.decode() if isinstance(head, bytes) else str(head)
        with contextlib.suppress(LockError):
            yield Call(WAKE, (keys.wake(waiter),), (liveness_ms,))


def replication_report(role: Any) -> str:
    """What a primary's ``ROLE`` reply says of its replicas, for an error message:
    ``" (the primary has 2 connected replicas, 1,234 bytes behind at most)"``."""
    if not isinstance(role, list | tuple) or len(role) < 3:
        return ""
    kind = role[0].decode() if isinstance(role[0], bytes) else str(role[0])
    if kind != "master":
        return f" (the node answering is a {kind}, not a primary)"
    offset, replicas = int(role[1]), role[2]
    if not replicas:
        return " (the primary has no connected replica)"
    behind = max(offset - int(replica[2]) for replica in replicas)
    count = len(replicas)
    return (
        f" (the primary has {count} connected replica{'s' if count != 1 else ''}, "
        f"{behind:,} bytes behind at most)"
    )


def ttl_call(hold: Hold) -> Call:
    """The script call that reads ``hold``'s remaining lease (``-2``: not held)."""
    return Call(TTL, (hold.keys.lock,), (hold.token,))


LAYOUT_MARKER = (
    "django-distlock: this server's locks use the bucket key layout (PREFIX{bb}:lock:NAME) "
    "since 0.1.0.dev1; processes of earlier versions must stop"
)


def claim_layout_steps(prefix: str, name: str | None) -> Generator[Op, Any, None]:
    """Steps that make sure no lock of the key layout before buckets is held under
    ``prefix`` on a single server (or a Sentinel's primary), and mark the server so that
    processes running that layout fail instead of taking locks this one cannot see.

    Raises ``LockBackendUnavailable`` (retrying once they are gone works) while such locks
    are held: the two layouts never take the same name at once.
    """
    key = legacy_index_key(prefix)
    held, remaining_ms = yield Call(CLAIM_LAYOUT, (key,), (LAYOUT_MARKER,))
    held = int(held)
    if held:
        raise LockBackendUnavailable(
            f"{held} lock{'s are' if held != 1 else ' is'} held under the key layout of "
            f"django-distlock before 0.1.0.dev1 ({key!r} lists them; the last one's lease "
            f"ends in {int(remaining_ms) / 1000:.1f} s), by processes still running an "
            "earlier version. This version cannot see those locks, so it takes none on this "
            "server until they are gone: stop the processes of the earlier version (see "
            "'Upgrading' in the README).",
            name=name,
        )


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
    replicas: tuple[int, int] | None = None,
) -> Generator[Op, Any, Acquired | NotAcquired | NotReplicated]:
    """Steps to take a lock, waiting (until the monotonic ``deadline``, or forever when
    it is ``None``) if ``blocking``.

    With ``replicas`` (``(count, timeout_ms)``), every attempt is followed by a ``WAIT``
    in the same round trip; a lock taken but acknowledged by fewer replicas is given
    back at once (:class:`NotReplicated`).

    A waiter blocks on a wake-up list that every release pushes to, and re-checks no
    later than the holder's lease end, so both a release and a crashed holder are
    noticed within about one round trip. If the steps are interrupted (an error, a
    cancelled task, ``KeyboardInterrupt``) at any point after the acquire script may have
    run, the lock is given back before the interruption propagates.
    """
    waiter = token[:16] if blocking else ""
    all_keys = keys.all(waiter)
    wait_keys = (keys.wake(waiter),) if fair else (keys.wake(waiter), keys.signal)
    liveness_ms = tuning.waiter_liveness_ms
    args = (
        token,
        ms(lease),
        owner,
        name,
        tuning.fence_memory_ms,
        waiter,
        liveness_ms,
        "1" if fair else "0",
        "",
    )
    ending_args = (*args[:-1], "1")
    queued_as = waiter if fair else ""
    waiting = False  # a BLPOP is outstanding
    consumed = False  # a wake-up reached us that we did not turn into the lock
    enqueued = False
    may_hold = False  # the acquire script may have run without us seeing its reply
    timer_fired = False
    try:
        while True:
            sent_at = time.monotonic()
            may_hold = True
            if waiting and timer_fired:
                # The holder's lease (or the re-check interval) is over: try again, and
                # end the BLPOP in the same round trip.
                waiting = False
                reply, woken = yield CallEndingWait(Call(ACQUIRE, all_keys, ending_args, replicas))
                consumed = consumed or woken
            else:
                reply = yield Call(ACQUIRE, all_keys, args, replicas)
            acknowledged = None
            if type(reply) is Replicated:
                reply, acknowledged = reply.reply, reply.acknowledged
            may_hold = False
            if reply[0] == 1:
                if replicas is not None and acknowledged is not None and acknowledged < replicas[0]:
                    # Not on enough replicas: a failover now could forget it. Give it back.
                    may_hold = True
                    yield from release_steps(keys, token, liveness_ms)
                    may_hold = consumed = enqueued = False
                    return NotReplicated(acknowledged, replicas[0], replicas[1])
                acquired = Acquired(int(reply[1]), int(reply[2]), sent_at)
                may_hold = True
                # No wait is outstanding here (a re-check after the timer ends it in the
                # same step), the acquire script took us off the queue, and a wake-up we
                # consumed was used: nothing to clean up or hand on.
                consumed = enqueued = False
                return acquired
            wait_ms = int(reply[1])
            enqueued = enqueued or (blocking and fair)
            if reply[2] and reply[2] not in (waiter, waiter.encode()):
                yield from _wake(keys, reply[2], liveness_ms)
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            if not blocking or remaining <= 0:
                return NotAcquired(wait_ms / 1000 if wait_ms >= 0 else None)
            if timer_fired and consumed:
                # A release woke us as the timer fired: try again at once.
                timer_fired = consumed = False
                continue
            if not waiting:
                yield StartWait(wait_keys)
                waiting = True
                consumed = False
            # The PTTL counts from when the script ran, so the timer counts from when it
            # was sent; +1 ms because Redis keeps a key until its PTTL is strictly past.
            timer = tuning.wait_cap if wait_ms < 0 else (wait_ms + 1) / 1000
            wake_at = sent_at + min(timer, tuning.wait_cap, max(remaining, 0.0))
            woken = yield AwaitWait(max(0.0, wake_at - time.monotonic()))
            timer_fired = not woken
            if woken:
                waiting = False
                consumed = True
    except BaseException:
        if may_hold:
            # Only our own token is deleted, so this is safe even if the script never ran.
            with contextlib.suppress(LockError):
                yield from release_steps(keys, token, liveness_ms)
        raise
    finally:
        # Leaving without the lock (or on error): end the wait and hand on any wake-up
        # we consumed, so the next waiter is not left sleeping until its own timer.
        try:
            if waiting:
                waiting = False
                handed_on = "1" if consumed else "0"
                reply, woken = yield CallEndingWait(
                    Call(PASS_ON, all_keys, (queued_as, liveness_ms, handed_on, "1"))
                )
                yield from _wake(keys, reply[1], liveness_ms)
                if woken:
                    reply = yield Call(PASS_ON, all_keys, ("", liveness_ms, "1", ""))
                    yield from _wake(keys, reply[1], liveness_ms)
            elif consumed or enqueued:
                handed_on = "1" if consumed else "0"
                reply = yield Call(PASS_ON, all_keys, (queued_as, liveness_ms, handed_on, ""))
                yield from _wake(keys, reply[1], liveness_ms)
        except LockError:
            pass
