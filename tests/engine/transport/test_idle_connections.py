"""Idle pooled connections the server closed (``CLIENT KILL``, its ``timeout``, a proxy's
idle limit) are never sent a request: a live slot migration moving a lock onto a node
whose idle connections were closed seconds before is ridden out (issue 27)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from redis.crc import key_slot

from django_distlock.engine import Backend, Lock, LockKeys
from tests.support.engine import Api, close_backend
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
