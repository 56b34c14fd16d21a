"""Prometheus multiprocess mode: three real worker processes (spawned, as gunicorn's would
be separate interpreters) write their metrics to ``PROMETHEUS_MULTIPROC_DIR``, and a
``MultiProcessCollector`` in this process sums them as a scrape would."""

from __future__ import annotations

import multiprocessing

import prometheus_client  # imported before PROMETHEUS_MULTIPROC_DIR is set: in-memory here
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from django_distlock import distlock
from tests.support.metrics_workers import BUSY, HELD, JOB, work

WORKERS = 3
CYCLES = 20


def scrape(directory: str) -> prometheus_client.CollectorRegistry:
    registry = prometheus_client.CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    return registry


def value(registry: prometheus_client.CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_a_scrape_sums_the_workers_and_the_held_gauge_counts_live_holds(
    tmp_path, monkeypatch, redis_client
):
    directory = str(tmp_path)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", directory)
    spawn = multiprocessing.get_context("spawn")
    holding = spawn.Event()
    busy = distlock(BUSY, timeout=60)
    assert busy.acquire(blocking=False)
    workers = [
        spawn.Process(target=work, args=(index, CYCLES, index == 0, holding), name=f"w{index}")
        for index in range(WORKERS)
    ]
    try:
        for worker in workers:
            worker.start()
        for worker in workers[1:]:
            worker.join(60)
            assert worker.exitcode == 0, f"{worker.name} failed: exit code {worker.exitcode}"
        assert holding.wait(60)

        registry = scrape(directory)
        acquired = {"lock": JOB, "result": "acquired"}
        assert value(registry, "distlock_acquire_total", **acquired) == WORKERS * CYCLES
        assert value(registry, "distlock_acquire_wait_seconds_count", **acquired) == (
            WORKERS * CYCLES
        )
        assert value(registry, "distlock_hold_seconds_count", lock=JOB) == WORKERS * CYCLES
        assert value(registry, "distlock_acquire_total", lock=BUSY, result="busy") == WORKERS
        # livesum: the two workers that ended released theirs; the holder still holds one.
        assert value(registry, "distlock_held", lock=JOB) == 0
        assert value(registry, "distlock_held", lock=HELD) == 1
        assert value(registry, "distlock_acquire_total", lock=HELD, result="acquired") == 1

        # A worker killed while holding: its file still says 1, until gunicorn's
        # child_exit hook (mark_process_dead) takes its live gauges out of the sum.
        workers[0].kill()
        workers[0].join(60)
        assert value(scrape(directory), "distlock_held", lock=HELD) == 1
        mark_process_dead(workers[0].pid, directory)
        registry = scrape(directory)
        assert value(registry, "distlock_held", lock=HELD) == 0
        assert value(registry, "distlock_acquire_total", lock=JOB, result="acquired") == (
            WORKERS * CYCLES
        )
    finally:
        for worker in workers:
            worker.kill()
            worker.join(60)
        busy.release()
