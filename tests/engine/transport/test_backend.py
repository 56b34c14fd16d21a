"""Backend: configuration, clients per event loop, key prefix, and observer events."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import sys
import threading
import time

import pytest
import redis
import redis.asyncio

from django_distlock.engine import Backend, Event, Lock, LockError, LockGroup, LockKeys
from django_distlock.engine.transport import routes as clusters
from tests.support.engine import (
    async_client,
    await_until,
    blocked_clients,
    keys_matching,
    lock_key,
    sync_client,
    wait_until,
)
from tests.support.probe import Topology, single_server_only

# -- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "argument"),
    [
        ({"prefix": ""}, ValueError, "prefix"),
        ({"prefix": "{app}:"}, ValueError, "prefix"),
        ({"prefix": "app}"}, ValueError, "prefix"),
        ({"prefix": 1}, TypeError, "prefix"),
        ({"timeout": 0}, ValueError, "timeout"),
        ({"timeout": -5}, ValueError, "timeout"),
        ({"timeout": math.nan}, ValueError, "timeout"),
        ({"timeout": math.inf}, ValueError, "timeout"),
        ({"timeout": True}, TypeError, "timeout"),
        ({"timeout": "30"}, TypeError, "timeout"),
        ({"timeout": 1e16}, ValueError, "timeout must be at most"),
        pytest.param(
            {"timeout": 10**400}, ValueError, "timeout must be at most", id="timeout=10**400"
        ),
        ({"auto_renew": 1}, TypeError, "auto_renew"),
        ({"observer": "log"}, TypeError, "observer"),
    ],
    ids=repr,
)
def test_bad_backend_arguments_are_rejected_naming_the_argument(kwargs, error, argument):
    with pytest.raises(error, match=argument):
        Backend(redis.Redis(), **kwargs)


@pytest.mark.parametrize(
    "client", ["redis://localhost", 42, redis.asyncio.Redis()], ids=["url", "int", "async-client"]
)
def test_backend_client_must_be_a_sync_redis_client(client):
    with pytest.raises(TypeError, match="client"):
        Backend(client)


def test_backend_needs_at_least_one_client():
    with pytest.raises(TypeError, match="client"):
        Backend()
    with pytest.raises(TypeError, match="client"):
        Backend(None, async_client=None)


def test_backend_repr_names_the_prefix():
    assert "app:locks:" in repr(Backend(redis.Redis(), prefix="app:locks:"))


async def test_a_backend_knows_it_is_on_a_cluster_without_io():
    """``is_cluster`` is known from what the backend was given, also when that is only an
    asyncio ``RedisCluster`` (regression: only a sync one or seed URLs counted)."""
    seeds = ["redis://127.0.0.1:1"]  # nothing is connected to
    async_cluster = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=1)
    try:
        assert Backend(cluster=seeds).is_cluster
        assert Backend(async_client=async_cluster).is_cluster
        assert "cluster" in repr(Backend(async_client=async_cluster))
        assert not Backend(redis.Redis(port=1)).is_cluster
        assert not Backend(async_client=lambda: redis.asyncio.Redis(port=1)).is_cluster
    finally:
        await async_cluster.aclose()


@pytest.mark.parametrize("given", ["instance", "factory"])
async def test_a_group_on_a_backend_given_only_an_async_cluster_client(cluster_setup, given):
    """A group of names in several buckets, on a backend whose only client is an asyncio
    ``RedisCluster`` (or a factory making one), takes its names a slot at a time
    (regression: the backend took itself for one server and sent one script for every
    name: ``CROSSSLOT``)."""
    cluster_setup.flushall()

    def make() -> redis.asyncio.cluster.RedisCluster:
        nodes = cluster_setup.startup_nodes
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(n.host, n.port) for n in nodes]
        )

    client = make() if given == "instance" else None
    backend = Backend(async_client=client if client is not None else make)
    names = [f"group:{number}" for number in range(8)]
    assert len({LockKeys.for_name("distlock:", name).bucket for name in names}) > 1
    try:
        group = LockGroup(names, backend=backend)
        assert await group.aacquire()
        probe = cluster_setup.client()
        assert all(probe.exists(lock_key(name)) for name in names)
        await group.arelease()
    finally:
        await backend.aclose()
        if client is not None:
            await client.aclose()


async def test_sync_use_without_a_sync_client_raises_lock_error(redis_server):
    backend = Backend(async_client=lambda: async_client(redis_server.port))
    lock = Lock("x", backend=backend)
    with pytest.raises(LockError, match="sync client"):
        lock.acquire()
    assert await lock.aacquire()
    await lock.arelease()


@single_server_only
async def test_async_use_without_an_async_client_raises_lock_error(redis_server, redis_client):
    backend = Backend(sync_client(redis_server.port))
    lock = Lock("x", backend=backend)
    with pytest.raises(LockError, match="async client"):
        await lock.aacquire()
    assert lock.acquire()
    lock.release()
    backend.client.close()


@single_server_only
async def test_async_client_factory_is_called_once_per_event_loop(redis_server, redis_client):
    """redis-py's asyncio clients belong to the loop that uses them: the factory is
    called once for each event loop that takes a lock, and what it made is closed when
    that loop shuts down."""
    made: list[tuple[asyncio.AbstractEventLoop, redis.asyncio.Redis]] = []

    def factory():
        client = async_client(redis_server.port, client_name=f"per-loop-{len(made)}")
        made.append((asyncio.get_running_loop(), client))
        return client

    backend = Backend(async_client=factory)
    lock = Lock("per-loop", backend=backend)
    for _ in range(3):
        async with lock:
            pass
    assert [loop for loop, _ in made] == [asyncio.get_running_loop()]

    def in_a_new_loop():
        async def use():
            async with lock:
                return asyncio.get_running_loop()

        return asyncio.run(use())

    other_loop = await asyncio.to_thread(in_a_new_loop)
    assert other_loop is not asyncio.get_running_loop()
    assert [loop for loop, _ in made] == [asyncio.get_running_loop(), other_loop]
    # That loop's client was closed at its shutdown (asyncio.run finalizes async
    # generators): no connection of it is left open on the server.
    names = [c["name"] for c in redis_client.client_list()]
    assert names.count("per-loop-1") == 0
    await backend.aclose()


@single_server_only
async def test_async_client_may_be_given_as_an_instance(redis_server, redis_client):
    client = async_client(redis_server.port)
    try:
        backend = Backend(async_client=client)
        lock = Lock("instance", backend=backend)
        async with lock:
            assert await client.exists(lock_key("instance")) == 1
        assert await client.exists(lock_key("instance")) == 0
    finally:
        await client.aclose()


def connections_named(topology: Topology, client_name: str) -> list[int]:
    """How many connections called ``client_name`` each primary has open."""
    counts = []
    for primary in topology.primaries():
        with primary.client() as client:
            counts.append(sum(1 for c in client.client_list() if c["name"] == client_name))
    return counts


def test_cluster_seed_url_settings_reach_the_cluster_clients():
    url = "rediss://app:secret@127.0.0.1:7000/0?socket_timeout=2&client_name=app"
    address, options = clusters._url_options(url)
    assert address == ("127.0.0.1", 7000)
    assert options == {
        "username": "app",
        "password": "secret",
        "db": 0,
        "socket_timeout": 2.0,
        "client_name": "app",
        "ssl": True,
    }
    aclient = clusters.async_cluster_from_urls([url])
    assert aclient.nodes_manager.connection_kwargs["password"] == "secret"
    assert aclient.nodes_manager.connection_kwargs["client_name"] == "app"


async def test_async_connections_carry_the_settings_of_the_client(
    topology, make_backend, redis_client
):
    """The engine's own async connections are opened with the client's settings
    (credentials, db, timeouts, name), also on a cluster (regression: there they got
    none of them)."""
    backend = make_backend(client_kwargs={"client_name": "settings-probe"})
    backend.client.close()  # from here on, only the engine's connections carry the name
    for number in range(30):  # on a cluster, locks on every primary
        async with Lock(f"spread:{number}", backend=backend):
            pass
    assert all(connections_named(topology, "settings-probe"))


async def test_aclose_closes_the_async_connections_to_every_node(
    topology, make_backend, redis_client
):
    """When ``aclose()`` returns, the running loop's connections are closed on every node
    (regression: on a cluster, some were left to a task of their own that the loop's
    shutdown cancelled, and leaked)."""
    backend = make_backend(client_kwargs={"client_name": "aclose-probe"})
    backend.client.close()  # from here on, only the engine's connections carry the name
    holder = Lock("busy", backend=backend, timeout=10)
    await holder.aacquire()
    assert not await Lock("busy", backend=backend).aacquire(blocking_timeout=0.1)
    await holder.arelease()
    assert any(connections_named(topology, "aclose-probe"))
    await backend.aclose()
    # Polled without yielding to the event loop: nothing else may close them meanwhile.
    wait_until(lambda: not any(connections_named(topology, "aclose-probe")), timeout=2)


# -- the prefix -------------------------------------------------------------------------


async def test_aclose_closes_the_connections_to_every_cluster_node(cluster_setup, monkeypatch):
    """Closing a cluster backend closes its connections of the running loop on every node:
    not only the first node's (dropping the loop's closer first let its finalizer take
    the other nodes' pools, and a loop ending soon after never finished closing them)."""
    connect = redis.asyncio.connection.AbstractConnection.connect
    opened: list[redis.asyncio.connection.AbstractConnection] = []

    async def recorded_connect(self, *args, **kwargs):
        opened.append(self)
        return await connect(self, *args, **kwargs)

    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "connect", recorded_connect)
    backend = Backend(cluster=cluster_setup.urls)
    # The locks live on one node, four at once (four connections there); the slot map
    # is read by redis-py's cluster client, whose connections the backend closes too.
    elsewhere = cluster_setup.nodes[1]
    names = [
        name
        for name in (f"spread:{number}" for number in range(1000))
        if cluster_setup.node_for_key(LockKeys.for_name("distlock:", name).lock) is elsewhere
    ][:4]
    locks = [Lock(name, backend=backend) for name in names]
    assert all(await asyncio.gather(*(lock.aacquire() for lock in locks)))
    for lock in locks:
        await lock.arelease()
    assert elsewhere.port in {connection.port for connection in opened}
    await backend.aclose()
    assert [connection for connection in opened if connection.is_connected] == []


async def test_every_key_a_lock_writes_is_under_the_prefix(make_backend, redis_client):
    """Holders, fair and unfair waiters, extends and releases leave keys under the
    prefix only."""
    backend = make_backend(prefix="app:locks:")
    seen: set[bytes] = set()

    def snapshot():
        seen.update(keys_matching(redis_client))

    for fair in (False, True):
        holder = Lock("job", backend=backend, fair=fair)
        await holder.aacquire()
        waiters = [
            asyncio.create_task(
                Lock("job", backend=backend, fair=fair).aacquire(blocking_timeout=5)
            )
            for _ in range(2)
        ]
        await await_until(lambda: blocked_clients(redis_client) == 2)
        await holder.aextend(1)
        snapshot()
        await holder.arelease()
        done, _ = await asyncio.wait(waiters, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert [task.result() for task in done] == [True]
        snapshot()
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        snapshot()
        redis_client.delete(LockKeys.for_name("app:locks:", "job").lock)

    assert seen
    assert all(key.startswith(b"app:locks:") for key in seen), seen
    job = LockKeys.for_name("app:locks:", "job")
    assert job.lock.encode() in seen
    assert job.index.encode() in seen


async def test_locks_under_different_prefixes_are_independent(api, make_backend, redis_client):
    first = Lock("same", backend=make_backend(prefix="one:"))
    second = Lock("same", backend=make_backend(prefix="two:"))
    assert await api.acquire(first, blocking=False)
    assert await api.acquire(second, blocking=False)
    assert redis_client.exists(lock_key("same", "one:"), lock_key("same", "two:")) == 2
    await api.release(first)
    await api.release(second)


# -- events -----------------------------------------------------------------------------


def current_thread_label(api):
    if api.name == "sync":
        return threading.current_thread().name
    return asyncio.current_task().get_name()


def assert_common_fields(event: Event, api, *, name: str, context: str) -> None:
    assert event.name == name
    assert event.context == context
    assert event.host == socket.gethostname()
    assert event.pid == os.getpid()
    assert event.thread == current_thread_label(api)
    assert abs(event.at - time.time()) < 5


async def test_acquired_and_released_events(api, observed_backend, recorder):
    lock = Lock("evt", backend=observed_backend, context="nightly")
    await api.acquire(lock)
    fence = lock.fence
    await asyncio.sleep(0.05)
    await api.release(lock)

    assert recorder.kinds() == ["acquired", "released"]
    acquired, released = recorder.events
    for event in (acquired, released):
        assert_common_fields(event, api, name="evt", context="nightly")
        assert event.fence == fence
        assert event.reason == ""
    assert 0 <= acquired.waited < 0.5
    assert acquired.held is None
    assert 0.05 <= released.held < 2
    assert acquired.at <= released.at


async def test_waited_counts_the_wait(api, observed_backend, recorder):
    holder = Lock("evt", backend=observed_backend, timeout=0.3, auto_renew=False)
    await api.acquire(holder)
    waiter = Lock("evt", backend=observed_backend)
    assert await api.acquire(waiter, blocking_timeout=5)
    acquired = recorder.of("acquired")
    assert len(acquired) == 2
    assert acquired[1].fence > acquired[0].fence
    assert 0.2 <= acquired[1].waited < 2
    await api.release(waiter)


async def test_contended_events(api, observed_backend, recorder):
    holder = Lock("evt", backend=observed_backend, timeout=10)
    await api.acquire(holder)
    other = Lock("evt", backend=observed_backend, context="ctx")
    assert not await api.acquire(other, blocking=False)
    assert not await api.acquire(other, blocking_timeout=0.2)

    contended = recorder.of("contended")
    assert len(contended) == 2
    for event in contended:
        assert_common_fields(event, api, name="evt", context="ctx")
        assert event.fence is None
        assert 8 < event.retry_after <= 10
    assert contended[0].waited < 0.5
    assert 0.2 <= contended[1].waited < 2
    await api.release(holder)


async def test_extended_event(api, observed_backend, recorder):
    lock = Lock("evt", backend=observed_backend, auto_renew=False)
    await api.acquire(lock)
    await api.extend(lock, 5)
    await api.reacquire(lock)
    extended = recorder.of("extended")
    assert len(extended) == 2
    for event in extended:
        assert_common_fields(event, api, name="evt", context="")
        assert event.fence == lock.fence


async def test_lost_event_when_an_extend_finds_the_lock_gone(
    api, observed_backend, recorder, redis_client
):
    lock = Lock("evt", backend=observed_backend, auto_renew=False)
    started = time.monotonic()
    await api.acquire(lock)
    fence = lock.fence
    redis_client.delete(lock_key("evt"))
    with pytest.raises(LockError):
        await api.extend(lock, 5)
    elapsed = time.monotonic() - started
    with pytest.raises(LockError):
        await api.release(lock)
    lost = recorder.of("lost")
    assert len(lost) == 1  # reported once, not again by the failed release
    assert_common_fields(lost[0], api, name="evt", context="")
    assert lost[0].fence == fence
    assert lost[0].reason
    assert 0 < lost[0].held <= elapsed  # from the acquire to the extend that found it gone
    assert "released" not in recorder.kinds()


async def test_a_failing_observer_never_breaks_the_lock(api, make_backend, redis_client, caplog):
    calls = []

    def broken(event):
        calls.append(event.kind)
        raise RuntimeError("observer is down")

    backend = make_backend(observer=broken)
    lock = Lock("evt", backend=backend)
    with caplog.at_level(logging.ERROR, logger="django_distlock"):
        async with api.hold(lock):
            assert redis_client.exists(lock_key("evt")) == 1
            assert not await api.acquire(Lock("evt", backend=backend), blocking=False)
    assert redis_client.exists(lock_key("evt")) == 0
    assert calls == ["acquired", "contended", "released"]
    failures = [r for r in caplog.records if "observer failed" in r.getMessage()]
    assert len(failures) == 3


def test_emit_stamps_the_time_and_keeps_a_given_one(recorder):
    backend = Backend(redis.Redis(), observer=recorder)
    common = {"name": "n", "fence": 1, "context": "", "host": "h", "pid": 1, "thread": "t"}
    backend.emit(Event("acquired", **common))
    backend.emit(Event("released", **common, at=123.0))
    assert abs(recorder.events[0].at - time.time()) < 5
    assert recorder.events[1].at == 123.0


def test_threads_reading_a_new_cluster_slot_map_at_once_do_not_trip_over_each_other(
    cluster_setup,
):
    """Threads taking their first locks on a new cluster backend at once all read the slot
    map, each adding the nodes it learns of while the others list the known ones
    (regression: "dictionary changed size during iteration" failed a first acquire).
    The GIL changes hands as often as it can, to let the threads interleave."""
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors: list[BaseException] = []
    try:
        for _ in range(25):
            backend = Backend(cluster=cluster_setup.urls)
            start = threading.Barrier(12)

            def first(number: int, backend: Backend = backend, start: threading.Barrier = start):
                start.wait(timeout=10)
                try:
                    lock = Lock(f"first:{number}", backend=backend, auto_renew=False)
                    assert lock.acquire(blocking=False)
                    lock.release()
                except BaseException as exc:  # collected for the assertion below
                    errors.append(exc)

            threads = [threading.Thread(target=first, args=(number,)) for number in range(12)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            backend.close()
    finally:
        sys.setswitchinterval(switch_interval)
    assert errors == []
