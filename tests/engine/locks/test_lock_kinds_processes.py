"""Lock kinds under real contention, on a single server and on a cluster: worker
processes (``tests/support/kind_workers.py``) record when they held what, on the
system-wide monotonic clock, and the tests check the recorded intervals.

- ``limit=3`` with 8 processes: never more than 3 holders, and 3 at once is reached;
- 6 shared holders and 2 exclusive ones (a ``Lock`` and a ``LockGroup``): an exclusive
  hold overlaps nothing, shared ones overlap each other, and the exclusive holders keep
  getting in while readers hammer;
- ``LockGroup`` with random subsets in random orders across 8 processes: everyone
  finishes (no deadlock) and no name is ever held twice;
- a re-entrant lock with tasks cancelled at random points inside nested ``async with``
  blocks: exclusion holds, and every level is accounted for (freed at the end).
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from collections import defaultdict
from typing import Any

import pytest

from django_distlock.engine import Lock
from tests.support.engine import Recorder, awaiting, close_backend, keys_of
from tests.support.kind_workers import (
    Workers,
    account_names,
    backend_for,
    max_overlap,
    overlapping_pairs,
)


def _jobs(count: int, scenario: str, **spec: Any) -> list[tuple[str, dict[str, Any]]]:
    """``count`` workers of ``scenario``, half of them on the async API, each seeded."""
    return [
        (scenario, {**spec, "seed": index, "api": "async" if index % 2 else "sync"})
        for index in range(count)
    ]


def _intervals(records: list[list[Any]]) -> list[tuple[int, int]]:
    return [(record[1], record[2]) for record in records]


def _fences_follow_time(records: list[tuple[int, int, int]]) -> bool:
    """True if the fences of holds that exclude each other (``(got, leaving, fence)``)
    increase in the order the holds were taken."""
    fences = [fence for _got, _leaving, fence in sorted(records)]
    return fences == sorted(set(fences))


def test_a_limited_lock_never_admits_more_than_its_limit_and_uses_all_of_it(kind_topology):
    spec = {
        "target": kind_topology.target,
        "name": "export:customer-7",
        "options": {"limit": 3, "timeout": 10},
        "duration": 1.5,
        "hold": (0.005, 0.03),
        "pause": (0, 0.005),
    }
    with Workers(_jobs(8, "cycle", **spec)) as workers:
        results = workers.run(timeout=60)
    records = [record for worker in results for record in worker]
    assert max_overlap(_intervals(records)) == 3  # never 4, and the limit is used
    fences = [record[3] for record in records]
    assert len(set(fences)) == len(fences)  # each hold has its own fence
    assert all(len(worker) >= 5 for worker in results), [len(worker) for worker in results]
    keys = keys_of("export:customer-7")
    assert kind_topology.client.exists(keys.lock, keys.holders) == 0  # nothing left behind


def test_shared_holds_overlap_and_exclusive_ones_exclude_everyone_without_starving(kind_topology):
    common = {"target": kind_topology.target, "name": "catalog", "duration": 2.0}
    readers = _jobs(
        6,
        "cycle",
        **common,
        options={"shared": True, "timeout": 10},
        hold=(0.01, 0.03),
        pause=(0, 0.001),  # six readers: rarely a moment without one
    )
    writers = _jobs(
        2, "cycle", **common, options={"timeout": 10}, hold=(0.002, 0.005), pause=(0.01, 0.02)
    )
    writers[1][1]["names"] = ["catalog:search"]  # a LockGroup is an exclusive holder too
    with Workers(readers + writers) as workers:
        results = workers.run(timeout=60)
    read = [record for worker in results[:6] for record in worker]
    written = [record for worker in results[6:] for record in worker]
    writes = _intervals(written)
    assert overlapping_pairs(writes, _intervals(read) + writes) == []
    assert max_overlap(_intervals(read)) >= 2  # shared holds do share
    # While six readers hammer, each writer still gets in many times in 2 s (a writer
    # that had to wait for a moment without readers would get in rarely or never).
    assert [len(worker) >= 15 for worker in results[6:]] == [True, True], [
        len(worker) for worker in results
    ]
    # A fence orders every exclusive hold against all the holds before and after it.
    for writer in written:
        before = [r[3] for r in read + written if r[2] <= writer[1]]
        after = [r[3] for r in read + written if r[1] >= writer[2]]
        assert all(fence < writer[3] for fence in before)
        assert all(fence > writer[3] for fence in after)


def test_groups_in_random_orders_finish_without_deadlock_and_never_share_a_name(kind_topology):
    names = account_names(6)
    spec = {
        "target": kind_topology.target,
        "names": names,
        "iterations": 30,
        "max_size": 4,
        "hold": (0, 0.003),
    }
    started = time.monotonic()
    with Workers(_jobs(8, "group", **spec)) as workers:
        results = workers.run(timeout=90)  # blocking without a timeout: a deadlock hangs
    assert time.monotonic() - started < 60
    by_name: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for worker in results:
        assert len(worker) == 30
        for chosen, got, leaving, fences in worker:
            for name in chosen:
                by_name[name].append((got, leaving, fences[name]))
    assert set(by_name) == set(names)
    for name, holds in by_name.items():
        assert max_overlap([(got, leaving) for got, leaving, _fence in holds]) == 1, name
        assert _fences_follow_time(holds), name
    assert not any(kind_topology.client.exists(keys_of(name).lock) for name in names)


async def test_reentrant_levels_are_counted_under_random_cancellation(kind_topology):
    recorder = Recorder()
    backend = backend_for(kind_topology.target, observer=recorder, timeout=10)
    pool = [Lock("account:1", backend=backend, reentrant=True) for _ in range(3)]
    rng = random.Random(12)
    owner: dict[str, Any] = {"task": None}
    errors: list[str] = []
    levels = {"entered": 0, "inner timeouts": 0}

    def check(condition: bool, what: str) -> None:
        if not condition:
            errors.append(what)

    async def nested(level: int, depth: int, token: str | None) -> None:
        lock = rng.choice(pool)
        async with lock:
            me = asyncio.current_task()
            levels["entered"] += 1
            check(lock.held, "not held inside its own block")
            if token is None:
                check(owner["task"] is None, "two tasks inside at once")
                owner["task"] = me
                token = lock.token
            check(lock.token == token, "a level got another acquisition")
            try:
                if level < depth:
                    try:
                        # A timeout cancels the inner levels at a random point; this
                        # level goes on, and must still hold the lock.
                        async with asyncio.timeout(rng.uniform(0, 0.01)):
                            await nested(level + 1, depth, token)
                    except TimeoutError:
                        levels["inner timeouts"] += 1
                    check(lock.held and lock.token == token, "an inner exit freed the lock")
                    check(owner["task"] is me, "someone got in after an inner exit")
                await asyncio.sleep(rng.uniform(0, 0.003))
            finally:
                if level == 1:
                    owner["task"] = None

    async def loop_forever() -> None:
        while True:
            await nested(1, rng.randint(1, 4), None)
            check(not any(lock.held for lock in pool), "held after the outermost exit")

    try:
        tasks = {asyncio.create_task(loop_forever()) for _ in range(8)}
        cancelled = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            await asyncio.sleep(rng.uniform(0, 0.01))
            victim = rng.choice(sorted(tasks, key=id))
            victim.cancel()  # wherever it is: waiting, inside, releasing
            tasks.discard(victim)
            # Bounded: a cancellation the engine lost would leave the victim running
            # (and this test hanging) instead of failing it.
            done, _ = await asyncio.wait({victim}, timeout=10)
            assert done, (
                f"a cancelled task ran on: its cancellation was lost "
                f"({victim.cancelling()} pending)\n{awaiting(victim)}"
            )
            with pytest.raises(asyncio.CancelledError):
                await victim
            cancelled += 1
            tasks.add(asyncio.create_task(loop_forever()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert errors == []
        assert cancelled > 50
        assert levels["entered"] > 200
        assert levels["inner timeouts"] > 20
        assert recorder.of("lost") == []
        # Re-entries are not events: one "acquired" and one "released" per outermost block.
        kinds = collections.Counter(recorder.kinds())
        assert kinds["acquired"] == kinds["released"] > 20, kinds
        assert kind_topology.client.exists(keys_of("account:1").lock) == 0
        plain = Lock("account:1", backend=backend)
        assert await plain.aacquire(blocking=False)
        await plain.arelease()
    finally:
        await close_backend(backend)
