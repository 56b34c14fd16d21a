"""What every request to Redis shares, sync or async: the rule that keeps each reply
with the request that asked for it (:func:`exchange`), what a request writes, what a
cluster's refusal asks for (:class:`Routing`, blocking waits included), and which errors
reach callers as which :class:`LockError`.

One rule makes every reply the answer to the request that asked for it: a connection
goes back to its pool only once every reply to what was written on it has been read
(error replies included); a timeout, a closed socket or an interruption disconnects it
first. Nothing retries a request that may have reached Redis: only one that was refused
before it ran (a cluster redirect, ``NOSCRIPT``, ``READONLY`` from a demoted Sentinel
primary, a connection that could not be opened) is sent again.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    MaxConnectionsError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..exceptions import LockBackendError, LockBackendUnavailable, LockError
from ..protocol.ops import Call, Replicated, demoted

__all__ = [
    "BACKEND_ERRORS",
    "FAILOVER_BUDGET",
    "FAILOVER_DELAY",
    "MAX_REDIRECTS",
    "POOL_POLL",
    "TRYAGAIN_BUDGET",
    "TRYAGAIN_DELAY",
    "NotSent",
    "Redirect",
    "Request",
    "Routing",
    "aconnection",
    "aexchange",
    "answer_of",
    "asend",
    "by_server",
    "commands_for",
    "exchange",
    "failure",
    "pool_full",
    "unavailable",
    "woken_by",
]

BACKEND_ERRORS = (RedisError, OSError, RedisClusterException)

# Error replies that mean "not now" rather than "never": a replica that is not (yet) the
# primary, a server loading its data or busy with a script, out of memory, a cluster
# without a quorum or in the middle of a migration, too few replicas for
# min-replicas-to-write, a blocked command ended by a failover.
_TRANSIENT_REPLIES = (ReadOnlyError, ClusterDownError, TryAgainError, OutOfMemoryError, AskError)
_TRANSIENT_PREFIXES = (
    "BUSY",
    "LOADING",
    "MASTERDOWN",
    "NOREPLICAS",
    "READONLY",
    "TRYAGAIN",
    "UNBLOCKED",
)

MAX_REDIRECTS = 16
"""``MOVED`` and ``ASK`` redirects one request follows before giving up."""
TRYAGAIN_DELAY = 0.02
"""Seconds before a request refused with ``TRYAGAIN`` (keys split by a slot migration in
progress) is sent again."""
TRYAGAIN_BUDGET = 3.0
"""Seconds a request keeps being refused for a migration before it is given up: a slot's
keys stay split between two nodes while a migration moves them."""
FAILOVER_DELAY = 0.05
"""Seconds between two tries of a request refused by a demoted primary (:func:`demoted`)
after the first, sent again at once."""
FAILOVER_BUDGET = 3.0
"""Seconds a request refused by a demoted primary keeps being sent again: until the
Sentinels name the new primary (they learn of a failover from each other within about
2 s)."""


def unavailable(name: str | None, exc: BaseException) -> LockBackendUnavailable:
    """The error a caller sees for a Redis call that could not be served."""
    about = "" if name is None else f" for lock {name!r}"
    return LockBackendUnavailable(
        f"Redis unavailable{about}: {type(exc).__name__}: {exc}", name=name
    )


def failure(name: str | None, exc: BaseException) -> LockError:
    """The :class:`LockError` for a failed Redis call: ``LockBackendError`` for an error
    reply that retrying will not cure, ``LockBackendUnavailable`` for everything else."""
    if isinstance(exc, LockError):
        return exc
    if (
        isinstance(exc, ResponseError)
        and not isinstance(exc, _TRANSIENT_REPLIES)
        and not str(exc).startswith(_TRANSIENT_PREFIXES)
    ):
        about = "" if name is None else f" on lock {name!r}"
        return LockBackendError(
            f"Redis refused an operation{about}: {type(exc).__name__}: {exc}", name=name
        )
    return unavailable(name, exc)


POOL_POLL = 0.01
"""Seconds between two looks at a client's pool that is at its ``max_connections`` (a
connection the engine gives back wakes a request that waits for one at once; one the
application gives back is seen at the next look)."""


def pool_full(pool: Any, waiting_since: float, within: float) -> float:
    """Seconds to wait before asking ``pool``, which is at its ``max_connections``, for a
    connection again, a request having waited since monotonic ``waiting_since``; past
    ``within`` seconds, raises :class:`NotSent` saying which cap kept it waiting."""
    left = waiting_since + within - time.monotonic()
    if left <= 0:
        cap = getattr(pool, "max_connections", None)
        error = MaxConnectionsError(
            f"no connection of the client's pool (max_connections={cap}) came free "
            f"within {within:g} s"
        )
        raise NotSent(error)
    return min(left, POOL_POLL)


class NotSent(Exception):
    """No connection could be opened: nothing was sent (safe to send elsewhere)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def exchange(
    pool: Any, commands: Sequence[Sequence[Any]], deadline: float | None = None
) -> list[Any]:
    """Write ``commands`` on one connection of the redis-py ``pool`` in one go and read a
    reply to each, an error reply (a ``ResponseError``) in place of its result.

    The connection goes back to ``pool`` only once every reply was read; a timeout (also
    the monotonic ``deadline``, whatever the socket timeout), a closed socket or an
    interruption disconnects it first, so that no later request can read a reply that is
    not its own. Raises :class:`NotSent` when no connection could be opened.
    """
    try:
        connection = pool.get_connection()
    except (ConnectionError, OSError) as exc:
        raise NotSent(exc) from exc
    try:
        connection.send_packed_command(connection.pack_commands(commands))
        replies = []
        for _ in commands:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not connection.can_read(timeout=left):
                    raise RedisTimeoutError("no answer in time")
            try:
                replies.append(connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)
    return replies


async def aconnection(pool: Any) -> Any:
    """A connection of the redis-py asyncio ``pool``, open and with nothing to read.

    redis-py 8's asyncio pool skips its own check of an idle connection while
    maintenance notifications are on (``"auto"``, the default): a connection the server
    closed while it sat in the pool (``CLIENT KILL``, the server's ``timeout``, a proxy's
    idle limit) is handed out as it is, and a request written on it fails with
    "Connection closed by server" though it never reached Redis. One that is closed, or
    has anything to read (no reply is left unread on a pooled connection: see
    :func:`exchange`), is connected anew before anything is written on it. The sync pool
    needs no such check: its ``can_read`` raises on a closed socket, and it reconnects.
    (:func:`_pending` is that check on both redis-py lines.)"""
    connection = await pool.get_connection()
    try:
        try:
            stale = await _pending(connection)
        except (ConnectionError, OSError):
            stale = True
        if stale:
            await connection.disconnect()
            await connection.connect()
    except BaseException:
        await pool.release(connection)
        raise
    return connection


def _pending(connection: Any) -> Awaitable[bool]:
    """Whether the asyncio ``connection`` has anything to read or is closed: ``can_read``
    from redis-py 8 on, where the older name, ``can_read_destructive`` (7.4), warns that
    it is deprecated."""
    check = getattr(connection, "can_read", None) or connection.can_read_destructive
    return check()


async def asend(connection: Any, commands: Sequence[Sequence[Any]]) -> None:
    """Write ``commands`` on ``connection``, on a new connection when the pooled one turns
    out to be lost as the write starts (nothing of it reached the server).

    The asyncio transport writes at once and raises only when the socket refused that
    first write or was lost before it: a reset while the connection sat in the pool (a
    proxy's or a firewall's RST), which redis-py's pure-Python parser does not see in
    its idle check (:func:`aconnection`). Bytes the kernel took are never reported as a
    failure of this write, so the request is written again, once, on a new connection;
    a write that failed there, or timed out (the transport's buffer was full, so part of
    it may have gone), is the request's error. CPython 3.13.0-3.13.5 raise
    ``AttributeError`` for a lost transport (python/cpython#136234) where other versions
    drop the bytes and fail the drain."""
    packed = connection.pack_commands(commands)
    try:
        await connection.send_packed_command(packed)
        return
    except (ConnectionError, OSError, AttributeError) as exc:
        if isinstance(exc, TimeoutError):
            raise
    await connection.disconnect(nowait=True)
    try:
        await connection.connect()
    except (ConnectionError, OSError) as exc:
        raise NotSent(exc) from exc
    await connection.send_packed_command(packed)


async def aexchange(pool: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Async twin of :func:`exchange` (the caller bounds it with ``asyncio.timeout``)."""
    try:
        connection = await aconnection(pool)
    except (ConnectionError, OSError) as exc:
        raise NotSent(exc) from exc
    try:
        await asend(connection, commands)
        replies = []
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    finally:
        await pool.release(connection)
    return replies


Request = Call | tuple[Any, ...]
"""A script call, or a plain command."""


def commands_for(request: Request, *, by_sha: bool, asking: bool) -> list[tuple[Any, ...]]:
    """What to write for ``request``: ``ASKING`` first when redirected by ``ASK``; a
    script by its SHA (or its source after ``NOSCRIPT``), then ``WAIT`` when it must reach
    replicas."""
    if isinstance(request, Call):
        script = request.script
        head = ("EVALSHA", script.sha) if by_sha else ("EVAL", script.source)
        command: tuple[Any, ...] = (*head, len(request.keys), *request.keys, *request.args)
    else:
        command = request
    commands = [("ASKING",), command] if asking else [command]
    if isinstance(request, Call) and request.replicas is not None:
        commands.append(("WAIT", *request.replicas))
    return commands


def answer_of(request: Request, replies: list[Any], asking: bool) -> Any:
    """The answer to ``request`` from its ``replies`` (an error reply as such)."""
    reply = replies[1] if asking else replies[0]
    if isinstance(reply, BaseException) or not isinstance(request, Call):
        return reply
    if request.replicas is None:
        return reply
    acknowledged = replies[-1]
    if isinstance(acknowledged, BaseException):
        return acknowledged
    return Replicated(reply, int(acknowledged), int(request.replicas[0]))


@dataclass(frozen=True, slots=True)
class Redirect:
    """A refusal to ride out: send the request again after ``delay`` seconds, to the
    server :meth:`Routes.redirected` names for ``kind`` (``"moved"``, ``"ask"``,
    ``"again"``), or to the same server for ``"noscript"`` (by the script's source)."""

    kind: str
    error: ResponseError
    delay: float = 0.0


class Routing:
    """One request on its way to the server that holds its key (a blocking wait's
    ``BLPOP`` as well): what to write next and what each refusal asks for. The sync and
    async drivers add only the I/O. ``budget``: seconds the request keeps being refused
    for a migration (``TRYAGAIN``, paced ``ASK``) before it gives up."""

    __slots__ = ("asking", "budget", "by_sha", "redirects", "request", "started")

    def __init__(self, request: Request, budget: float = TRYAGAIN_BUDGET) -> None:
        self.request = request
        self.budget = budget
        self.asking = False
        self.by_sha = True
        self.redirects = 0
        self.started = time.monotonic()

    def commands(self) -> list[tuple[Any, ...]]:
        """What to write for the next try."""
        return commands_for(self.request, by_sha=self.by_sha, asking=self.asking)

    def not_sent(self, failed: NotSent) -> None:
        """The try could not be sent: count it, or raise its error past
        :data:`MAX_REDIRECTS`."""
        if self.redirects >= MAX_REDIRECTS:
            raise failed.error from failed
        self.redirects += 1

    def failed(self, error: BaseException) -> float | None:
        """Seconds to wait before sending the request again after its try raised
        ``error``, or ``None`` to raise it. Only a try that a demoted primary refused
        (:func:`demoted`: it never ran) is sent again: at once, then every
        :data:`FAILOVER_DELAY` while the Sentinels still name that server, for up to
        :data:`FAILOVER_BUDGET`."""
        if not demoted(error) or time.monotonic() - self.started >= FAILOVER_BUDGET:
            return None
        self.redirects += 1
        return 0.0 if self.redirects == 1 else FAILOVER_DELAY

    def answer(self, replies: list[Any], is_cluster: bool) -> Any:
        """The request's answer from the try's ``replies``, or a :class:`Redirect` to
        follow; a refusal that cannot be ridden out is raised."""
        answer = answer_of(self.request, replies, self.asking)
        if not isinstance(answer, ResponseError):
            return answer
        if self.by_sha and isinstance(answer, NoScriptError):
            self.by_sha = False
            return Redirect("noscript", answer)
        return self.refused(answer, is_cluster)

    def refused(self, error: ResponseError, is_cluster: bool) -> Redirect:
        """The :class:`Redirect` that rides out ``error``, a cluster's refusal of a try
        (the answer to a request, or what ended a blocking wait); raises ``error`` when
        it cannot be ridden out.

        ``MOVED`` and ``ASK`` count against :data:`MAX_REDIRECTS`. ``TRYAGAIN`` is
        bounded by time alone (``budget`` from the first try): a slot whose
        keys stay split for a second refuses some fifty paced tries, and the ``MOVED``
        that ends the migration must still be followed. A ``TRYAGAIN`` from the node an
        ``ASK`` sent us to is tried again there, still asking: without ``ASKING`` that
        node answers ``MOVED``, back to the source, which answers ``ASK`` again, until
        the redirect limit gives up."""
        if not is_cluster or not isinstance(error, AskError | TryAgainError):
            raise error
        within_budget = time.monotonic() - self.started < self.budget
        if isinstance(error, TryAgainError):
            if not within_budget:
                raise error
            return Redirect("again", error, TRYAGAIN_DELAY)
        moved = isinstance(error, MovedError)  # redis-py derives MovedError from AskError
        if self.redirects < MAX_REDIRECTS:
            delay = 0.0
        elif moved or not within_budget:
            raise error
        else:
            # While a migration has a slot's keys split, the source answers ASK and the
            # target TRYAGAIN, in turn: past MAX_REDIRECTS that is a wait for the move,
            # paced and bounded like TRYAGAIN.
            delay = TRYAGAIN_DELAY
        self.redirects += 1
        self.asking = not moved
        return Redirect("moved" if moved else "ask", error, delay)


def woken_by(answer: Any) -> bool:
    """True for a BLPOP answer that is a wake-up (not an end-of-wait mark, not the
    server's own timeout)."""
    return isinstance(answer, list | tuple) and answer[1] not in (b"c", "c")


def by_server(routes: Any, calls: list[Call]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = {}
    for i, call in enumerate(calls):
        groups.setdefault(routes.for_key(call.keys[0]), []).append(i)
    return groups
