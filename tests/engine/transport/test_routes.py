"""A server's pools (:mod:`django_distlock.engine.transport.routes`): requests stay within
the client's ``max_connections``, waiting for one of its connections rather than opening
more."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster

from django_distlock.engine import Backend, Lock, LockBackendUnavailable, Tuning
from django_distlock.engine.transport.routes import NodeConnections
from tests.support.engine import HOST, close_backend

CAP = 4
WORKERS = 24
RUN_FOR = 1.5


class PeakConnections:
    """Samples ``CLIENT LIST`` on a probe connection of its own, in a thread, and keeps the
    most connections named ``name`` seen at once."""

    def __init__(self, port: int, name: str) -> None:
        self.probe = redis.Redis(host=HOST, port=port, client_name="probe")
        self.name = name
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def count(self) -> int:
        return sum(1 for entry in self.probe.client_list() if entry.get("name") == self.name)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.count())
            self.samples += 1
            time.sleep(0.005)

    def __enter__(self) -> PeakConnections:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, self.count())  # pooled connections outlive the run
        self.probe.close()


def test_sync_requests_never_exceed_max_connections(private_redis):
    name = "capped-sync"
    client = redis.Redis(host=HOST, port=private_redis.port, max_connections=CAP, client_name=name)
    backend = Backend(client, auto_renew=False)
    stop = threading.Event()
    failures: list[BaseException] = []
    rounds = [0] * WORKERS

    def work(i: int) -> None:
        lock = Lock(f"own-{i}", backend=backend)
        while not stop.is_set():
            try:
                assert lock.acquire(blocking=False)
                lock.release()
            except BaseException as exc:  # asserted below
                failures.append(exc)
                return
            rounds[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    try:
        with PeakConnections(private_redis.port, name) as connections:
            for thread in threads:
                thread.start()
            time.sleep(RUN_FOR)
            stop.set()
            for thread in threads:
                thread.join(30)
        assert failures == []
        assert min(rounds) > 0, "every worker got a connection in turn"
        assert connections.samples > 10
        assert connections.peak <= CAP, f"{connections.peak} connections, max_connections={CAP}"
    finally:
        stop.set()
        backend.close()
        client.close()


async def lock_and_release(backend: Backend) -> tuple[list[int], list[BaseException]]:
    """:data:`WORKERS` tasks, each taking and giving back a lock of its own for
    :data:`RUN_FOR` seconds: the rounds each made, and what any of them raised."""
    failures: list[BaseException] = []
    rounds = [0] * WORKERS
    ends = time.monotonic() + RUN_FOR

    async def work(i: int) -> None:
        lock = Lock(f"own-{i}", backend=backend)
        while time.monotonic() < ends:
            try:
                assert await lock.aacquire(blocking=False)
                await lock.arelease()
            except BaseException as exc:  # asserted by the caller
                failures.append(exc)
                return
            rounds[i] += 1

    await asyncio.wait_for(asyncio.gather(*(work(i) for i in range(WORKERS))), 30)
    return rounds, failures


async def test_async_requests_never_exceed_max_connections(private_redis):
    name = "capped-async"
    client = redis.asyncio.Redis(
        host=HOST, port=private_redis.port, max_connections=CAP, client_name=name
    )
    backend = Backend(async_client=client, auto_renew=False)
    try:
        with PeakConnections(private_redis.port, name) as connections:
            rounds, failures = await lock_and_release(backend)
        assert failures == []
        assert min(rounds) > 0, "every task got a connection in turn"
        assert connections.samples > 10
        assert connections.peak <= CAP, f"{connections.peak} connections, max_connections={CAP}"
    finally:
        await close_backend(backend)
        await client.aclose()


def test_a_request_that_finds_no_free_connection_in_time_names_max_connections(private_redis):
    """The wait for a connection of the client's pool is bounded
    (``Tuning.connection_wait``): then the request fails, saying why."""
    client = redis.Redis(host=HOST, port=private_redis.port, max_connections=2)
    backend = Backend(client, auto_renew=False, tuning=Tuning(connection_wait=0.3))
    taken = [client.connection_pool.get_connection() for _ in range(2)]
    try:
        started = time.monotonic()
        with pytest.raises(LockBackendUnavailable, match="max_connections=2"):
            Lock("starved", backend=backend).acquire(blocking=False)
        assert 0.3 <= time.monotonic() - started < 2
    finally:
        for connection in taken:
            client.connection_pool.release(connection)
        backend.close()
        client.close()


async def test_an_async_request_that_finds_no_free_connection_in_time_names_max_connections(
    private_redis,
):
    client = redis.asyncio.Redis(host=HOST, port=private_redis.port, max_connections=2)
    backend = Backend(async_client=client, auto_renew=False, tuning=Tuning(connection_wait=0.3))
    taken = [await client.connection_pool.get_connection() for _ in range(2)]
    try:
        started = time.monotonic()
        with pytest.raises(LockBackendUnavailable, match="max_connections=2"):
            await Lock("starved", backend=backend).aacquire(blocking=False)
        assert 0.3 <= time.monotonic() - started < 2
    finally:
        for connection in taken:
            await client.connection_pool.release(connection)
        await close_backend(backend)
        await client.aclose()


def test_a_request_gets_a_connection_the_application_gives_back(private_redis):
    """A connection the application gives back (no wake-up from the engine) is seen at
    the next look at the pool."""
    client = redis.Redis(host=HOST, port=private_redis.port, max_connections=1)
    backend = Backend(client, auto_renew=False)
    taken = client.connection_pool.get_connection()
    timer = threading.Timer(0.2, client.connection_pool.release, (taken,))
    try:
        started = time.monotonic()
        timer.start()
        lock = Lock("patient", backend=backend)
        assert lock.acquire(blocking=False)
        assert 0.2 <= time.monotonic() - started < 1
        lock.release()
    finally:
        timer.join()
        backend.close()
        client.close()


async def test_async_cluster_requests_never_exceed_max_connections(cluster_setup):
    # Each node's requests go through the client's own node connections, so the
    # client's max_connections holds per node (the engine used to make uncapped pools).
    name = "capped-async-cluster"
    primary = cluster_setup.primaries[0]
    client = redis.asyncio.cluster.RedisCluster(
        host=HOST, port=primary.port, max_connections=CAP, client_name=name
    )
    backend = Backend(async_client=client, auto_renew=False)
    try:
        # redis-py keeps the connection its seed node read the slot map on, outside the
        # nodes' connections: counted before the run, not against the cap.
        await client.initialize()
        with contextlib.ExitStack() as stack:
            nodes = [PeakConnections(node.port, name) for node in cluster_setup.primaries]
            baseline = [node.count() for node in nodes]
            for node in nodes:
                stack.enter_context(node)
            rounds, failures = await lock_and_release(backend)
        assert failures == []
        assert min(rounds) > 0, "every task got a connection in turn"
        used = [node.peak - before for node, before in zip(nodes, baseline, strict=True)]
        assert sum(used) > CAP, "the locks spread over the nodes"
        for node, extra in zip(nodes, used, strict=True):
            assert node.samples > 10
            assert extra <= CAP, f"{extra} connections, max_connections={CAP}"
    finally:
        await close_backend(backend)
        await client.aclose()


class _GoneCluster:
    """A cluster client whose node ``gone`` left the slot map."""

    def get_node(self, node_name: str) -> None:
        return None


class _Connection:
    def __init__(self) -> None:
        self.disconnected = False

    async def disconnect(self) -> None:
        self.disconnected = True


async def test_a_connection_of_a_node_that_left_the_cluster_is_closed_not_leaked():
    connections = NodeConnections(_GoneCluster(), "gone")  # type: ignore[arg-type]
    connection = _Connection()
    await connections.release(connection)
    assert connection.disconnected
    await connections.disconnect(inuse_connections=False)  # nothing left to close: no error
    with pytest.raises(redis.exceptions.ConnectionError, match="gone left the cluster"):
        await connections.get_connection()
