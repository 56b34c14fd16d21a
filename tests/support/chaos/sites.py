"""The topologies of a chaos run and the faults the nemesis injects into each.

A :class:`ChaosSite` starts a topology from :mod:`tests.support.topologies` (or one
:class:`~tests.support.redis_servers.RedisServer`), says how clients reach it
(``target``, as :func:`tests.support.kind_workers.backend_for` takes it, and
``min_replicas``), and injects the faults of its ``fault_kinds`` (durations and targets
chosen by the nemesis' seeded schedule):

- ``single``: one server behind a :class:`~tests.support.proxy.TcpProxy`; server-pause,
  server-restart, proxy-delay/stall/cut/lose-reply, client-kill-connections, maxmemory;
  and the transient errors (:data:`TRANSIENT_FAULTS`, drawn only when a run asks for
  the caller's faults): server-busy, server-loading;
- ``replicated``: a primary (behind a proxy) and 2 replicas, locks with
  ``min_replicas=1``; the faults of ``single``, replica-pause, replica-kill, failover;
- ``sentinel``: a primary, a replica, 3 Sentinels; server-pause, replica-pause, failover,
  client-kill-connections, maxmemory;
- ``cluster``: 3 primaries with a replica each; server-pause, replica-pause, failover,
  primary-crash, slot-migration, client-kill-connections, maxmemory.

``server-busy`` runs a Lua script that spins for the fault's duration: past
``busy-reply-threshold`` (set to 50 ms) every other request is answered ``BUSY``.
``server-loading`` reloads the server's data (``DEBUG RELOAD``, a save and a load) with
``key-load-delay`` stretching the load of its ballast keys (written once, outside the
lock keys) over the fault's duration: requests meanwhile are answered ``LOADING``, and
nothing is lost. Neither is injected on Sentinel or Cluster, whose failure detectors
(1 s) would take a busy node for a dead one.

``server-restart`` empties the server (data lives in memory only): the locks it held
vanish, so a double holder until the old holder learns of it is expected (fences keep
storage safe). ``failover`` is graceful (``SENTINEL FAILOVER``, ``CLUSTER FAILOVER``;
on ``replicated``, what a failover behind a virtual IP or DNS name does: a replica
promoted with ``REPLICAOF NO ONE``, the other replica moved to it, new connections sent
to it while open ones still reach the old primary for 0.2-1 s, then the old primary
demoted and those connections cut);
``primary-crash`` SIGKILLs a cluster primary, waits for its replica's promotion and
restarts it as a replica (writes not yet replicated are lost).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot

from django_distlock.engine import LockKeys
from tests.support.kind_workers import cluster_target, sentinel_target, single_target
from tests.support.proxy import TcpProxy, sends_command
from tests.support.redis_servers import RedisServer
from tests.support.servers import HOST
from tests.support.topologies import ClusterSetup, ReplicatedSetup, SentinelSetup

__all__ = [
    "SITES",
    "TRANSIENT_FAULTS",
    "ChaosSite",
    "ClusterSite",
    "ReplicatedSite",
    "SentinelSite",
    "SingleSite",
]

PREFIX = "distlock:"  # the Backend's default key prefix: the only keys a run touches
_TIMEOUT = 0.5
# With noeviction (the default policy) every write is refused with OOM while the limit
# is below what the server uses.
_PRESSURE_BYTES = 1
TRANSIENT_FAULTS = ("server-busy", "server-loading")
"""Faults a server answers with a transient error (``BUSY``, ``LOADING``) while it lasts."""
# Busy and loading servers answer at once past these: a request is refused, not delayed.
_BUSY_THRESHOLD_MS = 50
_SPIN = """
local now = redis.call('TIME')
local stop = now[1] * 1000000 + now[2] + tonumber(ARGV[1])
repeat now = redis.call('TIME') until now[1] * 1000000 + now[2] >= stop
return 1
"""
_BALLAST_KEYS = 1000
_BALLAST_PREFIX = "chaos-ballast:"  # read by nobody; never a lock's key
# A loading server answers requests between chunks of this many bytes of its data.
_LOADING_CHUNK_BYTES = 1024
# Servers that take DEBUG (server-loading), from the loopback only.
DEBUG_ARGS = ("--enable-debug-command", "local")


def _ask(server: RedisServer, *command: Any) -> Any:
    with server.client(socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT) as client:
        return client.execute_command(*command)


class ChaosSite:
    """A topology with the faults of its kind; start with :meth:`start`, stop with
    :meth:`stop` (which also heals)."""

    name = ""
    fault_kinds: Sequence[str] = ()
    transient_kinds: Sequence[str] = ()
    """Transient-error faults, drawn only in runs with the caller's faults."""
    own_kinds: Sequence[str] = ()
    """The faults this topology is there to meet (a failover, a slot migration): a run
    with ``RunConfig.each_own_fault`` meets each at least once."""
    min_replicas: int | str = 0
    """The clients' ``min_replicas`` (``"auto"`` or a count): the topology's default,
    or what a run gives (``ChaosSite(names, min_replicas=...)``)."""

    def __init__(self, lock_names: Sequence[str], min_replicas: int | str | None = None) -> None:
        self.lock_names = list(lock_names)
        if min_replicas is not None:
            self.min_replicas = min_replicas
        self._paused: list[RedisServer] = []
        self._squeezed: list[RedisServer] = []
        self._readers: dict[int, Any] = {}

    @property
    def target(self) -> dict[str, Any]:
        """How clients reach the topology."""
        raise NotImplementedError

    def start(self) -> ChaosSite:
        """Start every server."""
        raise NotImplementedError

    def stop(self) -> None:
        """Heal, then stop every server."""
        try:
            self.heal()
        finally:
            for reader in self._readers.values():
                reader.close()
            self._close()

    def _close(self) -> None:
        """Stop every server (and proxy) :meth:`start` started."""
        raise NotImplementedError

    def primaries(self) -> list[RedisServer]:
        """The servers taking writes now."""
        raise NotImplementedError

    def replicas(self) -> list[RedisServer]:
        """The running replicas."""
        return []

    def primary_for(self, name: str) -> RedisServer:
        """The primary holding lock ``name``."""
        return self.primaries()[0]

    def lock_holders(self, name: str) -> list[tuple[str, int | None]]:
        """Who holds lock ``name`` now, read from the server that serves it with a plain
        client (no proxy): ``(token, pid of its owner)`` per live holder (for the
        liveness probe). Raises when the server cannot be read."""
        server = self.primary_for(name)
        client = self._readers.get(server.port)
        if client is None:
            client = server.client(socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT)
            self._readers[server.port] = client
        return _holders(client, name)

    def serving(self) -> dict[str, str]:
        """The node (``port N``) serving each lock name's key now; a name whose node
        cannot be told (the topology in flux) is left out."""
        found = {}
        for name in self.lock_names:
            try:
                found[name] = f"port {self.primary_for(name).port}"
            except Exception:  # unknown is what the checker gets then
                continue
        return found

    def reaches(self, kind: str, target: str, detail: str) -> tuple[str, ...]:
        """What a fault of ``kind`` on ``target`` (with ``detail``) reached: the proxy
        and killed connections reach every client's connections; a replica's fault
        reaches its primaries too where locks wait for a replica (``min_replicas`` not
        0: ``"auto"`` waits wherever a replica is connected); a slot migration both its
        nodes; any other fault its target node."""
        if target in ("proxy", "primaries"):
            return ("connections",)
        if kind.startswith("replica-") and self.min_replicas:
            return (target, *(f"port {primary.port}" for primary in self.primaries()))
        if kind == "slot-migration":
            # "port A -> B; replied ..." (the redirect counts after it are not nodes)
            nodes = detail.partition(";")[0]
            return tuple(f"port {port}" for port in re.findall(r"\d+", nodes))
        return (target,)

    def holder_pids(self) -> set[int]:
        """The process ids holding an exclusive lock of :attr:`lock_names` now (from the
        owner metadata in the lock's value)."""
        pids = set()
        for name in self.lock_names:
            key = LockKeys.for_name(PREFIX, name).lock
            try:
                value = _ask(self.primary_for(name), "GET", key)
            except Exception:  # held as a sorted set, or the topology in flux: nobody
                continue
            if value:
                owner = json.loads(value.split(b"\n", 4)[4])
                pids.add(int(owner["pid"]))
        return pids

    def inject(self, kind: str, duration: float, rng: random.Random) -> tuple[str, str]:
        """Inject a fault of ``kind`` lasting ``duration`` seconds, heal it; returns
        ``(target, detail)``."""
        if kind not in (*self.fault_kinds, *self.transient_kinds):
            raise ValueError(f"{self.name} has no fault {kind!r}")
        method = getattr(self, "_" + kind.replace("-", "_"))
        result: tuple[str, str] = method(duration, rng)
        return result

    def heal(self) -> None:
        """Resume paused servers and lift memory limits."""
        while self._paused:
            server = self._paused.pop()
            if server.running and server.paused:
                server.resume()
        while self._squeezed:
            server = self._squeezed.pop()
            if server.running:
                _ask(server, "CONFIG", "SET", "maxmemory", 0)

    def _pause(self, server: RedisServer, duration: float) -> str:
        self._paused.append(server)
        server.pause()
        time.sleep(duration)
        server.resume()
        self._paused.remove(server)
        return f"port {server.port}"

    def _server_pause(self, duration: float, rng: random.Random) -> tuple[str, str]:
        return self._pause(self.primary_for(rng.choice(self.lock_names)), duration), "primary"

    def _replica_pause(self, duration: float, rng: random.Random) -> tuple[str, str]:
        return self._pause(rng.choice(self.replicas()), duration), "replica"

    def _client_kill_connections(self, duration: float, rng: random.Random) -> tuple[str, str]:
        killed = 0
        for primary in self.primaries():
            killed += _ask(primary, "CLIENT", "KILL", "TYPE", "normal")
        return "primaries", f"{killed} connections"

    def _server_busy(self, duration: float, rng: random.Random) -> tuple[str, str]:
        server = self.primary_for(rng.choice(self.lock_names))
        _ask(server, "CONFIG", "SET", "busy-reply-threshold", _BUSY_THRESHOLD_MS)
        with server.client(socket_timeout=duration + 5.0) as client:
            client.eval(_SPIN, 0, int(duration * 1_000_000))
        return f"port {server.port}", f"script busy {duration:.2f} s (BUSY)"

    def _server_loading(self, duration: float, rng: random.Random) -> tuple[str, str]:
        server = self.primary_for(rng.choice(self.lock_names))
        with server.client(socket_timeout=duration + 10.0) as client:
            if not client.exists(f"{_BALLAST_PREFIX}0"):
                pipe = client.pipeline(transaction=False)
                for index in range(_BALLAST_KEYS):
                    pipe.set(f"{_BALLAST_PREFIX}{index}", "x")
                pipe.execute()
            client.config_set("loading-process-events-interval-bytes", _LOADING_CHUNK_BYTES)
            client.config_set("key-load-delay", int(duration * 1_000_000 / _BALLAST_KEYS))
            began = time.monotonic()
            try:
                client.execute_command("DEBUG", "RELOAD")
            finally:
                client.config_set("key-load-delay", 0)
                # The server restarts empty after this (server-restart): drop the save.
                folder = client.config_get("dir")["dir"]
                Path(folder, client.config_get("dbfilename")["dbfilename"]).unlink(missing_ok=True)
        loaded = time.monotonic() - began
        return f"port {server.port}", f"DEBUG RELOAD, loading {loaded:.2f} s (LOADING)"

    def _maxmemory(self, duration: float, rng: random.Random) -> tuple[str, str]:
        server = self.primary_for(rng.choice(self.lock_names))
        self._squeezed.append(server)
        _ask(server, "CONFIG", "SET", "maxmemory", _PRESSURE_BYTES)
        time.sleep(duration)
        _ask(server, "CONFIG", "SET", "maxmemory", 0)
        self._squeezed.remove(server)
        return f"port {server.port}", "writes refused (OOM)"


class _Proxied(ChaosSite):
    """A primary reached through a proxy, for the network faults."""

    proxy: TcpProxy

    @property
    def target(self) -> dict[str, Any]:
        return single_target(self.proxy.url)

    def heal(self) -> None:
        self.proxy.resume()
        self.proxy.clear_delays()
        super().heal()

    def _proxy_delay(self, duration: float, rng: random.Random) -> tuple[str, str]:
        seconds = round(rng.uniform(0.02, 0.4), 3)
        self.proxy.delay_client_data(lambda _chunk: True, seconds)
        time.sleep(duration)
        self.proxy.clear_delays()
        return "proxy", f"requests delayed {seconds} s"

    def _proxy_stall(self, duration: float, rng: random.Random) -> tuple[str, str]:
        self.proxy.stall()
        time.sleep(duration)
        self.proxy.resume()
        return "proxy", "stalled"

    def _proxy_cut(self, duration: float, rng: random.Random) -> tuple[str, str]:
        count = self.proxy.connection_count
        self.proxy.cut()
        return "proxy", f"{count} connections cut"

    def _proxy_lose_reply(self, duration: float, rng: random.Random) -> tuple[str, str]:
        self.proxy.lose_reply(sends_command("EVALSHA"))
        return "proxy", "the next script's reply lost"

    def _server_restart(self, duration: float, rng: random.Random) -> tuple[str, str]:
        primary = self.primaries()[0]
        primary.kill()
        time.sleep(duration)
        primary.restart()
        return f"port {primary.port}", "killed, restarted empty"


class SingleSite(_Proxied):
    """One server behind a proxy."""

    name = "single"
    transient_kinds = TRANSIENT_FAULTS
    own_kinds = ("server-restart",)
    fault_kinds = (
        "server-pause",
        "server-restart",
        "proxy-delay",
        "proxy-stall",
        "proxy-cut",
        "proxy-lose-reply",
        "client-kill-connections",
        "maxmemory",
    )

    def start(self) -> SingleSite:
        self.server = RedisServer(DEBUG_ARGS).start()
        self.proxy = TcpProxy(HOST, self.server.port)
        return self

    def _close(self) -> None:
        self.proxy.close()
        self.server.stop()

    def primaries(self) -> list[RedisServer]:
        return [self.server]


class ReplicatedSite(_Proxied):
    """A primary (behind a proxy) with two replicas; locks wait for one (``WAIT``)."""

    name = "replicated"
    own_kinds = ("failover",)
    min_replicas = 1
    transient_kinds = TRANSIENT_FAULTS
    fault_kinds = (*SingleSite.fault_kinds, "replica-pause", "replica-kill", "failover")

    def start(self) -> ReplicatedSite:
        self.setup = ReplicatedSetup(replicas=2, extra_args=DEBUG_ARGS).start()
        self.proxy = TcpProxy(HOST, self.setup.primary.port)
        return self

    def _close(self) -> None:
        self.proxy.close()
        self.setup.stop()

    def primaries(self) -> list[RedisServer]:
        return [self.setup.primary]

    def replicas(self) -> list[RedisServer]:
        return [replica for replica in self.setup.replicas if replica.running]

    def _replica_kill(self, duration: float, rng: random.Random) -> tuple[str, str]:
        index = rng.randrange(len(self.setup.replicas))
        self.setup.kill_replica(index)
        time.sleep(duration)
        self.setup.restart_replica(index)
        return f"port {self.setup.replicas[index].port}", "killed, restarted"

    def _server_restart(self, duration: float, rng: random.Random) -> tuple[str, str]:
        target, detail = super()._server_restart(duration, rng)
        self.setup.wait_in_sync()
        return target, detail

    def _failover(self, duration: float, rng: random.Random) -> tuple[str, str]:
        setup = self.setup
        old = setup.primary
        index = rng.randrange(len(setup.replicas))
        new = setup.replicas[index]
        switch = round(rng.uniform(0.2, 1.0), 3)
        new.promote()  # takes writes now; the old primary still does too, until cut off
        for replica in setup.replicas:
            if replica is not new:
                replica.replicate(new)
        self.proxy.point_at(HOST, new.port)
        time.sleep(switch)  # clients already connected still reach the old primary
        old.replicate(new)  # demoted: writes refused, blocked waiters ended (UNBLOCKED)
        self.proxy.cut()
        setup.primary, setup.replicas[index] = new, old
        setup.wait_in_sync()
        return f"port {old.port}", f"replica port {new.port} promoted, old cut off {switch} s later"


class SentinelSite(ChaosSite):
    """A Sentinel-managed primary and replica."""

    name = "sentinel"
    own_kinds = ("failover",)
    fault_kinds = (
        "server-pause",
        "replica-pause",
        "failover",
        "client-kill-connections",
        "maxmemory",
    )

    def start(self) -> SentinelSite:
        self.setup = SentinelSetup().start()
        return self

    def _close(self) -> None:
        self.setup.stop()

    @property
    def target(self) -> dict[str, Any]:
        return sentinel_target(self.setup.sentinels, self.setup.service_name)

    def primaries(self) -> list[RedisServer]:
        return [self.setup.primary]

    def replicas(self) -> list[RedisServer]:
        return [self.setup.replica]

    def _failover(self, duration: float, rng: random.Random) -> tuple[str, str]:
        old = self.setup.primary
        seconds = self.setup.failover()
        return f"port {old.port}", f"primary now port {self.setup.primary.port} ({seconds:.2f} s)"


class ClusterSite(ChaosSite):
    """Three primaries with a replica each."""

    name = "cluster"
    own_kinds = ("failover", "slot-migration")
    fault_kinds = (
        "server-pause",
        "replica-pause",
        "failover",
        "primary-crash",
        "slot-migration",
        "client-kill-connections",
        "maxmemory",
    )

    _cluster_reader: RedisCluster | None = None

    def start(self) -> ClusterSite:
        self.setup = ClusterSetup().start()
        return self

    def _close(self) -> None:
        if self._cluster_reader is not None:
            self._cluster_reader.close()
        self.setup.stop()

    @property
    def target(self) -> dict[str, Any]:
        return cluster_target(self.setup.urls)

    def primaries(self) -> list[RedisServer]:
        return self.setup.primaries

    def replicas(self) -> list[RedisServer]:
        return self.setup.replicas

    def primary_for(self, name: str) -> RedisServer:
        return self.setup.primary_for_slot(_slot(name))

    def lock_holders(self, name: str) -> list[tuple[str, int | None]]:
        # A cluster client follows MOVED and ASK by itself: the probe reads through
        # slot migrations and failovers.
        if self._cluster_reader is None:
            self._cluster_reader = RedisCluster.from_url(
                self.setup.urls[0], socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT
            )
        return _holders(self._cluster_reader, name)

    def _failover(self, duration: float, rng: random.Random) -> tuple[str, str]:
        old = self.primary_for(rng.choice(self.lock_names))
        new = self.setup.failover_primary(old, graceful=True)
        return f"port {old.port}", f"CLUSTER FAILOVER to port {new.port}"

    def _primary_crash(self, duration: float, rng: random.Random) -> tuple[str, str]:
        old = self.primary_for(rng.choice(self.lock_names))
        began = time.monotonic()
        new = self.setup.failover_primary(old)
        promoted = time.monotonic() - began
        self.setup.restart_node(old)
        self.setup.wait_replicas_in_sync()
        return f"port {old.port}", f"killed, port {new.port} promoted in {promoted:.2f} s"

    def _slot_migration(self, duration: float, rng: random.Random) -> tuple[str, str]:
        slot = _slot(rng.choice(self.lock_names))
        source = self.setup.primary_for_slot(slot)
        target = rng.choice([node for node in self.setup.primaries if node is not source])

        def while_migrating(migration: Any) -> None:
            # Clients meet a MIGRATING slot (ASK for moved keys, TRYAGAIN for scripts
            # whose keys are split), its keys moved in two steps.
            time.sleep(duration / 2)
            keys = _ask(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            migration.move_keys(keys[: len(keys) // 2])
            time.sleep(duration / 2)

        before = self._redirects()
        self.setup.migrate_slot(slot, target, on_migrating=while_migrating)
        after = self._redirects()
        replies = ", ".join(f"{after[kind] - before[kind]} {kind}" for kind in _REDIRECTS)
        return f"slot {slot}", f"port {source.port} -> {target.port}; replied {replies}"

    def _redirects(self) -> dict[str, int]:
        """How many ``ASK``, ``TRYAGAIN`` and ``MOVED`` replies the primaries gave."""
        counts = dict.fromkeys(_REDIRECTS, 0)
        for node in self.setup.primaries:
            stats = _ask(node, "INFO", "errorstats")
            for kind in _REDIRECTS:
                counts[kind] += int(stats.get(f"errorstat_{kind}", {}).get("count", 0))
        return counts


def _holders(client: Any, name: str) -> list[tuple[str, int | None]]:
    """The live holders of ``name`` as ``client`` (a plain ``Redis`` or ``RedisCluster``)
    reads them: the token and owner of an exclusive hold (a string key), or of each
    unexpired member of a shared or limited one (a sorted set scored by lease end, ms)."""
    keys = LockKeys.for_name(PREFIX, name)
    kind = client.type(keys.lock)
    if kind == b"string":
        value = client.get(keys.lock)
        if value is None:
            return []
        token = value.split(b"\n", 1)[0].decode()
        return [(token, _pid(value))]
    if kind != b"zset":
        return []
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    tokens = client.zrangebyscore(keys.lock, now_ms, "+inf")
    owners = client.hmget(keys.holders, tokens) if tokens else []
    return [(token.decode(), _pid(owner)) for token, owner in zip(tokens, owners, strict=True)]


def _pid(value: bytes | None) -> int | None:
    found = _PID.search(value or b"")
    return int(found.group(1)) if found else None


_PID = re.compile(rb'"pid":\s*(\d+)')


_REDIRECTS = ("ASK", "TRYAGAIN", "MOVED")


def _slot(name: str) -> int:
    return key_slot(LockKeys.for_name(PREFIX, name).lock.encode())


SITES: dict[str, type[ChaosSite]] = {
    site.name: site for site in (SingleSite, ReplicatedSite, SentinelSite, ClusterSite)
}
