"""Which server holds a key, and the redis-py pools that reach it.

Every request the engine makes goes through redis-py: its connection pools, its
connections' ``send_packed_command``/``read_response``, and for a Redis Cluster its slot
map (``RedisCluster.get_node_from_key``), kept current with its own ``move_slot`` and
``initialize``. This module only decides *which* pool:

- a :class:`Server` is one server (a primary) with two redis-py pools: ``requests``, the
  pool every request uses (the client's own pool on a single server or a Sentinel's
  primary; the cluster client's pool of the node), and ``waits``, a pool of the same
  class and settings used for blocking waits only, so that hundreds of waiters each
  holding a connection for their whole wait never exhaust the application's pool;
- :class:`Routes` (sync) and :class:`AsyncRoutes` (one per event loop) map a key to its
  server and follow the cluster's redirects.

redis-py's asyncio connections belong to the event loop that opened them, so each loop
gets routes of its own (:mod:`.loop_routes`); the sync pools are redis-py's, which are
fork-safe by themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.client
import redis.cluster
import redis.retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, MaxConnectionsError, MovedError

from .requests import NotSent, aconnection, aexchange, exchange

__all__ = [
    "MAX_IDLE_WAITS",
    "AsyncRoutes",
    "AsyncServer",
    "Routes",
    "Server",
    "no_retry",
]

MAX_IDLE_WAITS = 8
"""Idle connections a server's wait pool keeps after a burst of waiters is over."""
MAX_WAITS = 2**31
"""The wait pool has no cap of its own (redis-py's pools default to 100): each waiter
holds one connection for its whole wait, and hundreds may wait at once."""


def no_retry() -> redis.retry.Retry:
    """redis-py's retry policy that never retries (for the clients the engine builds)."""
    return redis.retry.Retry(NoBackoff(), 0)


def _wait_pool_settings(pool: Any) -> dict[str, Any]:
    """The connection settings of ``pool`` for a pool of blocking waits beside it, minus
    what belongs to ``pool`` alone (its maintenance-notification handler). A Sentinel
    pool's connections keep asking that pool's Sentinels for the primary."""
    kwargs = dict(pool.connection_kwargs)
    kwargs.pop("maint_notifications_pool_handler", None)
    return {"connection_class": pool.connection_class, "max_connections": MAX_WAITS, **kwargs}


class Server:
    """One server as sync code reaches it (see the module docstring)."""

    __slots__ = (
        "__weakref__",
        "_bounded",
        "_lock",
        "_peak",
        "_waiting",
        "_waits",
        "name",
        "requests",
    )

    def __init__(self, name: str, requests: redis.ConnectionPool) -> None:
        self.name = name
        self.requests = requests
        self._waits: redis.ConnectionPool | None = None
        self._bounded: redis.ConnectionPool | None = None
        self._waiting = 0
        self._peak = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Server {self.name}>"

    def request(
        self, commands: Sequence[Sequence[Any]], deadline: float | None = None
    ) -> list[Any]:
        """:func:`~.requests.exchange` on the request pool; on the wait pool when the
        client's pool is at its ``max_connections`` (hundreds of waiters re-checking at
        once must not fail with pool errors)."""
        try:
            return exchange(self.requests, commands, deadline)
        except NotSent as failed:
            if not isinstance(failed.error, MaxConnectionsError):
                raise
        return exchange(self._wait_pool(), commands, deadline)

    def bounded_request(
        self, commands: Sequence[Sequence[Any]], deadline: float, connect_within: float
    ) -> list[Any]:
        """:func:`~.requests.exchange` until the monotonic ``deadline``, on a pool whose
        connections take at most ``connect_within`` seconds to connect and shake hands
        (renewals: a stalled server accepts connections but never answers, and the
        client's socket timeout may be longer than the lease to save)."""
        pool = self._bounded
        if pool is None:
            with self._lock:
                if self._bounded is None:
                    settings = _wait_pool_settings(self.requests)
                    settings["socket_timeout"] = settings["socket_connect_timeout"] = connect_within
                    self._bounded = redis.ConnectionPool(**settings)
                pool = self._bounded
        return exchange(pool, commands, deadline)

    def _wait_pool(self) -> redis.ConnectionPool:
        waits = self._waits
        if waits is None:
            with self._lock:
                if self._waits is None:
                    self._waits = redis.ConnectionPool(**_wait_pool_settings(self.requests))
                waits = self._waits
        return waits

    def open_wait(self) -> Any:
        """A connection of the wait pool, connected (give it back with :meth:`close_wait`)."""
        waits = self._wait_pool()
        with self._lock:
            self._waiting += 1
            self._peak = max(self._peak, self._waiting)
        try:
            return waits.get_connection()
        except BaseException:
            self._left(waits)
            raise

    def close_wait(self, connection: Any, *, clean: bool) -> None:
        """Give back a wait connection: ``clean`` when every reply to what was written on
        it was read; otherwise it is disconnected first."""
        waits = self._waits
        assert waits is not None
        if not clean:
            connection.disconnect()
        waits.release(connection)
        self._left(waits)

    def _left(self, waits: redis.ConnectionPool) -> None:
        with self._lock:
            self._waiting -= 1
            trim = self._waiting == 0 and self._peak > MAX_IDLE_WAITS
            if trim:
                self._peak = 0
        if trim:  # a burst of waiters is over: do not keep a connection per past waiter
            waits.disconnect(inuse_connections=False)

    def reset_idle(self) -> None:
        """Have every idle connection of its pools reconnect (a Sentinel's primary
        changed: each asks the Sentinels again on connect)."""
        for pool in (self.requests, self._waits, self._bounded):
            if pool is not None:
                pool.disconnect(inuse_connections=False)

    def subscriber(self) -> redis.client.PubSub:
        """A redis-py ``PubSub`` on a pool of its own (the settings of ``requests``, one
        connection), so that a subscription never takes one of the client's connections;
        the caller closes it (``close()``, then its ``connection_pool.disconnect()``)."""
        settings = _wait_pool_settings(self.requests)
        settings["max_connections"] = 1
        client = redis.Redis(connection_pool=redis.ConnectionPool(**settings))
        return client.pubsub()

    def close(self) -> None:
        """Close the idle connections of the engine's pools (``requests`` is its
        client's)."""
        for pool in (self._waits, self._bounded):
            if pool is not None:
                pool.disconnect(inuse_connections=False)


class AsyncServer:
    """Async twin of :class:`Server`, for one event loop. ``owned`` pools (a cluster
    node's, made by the engine) are closed with it."""

    __slots__ = ("__weakref__", "_owned", "_peak", "_waiting", "_waits", "name", "requests")

    def __init__(
        self, name: str, requests: redis.asyncio.ConnectionPool, *, owned: bool = False
    ) -> None:
        self.name = name
        self.requests = requests
        self._owned = owned
        self._waits: redis.asyncio.ConnectionPool | None = None
        self._waiting = 0
        self._peak = 0

    def __repr__(self) -> str:
        return f"<AsyncServer {self.name}>"

    async def request(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Async twin of :meth:`Server.request`."""
        try:
            return await aexchange(self.requests, commands)
        except NotSent as failed:
            if not isinstance(failed.error, MaxConnectionsError):
                raise
        return await aexchange(self._wait_pool(), commands)

    def _wait_pool(self) -> redis.asyncio.ConnectionPool:
        if self._waits is None:
            self._waits = redis.asyncio.ConnectionPool(**_wait_pool_settings(self.requests))
        return self._waits

    async def open_wait(self) -> Any:
        """Async twin of :meth:`Server.open_wait`."""
        waits = self._wait_pool()
        self._waiting += 1
        self._peak = max(self._peak, self._waiting)
        try:
            return await aconnection(waits)
        except BaseException:
            await self._left(waits)
            raise

    async def close_wait(self, connection: Any, *, clean: bool) -> None:
        """Async twin of :meth:`Server.close_wait`."""
        waits = self._waits
        assert waits is not None
        if not clean:
            await connection.disconnect(nowait=True)
        await waits.release(connection)
        await self._left(waits)

    async def _left(self, waits: redis.asyncio.ConnectionPool) -> None:
        self._waiting -= 1
        if self._waiting == 0 and self._peak > MAX_IDLE_WAITS:
            self._peak = 0
            await waits.disconnect(inuse_connections=False)

    async def reset_idle(self) -> None:
        """Async twin of :meth:`Server.reset_idle`."""
        for pool in (self.requests, self._waits):
            if pool is not None:
                await pool.disconnect(inuse_connections=False)

    async def aclose(self) -> None:
        """Close the wait pool, and the request pool when the engine made it."""
        if self._waits is not None:
            await self._waits.aclose()
        if self._owned:
            await self.requests.aclose()


class Routes:
    """Where keys live, for sync code: one server, or a Redis Cluster's nodes."""

    is_cluster = False

    def __init__(self, client: redis.Redis) -> None:
        pool = client.connection_pool
        self.server = Server(_pool_name(pool), pool)

    def for_key(self, key: str) -> Server:
        """The server holding ``key``."""
        return self.server

    def ready_for_key(self, key: str) -> Server | None:
        """:meth:`for_key` when no I/O is needed to know it (else ``None``)."""
        return self.server

    def prepare(self) -> None:
        """Read what must be known before the first request (a cluster's slot map), so
        that no request's time includes it (a lease counts from when its acquire is
        sent)."""

    def primaries(self) -> list[Server]:
        """Every server keys may live on, once each."""
        return [self.server]

    def moved(self, error: MovedError) -> None:
        """Record a ``MOVED`` redirect (only a cluster follows one)."""

    def asked(self, error: AskError) -> Server:
        """The server an ``ASK`` redirect names (only a cluster follows one)."""
        raise error

    def redirected(self, key: str, server: Server, error: Any, kind: str) -> Server:
        """Where a request on ``key`` goes after ``server`` refused it with ``error``, a
        redirect of ``kind`` (:func:`~.requests.redirect_of`): ``"moved"`` (the slot map
        is updated), ``"ask"`` (that one request only) or ``"again"`` (the same server)."""
        if kind == "moved":
            self.moved(error)
            return self.for_key(key)
        if kind == "ask":
            return self.asked(error)
        return server

    def refresh(self) -> None:
        """Read again where keys live (after a server could not be reached)."""

    def reset_idle(self) -> None:
        """Have the idle connections reconnect (a Sentinel's primary changed)."""
        self.server.reset_idle()

    def close(self) -> None:
        """Close what the engine opened itself."""
        self.server.close()


class AsyncRoutes:
    """Async twin of :class:`Routes`, for one event loop, on ``client`` (a
    ``redis.asyncio.Redis``; ``owned``: made by the engine for this loop, closed with it)."""

    is_cluster = False

    def __init__(self, client: redis.asyncio.Redis, *, owned: bool) -> None:
        pool = client.connection_pool
        self.server = AsyncServer(_pool_name(pool), pool)
        self._client = client
        self._owned = owned

    async def prepare(self) -> None:
        """Async twin of :meth:`Routes.prepare`."""

    def for_key(self, key: str) -> AsyncServer:
        """The server holding ``key``."""
        return self.server

    def primaries(self) -> list[AsyncServer]:
        """Every server keys may live on, once each."""
        return [self.server]

    async def moved(self, error: MovedError) -> None:
        """Record a ``MOVED`` redirect (only a cluster follows one)."""

    def asked(self, error: AskError) -> AsyncServer:
        """The server an ``ASK`` redirect names (only a cluster follows one)."""
        raise error

    async def redirected(self, key: str, server: AsyncServer, error: Any, kind: str) -> AsyncServer:
        """Async twin of :meth:`Routes.redirected`."""
        if kind == "moved":
            await self.moved(error)
            return self.for_key(key)
        if kind == "ask":
            return self.asked(error)
        return server

    async def refresh(self) -> None:
        """Read again where keys live (after a server could not be reached)."""

    async def reset_idle(self) -> None:
        """Have the idle connections reconnect (a Sentinel's primary changed)."""
        await self.server.reset_idle()

    async def aclose(self) -> None:
        """Close what the engine opened on this loop."""
        await self.server.aclose()
        if self._owned:
            # Its pool too, even one passed in: it served this loop alone.
            await self._client.aclose(close_connection_pool=True)


def _pool_name(pool: Any) -> str:
    kwargs = pool.connection_kwargs
    service = getattr(pool, "service_name", None)
    if service is not None:
        return f"sentinel service {service}"
    return "{}:{}".format(kwargs.get("host", "localhost"), kwargs.get("port", 6379))
