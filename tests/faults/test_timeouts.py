"""Timeouts Redis cannot represent (issue 9, item 8): refused with ``ValueError`` naming
the argument, before any network call, instead of failing in Redis (reported as
``LockBackendUnavailable``) or in ``float()`` (``OverflowError``)."""

from __future__ import annotations

import pytest

from django_distlock.engine import Lock
from tests.support.engine import script_calls

TOO_LARGE = pytest.mark.parametrize("seconds", [1e16, 10**400], ids=["1e16", "10**400"])


@TOO_LARGE
async def test_a_lease_too_large_is_refused_before_any_network_call(api, dead_backend, seconds):
    """``dead_backend`` fails any network call with LockBackendUnavailable."""

    async def acquire_with_lease() -> None:
        # Refused when the lock is made or when it is acquired: either is before I/O.
        lock = Lock("huge", backend=dead_backend, timeout=seconds)
        await api.acquire(lock, blocking=False)

    with pytest.raises(ValueError, match="timeout"):
        await acquire_with_lease()


async def test_a_blocking_timeout_too_large_is_refused_before_any_network_call(api, dead_backend):
    with pytest.raises(ValueError, match="blocking_timeout"):
        Lock("huge", backend=dead_backend, blocking_timeout=10**400)
    lock = Lock("huge", backend=dead_backend)
    with pytest.raises(ValueError, match="blocking_timeout"):
        await api.acquire(lock, blocking_timeout=10**400)


@TOO_LARGE
async def test_an_extension_too_large_is_refused_before_any_network_call(
    api, backend, redis_client, seconds
):
    lock = Lock("huge", backend=backend, timeout=30, auto_renew=False)
    assert await api.acquire(lock, blocking=False)
    before = script_calls(redis_client)
    with pytest.raises(ValueError, match="seconds"):
        await api.extend(lock, seconds)
    assert script_calls(redis_client) == before
    assert lock.held
    await api.release(lock)
