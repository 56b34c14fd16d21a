"""The topologies of a chaos run and the faults the nemesis injects into each.

A :class:`ChaosSite` starts a topology from :mod:`tests.support.topologies` (or one
:class:`~tests.support.redis_servers.RedisServer`), says how clients reach it
(``target``, as :func:`tests.support.kind_workers.backend_for` takes it, and
``min_replicas``), and injects the faults of its ``fault_kinds`` (durations and targets
chosen by the nemesis' seeded schedule):

- ``single``: one server behind a :class:`~tests.support.proxy.TcpProxy`; server-pause,
  server-restart, proxy-delay/stall/cut/lose-reply, client-kill-connections, maxmemory;
- ``replicated``: a primary (behind a proxy) and 2 replicas, locks with
  ``min_replicas=1``; the faults of ``single``, replica-pause, replica-kill;
- ``sentinel``: a primary, a replica, 3 Sentinels; server-pause, replica-pause, failover,
  client-kill-connections, maxmemory;
- ``cluster``: 3 primaries with a replica each; server-pause, replica-pause, failover,
  primary-crash, slot-migration, client-kill-connections, maxmemory.

``server-restart`` empties the server (data lives in memory only): the locks it held
vanish, so a double holder until the old holder learns of it is expected (fences keep
storage safe). ``failover`` is graceful (``SENTINEL FAILOVER``, ``CLUSTER FAILOVER``);
``primary-crash`` SIGKILLs a cluster primary, waits for its replica's promotion and
restarts it as a replica (writes not yet replicated are lost).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Sequence
from typing import Any

from redis.crc import key_slot

from django_distlock.engine import LockKeys
from tests.support.kind_workers import cluster_target, sentinel_target, single_target
from tests.support.proxy import TcpProxy, sends_command
from tests.support.redis_servers import RedisServer
from tests.support.servers import HOST
from tests.support.topologies import ClusterSetup, ReplicatedSetup, SentinelSetup

__all__ = ["SITES", "ChaosSite", "ClusterSite", "ReplicatedSite", "SentinelSite", "SingleSite"]

PREFIX = "distlock:"  # the Backend's default key prefix: the only keys a run touches
_TIMEOUT = 0.5
# With noeviction (the default policy) every write is refused with OOM while the limit
# is below what the server uses.
_PRESSURE_BYTES = 1


def _ask(server: RedisServer, *command: Any) -> Any:
    with server.client(socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT) as client:
        return client.execute_command(*command)


class ChaosSite:
    """A topology with the faults of its kind; start with :meth:`start`, stop with
    :meth:`stop` (which also heals)."""

    name = ""
    fault_kinds: Sequence[str] = ()
    min_replicas = 0

    def __init__(self, lock_names: Sequence[str]) -> None:
        self.lock_names = list(lock_names)
        self._paused: list[RedisServer] = []
        self._squeezed: list[RedisServer] = []

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
        reaches its primaries too where locks wait for a replica (``min_replicas``); a
        slot migration both its nodes; any other fault its target node."""
        if target in ("proxy", "primaries"):
            return ("connections",)
        if kind.startswith("replica-") and self.min_replicas:
            return (target, *(f"port {primary.port}" for primary in self.primaries()))
        if kind == "slot-migration":
            return tuple(f"port {port}" for port in re.findall(r"\d+", detail))
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
        if kind not in self.fault_kinds:
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
        self.server = RedisServer().start()
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
    min_replicas = 1
    fault_kinds = (*SingleSite.fault_kinds, "replica-pause", "replica-kill")

    def start(self) -> ReplicatedSite:
        self.setup = ReplicatedSetup(replicas=2).start()
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


class SentinelSite(ChaosSite):
    """A Sentinel-managed primary and replica."""

    name = "sentinel"
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
    fault_kinds = (
        "server-pause",
        "replica-pause",
        "failover",
        "primary-crash",
        "slot-migration",
        "client-kill-connections",
        "maxmemory",
    )

    def start(self) -> ClusterSite:
        self.setup = ClusterSetup().start()
        return self

    def _close(self) -> None:
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

        self.setup.migrate_slot(slot, target, on_migrating=while_migrating)
        return f"slot {slot}", f"port {source.port} -> {target.port}"


def _slot(name: str) -> int:
    return key_slot(LockKeys.for_name(PREFIX, name).lock.encode())


SITES: dict[str, type[ChaosSite]] = {
    site.name: site for site in (SingleSite, ReplicatedSite, SentinelSite, ClusterSite)
}
