"""A holder of each lock kind SIGKILLed while holding, on a single server and on a
cluster: what it held frees at its lease end (not earlier: the lease is what protects
the holder's work; promptly after: waiters are woken by their timers), and the other
holders of the same lock are not affected.

The holders are worker processes (``tests/support/kind_workers.py``, scenario ``hold``)
with renewal on, so only the kill ends their leases; the waiters are tasks of the test.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from typing import Any

from django_distlock.engine import Lock, LockGroup
from tests.support.engine import keys_of
from tests.support.kind_workers import Topology, Workers, account_names

LEASE = 1.0
# One observation across processes on a loaded 2-core machine: room for scheduling
# noise, but far less than the 1 s re-check a waiter falls back on without a timer.
LATE = 0.3


def _holders(kind_topology: Topology, count: int, **spec: Any) -> tuple[Workers, list[Any]]:
    """``count`` ``hold`` workers of ``spec``, each holding once this returns; their
    tokens (name -> token)."""
    jobs = [
        ("hold", {"target": kind_topology.target, "options": {"timeout": LEASE}, **spec})
    ] * count
    workers = Workers(jobs)
    try:
        lines = workers.first_lines()
        assert all(line.startswith("acquired ") for line in lines), lines
    except BaseException:
        workers.kill()
        raise
    return workers, [json.loads(line.split(" ", 1)[1]) for line in lines]


def _lease_left(kind_topology: Topology, name: str, token: str) -> float:
    """Seconds left on the lease of hold ``token`` of lock ``name`` (server clock)."""
    client, key = kind_topology.client, keys_of(name).lock
    if client.type(key) == b"zset":
        seconds, micros = client.time()
        return (client.zscore(key, token) - (seconds * 1000 + micros / 1000)) / 1000
    return client.pttl(key) / 1000


async def _at(acquiring: Awaitable[bool]) -> float:
    assert await acquiring
    return time.monotonic()


def waiting(lock: Lock | LockGroup) -> asyncio.Task[float]:
    """Acquire ``lock`` in the background for the calling task (which then holds it):
    the task's result is the monotonic time it got the lock."""
    return asyncio.create_task(_at(lock.aacquire(blocking_timeout=10)))


async def _blocked(*tasks: asyncio.Task[float]) -> None:
    await asyncio.sleep(0.2)  # every waiter is waiting by now
    assert not any(task.done() for task in tasks)


def _on_time(got_at: float, killed_at: float, lease_left: float) -> None:
    assert got_at - killed_at > lease_left - 0.01  # not before the lease end...
    assert got_at - killed_at < lease_left + LATE  # ...and promptly after


async def test_a_crashed_limited_holder_frees_its_slot_at_its_lease_end(kind_topology, backend_on):
    name = "export:customer-7"
    workers, tokens = _holders(kind_topology, 2, name=name, options={"timeout": LEASE, "limit": 2})
    with workers:
        lock = Lock(name, backend=backend_on, limit=2)
        task = waiting(lock)
        await _blocked(task)
        workers.kill(0)
        killed_at = time.monotonic()
        left = _lease_left(kind_topology, name, tokens[0][name])
        _on_time(await task, killed_at, left)
        # The other holder kept its slot all along, and gives it back normally.
        assert _lease_left(kind_topology, name, tokens[1][name]) > 0
        assert await Lock(name, backend=backend_on, limit=2).aacquire(blocking=False) is False
        assert workers.tell(1, "release") == "released"
        await lock.arelease()


async def test_a_crashed_shared_holder_keeps_a_writer_out_until_its_lease_end(
    kind_topology, backend_on
):
    name = "catalog"
    workers, tokens = _holders(
        kind_topology, 2, name=name, options={"timeout": LEASE, "shared": True}
    )
    with workers:
        writer = Lock(name, backend=backend_on)
        task = waiting(writer)
        await _blocked(task)
        workers.kill(0)
        killed_at = time.monotonic()
        left = _lease_left(kind_topology, name, tokens[0][name])
        assert workers.tell(1, "release") == "released"  # unaffected by the crash
        _on_time(await task, killed_at, left)
        await writer.arelease()


async def test_shared_waiters_of_a_crashed_writer_all_get_in_at_its_lease_end(
    kind_topology, backend_on
):
    name = "catalog"
    workers, tokens = _holders(kind_topology, 1, name=name)
    with workers:
        readers = [Lock(name, backend=backend_on, shared=True) for _ in range(3)]
        tasks = [waiting(reader) for reader in readers]
        await _blocked(*tasks)
        workers.kill(0)
        killed_at = time.monotonic()
        left = _lease_left(kind_topology, name, tokens[0][name])
        for got_at in await asyncio.gather(*tasks):
            _on_time(got_at, killed_at, left)
        for reader in readers:
            await reader.arelease()


async def test_a_crashed_reentrant_holder_frees_the_lock_at_its_lease_end(
    kind_topology, backend_on
):
    name = "account:1"
    workers, tokens = _holders(
        kind_topology, 1, name=name, depth=3, options={"timeout": LEASE, "reentrant": True}
    )
    with workers:
        lock = Lock(name, backend=backend_on, reentrant=True)
        task = waiting(lock)
        await _blocked(task)
        workers.kill(0)
        killed_at = time.monotonic()
        left = _lease_left(kind_topology, name, tokens[0][name])
        _on_time(await task, killed_at, left)
        await lock.arelease()


async def test_a_crashed_group_holder_frees_every_name_at_its_lease_end(kind_topology, backend_on):
    names = account_names(4)
    workers, tokens = _holders(kind_topology, 1, names=names)
    with workers:
        locks = [Lock(name, backend=backend_on) for name in names]
        tasks = [waiting(lock) for lock in locks]
        await _blocked(*tasks)
        workers.kill(0)
        killed_at = time.monotonic()
        left = {name: _lease_left(kind_topology, name, tokens[0][name]) for name in names}
        for name, got_at in zip(names, await asyncio.gather(*tasks), strict=True):
            _on_time(got_at, killed_at, left[name])
        for lock in locks:
            await lock.arelease()
