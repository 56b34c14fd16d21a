"""What the lock kinds cost: an uncontended cycle of each kind next to the mutex, and a
limited lock (``limit=4``) shared by 16 processes.

    .venv/bin/python bench/kinds.py            # about a minute
    .venv/bin/python bench/kinds.py --quick    # about 20 seconds, noisier

One private server (``bench/server.py``), nothing pinned. See bench/README.md.

1. Uncontended, one process, sync API: rounds of N acquire+release cycles per row, the
   order rotating every round; per cycle p50 and mean, and the ratio to the mutex (the
   plain ``Lock``) taken per round, median over rounds. ``reentrant, nested`` is one
   more level taken and given back (through another ``Lock`` object of the name) while
   the outer level stays held: no round trip at all.
2. Contended: 16 worker processes (``tests/support/kind_workers.py``, half of them on
   the async API) loop on ``Lock(name, limit=4)`` for a fixed time, each holding it
   ``HOLD`` seconds: acquisitions per second, the most holders seen at once (from the
   recorded intervals; 4 means the limit is used and never exceeded), wait (acquire
   called to returned) p50/p99, and the spread of acquisitions over the processes.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

import redis  # noqa: E402
from server import bench_server  # noqa: E402
from stats import fmt, median, percentile, table  # noqa: E402
from timing import rotated  # noqa: E402

from django_distlock.engine import Backend, Lock, LockGroup  # noqa: E402
from tests.support.kind_workers import Workers, max_overlap, single_target  # noqa: E402

HOLD = 0.002  # seconds each contended acquisition holds the lock
PROCESSES = 16
LIMIT = 4


class Row:
    """One uncontended row: ``cycle()`` takes and gives back once."""

    def __init__(self, label: str, cycle: Callable[[], None], close: Callable[[], None]) -> None:
        self.label = label
        self.cycle = cycle
        self.close = close
        self.durations_ns: list[int] = []
        self.round_means: list[float] = []
        self.round_p50s: list[float] = []


def _cycle_of(lock: Lock | LockGroup) -> Callable[[], None]:
    def cycle() -> None:
        if not lock.acquire():
            raise RuntimeError(f"{lock!r}: uncontended acquire returned False")
        lock.release()

    return cycle


def rows(backend: Backend) -> list[Row]:
    """The uncontended rows (each on names of its own)."""
    outer = Lock("bench:reentrant-nested", backend=backend, reentrant=True, timeout=10)
    inner = Lock("bench:reentrant-nested", backend=backend, reentrant=True, timeout=10)
    return [
        Row("mutex (Lock)", _cycle_of(Lock("bench:mutex", backend=backend, timeout=10)), _noop),
        Row(
            "limit=4",
            _cycle_of(Lock("bench:limited", backend=backend, limit=4, timeout=10)),
            _noop,
        ),
        Row(
            "shared=True",
            _cycle_of(Lock("bench:shared", backend=backend, shared=True, timeout=10)),
            _noop,
        ),
        Row(
            "reentrant=True, outer",
            _cycle_of(Lock("bench:reentrant", backend=backend, reentrant=True, timeout=10)),
            _noop,
        ),
        Row("reentrant=True, nested", _nested(outer, inner), outer.release),
        Row(
            "LockGroup, 2 names",
            _cycle_of(LockGroup([f"bench:g2:{i}" for i in range(2)], backend=backend, timeout=10)),
            _noop,
        ),
        Row(
            "LockGroup, 5 names",
            _cycle_of(LockGroup([f"bench:g5:{i}" for i in range(5)], backend=backend, timeout=10)),
            _noop,
        ),
    ]


def _noop() -> None:
    pass


def _nested(outer: Lock, inner: Lock) -> Callable[[], None]:
    if not outer.acquire():
        raise RuntimeError("the outer level of the re-entrant row could not be taken")
    return _cycle_of(inner)


def uncontended(server_url: str, *, rounds: int, cycles: int) -> list[Row]:
    backend = Backend(redis.Redis.from_url(server_url), timeout=10)
    measured = rows(backend)
    try:
        for row in measured:  # warm-up: connections, scripts, the watchdog thread
            for _ in range(cycles // 5):
                row.cycle()
        clock = time.perf_counter_ns
        for number in range(rounds):
            for row in rotated(measured, number):
                gc.collect()
                durations = [0] * cycles
                started = clock()
                for i in range(cycles):
                    t0 = clock()
                    row.cycle()
                    durations[i] = clock() - t0
                total = clock() - started
                row.durations_ns.extend(durations)
                row.round_means.append(total / cycles)
                row.round_p50s.append(percentile(durations, 50))
    finally:
        for row in measured:
            row.close()
        backend.close()
    return measured


def uncontended_table(measured: list[Row]) -> str:
    base = measured[0]
    lines = []
    for row in measured:
        by_mean = [m / b for m, b in zip(row.round_means, base.round_means, strict=True)]
        by_p50 = [m / b for m, b in zip(row.round_p50s, base.round_p50s, strict=True)]
        lines.append(
            [
                row.label,
                fmt(percentile(row.durations_ns, 50) / 1000, 0),
                fmt(sum(row.durations_ns) / len(row.durations_ns) / 1000, 0),
                fmt(percentile(row.durations_ns, 99) / 1000, 0),
                fmt(median(by_p50)),
                fmt(median(by_mean)),
            ]
        )
    return table(["kind", "p50 µs", "mean µs", "p99 µs", "x mutex (p50)", "x mutex (mean)"], lines)


def contended(server_url: str, *, duration: float) -> dict[str, Any]:
    spec = {
        "target": single_target(server_url),
        "name": "bench:limited-contended",
        "options": {"limit": LIMIT, "timeout": 10},
        "duration": duration,
        "hold": (HOLD, HOLD),
    }
    jobs = [
        ("cycle", {**spec, "seed": index, "api": "async" if index % 2 else "sync"})
        for index in range(PROCESSES)
    ]
    with Workers(jobs) as workers:
        results = workers.run(timeout=duration + 120)
    start = min(record[0] for worker in results for record in worker)
    end = start + int(duration * 1e9)
    # Only acquisitions started inside the window count (a process that waited through
    # it still gets the lock once the others stop).
    counted = [[record for record in worker if record[0] < end] for worker in results]
    waits = [(record[1] - record[0]) / 1e6 for worker in counted for record in worker]
    per_process = [len(worker) for worker in counted]
    everything = [(record[1], record[2]) for worker in results for record in worker]
    return {
        "acquisitions": sum(per_process),
        "per_second": sum(per_process) / duration,
        "most_at_once": max_overlap(everything),
        "wait_p50": percentile(waits, 50),
        "wait_p99": percentile(waits, 99),
        "min": min(per_process),
        "max": max(per_process),
        "spread": (max(per_process) - min(per_process)) / max(per_process) * 100,
        "ideal": duration / HOLD * LIMIT,
    }


def contended_table(result: dict[str, Any], duration: float) -> str:
    row = [
        f"limit={LIMIT}, {PROCESSES} processes, {duration:g} s",
        fmt(result["per_second"], 0),
        f"{result['most_at_once']}",
        fmt(result["wait_p50"], 1),
        fmt(result["wait_p99"], 1),
        f"{result['min']} / {result['max']}",
        fmt(result["spread"], 0),
    ]
    return table(
        [
            "scenario",
            "acq/s",
            "most holders at once",
            "wait p50 ms",
            "wait p99 ms",
            "min / max acq per process",
            "spread %",
        ],
        [row],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter window")
    options = parser.parse_args()
    rounds, cycles, duration = (4, 300, 2.0) if options.quick else (10, 1000, 5.0)
    with bench_server() as server:
        client = server.client()
        print(f"{server.version()}, load average {_load()}")
        measured = uncontended(server.url, rounds=rounds, cycles=cycles)
        print(f"\nUncontended acquire+release, {rounds} rounds x {cycles:,} cycles\n")
        print(uncontended_table(measured))
        client.flushall()
        result = contended(server.url, duration=duration)
        print(f"\nContended: each acquisition holds the lock {HOLD * 1000:g} ms\n")
        print(contended_table(result, duration))
        print(
            f"\n(the most {LIMIT} holders of {HOLD * 1000:g} ms could do in {duration:g} s: "
            f"{result['ideal'] / duration:,.0f} acq/s; load average now {_load()})"
        )
        client.close()


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
