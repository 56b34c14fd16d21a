"""What recording lock events costs: uncontended acquire+release through ``distlock()``
with ``DISTLOCK["EVENTS"] = "async"`` (the default) against ``"off"``.

    .venv/bin/python bench/events.py              # about 30 s
    .venv/bin/python bench/events.py --quick      # a few seconds, noisier

One process, one private server (``bench/server.py``), Django configured here with an
SQLite file database (migrated at start), or with ``--database postgres`` a private
PostgreSQL cluster (the suite's ``tests/support/postgres_servers.py``; not pinned). Rounds
alternate the two modes (the order rotating each round); a round is ``cycles`` x
``with distlock(name): pass``. An ``"async"`` round ends with ``flush_events()`` and its
time counts in the round, so the writer's work is charged to the mode that caused it and
never leaks into an ``"off"`` round. The ratio async/off is taken per round and the
median over rounds is reported (target: under 1.10). Both modes send signals (no
receivers here), so the difference is the buffer and the writer thread.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

from server import bench_server  # noqa: E402
from stats import median, percentile  # noqa: E402
from timing import PLACEMENTS, place, rotated, timed  # noqa: E402

MODES = ("off", "async")
TARGET = 1.10


def configure_django(redis_url: str, database: dict[str, object]) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django_distlock",
        ],
        DATABASES={"default": database},
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}},
        DISTLOCK={"EVENTS": "off"},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def run_round(mode: str, cycles: int) -> tuple[list[int], int, int, int]:
    """``cycles`` acquire+release in ``mode``: per-cycle ns, total ns (with the final
    flush in async mode), flush ns, process CPU ns."""
    from django.test.utils import override_settings

    from django_distlock import distlock
    from django_distlock.events import flush_events

    name = f"bench:events:{mode}"
    with override_settings(DISTLOCK={"EVENTS": mode}):
        for _ in range(20):  # the settings change rebuilt the backend: warm it up
            with distlock(name):
                pass
        flush_events(timeout=60)

        def cycle(_: int) -> None:
            with distlock(name):
                pass

        loop = timed(cycle, cycles)
        flush_start, flush_cpu = time.perf_counter_ns(), time.process_time_ns()
        flush_events(timeout=60)
        flushed = time.perf_counter_ns() - flush_start
        flush_cpu = time.process_time_ns() - flush_cpu
    return loop.durations, loop.total_ns + flushed, flushed, loop.cpu_ns + flush_cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="6 rounds x 500 cycles")
    parser.add_argument(
        "--database",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="an SQLite file (default), or a private PostgreSQL cluster started with "
        "tests/support/postgres_servers.py (needs Debian's postgresql package)",
    )
    parser.add_argument(
        "--pin",
        choices=PLACEMENTS,
        default="split",
        help="benchmark on the first CPU, server on the second (split, default), both on "
        "the first (same), or no pinning",
    )
    args = parser.parse_args()
    rounds, cycles = (6, 500) if args.quick else (args.rounds, args.cycles)

    with contextlib.ExitStack() as stack:
        server = stack.enter_context(bench_server())
        if args.database == "postgres":
            from tests.support.postgres_servers import PostgresServer

            database = stack.enter_context(PostgresServer()).settings("postgres")
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="distlock-bench-"))
            database = {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{tmp}/db"}
        pin = args.pin if len(os.sched_getaffinity(0)) >= 2 or args.pin != "split" else "same"
        place(pin, server)
        configure_django(server.url, database)

        from django_distlock.events import writer as eventwriter
        from django_distlock.models import LockEvent

        durations: dict[str, list[int]] = {mode: [] for mode in MODES}
        totals: dict[str, list[float]] = {mode: [] for mode in MODES}
        p50s: dict[str, list[float]] = {mode: [] for mode in MODES}
        flush_ns = cpu_ns = 0
        cpu: dict[str, int] = dict.fromkeys(MODES, 0)
        for r in range(rounds):
            for mode in rotated(MODES, r):
                cycle_ns, total, flushed, cpu_ns = run_round(mode, cycles)
                durations[mode].extend(cycle_ns)
                totals[mode].append(total / cycles)
                p50s[mode].append(percentile(cycle_ns, 50))
                cpu[mode] += cpu_ns
                if mode == "async":
                    flush_ns += flushed

        recorded = LockEvent.objects.filter(name="bench:events:async").count()
        writer = eventwriter.current_writer()
        dropped = writer.dropped_total if writer else 0
        failed = writer.failed_total if writer else 0

    print(
        f"# Event recording: {rounds} rounds x {cycles} acquire+release, "
        f"database={args.database}, pin={pin}\n"
    )
    print("| EVENTS | ops/s | mean µs | p50 µs | p99 µs | CPU µs/cycle |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        mean_us = sum(totals[mode]) / len(totals[mode]) / 1000
        print(
            f"| {mode} | {1e6 / mean_us:,.0f} | {mean_us:.1f} "
            f"| {percentile(durations[mode], 50) / 1000:.1f} "
            f"| {percentile(durations[mode], 99) / 1000:.1f} "
            f"| {cpu[mode] / (rounds * cycles) / 1000:.1f} |"
        )
    by_mean = median([a / o for a, o in zip(totals["async"], totals["off"], strict=True)])
    by_p50 = median([a / o for a, o in zip(p50s["async"], p50s["off"], strict=True)])
    expected = 2 * rounds * (cycles + 20)
    print()
    print(f"async/off (mean per cycle, flush included; median of rounds): {by_mean:.3f}")
    print(f"async/off (p50 per cycle; median of rounds): {by_p50:.3f}")
    extra_cpu = (cpu["async"] - cpu["off"]) / (rounds * cycles) / 1000
    print(f"final flush per async round: {flush_ns / rounds / 1e6:.2f} ms")
    print(f"extra process CPU with async: {extra_cpu:.1f} µs per cycle (2 events)")
    print(f"events recorded: {recorded:,} of {expected:,} (dropped {dropped}, failed {failed})")
    verdict = "PASS" if by_mean < TARGET and by_p50 < TARGET else "FAIL"
    print(f"target: async under {TARGET:.2f}x off: {verdict}")
    return 0 if recorded == expected and not dropped and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
