"""Where a key lives: one server, the primary a Sentinel names, or a Redis Cluster node.

A :class:`Topology` maps a key to the :class:`Node` that serves it and keeps that map
current: a Sentinel primary is asked for again whenever a connection opens, and a
cluster's slot map is read from a node and followed through ``MOVED`` and ``ASK``
redirects. Every node has connections of its own (:mod:`.pools`), sync ones and one pool
per event loop for async ones: all the engine's traffic runs on them, so a script, its
``WAIT`` for replicas, and a waiter's ``BLPOP`` reach the node that holds the lock's
keys.

What to do with an error reply (follow a redirect, retry, or give up) is decided here,
free of I/O, for the sync and async drivers alike (:func:`redirect_of`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, ResponseError, TryAgainError

from .exceptions import LockError
from .loops import LastLoop
from .pools import AsyncConnectionPool, ConnectionPool

__all__ = [
    "Cluster",
    "ConnectionSource",
    "Node",
    "Redirect",
    "SingleServer",
    "Topology",
    "key_slot",
    "redirect_of",
]

SLOTS = 16384
MAX_REDIRECTS = 16
"""``MOVED`` and ``ASK`` redirects one command follows before giving up."""
TRYAGAIN_DELAY = 0.02
"""Seconds before a command that got ``TRYAGAIN`` (keys split by a slot migration in
progress) is sent again."""
TRYAGAIN_BUDGET = 3.0
"""Seconds a command keeps answering ``TRYAGAIN`` before it is given up: a slot's keys
stay split between two nodes while a migration moves them."""


Settings = tuple[type[Any], dict[str, Any]]
"""A redis-py connection class and its keyword arguments."""


class ConnectionSource:
    """How to open connections to servers: a redis-py connection class and its keyword
    arguments (credentials, TLS, timeouts), sync and async, each given as such or as a
    callable read once, when first needed. ``host``/``port`` are replaced per node."""

    __slots__ = ("_async", "_lock", "_sync")

    def __init__(
        self,
        sync: Settings | Callable[[], Settings] | None,
        async_: Settings | Callable[[], Settings] | None,
    ) -> None:
        self._sync = sync
        self._async = async_
        self._lock = threading.Lock()

    def sync_settings(self) -> Settings:
        """The sync connection class and arguments (``LockError`` if there are none)."""
        with self._lock:
            if callable(self._sync):
                self._sync = self._sync()
        if self._sync is None:
            raise LockError("this backend has no sync client: pass Backend(client=...)")
        return self._sync

    def async_settings(self) -> Settings:
        """The async connection class and arguments (``LockError`` if there are none)."""
        with self._lock:
            if callable(self._async):
                self._async = self._async()
        if self._async is None:
            raise LockError("this backend has no async client: pass Backend(async_client=...)")
        return self._async


class Node:
    """One server (a primary) and the engine's connections to it."""

    __slots__ = (
        "__weakref__",
        "_async_pools",
        "_last_async",
        "_lock",
        "_pool",
        "address",
        "source",
    )

    def __init__(self, address: tuple[str, int] | None, source: ConnectionSource) -> None:
        self.address = address
        self.source = source
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._async_pools: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, AsyncConnectionPool
        ] = weakref.WeakKeyDictionary()
        self._last_async: LastLoop[AsyncConnectionPool] = LastLoop()

    def __repr__(self) -> str:
        where = "%s:%s" % self.address if self.address else "(resolved on connect)"  # noqa: UP031
        return f"<Node {where}>"

    def _kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.address is None:
            return kwargs
        host, port = self.address
        return {**kwargs, "host": host, "port": port}

    @property
    def pool(self) -> ConnectionPool:
        """The sync connections to this node."""
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._pool is None:
                    connection_class, kwargs = self.source.sync_settings()
                    self._pool = ConnectionPool(connection_class, self._kwargs(kwargs))
                pool = self._pool
        return pool

    def async_pool(self) -> AsyncConnectionPool:
        """The async connections to this node, for the running event loop."""
        loop = asyncio.get_running_loop()
        pool = self._last_async.get(loop)
        if pool is not None:
            return pool
        pool = self._async_pools.get(loop)
        if pool is None:
            connection_class, kwargs = self.source.async_settings()
            pool = self._async_pools[loop] = AsyncConnectionPool(
                connection_class, self._kwargs(kwargs)
            )
        self._last_async.remember(loop, pool)
        return pool

    def drop_async_pool(self, loop: asyncio.AbstractEventLoop) -> AsyncConnectionPool | None:
        """Forget ``loop``'s pool (closing it is the caller's); returns it, if any."""
        self._last_async.forget()
        return self._async_pools.pop(loop, None)

    def async_pools(self) -> list[AsyncConnectionPool]:
        """Every loop's pool (to close them)."""
        return list(self._async_pools.values())

    def forget_connections(self) -> list[Any]:
        """Drop every pool without closing it (a forked child must not touch its parent's
        sockets); returns what was dropped, for the caller to keep out of reach of GC."""
        dropped = [self._pool, dict(self._async_pools)]
        self._lock = threading.Lock()
        self._pool = None
        self._async_pools = weakref.WeakKeyDictionary()
        self._last_async.forget()
        return dropped

    def drop_idle(self) -> None:
        """Close the idle sync connections (after a failover they lead to the old
        primary; new ones ask the Sentinels again)."""
        pool = self._pool
        if pool is not None:
            pool.close()


@dataclass(frozen=True, slots=True)
class Redirect:
    """What an error reply asks for: send the command again to ``node`` (with ``ASKING``
    first when ``asking``), after ``delay`` seconds."""

    node: Node
    asking: bool = False
    delay: float = 0.0


class Topology:
    """Maps keys to nodes (see the module docstring)."""

    is_cluster = False

    def node_for(self, key: str | bytes) -> Node:
        """The node that serves ``key``."""
        raise NotImplementedError

    def nodes(self) -> list[Node]:
        """Every node keys may live on (each primary once)."""
        raise NotImplementedError

    def known_nodes(self) -> list[Node]:
        """Every node this topology has connections to (a cluster's former primaries
        included), to close them."""
        return self.nodes()

    def group(self, keys: Iterable[str]) -> dict[Node, list[str]]:
        """``keys`` by the node that serves them (order kept within a node)."""
        groups: dict[Node, list[str]] = {}
        for key in keys:
            groups.setdefault(self.node_for(key), []).append(key)
        return groups

    def moved(self, key: str | bytes, host: str, port: int) -> Node:
        """Record that ``key``'s slot is now served by ``host:port``; return that node."""
        raise NotImplementedError

    def asked(self, host: str, port: int) -> Node:
        """The node an ``ASK`` redirect names (the slot's map is unchanged)."""
        raise NotImplementedError

    def forget_connections(self) -> list[Any]:
        """Forget every node's connections (after fork); returns what was dropped."""
        return [node.forget_connections() for node in self.nodes()]


class SingleServer(Topology):
    """One server, or the primary a Sentinel names (its connections ask the Sentinels
    for the primary each time they connect)."""

    def __init__(self, source: ConnectionSource) -> None:
        self.node = Node(None, source)

    def node_for(self, key: str | bytes) -> Node:
        return self.node

    def nodes(self) -> list[Node]:
        return [self.node]

    def moved(self, key: str | bytes, host: str, port: int) -> Node:
        raise ResponseError(f"MOVED {host}:{port} from a server that is not in a cluster")

    def asked(self, host: str, port: int) -> Node:
        raise ResponseError(f"ASK {host}:{port} from a server that is not in a cluster")


class Cluster(Topology):
    """A Redis/Valkey Cluster: a map of its 16,384 slots to primaries, read from any node
    (``CLUSTER SLOTS``) when first needed and again after a ``MOVED`` or a failed node.

    ``seeds`` are ``(host, port)`` addresses to read the map from; ``read_slots`` is
    called with a :class:`Node` and must return ``CLUSTER SLOTS``'s reply (the drivers
    pass their own I/O).
    """

    is_cluster = True

    def __init__(self, seeds: Sequence[tuple[str, int]], source: ConnectionSource) -> None:
        if not seeds:
            raise ValueError("a cluster needs at least one seed node")
        self.source = source
        self.seeds = [(str(host), int(port)) for host, port in seeds]
        self._nodes: dict[tuple[str, int], Node] = {}
        self._slots: list[Node | None] = [None] * SLOTS
        self._lock = threading.Lock()
        self.mapped = False

    def node_at(self, host: str, port: int) -> Node:
        """The node at ``host:port`` (one object per address)."""
        address = (str(host), int(port))
        node = self._nodes.get(address)
        if node is None:
            with self._lock:
                node = self._nodes.setdefault(address, Node(address, self.source))
        return node

    def seed_nodes(self) -> list[Node]:
        """Nodes to read the slot map from: the known primaries first, then the seeds."""
        # Snapshots (list() copies without letting another thread run): threads reading
        # the slot map at once add nodes meanwhile.
        primaries = set(self._slots)
        known = [node for node in list(self._nodes.values()) if node in primaries]
        return known + [self.node_at(*seed) for seed in self.seeds]

    def load_slots(self, reply: Sequence[Any]) -> None:
        """Install the slot map from a ``CLUSTER SLOTS`` reply."""
        slots: list[Node | None] = [None] * SLOTS
        for entry in reply:
            start, end, primary = int(entry[0]), int(entry[1]), entry[2]
            host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
            node = self.node_at(host or self.seeds[0][0], int(primary[1]))
            for slot in range(start, end + 1):
                slots[slot] = node
        with self._lock:
            self._slots = slots
            self.mapped = True

    def node_for(self, key: str | bytes) -> Node:
        node = self._slots[key_slot(key.encode() if isinstance(key, str) else key)]
        if node is None:
            raise LookupError("no node serves this key's slot (the slot map is not read yet)")
        return node

    def nodes(self) -> list[Node]:
        return list(dict.fromkeys(node for node in self._slots if node is not None))

    def moved(self, key: str | bytes, host: str, port: int) -> Node:
        node = self.node_at(host, port)
        self._slots[key_slot(key.encode() if isinstance(key, str) else key)] = node
        return node

    def asked(self, host: str, port: int) -> Node:
        return self.node_at(host, port)

    def known_nodes(self) -> list[Node]:
        return list(self._nodes.values())

    def forget_connections(self) -> list[Any]:
        return [node.forget_connections() for node in list(self._nodes.values())]


def redirect_of(
    topology: Topology, key: str | bytes, error: BaseException, attempt: int, started: float
) -> Redirect | None:
    """What to do with ``error``, the reply to a command on ``key`` first sent at
    monotonic time ``started`` (``attempt`` counts redirects from 0): a :class:`Redirect`,
    or ``None`` to give up and raise it."""
    if not topology.is_cluster:
        return None
    if isinstance(error, TryAgainError):
        if time.monotonic() - started >= TRYAGAIN_BUDGET:
            return None
        return Redirect(topology.node_for(key), delay=TRYAGAIN_DELAY)
    if isinstance(error, MovedError):  # before AskError: redis-py derives it from AskError
        if attempt >= MAX_REDIRECTS:
            return None
        return Redirect(topology.moved(key, error.host, error.port))
    if isinstance(error, AskError):
        # While a migration has a slot's keys split, the source answers ASK and the target
        # TRYAGAIN, in turn: past MAX_REDIRECTS that is a wait for the move, paced and
        # bounded like TRYAGAIN (16 quick turns once failed locks mid-move).
        delay = 0.0
        if attempt >= MAX_REDIRECTS:
            if time.monotonic() - started >= TRYAGAIN_BUDGET:
                return None
            delay = TRYAGAIN_DELAY
        return Redirect(topology.asked(error.host, error.port), asking=True, delay=delay)
    return None
