"""How fast ``HeldLock.objects`` lists live locks: 10,000 held locks in a Redis that also
holds 1,000,000 unrelated keys.

    .venv/bin/python bench/listing.py              # about 30 s
    .venv/bin/python bench/listing.py --quick      # about 15 s, noisier

One process, one private server (``bench/server.py``). The unrelated keys are written
by a Lua loop, the locks are taken with ``distlock()`` (``auto_renew=False``, one-hour
lease, events off) and stay held while each query below runs ``repeats`` times, the
queries' order rotating every round. Times are wall-clock per query, from building the
queryset to the last model instance; ``server cmds`` counts the commands the server ran
per query (``INFO commandstats``, commands inside scripts included), and the last row is
the reference a listing would pay if it scanned the keyspace for the prefix instead of
reading the index.
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
from stats import fmt, percentile, table  # noqa: E402

HELD = 10_000
UNRELATED = 1_000_000
PAGE = 100
# Commands the benchmark itself sends to read the counters.
_OWN_COMMANDS = ("cmdstat_info", "cmdstat_config|resetstat")

_FILL = """
local pairs = {}
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  pairs[#pairs + 1] = 'cache:item:' .. i
  pairs[#pairs + 1] = 'x'
end
return redis.call('MSET', unpack(pairs))
"""


def configure_django(redis_url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_distlock"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}},
        DISTLOCK={"EVENTS": "off", "AUTO_RENEW": False, "TIMEOUT": 3600},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


def fill(client: redis.Redis, unrelated: int) -> float:
    started = time.perf_counter()
    for start in range(0, unrelated, 2000):
        client.eval(_FILL, 0, start, min(start + 1999, unrelated - 1))
    return time.perf_counter() - started


def hold_locks(held: int) -> tuple[list[Any], list[str], float]:
    from django_distlock import distlock

    names = [f"tenant:{i % 50}:invoice:{i:06}" for i in range(held)]
    started = time.perf_counter()
    locks = []
    for name in names:
        lock = distlock(name)
        if not lock.acquire(blocking=False):
            raise RuntimeError(f"could not take {name}")
        locks.append(lock)
    return locks, names, time.perf_counter() - started


def queries(names: list[str], client: redis.Redis) -> dict[str, Callable[[], Any]]:
    from django_distlock.models import HeldLock

    one = names[len(names) // 2]

    def scan_keyspace() -> int:
        # What a listing without an index would pay: walk the whole keyspace.
        return sum(1 for _ in client.scan_iter(match="distlock:{*}", count=1000))

    return {
        "all()[:100] (first page)": lambda: list(HeldLock.objects.all()[:PAGE]),
        "all()[9900:10000] (last page)": lambda: list(
            HeldLock.objects.all()[len(names) - PAGE : len(names)]
        ),
        'filter(name__startswith="tenant:7:")[:100]': lambda: list(
            HeldLock.objects.filter(name__startswith="tenant:7:")[:PAGE]
        ),
        "count()": lambda: HeldLock.objects.count(),
        'filter(name__contains=":0042").count()': lambda: HeldLock.objects.filter(
            name__contains=":0042"
        ).count(),
        'order_by("-ttl")[:100]': lambda: list(HeldLock.objects.order_by("-ttl")[:PAGE]),
        'order_by("-acquired_at")[:100]': lambda: list(
            HeldLock.objects.order_by("-acquired_at")[:PAGE]
        ),
        "get(name=...)": lambda: HeldLock.objects.get(name=one),
        "reference: SCAN MATCH over the keyspace": scan_keyspace,
    }


def server_commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k not in _OWN_COMMANDS)


def measure(
    runs: dict[str, Callable[[], Any]], client: redis.Redis, rounds: int, scan_rounds: int
) -> dict[str, tuple[list[float], float]]:
    """Per query: the durations (s) and the mean server commands per run."""
    keys = list(runs)
    durations: dict[str, list[float]] = {key: [] for key in keys}
    commands: dict[str, list[int]] = {key: [] for key in keys}
    for key in keys:  # warm-up: scripts loaded, connections open
        runs[key]()
    for r in range(rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for key in order:
            if key.startswith("reference") and r >= scan_rounds:
                continue
            gc.collect()
            client.config_resetstat()
            started = time.perf_counter()
            runs[key]()
            durations[key].append(time.perf_counter() - started)
            commands[key].append(server_commands(client))
    return {key: (durations[key], sum(commands[key]) / len(commands[key])) for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--held", type=int, default=HELD, help="locks held (10,000)")
    parser.add_argument("--unrelated", type=int, default=UNRELATED, help="other keys (1,000,000)")
    options = parser.parse_args()
    rounds = 20 if options.quick else 100
    scan_rounds = 2 if options.quick else 5

    with bench_server() as server:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        configure_django(server.url)
        fill_s = fill(client, options.unrelated)
        locks, names, hold_s = hold_locks(options.held)
        print(
            f"{server.version()}: {client.dbsize():,} keys ({options.unrelated:,} unrelated, "
            f"written in {fill_s:.1f} s; {len(locks):,} locks taken in {hold_s:.1f} s)\n"
        )
        results = measure(queries(names, client), client, rounds, scan_rounds)

    rows = []
    for key, (durations, commands) in results.items():
        ms = [d * 1000 for d in durations]
        rows.append(
            [
                key,
                str(len(ms)),
                fmt(percentile(ms, 50)),
                fmt(percentile(ms, 99)),
                fmt(max(ms)),
                fmt(commands, 0),
            ]
        )
    print(table(["query", "runs", "p50 ms", "p99 ms", "max ms", "server cmds"], rows))


if __name__ == "__main__":
    main()
