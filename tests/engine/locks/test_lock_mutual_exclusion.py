"""Mutual exclusion under real contention: processes, threads and asyncio tasks doing a
non-atomic read-modify-write under the lock lose no update, and fences increase in the
order the critical sections ran."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_distlock.engine import Lock
from tests.support.engine import start_worker, stop_worker
from tests.support.probe import server_and_cluster

PROCESSES = 6
ITERATIONS = 250


@server_and_cluster  # processes: Sentinel's primary is one server to them (see probe.py)
@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
def test_processes_exclude_each_other(topology, redis_client, fair):
    workers = [
        start_worker("count", topology.target(), "counter", str(ITERATIONS), str(int(fair)))
        for _ in range(PROCESSES)
    ]
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready", stop_worker(worker)
        redis_client.rpush("start", *["go"] * PROCESSES)
        for worker in workers:
            out, err = worker.communicate(timeout=90)
            assert worker.returncode == 0, err
            assert out.strip() == "done"
    finally:
        for worker in workers:
            stop_worker(worker)
    assert int(redis_client.get("counter")) == PROCESSES * ITERATIONS
    fences = [int(fence) for fence in redis_client.lrange("fences", 0, -1)]
    assert len(fences) == PROCESSES * ITERATIONS
    assert fences == sorted(set(fences))  # strictly increasing in section order


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
def test_threads_sharing_one_lock_object_exclude_each_other(backend, fair):
    lock = Lock("threads", backend=backend, fair=fair, timeout=10)
    state = {"counter": 0, "inside": 0, "max_inside": 0}
    fences: list[int] = []
    errors: list[BaseException] = []

    def work():
        try:
            for _ in range(60):
                with lock:  # one object: each thread has its own token
                    state["inside"] += 1
                    state["max_inside"] = max(state["max_inside"], state["inside"])
                    value = state["counter"]
                    fences.append(lock.fence)
                    time.sleep(0)  # invite a thread switch mid-update
                    state["counter"] = value + 1
                    state["inside"] -= 1
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert state["counter"] == 8 * 60
    assert state["max_inside"] == 1
    assert fences == sorted(set(fences))


@pytest.mark.parametrize("fair", [False, True], ids=["unfair", "fair"])
async def test_tasks_sharing_one_lock_object_exclude_each_other(backend, fair):
    lock = Lock("tasks", backend=backend, fair=fair, timeout=10)
    state = {"counter": 0, "inside": 0, "max_inside": 0}
    fences: list[int] = []

    async def work():
        for _ in range(8):
            async with lock:  # one object: each task has its own token
                state["inside"] += 1
                state["max_inside"] = max(state["max_inside"], state["inside"])
                value = state["counter"]
                fences.append(lock.fence)
                await asyncio.sleep(0)
                state["counter"] = value + 1
                state["inside"] -= 1

    await asyncio.wait_for(asyncio.gather(*(work() for _ in range(40))), 60)
    assert state["counter"] == 40 * 8
    assert state["max_inside"] == 1
    assert fences == sorted(set(fences))


async def test_sync_and_async_holders_exclude_each_other(backend):
    lock = Lock("mixed", backend=backend, timeout=10)
    state = {"inside": 0, "max_inside": 0, "counter": 0}

    def enter():
        state["inside"] += 1
        state["max_inside"] = max(state["max_inside"], state["inside"])

    def thread_work():
        for _ in range(40):
            with lock:
                enter()
                time.sleep(0.0005)
                state["counter"] += 1
                state["inside"] -= 1

    async def task_work():
        for _ in range(40):
            async with lock:
                enter()
                await asyncio.sleep(0.0005)
                state["counter"] += 1
                state["inside"] -= 1

    threads = [asyncio.to_thread(thread_work) for _ in range(2)]
    await asyncio.wait_for(asyncio.gather(*threads, task_work(), task_work()), 60)
    assert state["counter"] == 4 * 40
    assert state["max_inside"] == 1
