"""How fast held locks are listed: 10,000 held locks among 1,000,000 unrelated keys, on
one server (through ``HeldLock.objects``) and on a local 3-primary cluster (through the
engine's ``Listing``).

    .venv/bin/python bench/listing.py                       # both, about 1-2 minutes
    .venv/bin/python bench/listing.py --quick               # fewer repeats, noisier
    .venv/bin/python bench/listing.py --topology cluster    # single | cluster | both

One process. The unrelated keys are written by a Lua loop (on a cluster: a third on
each primary, under a hash tag of one of its slots). Single server (``bench/server.py``):
the locks are taken with ``distlock()`` (``auto_renew=False``, one-hour lease, events off)
and each query is a ``HeldLock.objects`` queryset, timed from building the queryset to
the last model instance. Cluster (``bench/server.py`` ``bench_cluster()``: 3 primaries,
no replicas): the locks are taken with the engine's ``Lock`` on
``Backend(cluster=[seed URLs])`` and each query is the :class:`LockQuery` that the same
queryset builds, passed to ``Listing(backend)`` (records, ``page()``, ``count()``), timed to
the last record (the Django layer only turns records into model instances). The locks
stay held while each query runs ``repeats`` times, the queries' order rotating every
round. ``server cmds`` counts the commands the servers ran per query (``INFO
commandstats`` of every primary, commands inside scripts included), and the last row is
the reference a listing would pay if it scanned the keyspace (every primary's) for the
prefix instead of reading the index.
"""

from __future__ import annotations

import argparse
import gc
import os
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
from redis.crc import key_slot  # noqa: E402
from server import bench_cluster, bench_server  # noqa: E402
from stats import fmt, percentile, table  # noqa: E402
from timing import rotated  # noqa: E402

HELD = 10_000
UNRELATED = 1_000_000
PAGE = 100
# Commands the benchmark itself sends to read the counters.
_OWN_COMMANDS = ("cmdstat_info", "cmdstat_config|resetstat")

PAGE_TARGET_MS = 50.0  # issue 11: a page of 100 out of 10,000 on a 3-primary cluster
_FILL = """
local pairs = {}
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  pairs[#pairs + 1] = 'cache:' .. ARGV[3] .. 'item:' .. i
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


def fill(client: redis.Redis, first: int, last: int, tag: str = "") -> None:
    """Keys ``cache:<tag>item:<first>`` .. ``<last>`` (inclusive) on ``client``'s server."""
    for start in range(first, last + 1, 2000):
        client.eval(_FILL, 0, start, min(start + 1999, last), tag)


def names_for(held: int) -> list[str]:
    return [f"tenant:{i % 50}:invoice:{i:06}" for i in range(held)]


def hold_locks(names: list[str], make: Callable[[str], Any]) -> tuple[list[Any], float]:
    started = time.perf_counter()
    locks = []
    for name in names:
        lock = make(name)
        if not lock.acquire(blocking=False):
            raise RuntimeError(f"could not take {name}")
        locks.append(lock)
    return locks, time.perf_counter() - started


def scan_reference(clients: list[redis.Redis]) -> Callable[[], int]:
    def scan_keyspace() -> int:
        # What a listing without an index would pay: walk the whole keyspace.
        return sum(
            1 for client in clients for _ in client.scan_iter(match="distlock:{*}", count=1000)
        )

    return scan_keyspace


def django_queries(names: list[str], clients: list[redis.Redis]) -> dict[str, Callable[[], Any]]:
    from django_distlock.models import HeldLock

    one = names[len(names) // 2]
    return {
        "all()[:100] (first page)": lambda: list(HeldLock.objects.all()[:PAGE]),
        "all() last page": lambda: list(HeldLock.objects.all()[len(names) - PAGE : len(names)]),
        'filter(name__startswith="tenant:7:")[:100]': lambda: list(
            HeldLock.objects.filter(name__startswith="tenant:7:")[:PAGE]
        ),
        "count()": lambda: HeldLock.objects.count(),
        'filter(name__contains=":0042").count()': lambda: HeldLock.objects.filter(
            name__contains=":0042"
        ).count(),
        'order_by("-ttl")[:100]': lambda: list(HeldLock.objects.order_by("-ttl")[:PAGE]),
        'order_by("-ttl")[9900:10000]': lambda: list(HeldLock.objects.order_by("-ttl")[9900:10000]),
        'order_by("-ttl") last page': lambda: list(
            HeldLock.objects.order_by("-ttl")[len(names) - PAGE : len(names)]
        ),
        'order_by("-acquired_at")[:100]': lambda: list(
            HeldLock.objects.order_by("-acquired_at")[:PAGE]
        ),
        "get(name=...)": lambda: HeldLock.objects.get(name=one),
        "reference: SCAN MATCH over the keyspace": scan_reference(clients),
    }


def engine_queries(
    names: list[str], backend: Any, clients: list[redis.Redis]
) -> dict[str, Callable[[], Any]]:
    """The same queries as :func:`django_queries`, as the ``LockQuery`` objects that
    ``HeldLock.objects`` builds for them, passed to the engine's ``Listing``."""
    from django_distlock.engine.listing.query import Listing, LockQuery

    listing = Listing(backend)
    one = names[len(names) // 2]

    def get_one() -> Any:
        page = listing.page(LockQuery(filters=(("exact", one),)), limit=2)
        if len(page.records) != 1:
            raise RuntimeError(f"get({one!r}) found {page.matched}")
        return page.records[0]

    return {
        "all()[:100] (first page)": lambda: listing.records(LockQuery(high=PAGE)),
        "all() last page": lambda: listing.records(
            LockQuery(low=len(names) - PAGE, high=len(names))
        ),
        'filter(name__startswith="tenant:7:")[:100]': lambda: listing.records(
            LockQuery(filters=(("startswith", "tenant:7:"),), high=PAGE)
        ),
        "count()": lambda: listing.count(),
        'filter(name__contains=":0042").count()': lambda: listing.count(
            LockQuery(filters=(("contains", ":0042"),))
        ),
        'order_by("-ttl")[:100]': lambda: listing.records(LockQuery(ordering=("-ttl",), high=PAGE)),
        'order_by("-ttl")[9900:10000]': lambda: listing.records(
            LockQuery(ordering=("-ttl",), low=9900, high=10000)
        ),
        'order_by("-ttl") last page': lambda: listing.records(
            LockQuery(ordering=("-ttl",), low=len(names) - PAGE, high=len(names))
        ),
        'order_by("-acquired_at")[:100]': lambda: listing.records(
            LockQuery(ordering=("-acquired_at",), high=PAGE)
        ),
        "get(name=...)": get_one,
        "reference: SCAN MATCH over the keyspace": scan_reference(clients),
    }


def server_commands(clients: list[redis.Redis]) -> int:
    total = 0
    for client in clients:
        stats = client.info("commandstats")
        total += sum(int(v["calls"]) for k, v in stats.items() if k not in _OWN_COMMANDS)
    return total


def measure(
    runs: dict[str, Callable[[], Any]], clients: list[redis.Redis], rounds: int, scan_rounds: int
) -> dict[str, tuple[list[float], float]]:
    """Per query: the durations (s) and the mean server commands per run."""
    keys = list(runs)
    durations: dict[str, list[float]] = {key: [] for key in keys}
    commands: dict[str, list[int]] = {key: [] for key in keys}
    for key in keys:  # warm-up: scripts loaded, connections open
        runs[key]()
    for r in range(rounds):
        for key in rotated(keys, r):
            if key.startswith("reference") and r >= scan_rounds:
                continue
            gc.collect()
            for client in clients:
                client.config_resetstat()
            started = time.perf_counter()
            runs[key]()
            durations[key].append(time.perf_counter() - started)
            commands[key].append(server_commands(clients))
    return {key: (durations[key], sum(commands[key]) / len(commands[key])) for key in keys}


Results = dict[str, tuple[list[float], float]]


def run_single(options: argparse.Namespace, rounds: int, scan_rounds: int) -> tuple[str, Results]:
    """``HeldLock.objects`` on one server."""
    with bench_server() as server:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        configure_django(server.url)
        from django_distlock import distlock

        started = time.perf_counter()
        fill(client, 0, options.unrelated - 1)
        fill_s = time.perf_counter() - started
        names = names_for(options.held)
        locks, hold_s = hold_locks(names, distlock)
        where = (
            f"single server, {server.version()}, `HeldLock.objects`: {client.dbsize():,} keys "
            f"({options.unrelated:,} unrelated, written in {fill_s:.1f} s; {len(locks):,} "
            f"locks taken in {hold_s:.1f} s)"
        )
        return where, measure(django_queries(names, [client]), [client], rounds, scan_rounds)


def _tag_on(client: redis.Redis) -> str:
    """A hash tag ``{...}`` whose slot ``client``'s node serves."""
    first, last = next(
        (int(a), int(b))
        for a, b, owner, *_ in client.execute_command("CLUSTER", "SLOTS")
        if int(owner[1]) == client.connection_pool.connection_kwargs["port"]
    )
    return next(
        tag for i in range(1 << 20) if first <= key_slot((tag := f"{{u{i}}}").encode()) <= last
    )


def run_cluster(options: argparse.Namespace, rounds: int, scan_rounds: int) -> tuple[str, Results]:
    """The engine's ``Listing`` on a local 3-primary cluster."""
    from django_distlock.engine import Backend, Lock

    with bench_cluster() as cluster:
        primaries = [node.client() for node in cluster.primaries]
        started = time.perf_counter()
        share = -(-options.unrelated // len(primaries))
        for index, client in enumerate(primaries):
            first = index * share
            last = min(first + share, options.unrelated) - 1
            if first <= last:
                fill(client, first, last, _tag_on(client))
        fill_s = time.perf_counter() - started
        backend = Backend(cluster=cluster.urls, auto_renew=False, timeout=3600)
        names = names_for(options.held)
        locks, hold_s = hold_locks(names, lambda name: Lock(name, backend=backend))
        per_node = [client.dbsize() for client in primaries]
        where = (
            f"{len(primaries)}-primary cluster, {cluster.nodes[0].version()}, engine "
            f"`Listing`: {sum(per_node):,} keys ({' + '.join(f'{n:,}' for n in per_node)} "
            f"per primary; {options.unrelated:,} unrelated, written in {fill_s:.1f} s; "
            f"{len(locks):,} locks taken in {hold_s:.1f} s)"
        )
        results = measure(engine_queries(names, backend, primaries), primaries, rounds, scan_rounds)
        for client in primaries:
            client.close()
        return where, results


def report(where: str, results: Results) -> str:
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
    return f"{where}\n\n" + table(
        ["query", "runs", "p50 ms", "p99 ms", "max ms", "server cmds"], rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--held", type=int, default=HELD, help="locks held (10,000)")
    parser.add_argument("--unrelated", type=int, default=UNRELATED, help="other keys (1,000,000)")
    parser.add_argument(
        "--topology",
        choices=("single", "cluster", "both"),
        default="both",
        help="one server (HeldLock.objects), a local 3-primary cluster (Listing), or both",
    )
    options = parser.parse_args()
    rounds = 20 if options.quick else 100
    scan_rounds = 2 if options.quick else 5
    print(f"load average at the start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}\n")
    texts = []
    if options.topology in ("single", "both"):
        texts.append(report(*run_single(options, rounds, scan_rounds)))
    if options.topology in ("cluster", "both"):
        where, results = run_cluster(options, rounds, scan_rounds)
        texts.append(report(where, results))
        page = [d * 1000 for d in results["all()[:100] (first page)"][0]]
        p50, p99 = percentile(page, 50), percentile(page, 99)
        verdict = "PASS" if p99 < PAGE_TARGET_MS else "FAIL"
        texts.append(
            f"{verdict}: cluster, first page of {PAGE} out of {options.held:,} held locks: "
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms (target < {PAGE_TARGET_MS:g} ms)"
        )
    print()
    print("\n\n".join(texts))
    print(f"\nload average at the end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
