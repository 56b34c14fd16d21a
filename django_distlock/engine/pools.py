"""The connections a backend opens for itself: blocking waits, renewals, and calls that
overflow an exhausted client pool.

They are built from the client's own connection settings (same server, credentials,
TLS) but kept apart from the client's pool: a waiter holds its connection for the whole
wait, so hundreds of waiters must never starve the application's pool, and a renewal
that timed out must be retried on a connection nobody else is reading from.

A pool grows with demand and keeps at most ``max_idle`` idle connections: after a burst
of waiters it shrinks back instead of keeping one connection per past waiter.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
import weakref
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = [
    "AsyncConnectionPool",
    "ConnectionPool",
    "async_connection_kwargs",
    "connection_settings",
]

MAX_IDLE = 8
SWEEP_EVERY = 0.1
"""Seconds between two checks of the deadlines of an async pool's requests in flight
(less for socket timeouts under 0.4 s)."""


def connection_settings(pool: Any) -> tuple[type[Any], dict[str, Any]]:
    """The connection class and keyword arguments of a redis-py pool, minus what belongs
    to that pool alone (its maintenance-notification handler)."""
    kwargs = dict(pool.connection_kwargs)
    kwargs.pop("maint_notifications_pool_handler", None)
    return pool.connection_class, kwargs


def async_connection_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Sync connection settings made fit for ``redis.asyncio`` connections: the arguments
    they take (credentials, db, timeouts, TLS, ...), without the objects that belong to
    sync connections (the engine retries itself)."""
    return {
        k: v
        for k, v in kwargs.items()
        if k in _async_connection_arguments() and k not in _SYNC_ONLY_ARGUMENTS
    }


_SYNC_ONLY_ARGUMENTS = frozenset(
    {
        "retry",
        "parser_class",
        "event_dispatcher",
        "redis_connect_func",  # a sync RedisCluster's on_connect
        "maint_notifications_pool_handler",
        "oss_cluster_maint_notifications_handler",
    }
)


@functools.cache
def _async_connection_arguments() -> frozenset[str]:
    # Each class of the hierarchy names its own arguments and passes the rest on as
    # **kwargs: SSLConnection's signature alone holds nothing but the ssl_* ones.
    return frozenset(
        name
        for cls in redis.asyncio.SSLConnection.__mro__
        if "__init__" in vars(cls)
        for name, parameter in inspect.signature(vars(cls)["__init__"]).parameters.items()
        if name != "self"
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    )


class ConnectionPool:
    """Sync connections to one server, created on demand (see the module docstring)."""

    def __init__(
        self, connection_class: type[Any], kwargs: dict[str, Any], *, max_idle: int = MAX_IDLE
    ) -> None:
        self.connection_class = connection_class
        self.kwargs = kwargs
        self.max_idle = max_idle
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} idle={len(self._idle)} {self.kwargs.get('host', '')}>"

    @property
    def idle(self) -> int:
        """Connections ready for reuse."""
        return len(self._idle)

    def new(self, connect_within: float | None = None) -> Any:
        """A new connection, connected (in at most ``connect_within`` seconds, if given).
        Through ``connect()`` itself: a Sentinel-managed connection asks the Sentinels
        for the primary there, which redis-py's implicit connect on first send skips."""
        connection = self.connection_class(**self.kwargs)
        if connect_within is None:
            connection.connect()
        else:
            _connect_within(connection, connect_within)
        return connection

    def get(self, connect_within: float | None = None) -> Any:
        """An idle connection that still looks usable, or a new one. An idle connection
        with something to read was closed by the server (a restart, an idle timeout) or
        holds a stray reply: it is replaced."""
        while True:
            with self._lock:
                if not self._idle:
                    return self.new(connect_within)
                connection = self._idle.pop()
            try:
                if not connection.can_read():
                    return connection
            except (OSError, RedisError):
                pass
            connection.disconnect()

    def put(self, connection: Any) -> None:
        """Give back a connection whose replies have all been read."""
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(connection)
                return
        connection.disconnect()

    def discard(self, connection: Any) -> None:
        """Close a connection that may still have a reply in flight (never reused)."""
        connection.disconnect()

    def close(self) -> None:
        """Close the idle connections (connections in use are closed when discarded)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.disconnect()


class AsyncConnectionPool:
    """Async twin of :class:`ConnectionPool`, for one event loop.

    Its connections are made without redis-py's socket timeout: redis-py applies it to
    every write with ``asyncio.wait_for`` (a task, a future and a timer per write before
    Python 3.12) and to every read with a timer of its own, which on a lock's fast path
    costs more than the rest of the client's work for the request. A driver bounds a
    whole request, its write and its replies, by the client's ``socket_timeout``
    (:attr:`timeout`) instead: :meth:`begin` notes the request's deadline, and one timer
    per pool, armed while requests are in flight, cancels the task of a request past its
    deadline (``asyncio.timeout`` would arm and cancel a timer per request). :meth:`get`
    bounds a new connection's connect and handshake (:attr:`connect_timeout` plus
    :attr:`timeout`).
    """

    def __init__(
        self, connection_class: type[Any], kwargs: dict[str, Any], *, max_idle: int = MAX_IDLE
    ) -> None:
        self.connection_class = connection_class
        self.timeout: float | None = kwargs.get("socket_timeout")
        connect_timeout = kwargs.get("socket_connect_timeout")
        # redis-py's own default: the socket timeout also bounds connecting.
        self.connect_timeout: float | None = (
            self.timeout if connect_timeout is None else connect_timeout
        )
        self.kwargs = {
            **kwargs,
            "socket_timeout": None,
            "socket_connect_timeout": self.connect_timeout,
        }
        self.max_idle = max_idle
        self._idle: list[Any] = []
        # Requests in flight (by connection): deadline, task, its cancellations then. Tasks
        # are weakly referenced: this pool is the value of a dict weakly keyed by their
        # loop, and a task left pending when its loop closed must not keep the loop alive.
        self._in_flight: dict[Any, tuple[float, weakref.ref[asyncio.Task[Any]], int]] = {}
        self._expired: dict[Any, tuple[weakref.ref[asyncio.Task[Any]], int]] = {}
        self._sweeping = False
        # A request fails between `timeout` and `timeout + _sweep_every` after it began.
        self._sweep_every = min(SWEEP_EVERY, max((self.timeout or 0.0) / 4, 0.001))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} idle={len(self._idle)} {self.kwargs.get('host', '')}>"

    @property
    def idle(self) -> int:
        """Connections ready for reuse."""
        return len(self._idle)

    def begin(self, connection: Any) -> None:
        """The running task is about to send a request on ``connection``: bound it by
        :attr:`timeout` (call :meth:`end` once it is answered or failed)."""
        if self.timeout is None:
            return
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - drivers run in tasks
            return
        deadline = time.monotonic() + self.timeout
        self._in_flight[connection] = (deadline, weakref.ref(task), task.cancelling())
        if not self._sweeping:
            self._sweeping = True
            asyncio.get_running_loop().call_later(self._sweep_every, self._sweep)

    def expired(self, connection: Any) -> bool:
        """True once the request on ``connection`` outlived :attr:`timeout` (its task was
        cancelled for it)."""
        return bool(self._expired) and connection in self._expired

    def end(self, connection: Any) -> bool:
        """The request on ``connection`` is over. True when it failed because it outlived
        :attr:`timeout` and nothing else cancelled its task meanwhile: the cancellation
        is taken back (``Task.uncancel``) and the caller raises :meth:`timed_out`."""
        if self._in_flight.pop(connection, None) is not None or not self._expired:
            return False
        expired = self._expired.pop(connection, None)
        if expired is None:
            return False
        task, cancels = expired[0](), expired[1]
        return task is not None and task.uncancel() <= cancels

    def _sweep(self) -> None:
        in_flight = self._in_flight
        if not in_flight:
            self._sweeping = False
            return
        now = time.monotonic()
        for connection, (deadline, task_ref, cancels) in list(in_flight.items()):
            task = task_ref()
            if task is None or task.done():
                del in_flight[connection]
            elif deadline <= now:
                del in_flight[connection]
                self._expired[connection] = (task_ref, cancels)
                task.cancel()
        asyncio.get_running_loop().call_later(self._sweep_every, self._sweep)

    def timed_out(self) -> RedisTimeoutError:
        """The error for a request that got no answer within :attr:`timeout`."""
        where = "{}:{}".format(self.kwargs.get("host", ""), self.kwargs.get("port", ""))
        return RedisTimeoutError(f"Timeout reading from {where} (socket_timeout={self.timeout})")

    async def get(self) -> Any:
        """Async twin of :meth:`ConnectionPool.get`."""
        while self._idle:
            connection = self._idle.pop()
            try:
                if not await connection.can_read():
                    return connection
            except (OSError, RedisError):
                pass
            await connection.disconnect()
        connection = self.connection_class(**self.kwargs)
        if self.timeout is None:
            await connection.connect()
            return connection
        try:
            async with asyncio.timeout((self.connect_timeout or 0.0) + self.timeout):
                await connection.connect()
        except TimeoutError as exc:
            await connection.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout connecting to server") from exc
        return connection

    async def put(self, connection: Any) -> None:
        """Give back a connection whose replies have all been read."""
        if not self.keep(connection):
            await connection.disconnect()

    def keep(self, connection: Any) -> bool:
        """Keep a connection whose replies have all been read for reuse; ``False`` when
        the pool has idle connections enough (the caller closes it: :meth:`discard`)."""
        if len(self._idle) < self.max_idle:
            self._idle.append(connection)
            return True
        return False

    async def discard(self, connection: Any) -> None:
        """Close a connection that may still have a reply in flight (never reused)."""
        await connection.disconnect()

    async def close(self) -> None:
        """Close the idle connections."""
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.disconnect()


def _connect_within(connection: Any, timeout: float) -> None:
    """Connect ``connection`` taking at most ``timeout`` seconds for the connect and the
    handshake (a stalled server accepts TCP connections but never answers)."""
    saved = connection.socket_timeout, connection.socket_connect_timeout
    bound = max(timeout, 0.001)
    connection.socket_timeout = connection.socket_connect_timeout = bound
    try:
        connection.connect()
    finally:
        connection.socket_timeout, connection.socket_connect_timeout = saved
        sock = getattr(connection, "_sock", None)
        if sock is not None:
            sock.settimeout(saved[0])
