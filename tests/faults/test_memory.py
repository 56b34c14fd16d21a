"""Memory hygiene (issue 9, item 9): what locks leave behind in Redis once released or
expired must be bounded: fence counters with a short lifetime, and no stale entries in
the listing index."""

from __future__ import annotations

import asyncio

from django_distlock.engine import Lock
from django_distlock.engine.keys import bucket_of
from tests.support.engine import keys_of, stored_lock

NAMES = 2000
LEASE = 10.0
HOUR = 3600.0


async def test_released_locks_leave_only_short_lived_fence_counters(api, backend, redis_client):
    for i in range(NAMES):
        lock = Lock(f"job:{i}", backend=backend, timeout=LEASE, auto_renew=False)
        assert await api.acquire(lock, blocking=False)
        await api.release(lock)

    # Nothing permanent: only the fence counters, each with its lifetime.
    keys = [key.decode() for key in redis_client.scan_iter(count=1000)]
    fences = {keys_of(f"job:{i}").fence for i in range(NAMES)}
    assert [key for key in keys if key not in fences] == []
    lifetimes = [redis_client.pttl(key) / 1000 for key in keys]
    assert min(lifetimes) > 0, "a fence counter never expires"
    assert max(lifetimes) <= HOUR + LEASE, f"fence counters live {max(lifetimes) / HOUR:.1f} hours"


async def test_an_expired_lock_leaves_the_listing_index_within_a_few_acquires_in_its_bucket(
    api, backend, redis_client
):
    """About one acquire in 16 prunes its bucket's index (every key a script touches lives
    in the lock's slot); a listing prunes every bucket it reads, and skips such entries
    until then."""
    abandoned = Lock("abandoned", backend=backend, timeout=0.1, auto_renew=False)
    assert await api.acquire(abandoned, blocking=False)
    index = keys_of("abandoned").index
    lease_end_ms = stored_lock(redis_client, "abandoned").lease_end_ms
    assert redis_client.zscore(index, "abandoned") == lease_end_ms
    await asyncio.sleep(0.2)
    assert redis_client.exists(keys_of("abandoned").lock) == 0  # expired, never released

    neighbour = next(
        name
        for name in (f"other:{i}" for i in range(10_000))
        if bucket_of(name) == bucket_of("abandoned")
    )
    other = Lock(neighbour, backend=backend, timeout=LEASE, auto_renew=False)
    acquires = 0
    while redis_client.zscore(index, "abandoned") is not None and acquires < 1_000:
        assert await api.acquire(other, blocking=False)
        await api.release(other)
        acquires += 1
    # The chance that 1,000 acquires all skip the pruning is below 1e-28.
    assert redis_client.zscore(index, "abandoned") is None, "the index keeps an expired lock"
    assert acquires >= 1
