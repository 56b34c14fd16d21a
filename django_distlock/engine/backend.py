"""Where locks live: the Redis clients, the key prefix and the defaults of a deployment."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
import redis.cluster
import redis.connection

from . import process
from .core import EXCLUSIVE
from .exceptions import LockError
from .keys import validate_prefix, validate_replicas, validate_seconds
from .loops import LastLoop, close_at_loop_shutdown
from .pools import async_connection_kwargs, connection_settings
from .topology import Cluster, ConnectionSource, Node, SingleServer, Topology
from .tuning import Tuning

__all__ = ["Backend", "Event", "Observer"]

logger = logging.getLogger("django_distlock")


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened to a lock, as told to a backend's observer.

    ``kind``: ``acquired released extended contended lost not_replicated`` (what a
    holder or an operator is told), or, for metrics, ``error`` (an acquire raised),
    ``release_failed``, ``renewed`` and ``renew_failed``. ``waited``/``held`` are
    seconds (``None`` where they do not apply), ``at`` epoch seconds. ``template``: the
    name template the name was filled from (``""`` for a name given as is). ``cause``:
    ``busy``/``timeout`` for ``contended``; ``gone``/``expired``/``abandoned`` for
    ``lost`` (:func:`~.renewal.lost_cause`); ``error``/``gone`` for ``renew_failed``;
    the exception's class name for ``error`` and ``release_failed``. ``mode``:
    ``"exclusive"``, ``"shared"`` or ``"limited"`` (``limit``: N, else ``None``).
    Taking a re-entrant lock again, and releasing it but the last time, are no events.
    """

    kind: str
    name: str
    fence: int | None
    context: str
    host: str
    pid: int
    thread: str
    waited: float | None = None
    held: float | None = None
    retry_after: float | None = None
    reason: str = ""
    at: float = 0.0
    template: str = ""
    cause: str = ""
    mode: str = EXCLUSIVE
    limit: int | None = None


Observer = Callable[[Event], None]

AsyncClientSource = redis.asyncio.Redis | Callable[[], redis.asyncio.Redis]


class Backend:
    """The Redis a set of locks lives on, and their defaults.

    Where the locks live, one of:

    - ``client``: a ``redis.Redis`` (one server, or the primary of a
      ``redis.sentinel.Sentinel(...).master_for(...)`` client), and/or ``async_client``:
      a ``redis.asyncio.Redis`` or a callable that makes one (the async twin);
    - ``cluster``: seed node URLs of a Redis/Valkey Cluster
      (``["redis://10.0.0.1:7000", ...]``, credentials and TLS taken from the first), or a
      ``redis.cluster.RedisCluster`` as ``client``.

    The clients are where the settings come from (server, credentials, TLS, timeouts):
    the engine talks to every node on connections of its own (:mod:`.topology`,
    :mod:`.pools`), sync and async, so that a script, its ``WAIT`` for replicas and a
    waiter's ``BLPOP`` reach the node holding the lock's keys. A process forked from this
    one opens its own.

    Keys are written under ``prefix`` only. ``timeout``, ``auto_renew`` and
    ``min_replicas`` are the defaults of locks that do not set them (``replica_timeout``:
    seconds an acquire waits for replicas to acknowledge it). ``observer`` is called with
    an :class:`Event` for every lock event; it must be quick and its errors are logged,
    never raised into the lock.

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
        min_replicas: int = 0,
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
        self._client = client
        self._async_source = async_client
        self._lock = threading.Lock()
        self._topology = self._build_topology(client, async_client, cluster)
        # True once the server is known to hold no lock of the key layout before buckets
        # (core.claim_layout_steps). A cluster never did: that layout could not run on one.
        self.layout_claimed = isinstance(self._topology, Cluster)
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._watched: LastLoop[bool] = LastLoop()
        _backends.add(self)

    def __repr__(self) -> str:
        return f"<Backend prefix={self.prefix!r} {type(self._topology).__name__}>"

    @property
    def client(self) -> redis.Redis | redis.cluster.RedisCluster:
        """The sync client given (``LockError`` if this backend has none)."""
        if self._client is None:
            raise LockError("this backend has no sync client: pass Backend(client=...)")
        return self._client

    # -- where keys live ----------------------------------------------------------------

    def _build_topology(
        self, client: Any, async_client: Any, cluster: Sequence[str] | None
    ) -> Topology:
        if cluster is not None:
            if isinstance(cluster, str) or not cluster:
                raise TypeError("cluster must be a non-empty list of seed node URLs")
            seeds = [_address(redis.connection.parse_url(url)) for url in cluster]
            return Cluster(seeds, _url_source(cluster[0]))
        if isinstance(client, redis.cluster.RedisCluster):
            return Cluster(_cluster_seeds(client), _cluster_source(client))
        return SingleServer(_client_source(client, async_client))

    def topology_now(self) -> Topology:
        """Where keys live as known now, without any I/O (a cluster's slot map may not be
        read yet: its ``node_for`` then raises ``LookupError``)."""
        return self._topology

    def topology(self) -> Topology:
        """Where keys live, with a cluster's slot map read (sync I/O if needed)."""
        topology = self._topology
        if isinstance(topology, Cluster) and not topology.mapped:
            self._read_slots_sync(topology)
        return topology

    async def atopology(self) -> Topology:
        """Async twin of :meth:`topology` (and the running loop's connections are closed
        when the loop shuts down)."""
        topology = self.loop_topology()
        if topology is None:
            topology = self._topology
            await self._read_slots_async(topology)  # type: ignore[arg-type]
        return topology

    def loop_topology(self) -> Topology | None:
        """:meth:`atopology` when it needs no I/O (else ``None``): the common case, without
        a coroutine."""
        self.watch_loop()
        topology = self._topology
        if type(topology) is Cluster and not topology.mapped:
            return None
        return topology

    def node_failed(self, node: Node) -> None:
        """A node stopped answering: a cluster re-reads its slot map before the next
        command (a replica may have been promoted)."""
        if isinstance(self._topology, Cluster):
            self._topology.mapped = False

    def _read_slots_sync(self, topology: Cluster) -> None:
        errors = []
        for node in topology.seed_nodes():
            pool = node.pool
            connection = pool.get()
            try:
                connection.send_command("CLUSTER", "SLOTS")
                reply = connection.read_response()
            except (redis.RedisError, OSError) as exc:
                pool.discard(connection)
                errors.append(f"{node}: {exc}")
                continue
            pool.put(connection)
            topology.load_slots(reply)
            return
        raise redis.ConnectionError(f"no cluster node answered CLUSTER SLOTS: {errors}")

    async def _read_slots_async(self, topology: Cluster) -> None:
        errors = []
        for node in topology.seed_nodes():
            pool = node.async_pool()
            connection = await pool.get()
            try:
                async with asyncio.timeout(pool.timeout):
                    await connection.send_command("CLUSTER", "SLOTS")
                    reply = await connection.read_response()
            except (redis.RedisError, OSError) as exc:
                await pool.discard(connection)
                errors.append(f"{node}: {str(exc) or type(exc).__name__}")
                continue
            await pool.put(connection)
            topology.load_slots(reply)
            return
        raise redis.ConnectionError(f"no cluster node answered CLUSTER SLOTS: {errors}")

    def close(self) -> None:
        """Close the idle sync connections this backend opened. The clients passed in are
        the caller's to close."""
        for node in (
            self._topology.nodes()
            if not isinstance(self._topology, Cluster)
            else list(self._topology._nodes.values())
        ):
            node.drop_idle()

    async def aclose(self) -> None:
        """Close the connections this backend opened on the running event loop (closed
        anyway when the loop shuts down through ``asyncio.run``)."""
        loop = asyncio.get_running_loop()
        for node in self._all_nodes():
            pool = node.drop_async_pool(loop)
            if pool is not None:
                await pool.close()
        # Dropped last: once dropped, the closer's finalizer takes the pools still there
        # and closes them in a task of its own, which a loop ending soon after would
        # never let finish.
        self._closers.pop(loop, None)
        self._watched.forget()

    def _all_nodes(self) -> list[Node]:
        return self._topology.known_nodes()

    def watch_loop(self) -> None:
        """Make sure the running loop's connections are closed when it shuts down."""
        loop = asyncio.get_running_loop()
        if self._watched.get(loop):
            return
        if loop not in self._closers:
            topology = self._topology
            self._closers[loop] = close_at_loop_shutdown(topology.known_nodes, self._closers, loop)
        self._watched.remember(loop, True)

    def _forget_after_fork(self) -> None:
        # The parent's connections stay the parent's: they are neither used nor closed
        # here (closing an asyncio connection needs the parent's loop), only forgotten.
        _inherited.append([node.forget_connections() for node in self._all_nodes()])
        self._lock = threading.Lock()
        self._closers = weakref.WeakKeyDictionary()
        self._watched.forget()

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


def _client_source(
    client: redis.Redis | None, async_source: AsyncClientSource | None
) -> ConnectionSource:
    """The connection settings of a client pair; the async client's (or its factory's,
    called once) are read when async code first needs them."""

    def async_settings() -> tuple[type[Any], dict[str, Any]] | None:
        if async_source is None:
            return None
        client = async_source if isinstance(async_source, redis.asyncio.Redis) else async_source()
        # A Sentinel client's connections reach its pool through a weak reference: the
        # client must live as long as the connections made from its settings.
        _kept_alive.append(client)
        return connection_settings(client.connection_pool)

    sync = connection_settings(client.connection_pool) if client is not None else None
    return ConnectionSource(sync, async_settings)


def _address(options: dict[str, Any]) -> tuple[str, int]:
    return str(options.get("host") or "localhost"), int(options.get("port") or 6379)


_NOT_CONNECTION_KWARGS = ("host", "port", "connection_class", "max_connections", "path", "url")


def _url_source(url: str) -> ConnectionSource:
    """The connection settings of a cluster seed URL (credentials, TLS), for every node."""
    options = redis.connection.parse_url(url)
    tls = (
        options.pop("connection_class", redis.connection.Connection)
        is redis.connection.SSLConnection
    )
    kwargs = {k: v for k, v in options.items() if k not in _NOT_CONNECTION_KWARGS}
    return ConnectionSource(
        (redis.connection.SSLConnection if tls else redis.connection.Connection, kwargs),
        (
            redis.asyncio.SSLConnection if tls else redis.asyncio.Connection,
            async_connection_kwargs(kwargs),
        ),
    )


def _cluster_seeds(client: redis.cluster.RedisCluster) -> list[tuple[str, int]]:
    nodes = client.nodes_manager.startup_nodes.values()
    return [(node.host, int(node.port)) for node in nodes]


def _cluster_source(client: redis.cluster.RedisCluster) -> ConnectionSource:
    kwargs = {
        k: v
        for k, v in client.nodes_manager.connection_kwargs.items()
        if k not in _NOT_CONNECTION_KWARGS and k != "maint_notifications_pool_handler"
    }
    sync_class = client.nodes_manager.connection_kwargs.get(
        "connection_class", redis.connection.Connection
    )
    tls = issubclass(sync_class, redis.connection.SSLConnection)
    return ConnectionSource(
        (sync_class, kwargs),
        (
            redis.asyncio.SSLConnection if tls else redis.asyncio.Connection,
            async_connection_kwargs(kwargs),
        ),
    )


_backends: weakref.WeakSet[Backend] = weakref.WeakSet()
_inherited: list[Any] = []  # what forked children must keep but never touch
_kept_alive: list[Any] = []  # async clients whose settings the engine's connections use


def _forget_connections_after_fork() -> None:
    for backend in list(_backends):
        backend._forget_after_fork()


process.forget_after_fork(_forget_connections_after_fork)
