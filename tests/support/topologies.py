"""Real Redis topologies for the test suite: a primary with replicas, Sentinel, Cluster.

Every process is a :class:`tests.support.redis_servers.RedisServer` started from the suite's
one server binary (:func:`tests.support.redis_servers.find_server_binary`) on free loopback
ports, so the usual guarantees hold: nothing talks to a server we did not start, and
whatever is still running at interpreter exit (or on SIGTERM, with
``install_termination_cleanup()``) is stopped. Every wait is bounded and fails with a
:class:`TopologyError` that carries what was last seen and the servers' logs.

Example::

    with SentinelSetup() as sentinel:
        sentinel.client().set("key", "value")
        seconds = sentinel.kill_primary_and_wait_for_failover()

    with ClusterSetup() as cluster:
        client = cluster.client()
        cluster.migrate_slot(key_slot(b"key"), cluster.primaries[1], on_migrating=...)
        cluster.failover_primary(cluster.node_for_key("key"))

Sentinel and Cluster need a 7.0+ server (``--cluster-port``, ``CLUSTER
ADDSLOTSRANGE``). Django-free on purpose. Findings about the clients are in
``TOPOLOGIES.md`` beside this file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.sentinel import Sentinel

from tests.support.redis_servers import RedisServer, RedisServerError, find_server_binary
from tests.support.servers import HOST, stop_all

__all__ = [
    "ClusterSetup",
    "ReplicatedSetup",
    "SentinelSetup",
    "SlotMigration",
    "TopologyError",
]

T = TypeVar("T")

_POLL_SECONDS = 0.05
_LOG_CHARS_PER_SERVER = 1500
# Connections the harness opens for its own checks: short, so a paused or dead server
# makes a check fail quickly and the wait loop try again.
_PROBE_TIMEOUT = 0.5
# A write that a replica refuses (READONLY) and that leaves nothing behind.
_WRITE_PROBE = ("DEL", "__distlock_topology_probe__")
_ACK_WAIT_MS = 100


class TopologyError(RedisServerError):
    """A topology did not start, or did not reach the state a wait asked for in time."""


def _probe(server: RedisServer) -> redis.Redis:
    return server.client(
        socket_timeout=_PROBE_TIMEOUT, socket_connect_timeout=_PROBE_TIMEOUT, decode_responses=True
    )


def _ask(server: RedisServer, *command: Any) -> Any:
    """Run one command on ``server`` over a fresh short-timeout connection."""
    with _probe(server) as client:
        return client.execute_command(*command)


def _wait_for(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    servers: Iterable[RedisServer],
) -> T:
    """Call ``check`` until it returns something other than None (a Redis error counts
    as not yet); after ``timeout`` seconds raise TopologyError naming ``what``, with the
    last Redis error and the logs of ``servers``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = check()
        except redis.RedisError as error:
            result, last = None, error
        if result is not None:
            return result
        if time.monotonic() > deadline:
            logs = "\n".join(server.log_tail(_LOG_CHARS_PER_SERVER) for server in servers)
            raise TopologyError(f"{what}: not within {timeout} s (last seen: {last!r})\n{logs}")
        time.sleep(_POLL_SECONDS)


def _role(server: RedisServer) -> str:
    """``master`` or ``slave`` from INFO replication."""
    role: str = server.replication()["role"]
    return role


def _accepts_writes(server: RedisServer) -> bool:
    try:
        _ask(server, *_WRITE_PROBE)
    except redis.ResponseError:
        return False
    return True


def _in_sync(replica: RedisServer, primary: RedisServer) -> bool:
    """The replica's link to ``primary`` is up and it applied every write so far."""
    mine, theirs = replica.replication(), primary.replication()
    return (
        mine.get("role") == "slave"
        and mine.get("master_port") == primary.port
        and mine.get("master_link_status") == "up"
        and mine.get("slave_repl_offset") == theirs.get("master_repl_offset")
    )


def _probe_key(primary: RedisServer) -> str:
    """A key ``primary`` may write: in a cluster, one that hashes to a slot it serves."""
    name = "__distlock_topology_probe__"
    if primary.mode != "cluster":
        return name
    for first, last, owner, *_replicas in _ask(primary, "CLUSTER", "SLOTS"):
        if int(owner[1]) == primary.port:
            # crc16 runs in C: even a one-slot range is found in a few milliseconds.
            return next(
                key
                for tag in range(1 << 20)
                if first <= key_slot((key := f"{name}{{{tag}}}").encode()) <= last
            )
    raise TopologyError(f"{primary!r} serves no slot.")


def _acknowledged(primary: RedisServer, replicas: Sequence[RedisServer]) -> bool:
    """Every replica is in sync and acknowledges a new write within a moment (``WAIT``).

    Being in sync is not enough for ``WAIT``-based tests: after a diskless full sync a
    replica reports its link up (and the primary lists it online) up to a second before
    the primary streams writes to it, and meanwhile ``WAIT`` does not count it. The
    probe write leaves no key behind.
    """
    if not all(_in_sync(replica, primary) for replica in replicas):
        return False
    if not replicas:
        return True
    key = _probe_key(primary)
    with _probe(primary) as client:
        client.set(key, 1)
        client.delete(key)
        info = client.info("replication")
        # WAIT returns once *any* n replicas acknowledged: wait for all of them, then
        # read which ones did.
        client.wait(info["connected_slaves"], _ACK_WAIT_MS)
        acked = {
            entry["port"]: entry["offset"]
            for name, entry in client.info("replication").items()
            if name.startswith("slave") and isinstance(entry, dict)
        }
    target: int = info["master_repl_offset"]
    return all(acked.get(replica.port, -1) >= target for replica in replicas)


def _wait_acknowledged(
    pairs: Sequence[tuple[RedisServer, RedisServer]],
    *,
    timeout: float,
    servers: Iterable[RedisServer],
) -> None:
    """Wait until, for every ``(replica, primary)`` pair, the replica is in sync and
    acknowledges writes (see :func:`_acknowledged`)."""
    by_primary: dict[RedisServer, list[RedisServer]] = {}
    for replica, primary in pairs:
        by_primary.setdefault(primary, []).append(replica)
    _wait_for(
        lambda: (
            True
            if all(_acknowledged(primary, replicas) for primary, replicas in by_primary.items())
            else None
        ),
        timeout=timeout,
        what=", ".join(f"{replica!r} in sync with {primary!r}" for replica, primary in pairs),
        servers=servers,
    )


class _Topology:
    """Start/stop plumbing shared by the setups: every server is a RedisServer, all of
    them are stopped together (in parallel) and a failed start stops what did start."""

    def __init__(self, binary: str | None) -> None:
        self.binary = binary or find_server_binary()
        self.start_seconds: float | None = None
        self.stop_seconds: float | None = None

    @property
    def servers(self) -> list[RedisServer]:
        """Every process of the topology."""
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        """Start every process and wait until the topology is healthy; on failure stop
        whatever was started and raise. ``start_seconds`` records how long it took."""
        began = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop every process (SIGTERM to all, then wait; SIGKILL after a grace period)
        and remove their directories. ``stop_seconds`` records how long it took."""
        began = time.monotonic()
        self._close_clients()
        stop_all(self.servers)
        self.stop_seconds = time.monotonic() - began

    def _close_clients(self) -> None:
        """Close connections the setup keeps for its own use."""

    @property
    def pids(self) -> list[int]:
        """PIDs of the processes now running."""
        return [server.pid for server in self.servers if server.pid is not None]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class ReplicatedSetup(_Topology):
    """A primary with ``replicas`` replicas over plain replication (no Sentinel), for
    ``WAIT``-based tests.

    Example::

        with ReplicatedSetup(replicas=2) as setup:
            client = setup.client()
            client.set("k", "v")
            setup.pause_replica(0)
            assert client.wait(2, 100) == 1
    """

    def __init__(
        self,
        replicas: int = 2,
        *,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        sync_timeout: float = 10.0,
    ) -> None:
        super().__init__(binary)
        self.sync_timeout = sync_timeout
        self.primary = RedisServer(extra_args, binary=self.binary)
        self.replicas = [
            RedisServer(extra_args, binary=self.binary, replica_of=self.primary)
            for _ in range(replicas)
        ]

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def _start(self) -> None:
        for server in self.servers:
            server.start()
        self.wait_in_sync()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client for the primary (see :meth:`RedisServer.client`)."""
        return self.primary.client(**kwargs)

    def wait_in_sync(self, timeout: float | None = None) -> None:
        """Wait until every running, unpaused replica has applied every write the
        primary made so far and the primary counts it for ``WAIT``."""
        _wait_acknowledged(
            [
                (replica, self.primary)
                for replica in self.replicas
                if replica.running and not replica.paused
            ],
            timeout=timeout or self.sync_timeout,
            servers=self.servers,
        )

    def connected_replicas(self) -> int:
        """How many replicas the primary counts as connected (``connected_slaves``)."""
        count: int = self.primary.replication()["connected_slaves"]
        return count

    def pause_replica(self, index: int) -> RedisServer:
        """SIGSTOP replica ``index``: its link stays open but it acknowledges nothing."""
        self.replicas[index].pause()
        return self.replicas[index]

    def resume_replica(self, index: int) -> RedisServer:
        """SIGCONT replica ``index`` and wait until it caught up."""
        replica = self.replicas[index]
        replica.resume()
        _wait_acknowledged(
            [(replica, self.primary)], timeout=self.sync_timeout, servers=self.servers
        )
        return replica

    def kill_replica(self, index: int) -> RedisServer:
        """SIGKILL replica ``index``."""
        self.replicas[index].kill()
        return self.replicas[index]

    def restart_replica(self, index: int) -> RedisServer:
        """(Re)start replica ``index`` on its port and wait until it is in sync."""
        replica = self.replicas[index]
        replica.restart()
        _wait_acknowledged(
            [(replica, self.primary)], timeout=self.sync_timeout, servers=self.servers
        )
        return replica


class SentinelSetup(_Topology):
    """A primary, a replica and ``sentinel_count`` Sentinels monitoring them as
    ``service_name`` with a quorum of ``quorum``.

    ``primary`` and ``replica`` follow the roles: after a failover they name the other
    server. The default timeouts make a failover after a crash take about 2-4 s.

    Example::

        with SentinelSetup() as setup:
            client = setup.client()          # follows the current primary
            client.set("k", "v")
            setup.failover()                 # SENTINEL FAILOVER
            assert client.get("k") == b"v"
    """

    def __init__(
        self,
        *,
        service_name: str = "mymaster",
        sentinel_count: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        binary: str | None = None,
        timeout: float = 15.0,
    ) -> None:
        super().__init__(binary)
        self.service_name = service_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.timeout = timeout
        self._primary = RedisServer(binary=self.binary)
        self._replica = RedisServer(binary=self.binary, replica_of=self._primary)
        self.sentinel_servers = [
            RedisServer(binary=self.binary, mode="sentinel") for _ in range(sentinel_count)
        ]
        self._manager: Sentinel | None = None
        self._paused: RedisServer | None = None

    @property
    def servers(self) -> list[RedisServer]:
        return [*self.sentinel_servers, self._replica, self._primary]

    @property
    def primary(self) -> RedisServer:
        """The server the Sentinels last promoted (or the first primary)."""
        return self._primary

    @property
    def replica(self) -> RedisServer:
        """The other data server (dead after :meth:`kill_primary_and_wait_for_failover`
        until :meth:`restart_replica`)."""
        return self._replica

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every Sentinel, as ``redis.sentinel.Sentinel`` takes them."""
        return [server.address for server in self.sentinel_servers]

    def _start(self) -> None:
        self._primary.start()
        self._replica.start()
        for sentinel in self.sentinel_servers:
            sentinel.start()
            with _probe(sentinel) as client:
                client.sentinel_monitor(self.service_name, HOST, self._primary.port, self.quorum)
                client.sentinel_set(
                    self.service_name, "down-after-milliseconds", self.down_after_ms
                )
                client.sentinel_set(self.service_name, "failover-timeout", self.failover_timeout_ms)
        self.wait_replica_in_sync()
        self.wait_until_monitored()

    def _close_clients(self) -> None:
        if self._manager is not None:
            for client in self._manager.sentinels:  # Sentinel.close() is redis-py 8.1+
                client.close()
            self._manager = None

    def sentinel_manager(self) -> Sentinel:
        """A ``redis.sentinel.Sentinel`` over our Sentinels, kept and closed by ``stop()``."""
        if self._manager is None:
            self._manager = Sentinel(self.sentinels, socket_timeout=1, socket_connect_timeout=1)
        return self._manager

    def client(self, **kwargs: Any) -> redis.Redis:
        """A client for the current primary, found through the Sentinels
        (``Sentinel.master_for``); ``kwargs`` go to ``master_for``.

        Each new connection asks the Sentinels where the primary is. With redis-py 8.1 a
        pooled connection still open to a demoted primary fails one write with
        ``ConnectionError("The previous master is now a slave")`` (its retries reconnect
        to the same address); the next command gets a fresh connection to the new
        primary. See ``TOPOLOGIES.md``.
        """
        return self.sentinel_manager().master_for(self.service_name, **kwargs)

    def reported_primaries(self) -> set[tuple[str, int] | None]:
        """The primary address each running Sentinel reports (``None`` if it does not
        answer)."""
        reported: set[tuple[str, int] | None] = set()
        for sentinel in self.sentinel_servers:
            if not sentinel.running or sentinel.paused:
                continue
            try:
                address = _ask(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
            except redis.RedisError:
                reported.add(None)
                continue
            reported.add((address[0], int(address[1])) if address else None)
        return reported

    def wait_until_monitored(self, timeout: float | None = None) -> None:
        """Wait until every running Sentinel sees our primary as up, the replica as up
        (when it runs) and every other Sentinel: only then can they agree on a failover."""
        others = len(self.sentinel_servers) - 1
        replicas = 1 if self._replica.running else 0

        def healthy() -> bool | None:
            for sentinel in self.sentinel_servers:
                if not sentinel.running:
                    continue
                with _probe(sentinel) as client:
                    master = client.sentinel_master(self.service_name)
                    good_replicas = [
                        replica
                        for replica in client.sentinel_slaves(self.service_name)
                        if not (replica["is_sdown"] or replica["is_disconnected"])
                        and replica["master-link-status"] == "ok"
                        and replica["port"] == self._replica.port
                    ]
                if (
                    master["port"] != self._primary.port
                    or master["is_sdown"]
                    or master["is_odown"]
                    or master["num-other-sentinels"] < others
                    or len(good_replicas) < replicas
                ):
                    return None
            return True

        _wait_for(
            healthy,
            timeout=timeout or self.timeout,
            what=f"Sentinels monitoring {self._primary!r} with {replicas} replica(s)",
            servers=self.servers,
        )

    def wait_for_failover(self, old_primary: RedisServer, timeout: float | None = None) -> float:
        """Wait until every running Sentinel reports a primary other than
        ``old_primary`` and that server takes writes; swap ``primary`` and ``replica``.
        Returns the seconds waited."""
        began = time.monotonic()
        by_address = {server.address: server for server in (self._primary, self._replica)}

        def promoted() -> RedisServer | None:
            reported = self.reported_primaries()
            if len(reported) != 1:
                return None
            (address,) = reported
            if address is None or address == old_primary.address:
                return None
            server = by_address.get(address)
            if server is None:
                raise TopologyError(f"The Sentinels promoted {address}, not one of ours.")
            return server if _accepts_writes(server) else None

        new_primary = _wait_for(
            promoted,
            timeout=timeout or self.timeout,
            what=f"Sentinel failover away from {old_primary!r}",
            servers=self.servers,
        )
        self._primary, self._replica = new_primary, old_primary
        # What the Sentinels did to the servers, so that restart() keeps the roles.
        new_primary.replica_of = None
        old_primary.replica_of = new_primary
        return time.monotonic() - began

    def failover(self, *, demote: bool = True, timeout: float | None = None) -> float:
        """``SENTINEL FAILOVER``: the replica is promoted without agreement between the
        Sentinels; wait until they all report it and it takes writes. Returns those
        seconds.

        The old primary keeps running as a primary that takes writes until the Sentinels
        turn it into a replica (``+convert-to-slave``), about 10 s later. With ``demote``
        (the default) we send it the same ``REPLICAOF`` at once and wait until it is in
        sync; with ``demote=False`` a test can watch that window.
        """
        old = self._primary
        # A Sentinel refuses ("INPROG") while its previous failover has not ended, which
        # it decides by itself a little after the servers were reconfigured: asked again.
        _wait_for(
            lambda: _ask(self.sentinel_servers[0], "SENTINEL", "FAILOVER", self.service_name),
            timeout=timeout or self.timeout,
            what=f"SENTINEL FAILOVER {self.service_name} accepted",
            servers=self.servers,
        )
        seconds = self.wait_for_failover(old, timeout)
        if demote:
            old.replicate(self._primary)
            self.wait_replica_in_sync(timeout)
        return seconds

    def kill_primary_and_wait_for_failover(self, timeout: float | None = None) -> float:
        """SIGKILL the primary and wait for the Sentinels to promote the replica.
        Returns the seconds from the kill until every Sentinel reported the new primary
        and it took writes. The old primary stays dead (see :meth:`restart_replica`)."""
        old = self._primary
        began = time.monotonic()
        old.kill()
        self.wait_for_failover(old, timeout)
        return time.monotonic() - began

    def pause_primary(self) -> RedisServer:
        """SIGSTOP the primary. Kept paused for longer than ``down_after_ms`` it is
        failed over (:meth:`wait_for_failover`)."""
        self._primary.pause()
        self._paused = self._primary
        return self._primary

    def resume_primary(self) -> RedisServer:
        """SIGCONT the server :meth:`pause_primary` paused (whatever its role now)."""
        if self._paused is None:
            raise TopologyError("No primary was paused.")
        paused, self._paused = self._paused, None
        paused.resume()
        return paused

    def wait_replica_in_sync(self, timeout: float | None = None) -> None:
        """Wait until ``replica`` replicates from ``primary`` and has applied all of its
        writes. After a failover the Sentinels reconfigure a demoted primary only some
        seconds after they see it again, so this is where that time is spent."""
        _wait_acknowledged(
            [(self._replica, self._primary)], timeout=timeout or self.timeout, servers=self.servers
        )

    def restart_replica(self, timeout: float | None = None) -> RedisServer:
        """(Re)start ``replica`` as a replica of the current primary (empty, it resyncs)
        and wait until it is in sync and the Sentinels see it: the setup can fail over
        again."""
        self._replica.replica_of = self._primary
        self._replica.restart()
        self.wait_replica_in_sync(timeout)
        self.wait_until_monitored(timeout)
        return self._replica

    def flushall(self) -> None:
        """Empty the data set (on the primary; the replica follows)."""
        _ask(self._primary, "FLUSHALL")


def _slot_ranges(shards: int) -> list[tuple[int, int]]:
    """Split the 16384 hash slots into ``shards`` contiguous inclusive ranges."""
    bounds = [REDIS_CLUSTER_HASH_SLOTS * index // shards for index in range(shards + 1)]
    return [(bounds[index], bounds[index + 1] - 1) for index in range(shards)]


class ClusterSetup(_Topology):
    """A Redis/Valkey Cluster: ``shards`` primaries with ``replicas_per_shard`` replicas
    each, built with ``CLUSTER ADDSLOTSRANGE`` / ``MEET`` / ``REPLICATE``.

    ``primaries`` and :meth:`primary_for_slot` ask the cluster, so they follow failovers
    and slot migrations.

    Example::

        with ClusterSetup() as cluster:
            client = cluster.client()
            client.set("{user:1}:a", 1)
            owner = cluster.node_for_key("{user:1}:a")
            cluster.failover_primary(owner)      # kill it; its replica takes over
    """

    def __init__(
        self,
        *,
        shards: int = 3,
        replicas_per_shard: int = 1,
        node_timeout_ms: int = 1000,
        binary: str | None = None,
        timeout: float = 20.0,
    ) -> None:
        super().__init__(binary)
        self.shards = shards
        self.replicas_per_shard = replicas_per_shard
        self.node_timeout_ms = node_timeout_ms
        self.timeout = timeout
        self.nodes = [
            RedisServer(
                ["--cluster-node-timeout", str(node_timeout_ms)], binary=self.binary, mode="cluster"
            )
            for _ in range(shards * (1 + replicas_per_shard))
        ]
        self._ids: dict[RedisServer, str] = {}
        self._clients: list[RedisCluster] = []

    @property
    def servers(self) -> list[RedisServer]:
        return list(self.nodes)

    def _start(self) -> None:
        for node in self.nodes:
            node.start()
        self._ids = {node: _ask(node, "CLUSTER", "MYID") for node in self.nodes}
        first_primaries = self.nodes[: self.shards]
        for epoch, (node, (first, last)) in enumerate(
            zip(first_primaries, _slot_ranges(self.shards), strict=True), start=1
        ):
            _ask(node, "CLUSTER", "ADDSLOTSRANGE", first, last)
            # Distinct epochs up front, as valkey-cli --cluster create does, so no
            # epoch collision has to be resolved before the cluster is stable.
            _ask(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        seed = self.nodes[0]
        for node in self.nodes[1:]:
            _ask(seed, "CLUSTER", "MEET", HOST, node.port, node.cluster_bus_port)
        self._wait_until_all_known()
        replicas = self.nodes[self.shards :]
        for index, replica in enumerate(replicas):
            primary = first_primaries[index % self.shards]
            _ask(replica, "CLUSTER", "REPLICATE", self._ids[primary])
        self.wait_ok()

    def _close_clients(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()

    def _wait_until_all_known(self) -> None:
        def everyone_knows_everyone() -> bool | None:
            for node in self.nodes:
                lines = _ask(node, "CLUSTER", "NODES").splitlines()
                known = [line for line in lines if "handshake" not in line.split()[2]]
                if len(known) != len(self.nodes):
                    return None
            return True

        _wait_for(
            everyone_knows_everyone,
            timeout=self.timeout,
            what="Every cluster node knowing every other",
            servers=self.nodes,
        )

    def node_id(self, node: RedisServer) -> str:
        """The cluster node ID of ``node`` (kept across restarts in its ``nodes.conf``)."""
        return self._ids[node]

    def node_at(self, address: tuple[str, int]) -> RedisServer:
        """Our node listening on ``address``."""
        for node in self.nodes:
            if node.address == address:
                return node
        raise TopologyError(f"No node of this cluster listens on {address}.")

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        """Every node, as ``RedisCluster(startup_nodes=...)`` takes them."""
        return [ClusterNode(HOST, node.port) for node in self.nodes]

    @property
    def urls(self) -> list[str]:
        """``redis://127.0.0.1:PORT`` for every node: seed URLs for settings."""
        return [f"redis://{HOST}:{node.port}" for node in self.nodes]

    def client(self, **kwargs: Any) -> RedisCluster:
        """A ``redis.cluster.RedisCluster`` seeded with every node; closed by ``stop()``
        if the caller has not closed it."""
        client = RedisCluster(startup_nodes=self.startup_nodes, **kwargs)
        self._clients.append(client)
        return client

    def slot_owners(self, node: RedisServer | None = None) -> dict[int, RedisServer]:
        """First slot of each range -> the primary serving it, as ``node`` (default: the
        first running node) sees it."""
        viewer = node or next(node for node in self.nodes if node.running)
        owners: dict[int, RedisServer] = {}
        for first, _last, primary, *_replicas in _ask(viewer, "CLUSTER", "SLOTS"):
            owners[first] = self.node_at((HOST, int(primary[1])))
        return owners

    @property
    def primaries(self) -> list[RedisServer]:
        """The primaries now serving slots, in slot order."""
        owners = self.slot_owners()
        return list(dict.fromkeys(owners[first] for first in sorted(owners)))

    @property
    def replicas(self) -> list[RedisServer]:
        """Running nodes that serve no slots."""
        primaries = self.primaries
        return [node for node in self.nodes if node.running and node not in primaries]

    def replicas_of(self, primary: RedisServer) -> list[RedisServer]:
        """Running nodes replicating from ``primary``."""
        return [
            node
            for node in self.nodes
            if node.running
            and node is not primary
            and node.replication().get("master_port") == primary.port
            and _role(node) == "slave"
        ]

    def primary_for_slot(self, slot: int) -> RedisServer:
        """The primary serving ``slot`` (the source, while the slot is migrating)."""
        viewer = next(node for node in self.nodes if node.running)
        for first, last, primary, *_replicas in _ask(viewer, "CLUSTER", "SLOTS"):
            if first <= slot <= last:
                return self.node_at((HOST, int(primary[1])))
        raise TopologyError(f"No node serves slot {slot}.")

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """The primary serving ``key``'s slot (hash tags respected)."""
        return self.primary_for_slot(key_slot(key.encode() if isinstance(key, str) else key))

    def _slot_view(self, node: RedisServer) -> tuple[tuple[int, int, int], ...]:
        return tuple(
            sorted(
                (first, last, int(primary[1]))
                for first, last, primary, *_ in _ask(node, "CLUSTER", "SLOTS")
            )
        )

    def wait_ok(self, timeout: float | None = None) -> None:
        """Wait until every running node says ``cluster_state:ok`` and sees the same
        slot map, covering every slot with running primaries, and every running replica's
        link to its primary is up."""
        running_ports = {node.port for node in self.nodes if node.running}

        def healthy() -> bool | None:
            views = set()
            for node in self.nodes:
                if not node.running:
                    continue
                if "cluster_state:ok" not in _ask(node, "CLUSTER", "INFO"):
                    return None
                views.add(self._slot_view(node))
                info = node.replication()
                if info["role"] == "slave" and info.get("master_link_status") != "up":
                    return None
            if len(views) != 1:
                return None
            (view,) = views
            covered = sum(last - first + 1 for first, last, _ in view)
            owners_run = all(port in running_ports for _, _, port in view)
            return True if covered == REDIS_CLUSTER_HASH_SLOTS and owners_run else None

        _wait_for(
            healthy,
            timeout=timeout or self.timeout,
            what="cluster_state:ok with one slot map on every running node",
            servers=self.nodes,
        )

    def wait_replicas_in_sync(self, timeout: float | None = None) -> None:
        """Wait until every running replica has applied all of its primary's writes (and
        is counted by ``WAIT``)."""
        _wait_acknowledged(
            [
                (replica, primary)
                for primary in self.primaries
                for replica in self.replicas_of(primary)
            ],
            timeout=timeout or self.timeout,
            servers=self.nodes,
        )

    def begin_slot_migration(self, slot: int, to_node: RedisServer) -> SlotMigration:
        """Mark ``slot`` IMPORTING on ``to_node`` and MIGRATING on its owner; move keys
        and finish through the returned :class:`SlotMigration`."""
        migration = SlotMigration(self, slot, self.primary_for_slot(slot), to_node)
        migration.begin()
        return migration

    def migrate_slot(
        self,
        slot: int,
        to_node: RedisServer,
        *,
        batch: int = 100,
        on_migrating: Callable[[SlotMigration], None] | None = None,
    ) -> None:
        """Move ``slot`` (and its keys) to the primary ``to_node``, live, the way
        ``valkey-cli --cluster reshard`` does. ``on_migrating(migration)`` runs while the
        slot is MIGRATING, before any key moved: it may move some keys itself
        (``migration.move_keys([...])``) so that clients get ``ASK`` for those."""
        migration = self.begin_slot_migration(slot, to_node)
        if on_migrating is not None:
            on_migrating(migration)
        migration.finish(batch=batch)

    def failover_primary(
        self, primary: RedisServer, *, graceful: bool = False, timeout: float | None = None
    ) -> RedisServer:
        """Fail the shard of ``primary`` over to its replica and wait until the cluster
        is ok again; returns the promoted node.

        By default ``primary`` is SIGKILLed (a crash: writes its replica had not received
        are lost; it stays dead, see :meth:`restart_node`). With ``graceful=True`` the
        replica runs ``CLUSTER FAILOVER``: it catches up first, and ``primary`` becomes
        its replica.
        """
        candidates = self.replicas_of(primary)
        if not candidates:
            raise TopologyError(f"{primary!r} has no running replica to fail over to.")
        slots = [first for first, owner in self.slot_owners().items() if owner is primary]
        if graceful:
            _ask(candidates[0], "CLUSTER", "FAILOVER")
        else:
            primary.kill()

        def promoted() -> RedisServer | None:
            owners = self.slot_owners(candidates[0])
            new = {owners.get(first) for first in slots}
            if len(new) != 1:
                return None
            (node,) = new
            return node if node in candidates and _role(node) == "master" else None

        new_primary = _wait_for(
            promoted,
            timeout=timeout or self.timeout,
            what=f"A replica of {primary!r} promoted",
            servers=self.nodes,
        )
        self.wait_ok(timeout)
        return new_primary

    def restart_node(self, node: RedisServer, timeout: float | None = None) -> RedisServer:
        """(Re)start ``node`` on its ports with an empty data set; its ``nodes.conf``
        makes it rejoin (a failed-over primary comes back as a replica). Waits until the
        cluster is ok."""
        node.restart()
        self.wait_ok(timeout)
        return node

    def flushall(self) -> None:
        """Empty every primary (replicas follow)."""
        for primary in self.primaries:
            _ask(primary, "FLUSHALL")


class SlotMigration:
    """One live slot migration, step by step (see :meth:`ClusterSetup.migrate_slot`).

    Between :meth:`begin` and :meth:`finish` the slot is MIGRATING on ``source`` and
    IMPORTING on ``target``: a client asking ``source`` for a key that already moved
    gets ``-ASK``; after :meth:`finish` a client with the old slot map gets ``-MOVED``.
    """

    def __init__(
        self, cluster: ClusterSetup, slot: int, source: RedisServer, target: RedisServer
    ) -> None:
        if source is target:
            raise ValueError(f"Slot {slot} is already served by {target!r}.")
        self.cluster = cluster
        self.slot = slot
        self.source = source
        self.target = target
        self.finished = False

    def begin(self) -> None:
        """IMPORTING on the target first, so no ASK ever points at a node that would
        refuse it."""
        source_id, target_id = self.cluster.node_id(self.source), self.cluster.node_id(self.target)
        _ask(self.target, "CLUSTER", "SETSLOT", self.slot, "IMPORTING", source_id)
        _ask(self.source, "CLUSTER", "SETSLOT", self.slot, "MIGRATING", target_id)

    def keys_left(self) -> int:
        """Keys of the slot still on the source."""
        count: int = _ask(self.source, "CLUSTER", "COUNTKEYSINSLOT", self.slot)
        return count

    def move_keys(self, keys: Iterable[str | bytes] | None = None, *, batch: int = 100) -> int:
        """``MIGRATE`` ``keys`` (default: every key left in the slot, ``batch`` at a
        time) to the target; returns how many were asked to move."""
        moved = 0
        if keys is not None:
            chosen = list(keys)
            for start in range(0, len(chosen), batch):
                self._migrate(chosen[start : start + batch])
            return len(chosen)
        while True:
            chunk = _ask(self.source, "CLUSTER", "GETKEYSINSLOT", self.slot, batch)
            if not chunk:
                return moved
            self._migrate(chunk)
            moved += len(chunk)

    def _migrate(self, keys: Sequence[str | bytes]) -> None:
        if keys:
            # "" + KEYS: the multi-key form; REPLACE makes a retried batch harmless.
            _ask(
                self.source,
                *("MIGRATE", HOST, self.target.port, "", 0, 5000, "REPLACE", "KEYS", *keys),
            )

    def finish(self, *, batch: int = 100) -> None:
        """Move the remaining keys, assign the slot to the target (target first, then
        source, then every other primary) and wait until every node agrees."""
        self.move_keys(batch=batch)
        target_id = self.cluster.node_id(self.target)
        others = [
            node
            for node in self.cluster.primaries
            if node is not self.source and node is not self.target
        ]
        for node in [self.target, self.source, *others]:
            _ask(node, "CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        self.finished = True
        self.cluster.wait_ok()
        _wait_for(
            lambda: True if self.cluster.primary_for_slot(self.slot) is self.target else None,
            timeout=self.cluster.timeout,
            what=f"Slot {self.slot} served by {self.target!r}",
            servers=self.cluster.nodes,
        )


def _measure(rounds: int = 3) -> None:
    """Print how long each setup takes to start and to stop with this machine's binary:
    ``python -m tests.support.topologies [ROUNDS]`` (``$DISTLOCK_REDIS_SERVER`` picks it)."""
    binary = find_server_binary()
    with RedisServer(binary=binary) as server, server.client() as client:
        version = (
            client.info("server").get("valkey_version") or client.info("server")["redis_version"]
        )
    print(f"{binary} ({version}), best and worst of {rounds}:")
    setups: list[Callable[[], _Topology]] = [ReplicatedSetup, SentinelSetup, ClusterSetup]
    for make in setups:
        starts, stops = [], []
        for _round in range(rounds):
            setup = make().start()
            setup.stop()
            assert setup.start_seconds is not None
            assert setup.stop_seconds is not None
            starts.append(setup.start_seconds)
            stops.append(setup.stop_seconds)
        print(
            f"  {type(setup).__name__:16} start {min(starts):.2f}-{max(starts):.2f} s"
            f"   stop {min(stops):.2f}-{max(stops):.2f} s"
        )
    with SentinelSetup() as sentinel:
        manual = sentinel.failover()
        crash = sentinel.kill_primary_and_wait_for_failover()
    print(f"  Sentinel failover: SENTINEL FAILOVER {manual:.2f} s, primary killed {crash:.2f} s")
    with ClusterSetup() as cluster:
        began = time.monotonic()
        cluster.failover_primary(cluster.primaries[0], graceful=True)
        graceful = time.monotonic() - began
        began = time.monotonic()
        cluster.failover_primary(cluster.primaries[1])
        killed = time.monotonic() - began
    print(f"  Cluster failover: CLUSTER FAILOVER {graceful:.2f} s, primary killed {killed:.2f} s")


if __name__ == "__main__":
    import sys

    _measure(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
