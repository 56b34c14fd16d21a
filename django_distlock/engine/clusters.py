"""Redis Cluster routes: a key's server from redis-py's ``RedisCluster`` slot map (sync,
and asyncio for each event loop), kept current with its own ``move_slot`` and
``initialize``; and those clients built from seed node URLs."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.cluster
from redis.backoff import NoBackoff
from redis.exceptions import AskError, MovedError

from .servers import AsyncRoutes, AsyncServer, Routes, Server, no_retry

__all__ = [
    "AsyncClusterRoutes",
    "ClusterRoutes",
    "async_cluster_from",
    "async_cluster_from_urls",
    "async_routes_for",
    "cluster_from_urls",
]


class ClusterRoutes(Routes):
    """:class:`Routes` of a Redis Cluster, on a ``redis.cluster.RedisCluster``'s slot map.
    ``make`` builds that client when first needed (reading the slot map is I/O)."""

    is_cluster = True

    def __init__(self, make: Callable[[], redis.cluster.RedisCluster], *, owned: bool) -> None:
        self._make = make
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
                server = self._servers.setdefault(node.name, Server(node.name, pool))
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


class AsyncClusterRoutes(AsyncRoutes):
    """:class:`AsyncRoutes` of a Redis Cluster, on a ``redis.asyncio.cluster.RedisCluster``'s
    slot map. Each node's requests go through a ``redis.asyncio.ConnectionPool`` made
    from that node's connection class and settings."""

    is_cluster = True

    def __init__(self, client: redis.asyncio.cluster.RedisCluster, *, owned: bool) -> None:
        self._cluster = client
        self._owned = owned
        self._servers: dict[str, AsyncServer] = {}

    async def prepare(self) -> None:
        await self._cluster.initialize()

    def _server(self, node: Any) -> AsyncServer:
        server = self._servers.get(node.name)
        if server is None:
            pool = redis.asyncio.ConnectionPool(
                connection_class=node.connection_class, **node.connection_kwargs
            )
            server = self._servers[node.name] = AsyncServer(node.name, pool, owned=True)
        return server

    def for_key(self, key: str) -> AsyncServer:
        return self._server(self._cluster.get_node_from_key(key))

    def primaries(self) -> list[AsyncServer]:
        return [self._server(node) for node in self._cluster.get_primaries()]

    async def moved(self, error: MovedError) -> None:
        await self._cluster.nodes_manager.move_slot(error)

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


def async_routes_for(client: Any, *, owned: bool) -> AsyncRoutes:
    """The async routes of ``client``, a ``redis.asyncio.Redis`` or an asyncio
    ``RedisCluster``."""
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        return AsyncClusterRoutes(client, owned=owned)
    if isinstance(client, redis.asyncio.Redis):
        return AsyncRoutes(client, owned=owned)
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
