"""The operations the protocol's steps (:mod:`.steps`) ask the I/O drivers
(:mod:`..transport.drivers`) to carry out (a :class:`Script` to call, the waits), what the
drivers send back, and which errors mean a failover ended a wait or refused a request
(:func:`interrupted`, :func:`demoted`): the vocabulary between the two, with no I/O and no
protocol of its own."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ConnectionError, ReadOnlyError, ResponseError

__all__ = [
    "AwaitWakeUp",
    "Call",
    "CallEndingWait",
    "Op",
    "Pause",
    "Replicated",
    "Script",
    "StartWait",
    "Wake",
    "demoted",
    "interrupted",
]


@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, so callers can ``EVALSHA`` and fall back to ``EVAL``."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())  # noqa: S324


@dataclass(slots=True)
class Call:
    """Run ``script`` with ``keys`` and ``args``; the driver sends back the reply.

    With ``replicas`` (a count and a timeout in ms), a ``WAIT`` follows the script on the
    same connection, in the same round trip, and the driver sends back
    ``Replicated(reply, acknowledged, required)``. A count of ``"auto"`` is decided by
    the driver for the server the script reaches (:mod:`..transport.replication`): no ``WAIT``, and
    the plain reply, where that is 0.
    """

    script: Script
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    replicas: tuple[int | str, int] | None = None


@dataclass(slots=True)
class Replicated:
    """A script's reply, how many replicas acknowledged its writes (``WAIT``) and how many
    it waited for."""

    reply: Any
    acknowledged: int
    required: int


@dataclass(slots=True)
class StartWait:
    """Send ``BLPOP keys...`` on a dedicated connection without waiting for the answer.

    The first key is the waiter's own wake-up list: ending the wait pushes to it (see
    :class:`CallEndingWait`), so a ``BLPOP`` still in flight ends as surely as one
    already blocked.
    """

    keys: tuple[str, ...]


@dataclass(slots=True)
class AwaitWakeUp:
    """Wait up to ``timeout`` seconds for the outstanding ``BLPOP`` to answer.

    The driver sends back a :class:`Wake`: ``WOKEN`` when it answered with a wake-up
    (the wait is over), ``TIMER`` when the time ran out first (the ``BLPOP`` stays
    outstanding), ``INTERRUPTED`` when the server ended it (the wait is over). An answer
    that is a leftover end-of-wait mark is not a wake-up: the driver sends the ``BLPOP``
    again and keeps waiting. Timing this on the client matters: servers time
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


@dataclass(slots=True)
class Pause:
    """Sleep ``seconds`` (pacing retries while a failover settles)."""

    seconds: float


class Wake(enum.Enum):
    """How an :class:`AwaitWakeUp` ended."""

    WOKEN = "woken"
    """A release (or a free slot) woke the waiter: try now."""
    TIMER = "timer"
    """The waiter's timer ran out first; its ``BLPOP`` is still outstanding."""
    INTERRUPTED = "interrupted"
    """The server ended the wait (``UNBLOCKED``: a planned failover demoted it). No
    ``BLPOP`` is outstanding; the primary may have changed: try again at once, riding out
    the failover within the caller's deadline."""


Op = Call | StartWait | AwaitWakeUp | CallEndingWait | Pause


def demoted(error: BaseException) -> bool:
    """True for a request refused by a primary that a failover made a replica, on a
    connection that asks the Sentinels where the primary is when it connects again:
    redis-py's Sentinel connections answer ``READONLY`` by disconnecting and raising
    ``ConnectionError`` ("The previous master is now a slave") from the
    ``ReadOnlyError``. The request did not run (a replica refuses every write, a script's
    first one included), so it may be sent again."""
    return isinstance(error, ConnectionError) and isinstance(error.__context__, ReadOnlyError)


def interrupted(error: BaseException) -> bool:
    """True for a blocked command ended by the server changing role (``UNBLOCKED``: a
    planned failover demoting the primary), or refused because it did (:func:`demoted`).
    redis-py 8.2's Sentinel connections raise ``ConnectionError`` ("The previous master is
    now a slave") from the ``UNBLOCKED`` reply; earlier versions raise the reply."""
    if demoted(error):
        return True
    reply = error.__context__ if isinstance(error, ConnectionError) else error
    return isinstance(reply, ResponseError) and str(reply).startswith("UNBLOCKED")
