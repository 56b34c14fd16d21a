"""Fixtures for the engine tests: backends on the suite's real servers, closed cleanly.

Every test here that uses ``topology`` (through ``backend``, ``make_backend`` or
``redis_client``) runs on each topology, ``single``, ``sentinel`` and ``cluster``
(``tests/conftest.py`` says which tests stay on one server, and how).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis

from django_distlock.engine import Backend
from tests.support.engine import Api, AsyncApi, Recorder, SyncApi, close_backend, closed_port
from tests.support.kind_workers import Topology as KindTopology
from tests.support.kind_workers import (
    backend_for,
    cluster_target,
    single_target,
)
from tests.support.probe import BackendMaker, Topology, every_topology  # noqa: F401
from tests.support.redis_servers import RedisServer

BackendFactory = Callable[..., Backend]


@pytest.fixture
async def make_backend(topology: Topology) -> AsyncIterator[BackendFactory]:
    """``make_backend(server=None, *, port=None, client_kwargs=None,
    async_client_kwargs=None, **backend_options)``: a Backend with a sync and an async
    client on ``server`` or ``port`` (default: the test's topology)."""
    maker = BackendMaker()

    def make(
        server: RedisServer | None = None, *, port: int | None = None, **options: Any
    ) -> Backend:
        if port is None and server is not None:
            port = server.port
        return maker(topology if port is None else port, **options)

    yield make
    await maker.aclose()


@pytest.fixture
def backend(make_backend: BackendFactory, redis_client: redis.Redis) -> Backend:
    """A backend on the test's topology, flushed before the test."""
    return make_backend()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def observed_backend(
    make_backend: BackendFactory, redis_client: redis.Redis, recorder: Recorder
) -> Backend:
    """A backend on the test's topology whose events go to ``recorder``."""
    return make_backend(observer=recorder)


@pytest.fixture
async def dead_backend() -> AsyncIterator[Backend]:
    """A backend whose clients point at a closed port: any network call fails with
    ``LockBackendUnavailable``, so a ``TypeError``/``ValueError`` from it proves the
    input was refused before any network call. (No topology: nothing answers there.)"""
    maker = BackendMaker()
    yield maker(closed_port(), client_kwargs={"socket_connect_timeout": 1, "socket_timeout": 1})
    await maker.aclose()


@pytest.fixture(params=[SyncApi(), AsyncApi()], ids=lambda api: api.name)
def api(request: pytest.FixtureRequest) -> Api:
    """The sync or the async face of the lock."""
    return request.param


@pytest.fixture(params=["single", "cluster"])
def kind_topology(request: pytest.FixtureRequest) -> Iterator[KindTopology]:
    """The shared single server or the shared cluster, flushed, for worker processes
    (``tests/support/kind_workers.py``): processes contend on one server and on the
    cluster, not on Sentinel, whose primary is one server to them (see
    ``server_and_cluster`` in ``tests/support/probe.py``)."""
    if request.param == "single":
        server = request.getfixturevalue("redis_server")
        with server.client() as client:
            client.flushall()
            yield KindTopology("single", single_target(server.url), client)
    else:
        cluster = request.getfixturevalue("cluster_setup")
        cluster.flushall()
        yield KindTopology("cluster", cluster_target(cluster.urls), cluster.client())


@pytest.fixture
async def backend_on(kind_topology: KindTopology) -> AsyncIterator[Backend]:
    """A backend of the test's own on ``kind_topology`` (sync and async)."""
    backend = backend_for(kind_topology.target, timeout=10)
    yield backend
    await close_backend(backend)
