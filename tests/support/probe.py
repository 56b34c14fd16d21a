"""The lock servers a behaviour test runs on, and what tests read from them.

A behaviour test asks for the ``topology`` fixture (directly, or through ``backend``,
``make_backend`` or ``redis_client``) and, where :func:`every_topology` is that fixture
(``tests/engine/``, ``tests/test_managers.py``), runs once on each of
:data:`TOPOLOGIES`: the session's single server, its Sentinel setup and its Cluster
(``tests/conftest.py``). :data:`single_server_only`, :data:`server_and_cluster` (tests of
contending processes) and :data:`one_primary_only` narrow that for a test. A
:class:`Topology` opens the clients of each (``probe()`` for the test's own reads and
writes, :class:`BackendMaker` for the engine's ``Backend``), flushes every primary, names
it for the Django settings (:meth:`Topology.distlock_settings`) and for worker processes
(:meth:`Topology.target`, read back by :func:`backend_for_target` and
:func:`probe_for_target`).

Keys of one lock share a slot, so single-key and same-lock commands work on a cluster
probe as on one server. Commands a cluster client sends to one node only (``KEYS``,
``INFO``) or refuses across slots go through :mod:`tests.support.engine`:
``keys_matching``, ``blocked_clients`` and ``script_calls`` take a probe client and ask
every primary.

Django-free: the worker processes of :mod:`tests.support.workers` use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from django_distlock.engine import Backend
from tests.support.engine import async_client, close_backend, primaries_of, sync_client
from tests.support.redis_servers import RedisServer
from tests.support.topologies import ClusterSetup, SentinelSetup

__all__ = [
    "CLUSTER",
    "SENTINEL",
    "SINGLE",
    "TOPOLOGIES",
    "BackendMaker",
    "Probe",
    "Topology",
    "backend_for_target",
    "every_topology",
    "one_primary_only",
    "probe_for_target",
    "server_and_cluster",
    "single_server_only",
    "topology_of",
]

SINGLE = "single"
SENTINEL = "sentinel"
CLUSTER = "cluster"
TOPOLOGIES = (SINGLE, SENTINEL, CLUSTER)

Probe = redis.Redis | RedisCluster

single_server_only = pytest.mark.parametrize("topology", [SINGLE], indirect=True)
"""For a test that uses the topology-aware fixtures but is about one server (it kills,
pauses or restarts it, counts its commands, puts a proxy in front of its port, forks
with its port, or tests a client of one server): it runs on the single server only."""

server_and_cluster = pytest.mark.parametrize("topology", [SINGLE, CLUSTER], indirect=True)
"""For a test of processes contending for locks (workers started with
:meth:`Topology.target`): it runs on the single server and on the cluster, not on
Sentinel. To processes contending on it, the Sentinel setup is one primary, as the single
server is: what Sentinel adds is how a client finds that primary, which the in-process
tests on Sentinel check (and the failover tests of ``tests/faults/``). The cluster stays:
there a lock's keys, and a group's names, live on several primaries."""

one_primary_only = pytest.mark.parametrize("topology", [SINGLE, SENTINEL], indirect=True)
"""For a behaviour that only a deployment with one primary can have (the key layout before
buckets, whose keys of one lock were in different slots): not run on the cluster."""


def _no_retry() -> Retry:
    return Retry(NoBackoff(), 0)


@dataclass(frozen=True)
class Topology:
    """One of the session's lock servers: ``name`` is one of :data:`TOPOLOGIES`, and
    ``server``, ``sentinel`` or ``cluster`` the setup it names (``port`` instead of
    ``server``: a single server the test only knows by its port)."""

    name: str
    server: RedisServer | None = None
    sentinel: SentinelSetup | None = None
    cluster: ClusterSetup | None = None
    port: int | None = None

    def __str__(self) -> str:
        return self.name

    def single_port(self) -> int:
        """The port of the single server (or of whatever listens on ``port``)."""
        if self.port is not None:
            return self.port
        assert self.server is not None, f"{self.name} is not one server"
        return self.server.port

    def primaries(self) -> list[RedisServer]:
        """The servers that take writes (every primary of the cluster)."""
        if self.sentinel is not None:
            return [self.sentinel.primary]
        if self.cluster is not None:
            return self.cluster.primaries
        assert self.server is not None
        return [self.server]

    def flushall(self) -> None:
        """Empty every primary (replicas follow)."""
        if self.sentinel is not None:
            self.sentinel.flushall()
        elif self.cluster is not None:
            self.cluster.flushall()
        else:
            assert self.server is not None
            with self.server.client() as client:
                client.flushall()

    def probe(self, **kwargs: Any) -> Probe:
        """A client of the test's own, closed by the caller: the server's, the Sentinel
        primary's (the session setup never fails over), or a ``RedisCluster``. It is
        connected to every primary already: a test's first command must not wait for a
        connection (tests race the watchdog's 100 ms renewals with it)."""
        client: Probe
        if self.cluster is not None:
            client = RedisCluster(startup_nodes=self.cluster.startup_nodes, **kwargs)
        else:
            client = self.primaries()[0].client(**kwargs)
        for primary in primaries_of(client):
            primary.ping()
        return client

    def target(self) -> str:
        """This topology as a command-line argument (see :func:`backend_for_target`)."""
        if self.sentinel is not None:
            addresses = ",".join(f"{host}:{port}" for host, port in self.sentinel.sentinels)
            return f"{SENTINEL}:{addresses}/{self.sentinel.service_name}"
        if self.cluster is not None:
            return f"{CLUSTER}:" + ",".join(self.cluster.urls)
        return f"{SINGLE}:{self.single_port()}"

    def distlock_settings(self, options: str = "") -> dict[str, Any]:
        """The ``DISTLOCK`` keys that put locks on this topology (none for the single
        server: ``CACHES["default"]`` points at it). ``options``: a URL query for the
        connections to the lock servers (``"decode_responses=True"``)."""
        query = f"?{options}" if options else ""
        if self.sentinel is not None:
            service = self.sentinel.service_name
            return {
                "SENTINELS": self.sentinel.sentinels,
                "SENTINEL_SERVICE": f"redis://{service}/0{query}" if query else service,
            }
        if self.cluster is not None:
            return {"CLUSTER": [url + query for url in self.cluster.urls]}
        return {"URL": self.primaries()[0].url + query} if query else {}


@pytest.fixture(name="topology", params=TOPOLOGIES)
def every_topology(request: pytest.FixtureRequest) -> Topology:
    """The ``topology`` fixture of a parametrised package or module (imported into its
    ``conftest.py`` or module): the session's single server, Sentinel setup or Cluster,
    one per run of the test."""
    return topology_of(request, request.param)


def topology_of(request: pytest.FixtureRequest, name: str) -> Topology:
    """The session's setup called ``name``, started on first use (the ``topology``
    fixtures of ``tests/conftest.py`` and ``tests/engine/conftest.py``)."""
    if name == SENTINEL:
        return Topology(name, sentinel=request.getfixturevalue("sentinel_setup"))
    if name == CLUSTER:
        return Topology(name, cluster=request.getfixturevalue("cluster_setup"))
    return Topology(SINGLE, server=request.getfixturevalue("redis_server"))


class BackendMaker:
    """Makes ``Backend`` objects on a topology and closes whatever they and their clients
    opened (:meth:`aclose`, on the event loop the async ones used).

    Clients fail at once instead of retrying (fault tests must be quick). On a Sentinel
    setup the clients follow the primary through the Sentinels, as in production; on a
    cluster the backend gets the seed URLs, or a ``RedisCluster`` when client options
    are given.
    """

    def __init__(self) -> None:
        self.made: list[Backend] = []
        self._sync_sentinels: list[redis.sentinel.Sentinel] = []
        self._async_sentinels: list[redis.asyncio.sentinel.Sentinel] = []

    def __call__(
        self,
        topology: Topology | int,
        *,
        client_kwargs: dict[str, Any] | None = None,
        async_client_kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Backend:
        kwargs = dict(client_kwargs or {})
        akwargs = dict(kwargs if async_client_kwargs is None else async_client_kwargs)
        if isinstance(topology, int):
            topology = Topology(SINGLE, port=topology)
        if topology.cluster is not None:
            if kwargs:
                kwargs.setdefault("retry", _no_retry())
                client = RedisCluster(startup_nodes=topology.cluster.startup_nodes, **kwargs)
                backend = Backend(client, **options)
            else:
                backend = Backend(cluster=topology.cluster.urls, **options)
        elif topology.sentinel is not None:
            backend = Backend(
                self.sentinel_client(topology.sentinel, **kwargs),
                async_client=lambda: self.async_sentinel_client(topology.sentinel, **akwargs),
                **options,
            )
        else:
            port = topology.single_port()
            backend = Backend(
                sync_client(port, **kwargs),
                async_client=lambda: async_client(port, **akwargs),
                **options,
            )
        self.made.append(backend)
        return backend

    def sentinel_client(self, setup: SentinelSetup, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("retry", _no_retry())
        sentinel = redis.sentinel.Sentinel(setup.sentinels, socket_timeout=1)
        self._sync_sentinels.append(sentinel)
        return sentinel.master_for(setup.service_name, **kwargs)

    def async_sentinel_client(self, setup: SentinelSetup, **kwargs: Any) -> redis.asyncio.Redis:
        kwargs.setdefault("retry", redis.asyncio.retry.Retry(NoBackoff(), 0))
        sentinel = redis.asyncio.sentinel.Sentinel(setup.sentinels, socket_timeout=1)
        self._async_sentinels.append(sentinel)
        return sentinel.master_for(setup.service_name, **kwargs)

    async def aclose(self) -> None:
        for backend in self.made:
            await close_backend(backend)
        for sentinel in self._sync_sentinels:
            for client in sentinel.sentinels:
                client.close()
        for asentinel in self._async_sentinels:
            for aclient in asentinel.sentinels:
                await aclient.aclose()


def _parse_target(target: str) -> tuple[str, str]:
    kind, _, rest = target.partition(":")
    if kind not in TOPOLOGIES or not rest:
        raise ValueError(f"not a topology target: {target!r}")
    return kind, rest


def backend_for_target(target: str) -> Backend:
    """A sync backend on ``target`` (:meth:`Topology.target`) in a worker process:
    ``single:PORT``, ``sentinel:HOST:PORT,.../SERVICE`` or ``cluster:URL,...``."""
    kind, rest = _parse_target(target)
    if kind == CLUSTER:
        return Backend(cluster=rest.split(","))
    if kind == SENTINEL:
        sentinels, service = _sentinel_target(rest)
        client = redis.sentinel.Sentinel(sentinels, socket_timeout=1).master_for(
            service, retry=_no_retry()
        )
        return Backend(client)
    return Backend(sync_client(int(rest)))


def probe_for_target(target: str) -> Probe:
    """A client on ``target`` for a worker's own reads and writes (single keys only on
    a cluster)."""
    kind, rest = _parse_target(target)
    if kind == CLUSTER:
        return RedisCluster(startup_nodes=[ClusterNode(*_address(url)) for url in rest.split(",")])
    if kind == SENTINEL:
        sentinels, service = _sentinel_target(rest)
        # Timeouts for the Sentinels only: the worker's BLPOP on the primary waits long.
        sentinel = redis.sentinel.Sentinel(sentinels, sentinel_kwargs={"socket_timeout": 1})
        return sentinel.master_for(service)
    return sync_client(int(rest))


def _address(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("redis://").partition(":")
    return host, int(port)


def _sentinel_target(rest: str) -> tuple[list[tuple[str, int]], str]:
    addresses, _, service = rest.partition("/")
    return [_address(address) for address in addresses.split(",")], service
