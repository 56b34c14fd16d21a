"""A rolling deploy from the key layout before buckets (0.1.0.dev0) never doubles a lock.

The two layouts keep a lock under different keys, so neither can see the other's locks.
The first acquire of a backend claims the server for the bucket layout
(``core.claim_layout_steps``): refused while the earlier layout's index lists a live lock,
after which a marker string replaces that index and the earlier version's scripts fail
with WRONGTYPE instead of taking a lock. The earlier version's side runs its own scripts,
frozen in ``tests.support.legacy_layout``. It runs on the single server and on Sentinel:
the earlier layout could not run on a cluster (its index was in another slot).
"""

from __future__ import annotations

import pytest
import redis

from django_distlock.engine import Backend, Lock, LockBackendError, LockBackendUnavailable
from django_distlock.engine.core import LAYOUT_MARKER
from django_distlock.engine.keys import legacy_index_key
from tests.engine.conftest import BackendFactory
from tests.support.engine import Api
from tests.support.legacy_layout import legacy_acquire, legacy_keys, legacy_release
from tests.support.probe import one_primary_only
from tests.support.topologies import ClusterSetup

PREFIX = "distlock:"
NAME = "invoice:42"


@one_primary_only
async def test_a_lock_held_by_the_earlier_layout_is_not_taken_again(
    api: Api, backend: Backend, redis_client: redis.Redis
) -> None:
    assert legacy_acquire(redis_client, PREFIX, NAME, "old-token", 60_000)[0] == 1

    lock = Lock(NAME, backend=backend, auto_renew=False)
    with pytest.raises(LockBackendUnavailable) as refused:
        await api.acquire(lock, blocking=False)

    message = str(refused.value)
    assert "1 lock is held under the key layout of django-distlock before 0.1.0.dev1" in message
    assert "'distlock:index'" in message
    assert "stop the processes of the earlier version" in message
    assert refused.value.name == NAME
    assert not lock.held
    # Nothing of the earlier version's lock was touched, and nothing of ours written.
    assert redis_client.type(legacy_index_key(PREFIX)) == b"zset"
    assert redis_client.exists(legacy_keys(PREFIX, NAME)[0]) == 1
    lock_key, fence_key = legacy_keys(PREFIX, NAME)[:2]
    assert sorted(redis_client.keys(f"{PREFIX}{{*")) == [lock_key.encode(), fence_key.encode()]


@one_primary_only
async def test_once_the_earlier_layout_holds_nothing_the_server_is_claimed(
    api: Api, backend: Backend, redis_client: redis.Redis
) -> None:
    legacy_acquire(redis_client, PREFIX, "other", "old-token", 60_000)
    assert legacy_release(redis_client, PREFIX, "other", "old-token") == 1

    lock = Lock(NAME, backend=backend, auto_renew=False)
    assert await api.acquire(lock, blocking=False)
    try:
        assert redis_client.get(legacy_index_key(PREFIX)) == LAYOUT_MARKER.encode()
        # The earlier version's acquire now fails instead of taking a lock we cannot see.
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            legacy_acquire(redis_client, PREFIX, NAME, "old-token", 60_000)
    finally:
        await api.release(lock)


@one_primary_only
async def test_expired_entries_of_the_earlier_layout_do_not_block_the_claim(
    api: Api, backend: Backend, redis_client: redis.Redis
) -> None:
    # A lock of the earlier version that expired without a release left its index entry.
    redis_client.zadd(legacy_index_key(PREFIX), {"crashed": 1})

    lock = Lock(NAME, backend=backend, auto_renew=False)
    assert await api.acquire(lock, blocking=False)
    await api.release(lock)
    assert redis_client.get(legacy_index_key(PREFIX)) == LAYOUT_MARKER.encode()


@one_primary_only
async def test_the_claim_is_one_round_trip_per_backend(
    api: Api, make_backend: BackendFactory, redis_client: redis.Redis
) -> None:
    claimed = make_backend()
    lock = Lock(NAME, backend=claimed, auto_renew=False)
    assert await api.acquire(lock, blocking=False)
    await api.release(lock)
    assert claimed.layout_claimed

    # Later acquires of a claimed backend do not ask again: they still succeed when the
    # marker is (artificially) replaced by a live earlier-layout lock...
    redis_client.delete(legacy_index_key(PREFIX))
    legacy_acquire(redis_client, PREFIX, "other", "old-token", 60_000)
    assert await api.acquire(lock, blocking=False)
    await api.release(lock)
    # ...which a new backend (a new process) refuses.
    with pytest.raises(LockBackendUnavailable):
        await api.acquire(Lock(NAME, backend=make_backend(), auto_renew=False), blocking=False)


@one_primary_only
async def test_a_key_of_another_type_at_the_old_index_is_a_backend_error(
    api: Api, backend: Backend, redis_client: redis.Redis
) -> None:
    redis_client.hset(legacy_index_key(PREFIX), "x", "1")

    with pytest.raises(LockBackendError, match=r"distlock:index is a hash, not a lock index"):
        await api.acquire(Lock(NAME, backend=backend, auto_renew=False), blocking=False)
    assert redis_client.type(legacy_index_key(PREFIX)) == b"hash"


def test_a_cluster_backend_claims_nothing(cluster_setup: ClusterSetup) -> None:
    # The layout before buckets could not run on a cluster (its index was in another slot).
    backend = Backend(cluster=cluster_setup.urls)
    try:
        assert backend.layout_claimed
    finally:
        backend.close()
