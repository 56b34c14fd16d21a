"""Lock kinds beyond the mutex, against real servers: limited (``limit=N``), shared
(``shared=True``), re-entrant (``reentrant=True``) and several names at once
(``LockGroup``). Sync and async side by side (the ``api`` fixture)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_distlock.engine import (
    Lock,
    LockError,
    LockGroup,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)
from tests.support.engine import keys_of, wait_until

# -- limited ---------------------------------------------------------------------------


async def test_a_limited_lock_admits_n_holders_each_with_its_own_token_and_fence(api, backend):
    holders = [Lock("export:7", backend=backend, limit=3, timeout=10) for _ in range(4)]
    for lock in holders[:3]:
        assert await api.acquire(lock, blocking=False)
    assert len({lock.token for lock in holders[:3]}) == 3
    fences = [lock.fence for lock in holders[:3]]
    assert fences == sorted(fences)
    assert len(set(fences)) == 3

    assert await api.acquire(holders[3], blocking=False) is False
    assert 9 < holders[3].retry_after <= 10

    await api.release(holders[1])
    assert await api.acquire(holders[3], blocking=False)
    assert holders[3].fence > max(fences)
    for lock in (holders[0], holders[2], holders[3]):
        await api.release(lock)


async def test_a_limited_lock_stores_a_sorted_set_of_holders_and_nothing_after_release(
    api, backend, redis_client
):
    keys = keys_of("export:7")
    first = Lock("export:7", backend=backend, limit=2, timeout=10)
    second = Lock("export:7", backend=backend, limit=2, timeout=10)
    assert await api.acquire(first)
    assert await api.acquire(second)
    assert redis_client.type(keys.lock) == b"zset"
    assert redis_client.zcard(keys.lock) == 2
    assert redis_client.hget(keys.holders, "#kind") == b"limited 2"
    assert 9_000 < redis_client.pttl(keys.lock) <= 10_000
    assert redis_client.zcard(keys.holder_index) == 2
    await api.release(first)
    await api.release(second)
    assert redis_client.exists(keys.lock, keys.holders) == 0
    assert redis_client.zcard(keys.holder_index) == 0


async def test_a_crashed_limited_holder_frees_its_slot_at_its_lease_end(api, backend):
    crashed = Lock("export:7", backend=backend, limit=1 + 1, timeout=0.3, auto_renew=False)
    other = Lock("export:7", backend=backend, limit=2, timeout=10)
    # Its lease starts after this, when the server runs the acquire: timed from here, the
    # bound holds however long the acquires take (an async client's first request builds
    # its connections; measured from after them, a slow start read as an early grant).
    sent = time.monotonic()
    assert await api.acquire(crashed)
    assert await api.acquire(other)
    waiter = Lock("export:7", backend=backend, limit=2, timeout=10)
    assert await api.acquire(waiter, blocking_timeout=5)
    assert time.monotonic() - sent >= 0.29  # not before the crashed holder's lease end
    await api.release(other)
    await api.release(waiter)
    with pytest.raises(LockLost):
        await api.release(crashed)


async def test_a_waiter_of_a_limited_lock_is_woken_by_a_release(api, backend):
    holders = [Lock("export:7", backend=backend, limit=2, timeout=30) for _ in range(2)]
    for lock in holders:
        assert await api.acquire(lock)
    waiter = Lock("export:7", backend=backend, limit=2, timeout=30)
    woke = threading.Event()

    def wait_in_thread() -> None:
        if waiter.acquire(blocking_timeout=20):
            woke.set()
            waiter.release()

    thread = threading.Thread(target=wait_in_thread)
    thread.start()
    await asyncio.sleep(0.3)
    assert not woke.is_set()
    await api.release(holders[0])
    thread.join(10)
    assert woke.is_set()
    await api.release(holders[1])


async def test_one_name_is_used_with_one_limit(api, backend):
    three = Lock("export:7", backend=backend, limit=3)
    assert await api.acquire(three)
    with pytest.raises(LockError, match=r"held as a limited lock \(limit=3\).*limit=4"):
        await api.acquire(Lock("export:7", backend=backend, limit=4), blocking=False)
    with pytest.raises(LockError, match=r"limited lock.*exclusively"):
        await api.acquire(Lock("export:7", backend=backend), blocking=False)
    with pytest.raises(LockError, match=r"limited lock.*shared"):
        await api.acquire(Lock("export:7", backend=backend, shared=True), blocking=False)
    await api.release(three)

    mutex = Lock("export:7", backend=backend)
    assert await api.acquire(mutex)
    with pytest.raises(LockError, match=r"exclusive lock.*limit=3"):
        await api.acquire(Lock("export:7", backend=backend, limit=3), blocking=False)
    await api.release(mutex)


async def test_limit_one_is_the_plain_exclusive_lock(api, backend, redis_client):
    lock = Lock("export:7", backend=backend, limit=1)
    assert await api.acquire(lock)
    assert redis_client.type(keys_of("export:7").lock) == b"string"
    assert await api.acquire(Lock("export:7", backend=backend), blocking=False) is False
    await api.release(lock)


async def test_a_limited_hold_extends_reports_its_ttl_and_renews(api, backend):
    renewed = Lock("export:7", backend=backend, limit=2, timeout=0.5)
    assert await api.acquire(renewed)
    await asyncio.sleep(1.2)  # more than two leases: only renewals keep it
    assert renewed.held
    assert not renewed.lost
    assert 0 < await api.ttl(renewed) <= 0.5
    await api.extend(renewed, 30, replace_ttl=True)
    assert 29 < await api.ttl(renewed) <= 30
    await api.release(renewed)


async def test_a_limited_hold_whose_entry_vanished_is_lost(api, backend, redis_client):
    lock = Lock("export:7", backend=backend, limit=2, timeout=10, auto_renew=False)
    assert await api.acquire(lock)
    redis_client.zrem(keys_of("export:7").lock, lock.token)
    assert await api.ttl(lock) is None
    assert lock.lost
    with pytest.raises(LockNotOwned):
        await api.release(lock)


# -- shared ----------------------------------------------------------------------------


async def test_shared_holds_coexist_and_exclude_an_exclusive_one(api, backend):
    readers = [Lock("catalog", backend=backend, shared=True, timeout=10) for _ in range(5)]
    for lock in readers:
        assert await api.acquire(lock, blocking=False)
    writer = Lock("catalog", backend=backend, timeout=10)
    assert await api.acquire(writer, blocking=False) is False
    assert 9 < writer.retry_after <= 10
    for lock in readers:
        await api.release(lock)
    assert await api.acquire(writer, blocking=False)
    assert await api.acquire(readers[0], blocking=False) is False
    await api.release(writer)


async def test_a_waiting_writer_goes_before_new_shared_holders(api, backend, redis_client):
    reader = Lock("catalog", backend=backend, shared=True, timeout=30)
    assert await api.acquire(reader)
    writer = Lock("catalog", backend=backend, timeout=30)
    got_it = threading.Event()

    def write() -> None:
        assert writer.acquire(blocking_timeout=20)
        got_it.set()
        time.sleep(0.2)
        writer.release()

    thread = threading.Thread(target=write)
    thread.start()
    wait_until(lambda: redis_client.exists(keys_of("catalog").writers), timeout=5)
    latecomer = Lock("catalog", backend=backend, shared=True, timeout=30)
    assert await api.acquire(latecomer, blocking=False) is False  # the writer is first
    await api.release(reader)
    thread.join(10)
    assert got_it.is_set()
    assert await api.acquire(latecomer, blocking_timeout=10)
    await api.release(latecomer)


async def test_a_writer_that_gives_up_lets_shared_holders_in_again(api, backend, redis_client):
    reader = Lock("catalog", backend=backend, shared=True, timeout=30)
    assert await api.acquire(reader)
    writer = Lock("catalog", backend=backend, timeout=30)
    assert await api.acquire(writer, blocking_timeout=0.3) is False
    assert redis_client.exists(keys_of("catalog").writers) == 0
    other = Lock("catalog", backend=backend, shared=True, timeout=30)
    assert await api.acquire(other, blocking=False)
    await api.release(other)
    await api.release(reader)


async def test_a_waiting_group_goes_before_new_shared_holders(api, backend, redis_client):
    """A group's holds are exclusive: waiting for a name held shared, it goes before new
    shared holders as a waiting writer does (readers that are never all out at once
    would starve it otherwise)."""
    reader = Lock("catalog", backend=backend, shared=True, timeout=30)
    assert await api.acquire(reader)
    group = LockGroup(["catalog", "catalog:search"], backend=backend, timeout=30)
    got_it = threading.Event()

    def rebuild() -> None:
        assert group.acquire(blocking_timeout=20)
        got_it.set()
        time.sleep(0.2)
        group.release()

    thread = threading.Thread(target=rebuild)
    thread.start()
    try:
        wait_until(lambda: redis_client.exists(keys_of("catalog").writers), timeout=5)
        latecomer = Lock("catalog", backend=backend, shared=True, timeout=30)
        assert await api.acquire(latecomer, blocking=False) is False  # the group is first
    finally:
        await api.release(reader)
        thread.join(10)
    assert got_it.is_set()
    assert redis_client.exists(keys_of("catalog").writers) == 0
    assert await api.acquire(latecomer, blocking_timeout=10)
    await api.release(latecomer)


async def test_a_group_that_gives_up_lets_shared_holders_in_again(api, backend, redis_client):
    reader = Lock("catalog", backend=backend, shared=True, timeout=30)
    assert await api.acquire(reader)
    group = LockGroup(["catalog", "catalog:search"], backend=backend, timeout=30)
    assert await api.acquire(group, blocking_timeout=0.3) is False
    assert redis_client.exists(keys_of("catalog").writers) == 0
    other = Lock("catalog", backend=backend, shared=True, timeout=30)
    assert await api.acquire(other, blocking=False)
    await api.release(other)
    await api.release(reader)


async def test_shared_waiters_all_get_in_when_the_writer_leaves(api, backend):
    writer = Lock("catalog", backend=backend, timeout=30)
    assert await api.acquire(writer)
    readers = [Lock("catalog", backend=backend, shared=True, timeout=30) for _ in range(4)]
    inside = threading.Barrier(len(readers) + 1, timeout=15)

    def read(lock: Lock) -> None:
        assert lock.acquire(blocking_timeout=15)
        inside.wait()  # all four at once: each shared hold let the next waiter in
        lock.release()

    threads = [threading.Thread(target=read, args=(lock,)) for lock in readers]
    for thread in threads:
        thread.start()
    await asyncio.sleep(0.3)
    await api.release(writer)
    inside.wait()
    for thread in threads:
        thread.join(10)


async def test_every_shared_hold_renews_on_its_own(api, backend):
    readers = [Lock("catalog", backend=backend, shared=True, timeout=0.5) for _ in range(2)]
    for lock in readers:
        assert await api.acquire(lock)
    await asyncio.sleep(1.2)
    for lock in readers:
        assert lock.held
        assert 0 < await api.ttl(lock) <= 0.5
    writer = Lock("catalog", backend=backend, timeout=10)
    assert await api.acquire(writer, blocking=False) is False
    for lock in readers:
        await api.release(lock)


# -- re-entrant ------------------------------------------------------------------------


async def test_a_reentrant_lock_is_freed_after_as_many_releases_as_acquires(api, backend):
    outer = Lock("account:1", backend=backend, reentrant=True, timeout=10)
    inner = Lock("account:1", backend=backend, reentrant=True, timeout=10)
    assert await api.acquire(outer)
    fence = outer.fence
    assert await api.acquire(inner)  # another Lock of the same name: the same hold
    assert await api.acquire(outer)
    assert inner.fence == fence
    assert inner.token == outer.token
    other = Lock("account:1", backend=backend, timeout=10)
    await api.release(outer)
    await api.release(inner)
    assert await api.acquire(other, blocking=False) is False  # one level still held
    await api.release(outer)
    assert await api.acquire(other, blocking=False)
    await api.release(other)


async def test_a_reentrant_lock_is_not_reentrant_for_another_thread(api, backend):
    lock = Lock("account:1", backend=backend, reentrant=True, timeout=10)
    assert await api.acquire(lock)
    taken = []
    thread = threading.Thread(target=lambda: taken.append(lock.acquire(blocking=False)))
    thread.start()
    thread.join(10)
    assert taken == [False]
    await api.release(lock)


async def test_a_reentrant_lock_is_not_reentrant_for_a_child_task(backend):
    lock = Lock("account:1", backend=backend, reentrant=True, timeout=10)
    async with lock:

        async def child() -> bool:
            return await lock.aacquire(blocking=False)

        assert await asyncio.create_task(child()) is False
        assert lock.held


async def test_reentry_survives_a_cancelled_inner_acquire(backend):
    lock = Lock("account:1", backend=backend, reentrant=True, timeout=10)
    async with lock:
        blocker = Lock("account:1", backend=backend, timeout=10)

        async def inner() -> None:
            async with lock:
                await asyncio.sleep(10)

        task = asyncio.create_task(inner())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert lock.held  # the inner level left, the outer one is still held
        assert await blocker.aacquire(blocking=False) is False
    assert not lock.held


async def test_a_plain_lock_refuses_reentry(api, backend):
    lock = Lock("account:1", backend=backend, timeout=10)
    assert await api.acquire(lock)
    with pytest.raises(LockError, match="reentrant=True"):
        await api.acquire(lock)
    await api.release(lock)


# -- options ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"limit": 2, "shared": True},
        {"limit": 2, "reentrant": True},
        {"shared": True, "reentrant": True},
    ],
)
def test_kinds_do_not_combine(dead_backend, options):
    with pytest.raises(ValueError, match="cannot be combined"):
        Lock("x", backend=dead_backend, **options)


@pytest.mark.parametrize(
    ("limit", "error"),
    [(0, ValueError), (10_001, ValueError), (True, TypeError), (2.0, TypeError), ("2", TypeError)],
)
def test_limit_must_be_a_small_positive_int(dead_backend, limit, error):
    with pytest.raises(error, match="limit"):
        Lock("x", backend=dead_backend, limit=limit)


@pytest.mark.parametrize("option", ["shared", "reentrant"])
def test_kind_flags_are_bools(dead_backend, option):
    with pytest.raises(TypeError, match=option):
        Lock("x", backend=dead_backend, **{option: 1})


# -- several names ---------------------------------------------------------------------


async def test_a_group_takes_every_name_or_none(backend, redis_client):
    group = LockGroup(["account:2", "account:1", "account:3"], backend=backend, timeout=10)
    busy = Lock("account:3", backend=backend, timeout=10)
    assert busy.acquire()
    busy_fence = busy.fence
    assert group.acquire(blocking=False) is False
    assert not any(redis_client.exists(keys_of(f"account:{i}").lock) for i in (1, 2))
    assert 9 < group.retry_after <= 10
    busy.release()
    assert group.acquire(blocking=False)
    assert group.held
    fences = group.fences
    assert list(fences) == ["account:2", "account:1", "account:3"]
    assert all(isinstance(fence, int) for fence in fences.values())
    assert fences["account:3"] > busy_fence
    group.release()
    assert not group.held
    assert not any(redis_client.exists(keys_of(f"account:{i}").lock) for i in (1, 2, 3))


async def test_a_group_waits_for_the_busy_name_and_then_takes_all(backend):
    busy = Lock("account:2", backend=backend, timeout=10)
    taken = threading.Event()

    def hold_a_while() -> None:
        with busy:
            taken.set()
            time.sleep(0.3)

    thread = threading.Thread(target=hold_a_while)
    thread.start()
    assert taken.wait(10)
    group = LockGroup(["account:1", "account:2"], backend=backend, timeout=10)
    async with group:
        assert group.held
        assert group.fences["account:2"] > 0
    assert not group.held
    thread.join(10)


async def test_groups_in_opposite_orders_never_deadlock(backend):
    names = [f"account:{i}" for i in range(6)]
    done = []

    def transfer(order: list[str]) -> None:
        for _ in range(20):
            with LockGroup(order, backend=backend, timeout=10, blocking_timeout=20):
                pass
        done.append(True)

    threads = [
        threading.Thread(target=transfer, args=(names if i % 2 else names[::-1],)) for i in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert done == [True] * 4


async def test_a_group_refuses_bad_names(dead_backend):
    with pytest.raises(TypeError, match="iterable"):
        LockGroup("account:1", backend=dead_backend)
    with pytest.raises(ValueError, match="empty"):
        LockGroup([], backend=dead_backend)
    with pytest.raises(ValueError, match="twice"):
        LockGroup(["a", "b", "a"], backend=dead_backend)
    with pytest.raises(TypeError, match="str"):
        LockGroup(["a", 1], backend=dead_backend)


async def test_a_group_that_times_out_raises_not_acquired(backend):
    busy = Lock("account:1", backend=backend, timeout=10)
    assert busy.acquire()
    group = LockGroup(["account:1", "account:9"], backend=backend, blocking_timeout=0.2)
    with pytest.raises(LockNotAcquired, match="account:1"), group:
        pass
    busy.release()
