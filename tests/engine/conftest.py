"""Fixtures for the engine tests: backends on the suite's real servers, closed cleanly."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis

from django_distlock.engine import Backend
from tests.support.engine import (
    Api,
    AsyncApi,
    Recorder,
    SyncApi,
    async_client,
    close_backend,
    closed_port,
    sync_client,
)
from tests.support.kind_workers import (
    Topology,
    backend_for,
    cluster_target,
    sentinel_target,
    single_target,
)
from tests.support.redis_servers import RedisServer

BackendFactory = Callable[..., Backend]


@pytest.fixture
async def make_backend(redis_server: RedisServer) -> AsyncIterator[BackendFactory]:
    """``make_backend(server=None, *, port=None, client_kwargs=None, **backend_options)``:
    a Backend with a sync and an async client on ``server`` (default: the shared one)."""
    made: list[Backend] = []

    def make(
        server: RedisServer | None = None,
        *,
        port: int | None = None,
        client_kwargs: dict[str, Any] | None = None,
        async_client_kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Backend:
        target = port if port is not None else (server or redis_server).port
        kwargs = dict(client_kwargs or {})
        akwargs = dict(kwargs if async_client_kwargs is None else async_client_kwargs)
        backend = Backend(
            sync_client(target, **kwargs),
            async_client=lambda: async_client(target, **akwargs),
            **options,
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await close_backend(backend)


@pytest.fixture
def backend(make_backend: BackendFactory, redis_client: redis.Redis) -> Backend:
    """A backend on the shared server, flushed before the test."""
    return make_backend()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def observed_backend(
    make_backend: BackendFactory, redis_client: redis.Redis, recorder: Recorder
) -> Backend:
    """A backend on the shared server whose events go to ``recorder``."""
    return make_backend(observer=recorder)


@pytest.fixture
def dead_backend(make_backend: BackendFactory) -> Backend:
    """A backend whose clients point at a closed port: any network call fails with
    ``LockBackendUnavailable``, so a ``TypeError``/``ValueError`` from it proves the
    input was refused before any network call."""
    return make_backend(
        port=closed_port(), client_kwargs={"socket_connect_timeout": 1, "socket_timeout": 1}
    )


@pytest.fixture(params=[SyncApi(), AsyncApi()], ids=lambda api: api.name)
def api(request: pytest.FixtureRequest) -> Api:
    """The sync or the async face of the lock."""
    return request.param


@pytest.fixture(params=["single", "cluster"])
def topology(request: pytest.FixtureRequest) -> Topology:
    """The shared single server or the shared cluster, flushed, for worker processes
    (``tests/support/kind_workers.py``); ``"sentinel"`` by indirect parametrization."""
    if request.param == "single":
        server = request.getfixturevalue("redis_server")
        client = request.getfixturevalue("redis_client")  # flushed
        return Topology("single", single_target(server.url), client)
    if request.param == "sentinel":
        setup = request.getfixturevalue("sentinel_setup")
        setup.flushall()
        return Topology("sentinel", sentinel_target(setup.sentinels, "mymaster"), setup.client())
    cluster = request.getfixturevalue("cluster_setup")
    cluster.flushall()
    return Topology("cluster", cluster_target(cluster.urls), cluster.client())


@pytest.fixture
async def backend_on(topology: Topology) -> AsyncIterator[Backend]:
    """A backend of the test's own on ``topology`` (sync and async)."""
    backend = backend_for(topology.target, timeout=10)
    yield backend
    await close_backend(backend)
