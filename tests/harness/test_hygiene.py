"""The suite's check that no test leaves a lock held (``tests/support/hygiene.py``): it
finds a lock a live lock object still holds, and one whose object was dropped, releases
both, and says why each was left."""

from __future__ import annotations

import gc

import redis

from django_distlock.engine import Backend, Lock
from tests.support.engine import lock_key
from tests.support.hygiene import release_left_holds
from tests.support.redis_servers import RedisServer


def test_a_lock_still_held_and_a_dropped_one_are_found_and_released(
    redis_server: RedisServer,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    backend = Backend(redis.Redis.from_url(redis_server.url))
    try:
        kept = Lock("hygiene:kept", backend=backend, timeout=30)
        assert kept.acquire(blocking=False)
        dropped = Lock("hygiene:dropped", backend=backend, timeout=30)
        assert dropped.acquire(blocking=False)
        del dropped
        gc.collect()

        left = release_left_holds()

        assert left == [
            "'hygiene:dropped' (its lock object was garbage-collected while it held the lock)",
            "'hygiene:kept' (still held)",
        ]
        assert not client.exists(lock_key("hygiene:kept"), lock_key("hygiene:dropped"))
        assert release_left_holds() == []  # nothing is left for the suite's own check
    finally:
        backend.close()
        client.close()
