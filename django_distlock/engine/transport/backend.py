"""Where locks live: the Redis clients, the key prefix and the defaults of a deployment."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from .. import process
from ..exceptions import LockError
from ..keys import validate_prefix, validate_replicas, validate_seconds
from ..protocol.hold import Event, Observer
from ..tuning import Tuning, ms
from .replication import ReplicaCounts
from .routes import (
    AsyncRoutes,
    ClusterRoutes,
    LoopRoutes,
    Routes,
    Server,
    async_cluster_from,
    async_cluster_from_urls,
    async_routes_for,
    cluster_from_urls,
)

__all__ = ["Backend"]

logger = logging.getLogger("django_distlock")


AsyncClientSource = (
    redis.asyncio.Redis
    | redis.asyncio.cluster.RedisCluster
    | Callable[[], redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster]
)


class Backend:
    """The Redis a set of locks lives on, and their defaults.

    Where the locks live, one of:

    - ``client``: a ``redis.Redis`` (one server, or the primary of a
      ``redis.sentinel.Sentinel(...).master_for(...)`` client), and/or ``async_client``:
      a ``redis.asyncio.Redis``, or a callable that makes one (called once per event
      loop: redis-py's asyncio clients belong to the loop that uses them; what it makes,
      its connection pool included, is closed when that loop shuts down; an instance
      serves one loop and is the caller's to close);
    - ``cluster``: seed node URLs of a Redis/Valkey Cluster
      (``["redis://10.0.0.1:7000", ...]``, credentials and TLS taken from the first), or a
      ``redis.cluster.RedisCluster`` as ``client`` (and, optionally, an asyncio
      ``RedisCluster`` or a callable making one as ``async_client``).

    Requests go through the clients' own redis-py pools (see :mod:`.routes`), never past
    their ``max_connections``: at the cap a request waits for a connection to come free
    (``Tuning.connection_wait``). Blocking waits and renewals go through a pool of the
    same settings beside each, so that waiters never exhaust the application's pool and
    renewals never queue for it. The clients passed in are the caller's to close.

    Keys are written under ``prefix`` only. ``timeout``, ``auto_renew`` and
    ``min_replicas`` are the defaults of locks that do not set them (``replica_timeout``:
    seconds an acquire waits for replicas to acknowledge it; ``min_replicas="auto"``
    waits for one replica where the lock's primary has one, see :mod:`.replication`).
    ``observer`` is called with an :class:`Event` for every lock event; it must be quick
    and its errors are logged, never raised into the lock.

    >>> import redis
    >>> backend = Backend(redis.Redis(), prefix="myapp:locks:")
    """

    def __init__(
        self,
        client: redis.Redis | redis.cluster.RedisCluster | None = None,
        *,
        async_client: AsyncClientSource | None = None,
        cluster: Sequence[str] | None = None,
        prefix: str = "distlock:",
        timeout: float = 30.0,
        auto_renew: bool = True,
        min_replicas: int | str = 0,
        replica_timeout: float = 0.1,
        observer: Observer | None = None,
        tuning: Tuning | None = None,
    ) -> None:
        if client is None and async_client is None and cluster is None:
            raise TypeError("Backend needs a client, an async_client, a cluster, or both clients")
        if client is not None and not isinstance(client, redis.Redis | redis.cluster.RedisCluster):
            raise TypeError(
                f"client must be a redis.Redis or a redis.cluster.RedisCluster, "
                f"not {type(client).__name__}"
            )
        if cluster is not None and (isinstance(cluster, str) or not cluster):
            raise TypeError("cluster must be a non-empty list of seed node URLs")
        if not isinstance(auto_renew, bool):
            raise TypeError(f"auto_renew must be a bool, not {type(auto_renew).__name__}")
        if observer is not None and not callable(observer):
            raise TypeError("observer must be callable")
        self.prefix = validate_prefix(prefix)
        self.timeout = validate_seconds(timeout, "timeout")
        self.auto_renew = auto_renew
        self.min_replicas = validate_replicas(min_replicas, "min_replicas")
        self.replica_timeout = validate_seconds(replica_timeout, "replica_timeout")
        self.observer = observer
        self.tuning: Tuning = tuning if tuning is not None else Tuning()
        self.replica_counts = ReplicaCounts(self.tuning)
        """What ``min_replicas="auto"`` knows of each primary's replicas."""
        self._client = client
        self.is_cluster = (
            cluster is not None
            or isinstance(client, redis.cluster.RedisCluster)
            or isinstance(async_client, redis.asyncio.cluster.RedisCluster)
        )
        """True when the locks live on a Redis Cluster (known without any I/O; an
        ``async_client`` given as a factory is taken for one server)."""
        self._routes = _sync_routes(client, cluster, self.tuning)
        self._loop_routes = LoopRoutes(
            _async_routes_maker(client, async_client, cluster, self.tuning)
        )
        self._on_close: list[Callable[[], None]] = []
        _backends.add(self)

    def __repr__(self) -> str:
        kind = "cluster" if self.is_cluster else "server"
        return f"<Backend prefix={self.prefix!r} {kind}>"

    def acknowledgement(self, min_replicas: int | str | None) -> tuple[int | str, int] | None:
        """The ``WAIT`` an acquire asks for (replica count, timeout in ms) given a lock's
        ``min_replicas`` (``None``: this backend's), or ``None`` for no ``WAIT``."""
        count = self.min_replicas if min_replicas is None else min_replicas
        return (count, ms(self.replica_timeout)) if count else None

    @property
    def client(self) -> redis.Redis | redis.cluster.RedisCluster:
        """The sync client given (``LockError`` if this backend has none)."""
        if self._client is None:
            raise LockError("this backend has no sync client: pass Backend(client=...)")
        return self._client

    def routes(self) -> Routes:
        """Where keys live, for sync code (``LockError`` without a sync client)."""
        routes = self._routes
        if routes is None:
            raise LockError("this backend has no sync client: pass Backend(client=...)")
        return routes

    async def aroutes(self) -> AsyncRoutes:
        """Where keys live, for the running event loop."""
        return await self._loop_routes.get()

    def server_now(self, key: str) -> Server | None:
        """The sync server holding ``key`` when that is known without I/O, else ``None``."""
        routes = self._routes
        return None if routes is None else routes.ready_for_key(key)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Have ``callback()`` called once by the next :meth:`close` or :meth:`aclose`:
        what the engine keeps per backend beside its pools (the force-release
        subscription) ends with them."""
        self._on_close.append(callback)

    def _closing(self) -> None:
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.exception("django-distlock: closing %r failed", self)

    def close(self) -> None:
        """Close the sync connections this backend opened itself (the clients passed in
        are the caller's to close), and its force-release subscription."""
        self._closing()
        if self._routes is not None:
            self._routes.close()

    async def aclose(self) -> None:
        """Close the connections this backend opened on the running event loop (closed
        anyway when the loop shuts down through ``asyncio.run``), and its force-release
        subscription (opened again by the next auto-renewed hold)."""
        self._closing()
        await self._loop_routes.aclose()

    def _forget_after_fork(self) -> None:
        # The parent's asyncio connections stay the parent's: they are neither used nor
        # closed here (closing one needs the parent's loop), only forgotten. redis-py's
        # sync pools reset themselves in a child.
        _inherited.append(self._loop_routes)
        self._loop_routes = LoopRoutes(self._loop_routes.make)

    def emit(self, event: Event) -> None:
        """Tell the observer about ``event``; never raises."""
        observer = self.observer
        if observer is None:
            return
        if not event.at:
            object.__setattr__(event, "at", time.time())
        try:
            observer(event)
        except Exception:
            logger.exception("django-distlock observer failed on %s event", event.kind)


def _sync_routes(client: Any, cluster: Sequence[str] | None, tuning: Tuning) -> Routes | None:
    if cluster is not None:
        urls = list(cluster)
        return ClusterRoutes(lambda: cluster_from_urls(urls), tuning, owned=True)
    if isinstance(client, redis.cluster.RedisCluster):
        return ClusterRoutes(lambda: client, tuning, owned=False)
    if client is not None:
        return Routes(client, tuning)
    return None


def _async_routes_maker(
    client: Any,
    async_client: AsyncClientSource | None,
    cluster: Sequence[str] | None,
    tuning: Tuning,
) -> Callable[[], AsyncRoutes]:
    """How to make an event loop's routes: from the async client (a factory is called
    for each loop; what it makes is closed with the loop), or a cluster's seeds."""
    if async_client is not None:
        if callable(async_client) and not isinstance(
            async_client, redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
        ):
            factory = async_client
            return lambda: async_routes_for(factory(), tuning, owned=True)
        instance = async_client
        return lambda: async_routes_for(instance, tuning, owned=False)
    if cluster is not None:
        urls = list(cluster)
        return lambda: async_routes_for(async_cluster_from_urls(urls), tuning, owned=True)
    if isinstance(client, redis.cluster.RedisCluster):
        addresses = [(node.host, int(node.port)) for node in client.get_primaries()]
        options = dict(client.get_connection_kwargs())
        return lambda: async_routes_for(async_cluster_from(addresses, options), tuning, owned=True)

    def none() -> AsyncRoutes:
        raise LockError("this backend has no async client: pass Backend(async_client=...)")

    return none


_backends: weakref.WeakSet[Backend] = weakref.WeakSet()
_inherited: list[Any] = []  # what forked children must keep but never touch


def _forget_connections_after_fork() -> None:
    for backend in list(_backends):
        backend._forget_after_fork()


process.forget_after_fork(_forget_connections_after_fork)
