"""The watchdog at scale: one process holding 500 to 5,000 auto-renewed locks, sync and
async side by side, and what keeping them costs.

    .venv/bin/python bench/renewals.py                              # about 2 minutes
    .venv/bin/python bench/renewals.py --counts 500,2000 --periods 2   # about 40 s

One private server (``bench/server.py``), one ``Backend`` with a sync client and an
async one. For each count N (``--counts``), interleaved (the order of sync and async
rotating from one count to the next):

- sync: this thread takes N ``Lock(f"renew:{i}", timeout=LEASE, auto_renew=True)``
  with ``acquire()``, then sleeps ``--periods`` leases while the watchdog renews them;
- async: one task on one event loop (kept for the whole run) takes N locks with
  ``aacquire()``, then ``asyncio.sleep``s as long.

Renewals and losses are counted by the backend's ``observer`` (``renewed`` and ``lost``
events); the client's process CPU, the server's ``INFO cpu`` and ``INFO stats``
``total_connections_received`` are read at both ends of the hold window. Then every lock
is released (a lost lock's release raises ``LockError``: counted, not fatal) and the
server gets ``--pause`` seconds before the next row. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import faulthandler
import gc
import logging
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

import redis  # noqa: E402
import redis.asyncio  # noqa: E402
from run import cpu_model, engine_digest, git_commit, load  # noqa: E402
from server import bench_server  # noqa: E402
from stats import fmt, table  # noqa: E402
from timing import PLACEMENTS, place, rotated  # noqa: E402

from django_distlock.engine import Backend, Event, Lock, LockError  # noqa: E402
from tests.support.redis_servers import RedisServer  # noqa: E402

MODES = ("sync", "async")
RENEWALS_PER_LEASE = 3  # the watchdog renews at a third of the lease
FLAT = 1.5  # largest-N CPU per renewal over smallest-N: at most this is "flat"


class Counts:
    """The backend's observer: events counted by kind (called from the watchdog's
    notifier thread, so behind a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter[str] = collections.Counter()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self._counts[event.kind] += 1

    def snapshot(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self._counts)


class Logged(logging.Handler):
    """Counts what ``django_distlock`` logs (one WARNING per failed renewal attempt:
    thousands when the watchdog falls behind) instead of printing it; ``--verbose``
    prints it too."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: collections.Counter[str] = collections.Counter()
        self.first: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        level = record.levelname
        self.counts[level] += 1
        self.first.setdefault(level, record.getMessage())


@dataclass
class Row:
    mode: str
    locks: int
    lease: float
    periods: int
    acquire_s: float = 0.0
    not_taken: int = 0
    renewed: int = 0
    renew_failed: int = 0
    lost_events: int = 0
    lost_at_end: int = 0
    release_errors: int = 0
    release_error_kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    window_s: float = 0.0
    client_cpu_ns: int = 0
    server_cpu_s: float = 0.0
    connections: int = 0
    load_after: str = ""

    @property
    def expected(self) -> int:
        return self.locks * self.periods * RENEWALS_PER_LEASE

    def client_us_per_renewal(self) -> float | None:
        return self.client_cpu_ns / self.renewed / 1000 if self.renewed else None

    def server_us_per_renewal(self) -> float | None:
        return self.server_cpu_s / self.renewed * 1e6 if self.renewed else None


@dataclass(frozen=True)
class Reading:
    """What is read at each end of the hold window."""

    events: collections.Counter[str]
    cpu_ns: int
    server_cpu_s: float
    connections: int
    at: float


def read(counts: Counts, admin: redis.Redis) -> Reading:
    cpu = admin.info("cpu")
    stats = admin.info("stats")
    return Reading(
        events=counts.snapshot(),
        cpu_ns=time.process_time_ns(),
        server_cpu_s=float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        connections=int(stats["total_connections_received"]),
        at=time.monotonic(),
    )


def window(row: Row, before: Reading, after: Reading) -> None:
    row.renewed = after.events["renewed"] - before.events["renewed"]
    row.renew_failed = after.events["renew_failed"] - before.events["renew_failed"]
    row.window_s = after.at - before.at
    row.client_cpu_ns = after.cpu_ns - before.cpu_ns
    row.server_cpu_s = after.server_cpu_s - before.server_cpu_s
    row.connections = after.connections - before.connections


def release_failed(row: Row, exc: LockError) -> None:
    row.release_errors += 1
    row.release_error_kinds[type(exc).__name__] += 1


def sync_row(backend: Backend, counts: Counts, admin: redis.Redis, row: Row) -> None:
    locks = [
        Lock(f"renew:{i}", backend=backend, timeout=row.lease, auto_renew=True)
        for i in range(row.locks)
    ]
    gc.collect()
    started = time.perf_counter()
    taken = [lock for lock in locks if lock.acquire(blocking=False)]
    row.acquire_s = time.perf_counter() - started
    row.not_taken = row.locks - len(taken)
    before = read(counts, admin)
    time.sleep(row.lease * row.periods)
    after = read(counts, admin)
    window(row, before, after)
    row.lost_at_end = sum(lock.lost for lock in taken)
    for lock in taken:
        try:
            lock.release()
        except LockError as exc:
            release_failed(row, exc)


async def async_row(backend: Backend, counts: Counts, admin: redis.Redis, row: Row) -> None:
    # One task takes, holds and releases every lock: a hold whose task ended is not
    # renewed, and ``lock.lost`` describes the calling task's acquisition.
    locks = [
        Lock(f"renew:{i}", backend=backend, timeout=row.lease, auto_renew=True)
        for i in range(row.locks)
    ]
    gc.collect()
    started = time.perf_counter()
    taken = [lock for lock in locks if await lock.aacquire(blocking=False)]
    row.acquire_s = time.perf_counter() - started
    row.not_taken = row.locks - len(taken)
    before = read(counts, admin)  # a blocking INFO: well under a millisecond on loopback
    await asyncio.sleep(row.lease * row.periods)
    after = read(counts, admin)
    window(row, before, after)
    row.lost_at_end = sum(lock.lost for lock in taken)
    for lock in taken:
        try:
            await lock.arelease()
        except LockError as exc:
            release_failed(row, exc)


def run(server: RedisServer, args: argparse.Namespace) -> list[Row]:
    host, port = server.address
    counts = Counts()
    admin = server.client()
    client = redis.Redis(host=host, port=port)
    async_clients: list[redis.asyncio.Redis] = []

    def async_client() -> redis.asyncio.Redis:
        made = redis.asyncio.Redis(host=host, port=port)
        async_clients.append(made)
        return made

    backend = Backend(client, async_client=async_client, observer=counts)
    rows: list[Row] = []
    with asyncio.Runner() as runner:
        try:
            # Warm-up: connections, scripts, the watchdog's thread and the loop's timers.
            warm = Row("sync", 20, args.lease, 0)
            sync_row(backend, counts, admin, warm)
            runner.run(async_row(backend, counts, admin, Row("async", 20, args.lease, 0)))
            time.sleep(args.pause)
            for number, n in enumerate(args.counts):
                for mode in rotated(MODES, number):
                    row = Row(mode, n, args.lease, args.periods)
                    print(f"  {mode} {n:,} locks ... ", end="", flush=True)
                    before = counts.snapshot()
                    if mode == "sync":
                        sync_row(backend, counts, admin, row)
                    else:
                        runner.run(async_row(backend, counts, admin, row))
                    time.sleep(args.pause)  # the server's moment, and late events arrive
                    # Every hold reports its loss once, from the watchdog or from release.
                    row.lost_events = counts.snapshot()["lost"] - before["lost"]
                    row.load_after = f"{os.getloadavg()[0]:.2f}"
                    rows.append(row)
                    print(
                        f"{row.renewed:,}/{row.expected:,} renewals, "
                        f"{max(row.lost_events, row.lost_at_end):,} lost",
                        flush=True,
                    )
        finally:
            runner.run(backend.aclose())
            for made in async_clients:
                runner.run(made.aclose())
            backend.close()
            client.close()
            admin.close()
    return rows


def results_table(rows: list[Row]) -> str:
    lines = []
    for row in rows:
        lines.append(
            [
                row.mode,
                f"{row.locks:,}",
                fmt(row.lease, 1),
                f"{row.renewed:,}",
                f"{row.expected:,}",
                f"{row.renew_failed:,}",
                f"{row.lost_events:,}",
                f"{row.lost_at_end:,}",
                f"{row.release_errors:,}",
                fmt(row.client_us_per_renewal(), 1),
                fmt(row.server_us_per_renewal(), 1),
                f"{row.connections:,}",
                fmt(row.acquire_s, 2),
                row.load_after,
            ]
        )
    return table(
        [
            "mode",
            "locks",
            "lease s",
            "renewals done",
            "renewals expected",
            "renew failed",
            "lost (events)",
            "lost (lock.lost at end)",
            "release errors",
            "client CPU µs/renewal",
            "server CPU µs/renewal",
            "connections opened",
            "acquire phase s",
            "load after",
        ],
        lines,
    )


def verdicts(rows: list[Row]) -> list[str]:
    lines = []
    for mode in MODES:
        mine = sorted((r for r in rows if r.mode == mode), key=lambda r: r.locks)
        if not mine:
            continue
        small, large = mine[0], mine[-1]
        a, b = small.client_us_per_renewal(), large.client_us_per_renewal()
        if len(mine) < 2:
            cpu = "one count only: no trend"
        elif a is None or b is None:
            cpu = "not measurable (a row renewed nothing)"
        else:
            ratio = b / a
            word = "flat" if ratio <= FLAT else "NOT flat"
            cpu = (
                f"{word}: {fmt(b, 1)} µs at {large.locks:,} locks / {fmt(a, 1)} µs at "
                f"{small.locks:,} = {ratio:.2f}x (flat: <= {FLAT}x)"
            )
        lost = [(r.locks, max(r.lost_events, r.lost_at_end)) for r in mine]
        if any(n for _, n in lost):
            detail = ", ".join(f"{n:,} of {locks:,}" for locks, n in lost if n)
            kept = f"locks LOST: {detail}"
        else:
            kept = "no lock lost"
        done = ", ".join(f"{r.renewed / r.expected:.0%} at {r.locks:,}" for r in mine if r.expected)
        x, y = small.server_us_per_renewal(), large.server_us_per_renewal()
        server = f" (server: {y / x:.2f}x)" if len(mine) > 1 and x and y else ""
        lines.append(
            f"- {mode}: client CPU per renewal {cpu}{server}; {kept}; renewals done of "
            f"expected: {done}."
        )
    not_taken = [r for r in rows if r.not_taken]
    for r in not_taken:
        lines.append(f"- WARNING: {r.mode} {r.locks:,}: {r.not_taken:,} locks were not taken.")
    errors = collections.Counter[str]()
    for r in rows:
        errors.update(r.release_error_kinds)
    if errors:
        lines.append(
            "- release errors by exception: "
            + ", ".join(f"{k} {v:,}" for k, v in errors.most_common())
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--counts",
        type=lambda s: [int(x) for x in s.split(",") if x.strip()],
        default=[500, 1000, 2000, 5000],
        help="locks held at once, comma-separated (default 500,1000,2000,5000)",
    )
    parser.add_argument("--lease", type=float, default=3.0, help="lease in seconds (3)")
    parser.add_argument("--periods", type=int, default=3, help="leases the locks are held for (3)")
    parser.add_argument("--pause", type=float, default=2.0, help="seconds between rows (2)")
    parser.add_argument(
        "--pin",
        choices=PLACEMENTS,
        default="split",
        help="client and server on two CPUs (default), both on one, or unpinned",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="print what django_distlock logs (stderr)"
    )
    parser.add_argument(
        "--output", type=Path, help="append the Markdown to this file (default: print only)"
    )
    args = parser.parse_args(argv)
    logged = Logged()
    engine_logger = logging.getLogger("django_distlock")
    engine_logger.addHandler(logged)
    if args.verbose:
        engine_logger.addHandler(logging.StreamHandler())
    engine_logger.propagate = False
    faulthandler.dump_traceback_later(600 + 60 * len(args.counts) * args.periods, exit=False)
    started = time.monotonic()
    digest = engine_digest()
    with bench_server() as server:
        where = place(args.pin, server)
        load_start = load()
        print(f"{server.version()}; {where}; load average {load_start}", flush=True)
        rows = run(server, args)
        header = (
            f"### Watchdog renewals at scale (lease {args.lease:g} s, held "
            f"{args.periods} leases)\n\n"
            f"- {time.strftime('%Y-%m-%d %H:%M %Z')}; django-distlock {git_commit()} "
            f"(source digest {digest}); Python {platform.python_version()}; redis-py "
            f"{redis.__version__}; {server.version()}\n"
            f"- {cpu_model()}, {os.cpu_count()} CPUs; {where}; load average at the start "
            f"{load_start}"
        )
    elapsed = time.monotonic() - started
    notes = verdicts(rows)
    for level, count in logged.counts.most_common():
        notes.append(
            f"- django_distlock logged {count:,} {level} records (first: "
            f"{logged.first[level]!r}{'' if args.verbose else '; --verbose prints them'})."
        )
    if engine_digest() != digest:
        notes.append("- WARNING: django_distlock's source changed during the run. Run again.")
    text = (
        header
        + "\n\n"
        + results_table(rows)
        + "\n\nRenewals and losses from the backend's observer; `lost (events)` counts "
        "`lost` events up to and including release, `lost (lock.lost at end)` the locks "
        "whose `lock.lost` was true when the hold window ended. CPU and connections over "
        "the hold window only (after the acquire phase, before release): client CPU is "
        "this whole process's (every thread: the watchdog, the notifier thread and the "
        "observer included; nothing subtracted), server CPU from `INFO cpu`. `renewals "
        "expected` is the nominal N x periods x 3; the watchdog renews a third of a lease "
        "after the previous renewal was sent, rounded up to a grid of at most 50 ms, so a "
        "healthy row counts up to one renewal per lock fewer over 2-3 leases (83% of the "
        "nominal at 2 periods, 89% at 3).\n\n"
        + "\n".join(notes)
        + f"\n\nTotal run time: {elapsed:.0f} s; load average at the end: {load()}."
    )
    print()
    print(text)
    if args.output is not None:
        with args.output.open("a") as out:
            out.write(text + "\n\n")
        print(f"\nappended to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
