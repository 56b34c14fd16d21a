"""What ``MIN_REPLICAS="auto"`` costs in normal running (issue 27): uncontended
acquire+release, sync, on a server without replicas and on a primary with one replica,
with ``min_replicas`` 0, ``"auto"`` and 1, interleaved in rounds.

    .venv/bin/python bench/replicas.py --rounds 15 --cycles 400

Each round runs ``cycles`` acquire+release cycles of each configuration (its own
backend, its own lock name), the order rotating from round to round so that slow phases
of a shared machine hit every configuration. Reported per configuration: p50 and p99 of
one cycle over every round, and the median over rounds of the ratio of the round's p50 to
that round's p50 of the same server with ``min_replicas=0``. The servers are started
here (``tests/support``), on loopback, with the suite's server binary.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

import redis  # noqa: E402
from stats import median, percentile, table  # noqa: E402

from django_distlock.engine import AUTO_REPLICAS, Backend, Lock  # noqa: E402
from tests.support.redis_servers import RedisServer  # noqa: E402
from tests.support.servers import install_termination_cleanup  # noqa: E402
from tests.support.topologies import ReplicatedSetup  # noqa: E402

SETTINGS: tuple[int | str, ...] = (0, AUTO_REPLICAS, 1)


def _cycles(lock: Lock, count: int) -> list[int]:
    durations = []
    for _ in range(count):
        began = time.perf_counter_ns()
        lock.acquire()
        lock.release()
        durations.append(time.perf_counter_ns() - began)
    return durations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=400)
    options = parser.parse_args()
    install_termination_cleanup()
    with RedisServer() as single, ReplicatedSetup(replicas=1) as replicated:
        servers = {"no replica": single.url, "1 replica": replicated.primary.url}
        configs = [(where, setting) for where in servers for setting in SETTINGS]
        locks = {}  # one backend and lock per configuration, warmed up
        for where, setting in configs:
            if where == "no replica" and setting == 1:
                continue  # every acquire would be refused: nothing to measure
            backend = Backend(redis.Redis.from_url(servers[where]), min_replicas=setting)
            lock = Lock(f"bench:{where}:{setting}", backend=backend, auto_renew=False)
            _cycles(lock, 50)
            locks[where, setting] = lock
        durations: dict[tuple[str, int | str], list[int]] = {key: [] for key in locks}
        ratios: dict[tuple[str, int | str], list[float]] = {key: [] for key in locks}
        load = os.getloadavg()[0]
        keys = list(locks)
        for index in range(options.rounds):
            order = keys[index % len(keys) :] + keys[: index % len(keys)]
            p50s = {}
            for key in order:
                measured = _cycles(locks[key], options.cycles)
                durations[key] += measured
                p50s[key] = percentile(measured, 50)
            for key in keys:
                ratios[key].append(p50s[key] / p50s[key[0], 0])
        rows = [
            [
                where,
                str(setting),
                f"{percentile(durations[where, setting], 50) / 1000:.0f}",
                f"{percentile(durations[where, setting], 99) / 1000:.0f}",
                f"{median(ratios[where, setting]):.3f}",
            ]
            for where, setting in keys
        ]
    print(
        f"{options.rounds} rounds x {options.cycles} cycles; load average "
        f"{load:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    print(table(["server", "min_replicas", "p50 µs", "p99 µs", "p50 / min_replicas 0"], rows))


if __name__ == "__main__":
    main()
