"""Which server holds a key, and the redis-py pools that reach it: a :class:`Server`
(one server's pools), :class:`Routes` and :class:`AsyncRoutes` (one server or a Sentinel's
primary), the routes of each event loop (:class:`LoopRoutes`: redis-py's asyncio clients
and connections belong to the loop that opened them, so each loop gets routes of its own,
closed when it shuts down), and on a Redis Cluster :class:`ClusterRoutes` and
:class:`AsyncClusterRoutes` (a key's server from redis-py's ``RedisCluster`` slot map, kept
current with its own ``move_slot`` and ``initialize``; clients built from seed URLs)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.client
import redis.cluster
import redis.retry
from redis.backoff import NoBackoff
from redis.exceptions import AskError, ConnectionError, MaxConnectionsError, MovedError

from ..tuning import Tuning
from .requests import NotSent, aconnection, aexchange, exchange, pool_full

__all__ = [
    "MAX_IDLE_WAITS",
    "AsyncClusterRoutes",
    "AsyncRoutes",
    "AsyncServer",
    "ClusterRoutes",
    "LoopRoutes",
    "NodeConnections",
    "Routes",
    "Server",
    "async_cluster_from",
    "async_cluster_from_urls",
    "async_routes_for",
    "close_with_loop",
    "cluster_from_urls",
    "no_retry",
]


MAX_IDLE_WAITS = 8
"""Idle connections a server's own pool keeps after a burst of waiters is over."""
MAX_WAITS = 2**31
"""The engine's own pool has no cap (redis-py's pools default to 100): each waiter
holds one connection for its whole wait, and hundreds may wait at once."""


def no_retry() -> redis.retry.Retry:
    """redis-py's retry policy that never retries (for the clients the engine builds)."""
    return redis.retry.Retry(NoBackoff(), 0)


def _own_pool_settings(pool: Any) -> dict[str, Any]:
    """The connection settings of ``pool`` for the engine's own pool beside it, uncapped,
    minus what belongs to ``pool`` alone (its maintenance-notification handler). A
    Sentinel pool's connections keep asking that pool's Sentinels for the primary."""
    kwargs = dict(pool.connection_kwargs)
    kwargs.pop("maint_notifications_pool_handler", None)
    return {"connection_class": pool.connection_class, "max_connections": MAX_WAITS, **kwargs}


def _bounded(settings: dict[str, Any], within: float) -> dict[str, Any]:
    """``settings`` whose connect, handshake and reads take at most ``within`` seconds."""
    for name in ("socket_timeout", "socket_connect_timeout"):
        current = settings.get(name)
        settings[name] = within if current is None else min(current, within)
    return settings


class Server:
    """One server as sync code reaches it: the client's own pool (``requests``), which
    requests never take past its ``max_connections``, and the engine's pool beside it
    (the client's settings, uncapped, each connection's socket timeouts at most
    ``Tuning.renewal_attempt``) for what must not queue for the client's pool: blocking
    waits, which hold a connection for their whole wait, and renewals, due before a lease
    ends."""

    __slots__ = (
        "__weakref__",
        "_freed",
        "_lock",
        "_own",
        "_peak",
        "_queued",
        "_waiting",
        "name",
        "requests",
        "tuning",
    )

    def __init__(self, name: str, requests: redis.ConnectionPool, tuning: Tuning) -> None:
        self.name = name
        self.requests = requests
        self.tuning = tuning
        self._own: redis.ConnectionPool | None = None
        self._waiting = 0
        self._peak = 0
        self._queued = 0
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)

    def __repr__(self) -> str:
        return f"<Server {self.name}>"

    def request(
        self, commands: Sequence[Sequence[Any]], deadline: float | None = None
    ) -> list[Any]:
        """:func:`~.requests.exchange` on the client's pool. When the pool is at its
        ``max_connections``, waits for one of its connections to come free, up to
        ``Tuning.connection_wait`` (then :class:`~.requests.NotSent` naming the cap)."""
        waiting_since = None
        while True:
            try:
                replies = exchange(self.requests, commands, deadline)
            except NotSent as failed:
                if not isinstance(failed.error, MaxConnectionsError):
                    raise
                if waiting_since is None:
                    waiting_since = time.monotonic()
                pause = pool_full(self.requests, waiting_since, self.tuning.connection_wait)
                with self._freed:
                    self._queued += 1
                    self._freed.wait(pause)
                    self._queued -= 1
                continue
            except BaseException:
                self._free()
                raise
            self._free()
            return replies

    def _free(self) -> None:
        if self._queued:  # read unlocked: a request that misses this looks again soon
            with self._freed:
                self._freed.notify()

    def bounded_request(self, commands: Sequence[Sequence[Any]], deadline: float) -> list[Any]:
        """:func:`~.requests.exchange` on the engine's own pool until the monotonic
        ``deadline`` (renewals: a stalled server accepts connections but never answers,
        and the client's socket timeout may be longer than the lease to save)."""
        return exchange(self._own_pool(), commands, deadline)

    def _own_pool(self) -> redis.ConnectionPool:
        own = self._own
        if own is None:
            with self._lock:
                if self._own is None:
                    settings = _own_pool_settings(self.requests)
                    within = self.tuning.renewal_attempt
                    self._own = redis.ConnectionPool(**_bounded(settings, within))
                own = self._own
        return own

    def open_wait(self) -> Any:
        """A connection of the engine's pool, connected (give it back with
        :meth:`close_wait`)."""
        own = self._own_pool()
        with self._lock:
            self._waiting += 1
            self._peak = max(self._peak, self._waiting)
        try:
            return own.get_connection()
        except BaseException:
            self._left(own)
            raise

    def close_wait(self, connection: Any, *, clean: bool) -> None:
        """Give back a wait connection: ``clean`` when every reply to what was written on
        it was read; otherwise it is disconnected first."""
        own = self._own
        assert own is not None
        if not clean:
            connection.disconnect()
        own.release(connection)
        self._left(own)

    def _left(self, own: redis.ConnectionPool) -> None:
        with self._lock:
            self._waiting -= 1
            trim = self._waiting == 0 and self._peak > MAX_IDLE_WAITS
            if trim:
                self._peak = 0
        if trim:  # a burst of waiters is over: do not keep a connection per past waiter
            own.disconnect(inuse_connections=False)

    def reset_idle(self) -> None:
        """Have every idle connection of its pools reconnect (a Sentinel's primary
        changed: each asks the Sentinels again on connect)."""
        for pool in (self.requests, self._own):
            if pool is not None:
                pool.disconnect(inuse_connections=False)

    def subscriber(self) -> redis.client.PubSub:
        """A redis-py ``PubSub`` on a pool of its own (the settings of ``requests``, one
        connection), so that a subscription never takes one of the client's connections;
        the caller closes it (``close()``, then its ``connection_pool.disconnect()``).

        Its connection never reconnects by itself: a read that fails raises at once. The
        caller subscribes again when it wants to; redis-py's retry would open the
        connection again under a thread reading it even when the caller closed it."""
        settings = _own_pool_settings(self.requests)
        settings["max_connections"] = 1
        settings["retry"] = redis.retry.Retry(NoBackoff(), 0, supported_errors=())
        settings["retry_on_error"] = []
        settings["retry_on_timeout"] = False
        client = redis.Redis(connection_pool=redis.ConnectionPool(**settings))
        return client.pubsub()

    def close(self) -> None:
        """Close the idle connections of the engine's pool (``requests`` is its
        client's)."""
        if self._own is not None:
            self._own.disconnect(inuse_connections=False)


class AsyncServer:
    """Async twin of :class:`Server`, for one event loop (the engine's pool has the
    client's settings: the async driver bounds each read itself); ``requests`` is the
    client's pool, or a cluster node's connections (:class:`NodeConnections`)."""

    __slots__ = (
        "__weakref__",
        "_own",
        "_peak",
        "_queued",
        "_waiting",
        "name",
        "requests",
        "tuning",
    )

    def __init__(
        self,
        name: str,
        requests: redis.asyncio.ConnectionPool | NodeConnections,
        tuning: Tuning,
    ) -> None:
        self.name = name
        self.requests = requests
        self.tuning = tuning
        self._own: redis.asyncio.ConnectionPool | None = None
        self._waiting = 0
        self._peak = 0
        # Requests waiting for a connection of the client's pool, first come first woken.
        self._queued: collections.deque[asyncio.Future[None]] = collections.deque()

    def __repr__(self) -> str:
        return f"<AsyncServer {self.name}>"

    async def request(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Async twin of :meth:`Server.request`."""
        waiting_since = None
        while True:
            try:
                replies = await aexchange(self.requests, commands)
            except NotSent as failed:
                if not isinstance(failed.error, MaxConnectionsError):
                    raise
                if waiting_since is None:
                    waiting_since = time.monotonic()
                pause = pool_full(self.requests, waiting_since, self.tuning.connection_wait)
                freed = asyncio.get_running_loop().create_future()
                self._queued.append(freed)
                try:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(pause):
                            await freed
                finally:
                    with contextlib.suppress(ValueError):  # gone: _free woke it
                        self._queued.remove(freed)
                continue
            except BaseException:
                self._free()
                raise
            self._free()
            return replies

    def _free(self) -> None:
        while self._queued:
            freed = self._queued.popleft()
            if not freed.done():
                freed.set_result(None)
                return

    async def bounded_request(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Async twin of :meth:`Server.bounded_request` (the caller bounds it with
        ``asyncio.timeout``)."""
        return await aexchange(self._own_pool(), commands)

    def _own_pool(self) -> redis.asyncio.ConnectionPool:
        if self._own is None:
            self._own = redis.asyncio.ConnectionPool(**_own_pool_settings(self.requests))
        return self._own

    async def open_wait(self) -> Any:
        """Async twin of :meth:`Server.open_wait`."""
        own = self._own_pool()
        self._waiting += 1
        self._peak = max(self._peak, self._waiting)
        try:
            return await aconnection(own)
        except BaseException:
            await self._left(own)
            raise

    async def close_wait(self, connection: Any, *, clean: bool) -> None:
        """Async twin of :meth:`Server.close_wait`."""
        own = self._own
        assert own is not None
        if not clean:
            await connection.disconnect(nowait=True)
        await own.release(connection)
        await self._left(own)

    async def _left(self, own: redis.asyncio.ConnectionPool) -> None:
        self._waiting -= 1
        if self._waiting == 0 and self._peak > MAX_IDLE_WAITS:
            self._peak = 0
            await own.disconnect(inuse_connections=False)

    async def reset_idle(self) -> None:
        """Async twin of :meth:`Server.reset_idle`."""
        for pool in (self.requests, self._own):
            if pool is not None:
                await pool.disconnect(inuse_connections=False)

    async def aclose(self) -> None:
        """Close the engine's pool (``requests`` is its client's)."""
        if self._own is not None:
            await self._own.aclose()


class Routes:
    """Where keys live, for sync code: one server, or a Redis Cluster's nodes."""

    is_cluster = False

    def __init__(self, client: redis.Redis, tuning: Tuning) -> None:
        pool = client.connection_pool
        self.server = Server(_pool_name(pool), pool, tuning)

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
        redirect of ``kind`` (:meth:`~.requests.Routing.refused`): ``"moved"`` (the slot map
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

    def __init__(self, client: redis.asyncio.Redis, tuning: Tuning, *, owned: bool) -> None:
        pool = client.connection_pool
        self.server = AsyncServer(_pool_name(pool), pool, tuning)
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


def close_with_loop(
    loop: asyncio.AbstractEventLoop,
    close: Callable[[], Awaitable[None]],
) -> AsyncGenerator[None, None]:
    """Run ``close()`` when ``loop`` shuts down; returns what the caller keeps alive for as
    long as the loop's connections may need closing.

    An event loop has no shutdown callback, but ``shutdown_asyncgens()`` (called by
    ``asyncio.run``, asgiref's ``async_to_sync`` and test runners) finalizes every async
    generator started on it, so one is started here whose ``finally`` closes what the loop
    opened: redis-py's asyncio connections belong to their loop and cannot be closed from
    another one.
    """

    async def closer() -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await close()

    generator = closer()
    # Run it to its first `yield` (it awaits nothing before), which registers it with the
    # running loop's async-generator hooks.
    with contextlib.suppress(StopIteration):
        generator.asend(None).send(None)
    assert loop is asyncio.get_running_loop()
    return generator


class LoopRoutes:
    """The :class:`AsyncRoutes` of each event loop, made by ``make()`` when a loop first
    needs them and closed when it shuts down (or by :meth:`aclose`)."""

    def __init__(self, make: Callable[[], AsyncRoutes]) -> None:
        self.make = make
        self._routes: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[AsyncRoutes, asyncio.Future[None], Any]
        ] = weakref.WeakKeyDictionary()

    async def get(self) -> AsyncRoutes:
        """The running loop's routes (its cluster slot map read)."""
        loop = asyncio.get_running_loop()
        while True:
            entry = self._routes.get(loop)
            if entry is None:
                break
            routes, started, _ = entry
            if not started.done():
                # Another task is reading the slot map: wait for it (and if it failed,
                # try again here). asyncio.wait never raises for what it waits on: a
                # CancelledError from it is this task's own, and goes on up.
                await asyncio.wait({started})
            if started.cancelled():
                continue
            return routes
        routes = self.make()
        started = loop.create_future()
        closer = close_with_loop(loop, lambda: self._closed(loop, routes))
        self._routes[loop] = (routes, started, closer)
        try:
            await routes.prepare()
        except BaseException:
            self._routes.pop(loop, None)
            started.cancel()
            await routes.aclose()
            raise
        started.set_result(None)
        return routes

    async def _closed(self, loop: asyncio.AbstractEventLoop, routes: AsyncRoutes) -> None:
        entry = self._routes.get(loop)
        if entry is not None and entry[0] is routes:
            del self._routes[loop]
        await routes.aclose()

    async def aclose(self) -> None:
        """Close the running loop's routes."""
        entry = self._routes.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry[0].aclose()

    def forget(self) -> None:
        """Forget every loop's routes without closing them (a forked child must not touch
        its parent's sockets)."""
        self._routes = weakref.WeakKeyDictionary()


class ClusterRoutes(Routes):
    """:class:`Routes` of a Redis Cluster, on a ``redis.cluster.RedisCluster``'s slot map.
    ``make`` builds that client when first needed (reading the slot map is I/O)."""

    is_cluster = True

    def __init__(
        self, make: Callable[[], redis.cluster.RedisCluster], tuning: Tuning, *, owned: bool
    ) -> None:
        self._make = make
        self._tuning = tuning
        self._owned = owned
        self._client: redis.cluster.RedisCluster | None = None
        self._servers: dict[str, Server] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> redis.cluster.RedisCluster:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make()
                client = self._client
        return client

    def _server(self, node: Any) -> Server:
        pool = self.client.get_redis_connection(node).connection_pool
        server = self._servers.get(node.name)
        if server is None:
            with self._lock:
                server = self._servers.setdefault(node.name, Server(node.name, pool, self._tuning))
        if server.requests is not pool:  # redis-py made the node's client anew
            server.requests = pool
        return server

    def for_key(self, key: str) -> Server:
        return self._server(self.client.get_node_from_key(key))

    def prepare(self) -> None:
        self.client  # noqa: B018 - builds the client, which reads the slot map

    def ready_for_key(self, key: str) -> Server | None:
        if self._client is None:
            return None
        return self._server(self._client.get_node_from_key(key))

    def primaries(self) -> list[Server]:
        return [self._server(node) for node in self.client.get_primaries()]

    def moved(self, error: MovedError) -> None:
        self.client.nodes_manager.move_slot(error)

    def asked(self, error: AskError) -> Server:
        node = self.client.get_node(host=error.host, port=error.port)
        if node is None:  # a node the map does not know yet
            self.refresh()
            node = self.client.get_node(host=error.host, port=error.port)
            if node is None:
                raise error
        return self._server(node)

    def refresh(self) -> None:
        if self._client is not None:
            self._client.nodes_manager.initialize()

    def reset_idle(self) -> None:
        for server in list(self._servers.values()):
            server.requests.disconnect(inuse_connections=False)

    def close(self) -> None:
        for server in list(self._servers.values()):
            server.close()
        if self._owned and self._client is not None:
            self._client.close()
            self._client = None


class NodeConnections:
    """A ``redis.asyncio.cluster.RedisCluster`` node's own connections, as the pool of an
    :class:`AsyncServer`: the engine's requests to the node share the client's
    connections and its ``max_connections`` (``ClusterNode.acquire_connection`` and
    ``release``; the node is looked up by name each time, as a slot map refresh may
    replace it)."""

    __slots__ = ("_cluster", "name")

    def __init__(self, cluster: redis.asyncio.cluster.RedisCluster, name: str) -> None:
        self._cluster = cluster
        self.name = name

    def _found(self) -> Any:
        """The node now, or ``None`` once it left the cluster."""
        return self._cluster.get_node(node_name=self.name)

    def _node(self) -> Any:
        node = self._found()
        if node is None:
            raise ConnectionError(f"{self.name} left the cluster")
        return node

    @property
    def connection_class(self) -> Any:
        return self._node().connection_class

    @property
    def connection_kwargs(self) -> dict[str, Any]:
        return self._node().connection_kwargs

    @property
    def max_connections(self) -> int:
        return int(self._node().max_connections)

    async def get_connection(self) -> Any:
        connection = self._node().acquire_connection()  # MaxConnectionsError at the cap
        try:
            if not connection.is_connected:
                await connection.connect()
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: Any) -> None:
        """Give ``connection`` back to its node; closed instead when the node left the
        cluster meanwhile (nothing would close it then)."""
        node = self._found()
        if node is None:
            await connection.disconnect()
        else:
            node.release(connection)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        """Close the node's idle connections (in-use ones are the client's to close)."""
        node = self._found()
        if node is not None:
            await node.disconnect_free_connections()


class AsyncClusterRoutes(AsyncRoutes):
    """:class:`AsyncRoutes` of a Redis Cluster, on a ``redis.asyncio.cluster.RedisCluster``'s
    slot map. Each node's requests go through that node's own connections
    (:class:`NodeConnections`)."""

    is_cluster = True

    def __init__(
        self, client: redis.asyncio.cluster.RedisCluster, tuning: Tuning, *, owned: bool
    ) -> None:
        self._cluster = client
        self._tuning = tuning
        self._owned = owned
        self._servers: dict[str, AsyncServer] = {}

    async def prepare(self) -> None:
        await self._cluster.initialize()

    def _server(self, node: Any) -> AsyncServer:
        server = self._servers.get(node.name)
        if server is None:
            connections = NodeConnections(self._cluster, node.name)
            server = self._servers[node.name] = AsyncServer(node.name, connections, self._tuning)
        return server

    def for_key(self, key: str) -> AsyncServer:
        return self._server(self._cluster.get_node_from_key(key))

    def primaries(self) -> list[AsyncServer]:
        return [self._server(node) for node in self._cluster.get_primaries()]

    async def moved(self, error: MovedError) -> None:
        updated = self._cluster.nodes_manager.move_slot(error)
        if inspect.isawaitable(updated):  # a coroutine from redis-py 8 on; 7.4 updates at once
            await updated

    def asked(self, error: AskError) -> AsyncServer:
        node = self._cluster.get_node(host=error.host, port=error.port)
        if node is None:
            raise error
        return self._server(node)

    async def refresh(self) -> None:
        await self._cluster.nodes_manager.initialize()

    async def reset_idle(self) -> None:
        for server in list(self._servers.values()):
            await server.requests.disconnect(inuse_connections=False)

    async def aclose(self) -> None:
        for server in list(self._servers.values()):
            await server.aclose()
        if self._owned:
            await self._cluster.aclose()


def async_routes_for(client: Any, tuning: Tuning, *, owned: bool) -> AsyncRoutes:
    """The async routes of ``client``, a ``redis.asyncio.Redis`` or an asyncio
    ``RedisCluster``."""
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        return AsyncClusterRoutes(client, tuning, owned=owned)
    if isinstance(client, redis.asyncio.Redis):
        return AsyncRoutes(client, tuning, owned=owned)
    raise TypeError(
        "async_client must be (or make) a redis.asyncio.Redis or a "
        f"redis.asyncio.cluster.RedisCluster, not {type(client).__name__}"
    )


_URL_ONLY = ("host", "port", "connection_class", "path", "url")


def _url_options(url: str) -> tuple[tuple[str, int], dict[str, Any]]:
    """The address and the client options (credentials, TLS, timeouts) of a node URL."""
    options = redis.connection.parse_url(url)
    address = (str(options.get("host") or "localhost"), int(options.get("port") or 6379))
    tls = options.get("connection_class") is redis.connection.SSLConnection
    options = {k: v for k, v in options.items() if k not in _URL_ONLY}
    if tls:
        options["ssl"] = True
    return address, options


def cluster_from_urls(urls: Sequence[str]) -> redis.cluster.RedisCluster:
    """A ``RedisCluster`` on seed node ``urls`` (options from the first), which never
    retries a command by itself."""
    addresses = [_url_options(url)[0] for url in urls]
    options = _url_options(urls[0])[1]
    return redis.cluster.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(host, port) for host, port in addresses],
        retry=no_retry(),
        **options,
    )


def async_cluster_from(
    addresses: Sequence[tuple[str, int]], options: dict[str, Any]
) -> redis.asyncio.cluster.RedisCluster:
    """An asyncio ``RedisCluster`` seeded with ``addresses``, with the ``options`` it
    takes (others are the sync client's own: pools, retries, event dispatchers)."""
    accepted = _async_cluster_arguments()
    return redis.asyncio.cluster.RedisCluster(
        startup_nodes=[redis.asyncio.cluster.ClusterNode(host, port) for host, port in addresses],
        retry=redis.asyncio.retry.Retry(NoBackoff(), 0),
        **{k: v for k, v in options.items() if k in accepted},
    )


def async_cluster_from_urls(urls: Sequence[str]) -> redis.asyncio.cluster.RedisCluster:
    """Async twin of :func:`cluster_from_urls`."""
    return async_cluster_from([_url_options(url)[0] for url in urls], _url_options(urls[0])[1])


_NOT_FORWARDED = frozenset(
    {"self", "host", "port", "startup_nodes", "retry", "event_dispatcher", "policy_resolver"}
)


def _async_cluster_arguments() -> frozenset[str]:
    parameters = inspect.signature(redis.asyncio.cluster.RedisCluster.__init__).parameters
    return frozenset(parameters) - _NOT_FORWARDED
