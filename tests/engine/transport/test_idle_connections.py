"""Idle pooled connections the server closed (``CLIENT KILL``, its ``timeout``, a proxy's
idle limit) are never sent a request: a live slot migration moving a lock onto a node
whose idle connections were closed seconds before is ridden out (issue 27)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

from django_distlock.engine import Backend, Lock, LockKeys
from tests.support.engine import Api, close_backend
from tests.support.proxy import TcpProxy
from tests.support.redis_servers import RedisServer
from tests.support.topologies import ClusterSetup

PREFIX = "distlock:"


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "plain"])
async def test_a_lock_migrating_onto_a_node_whose_idle_connections_were_closed_rides_it_out(
    api: Api, private_cluster: ClusterSetup, fair: bool
) -> None:
    """The chaos run's finding (cluster, ``fair-async``): ``CLIENT KILL`` closed every
    connection; seconds later a slot migration moved the lock to a node whose idle
    connections the backend's pools still held. redis-py 8.1's asyncio pool hands such a
    connection out unchecked (its check is skipped while maintenance notifications are
    on, the default), so the acquire's script was written on a socket the server had
    closed and raised ``LockBackendUnavailable`` ("Connection closed by server"). The
    request never reached Redis: the engine opens a new connection and sends it there."""
    backend = Backend(cluster=private_cluster.urls)
    name = "moving"
    slot = key_slot(LockKeys.for_name(PREFIX, name).lock.encode())
    home = private_cluster.primary_for_slot(slot)
    other = next(node for node in private_cluster.primaries if node is not home)
    lock = Lock(name, backend=backend, timeout=30, fair=fair, auto_renew=False)
    # The lock lives on `other` for a while: the backend keeps idle connections there.
    private_cluster.migrate_slot(slot, other)
    assert await api.acquire(lock, blocking_timeout=5)
    await api.release(lock)
    private_cluster.migrate_slot(slot, home)
    assert await api.acquire(lock, blocking_timeout=5)
    await api.release(lock)
    with other.client() as admin:
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    await asyncio.sleep(0.2)  # the kill is past: the client has seen the sockets close

    # Live: every key moved to `other`, the slot still MIGRATING (ASK there, TRYAGAIN
    # until the move ends, then MOVED).
    migration = private_cluster.begin_slot_migration(slot, other)
    migration.move_keys()
    finisher = threading.Timer(0.5, migration.finish)
    finisher.start()
    try:
        assert await api.acquire(lock, blocking_timeout=5)
    finally:
        await asyncio.to_thread(finisher.join)
    assert private_cluster.primary_for_slot(slot) is other
    assert await api.owned(lock)
    await api.release(lock)
    with other.client() as probe:
        assert probe.exists(LockKeys.for_name(PREFIX, name).lock) == 0
    await close_backend(backend)


def _backend_through(proxy: TcpProxy) -> Backend:
    """A backend whose sync and async clients reach the server through ``proxy``."""
    return Backend(
        redis.Redis.from_url(proxy.url),
        async_client=lambda: redis.asyncio.Redis.from_url(proxy.url),
    )


async def test_an_idle_connection_the_network_reset_is_not_written_on(
    api: Api, redis_server: RedisServer, make_proxy: Callable[[RedisServer], TcpProxy]
) -> None:
    """A request whose write fails on a pooled connection reset while idle (a proxy's or
    firewall's RST, not the server's orderly close) is written again on a new one.

    redis-py's pure-Python parser does not see the reset in ``can_read``. On CPython
    3.13.0-3.13.5 asyncio's ``writelines`` on such a transport raised ``AttributeError``
    (python/cpython#136234), which escaped ``aacquire`` as is (found by the Python 3.13
    pass); on 3.11 the write's drain failed, and an acquire that never reached Redis raised
    ``LockBackendUnavailable`` with the server up. The sync pool's check sees the reset."""
    proxy = make_proxy(redis_server)
    backend = _backend_through(proxy)
    lock = Lock("reset-while-idle", backend=backend, timeout=30, auto_renew=False)
    try:
        assert await api.acquire(lock, blocking=False)
        await api.release(lock)
        proxy.cut()  # every pooled connection is reset: both ends get an RST
        await asyncio.sleep(0.2)  # the client's side has seen it

        assert await api.acquire(lock, blocking=False)
        assert await api.owned(lock)
        await api.release(lock)
    finally:
        await close_backend(backend)


async def test_an_idle_wait_connection_the_network_reset_is_not_written_on(
    api: Api, redis_server: RedisServer, make_proxy: Callable[[RedisServer], TcpProxy]
) -> None:
    """The same for the connections blocking acquires wait on (their own pool): a waiter
    whose pooled wait connection was reset while idle waits on a new one, and is woken by
    the release (the chaos runs' ``mutex-async`` workload on Python 3.13 found it)."""
    proxy = make_proxy(redis_server)
    backend = _backend_through(proxy)
    direct = Backend(redis.Redis.from_url(redis_server.url))
    name = "reset-while-waiting"
    holder = Lock(name, backend=direct, timeout=30, auto_renew=False)
    waiter = Lock(name, backend=backend, timeout=30, auto_renew=False)
    taken = threading.Event()

    def hold_briefly() -> None:  # a sync lock is released by the thread that took it
        with holder:
            taken.set()
            time.sleep(0.3)

    try:
        for reset in (False, True):
            taken.clear()
            other = threading.Thread(target=hold_briefly)
            other.start()
            try:
                assert taken.wait(5)
                assert await api.acquire(waiter, blocking_timeout=10)
            finally:
                await asyncio.to_thread(other.join)
            await api.release(waiter)
            if not reset:
                proxy.cut()  # the wait connection, back in its pool, is reset
                await asyncio.sleep(0.2)
    finally:
        await close_backend(backend)
        direct.close()
