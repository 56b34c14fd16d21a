"""What a lock leaves behind in Redis: bytes per distinct lock name after it was taken
and released, side by side with the peers, and what is left once the fence memory lapses.

    .venv/bin/python bench/memory.py            # 100,000 names per row, about a minute
    .venv/bin/python bench/memory.py --quick    # 10,000 names per row

One private server (``bench/server.py``), one implementation at a time on an empty
database: take and release ``N`` distinct names (``lock:0`` ... ``lock:N-1``), then read
``DBSIZE`` and ``INFO memory`` (``used_memory`` minus the empty database's), and what one
of the keys left costs (``MEMORY USAGE``) and how long it lives (``PTTL``). The last row
runs our lock with ``Tuning(fence_memory=1)`` and reads the server again two seconds
later: what stays is bounded in time, not only in size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

import impls  # noqa: E402
import redis  # noqa: E402
from server import bench_server  # noqa: E402
from stats import fmt, table  # noqa: E402

from tests.support.redis_servers import RedisServer  # noqa: E402

ROWS = ("distlock", "redis-py", "python-redis-lock", "pottery")


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def leftovers(client: redis.Redis) -> tuple[int, int | None, float | None]:
    """Keys left, bytes of one of them (``MEMORY USAGE``), and its PTTL in seconds."""
    keys = client.dbsize()
    sample = client.randomkey()
    if sample is None:
        return keys, None, None
    pttl = client.pttl(sample)
    return keys, client.memory_usage(sample), None if pttl < 0 else pttl / 1000


def measure(server: RedisServer, key: str, names: int, *, fence_memory: float | None = None):
    client = server.client()
    client.flushall()
    time.sleep(0.2)  # let the server settle its lazy-free of the previous row
    base = used_memory(client)
    work = impls.make_client(server.port)
    if key != "distlock":
        make = impls.IMPLS[key].make
    else:
        # One backend for every name, as an application has (the bench's per-lock maker
        # opens a backend, and its connections, per lock: their client buffers would be
        # counted as what the locks leave).
        from django_distlock.engine import Backend, Lock, Tuning

        tuning = None if fence_memory is None else Tuning(fence_memory=fence_memory)
        backend = Backend(work, tuning=tuning, auto_renew=fence_memory is None)

        def make(client: redis.Redis, name: str, lease: float):
            return Lock(name, backend=backend, timeout=lease)

    started = time.perf_counter()
    for i in range(names):
        lock = make(work, f"lock:{i}", 10.0)
        lock.acquire()
        lock.release()
    elapsed = time.perf_counter() - started
    keys, sample_bytes, sample_ttl = leftovers(client)
    grown = used_memory(client) - base
    result = {
        "keys": keys,
        "bytes_per_name": grown / names,
        "total_mb": grown / 1e6,
        "sample_bytes": sample_bytes,
        "ttl": sample_ttl,
        "elapsed": elapsed,
    }
    if fence_memory is not None:
        time.sleep(fence_memory + 10.0 + 1.0)  # the lease (10 s) + fence memory, + slack
        result["keys_later"] = client.dbsize()
    work.close()
    client.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 names per row")
    options = parser.parse_args()
    names = 10_000 if options.quick else 100_000
    with bench_server() as server:
        rows = []
        for key in ROWS:
            r = measure(server, key, names)
            rows.append(
                [
                    impls.IMPLS[key].label,
                    f"{r['keys']:,}",
                    fmt(r["bytes_per_name"], 0),
                    fmt(r["total_mb"], 1),
                    "-" if r["sample_bytes"] is None else str(r["sample_bytes"]),
                    "-" if r["ttl"] is None else f"{r['ttl']:,.0f} s",
                ]
            )
        short = measure(server, "distlock", names, fence_memory=1.0)
        print(f"\n{names:,} distinct names, each acquired and released once ({server.version()})\n")
        print(
            table(
                [
                    "implementation",
                    "keys left",
                    "bytes/name",
                    "MB total",
                    "one key (bytes)",
                    "its TTL",
                ],
                rows,
            )
        )
        print(
            f"\ndistlock with Tuning(fence_memory=1): {short['keys']:,} keys right after "
            f"({fmt(short['bytes_per_name'], 0)} bytes/name), {short['keys_later']:,} keys "
            "once the lease + fence memory are over"
        )


if __name__ == "__main__":
    main()
