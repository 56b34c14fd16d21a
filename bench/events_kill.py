"""What ``SIGKILL`` (or the OOM killer) costs the ``"async"`` event writer: the events
still in the buffer, never written.

    .venv/bin/python bench/events_kill.py              # 8 trials, about 40 s
    .venv/bin/python bench/events_kill.py --trials 3   # quicker

Each trial starts a child process (Django configured as in ``bench/events.py``: an SQLite
file database, ``DISTLOCK["EVENTS"] = "async"``, one private server) that runs
``with distlock(name): pass`` in a loop and counts the cycles it finished in shared
memory. After a random 2-4 s the parent kills it with ``SIGKILL`` and counts the cycles
whose ``released`` event reached the database. Lost: the cycles the child finished minus
those recorded, and the time between the last recorded event and the kill.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

from events import configure_django  # noqa: E402
from server import bench_server  # noqa: E402
from stats import median  # noqa: E402

NAME = "bench:events:kill"


def child(redis_url: str, database: dict[str, object], cycles: object, ready: object) -> None:
    """Lock and unlock until killed, counting finished cycles in ``cycles``."""
    configure_django(redis_url, database)
    from django.test.utils import override_settings

    from django_distlock import distlock
    from django_distlock.events import flush_events

    with override_settings(DISTLOCK={"EVENTS": "async"}):
        with distlock(NAME):  # warm up: connections, scripts, the writer thread
            pass
        flush_events(timeout=30)
        ready.set()  # type: ignore[attr-defined]
        while True:
            with distlock(NAME):
                pass
            cycles.value += 1  # type: ignore[attr-defined]


def trial(redis_url: str, tmp: str, number: int, run_for: float) -> tuple[int, int, float]:
    """One killed child: (cycles finished, cycles recorded, seconds of events lost)."""
    database = {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{tmp}/db{number}"}
    context = multiprocessing.get_context("spawn")
    cycles, ready = context.Value("q", 0, lock=False), context.Event()
    process = context.Process(target=child, args=(redis_url, database, cycles, ready))
    process.start()
    if not ready.wait(60):
        process.kill()
        raise RuntimeError("the child did not start")
    time.sleep(run_for)
    os.kill(process.pid, signal.SIGKILL)
    killed_at = datetime.now(UTC)
    process.join()
    finished = cycles.value + 1  # the warm-up cycle
    import sqlite3

    # sqlite3's own context manager commits but does not close.
    with contextlib.closing(sqlite3.connect(database["NAME"])) as db:  # type: ignore[arg-type]
        recorded, last = db.execute(
            "SELECT COUNT(*), MAX(at) FROM django_distlock_lockevent WHERE kind = 'released'"
        ).fetchone()
    last_at = datetime.fromisoformat(last).replace(tzinfo=UTC)
    return finished, recorded, (killed_at - last_at).total_seconds()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    with bench_server() as server, tempfile.TemporaryDirectory(prefix="distlock-bench-") as tmp:
        # The parent migrates each database once, through the child's own settings.
        for number in range(args.trials):
            database = {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{tmp}/db{number}"}
            _migrate(server.url, database)
        for number in range(args.trials):
            rows.append(trial(server.url, tmp, number, rng.uniform(2.0, 4.0)))
    print(f"# SIGKILL of a process recording events (EVENTS=async), {args.trials} trials\n")
    print("| cycles finished | cycles recorded | cycles lost | events lost over (s) |")
    print("|---|---|---|---|")
    for finished, recorded, window in rows:
        print(f"| {finished:,} | {recorded:,} | {finished - recorded:,} | {window:.2f} |")
    lost = [finished - recorded for finished, recorded, _ in rows]
    windows = [window for _, _, window in rows]
    print()
    print(f"cycles lost: median {median(lost):.0f}, min {min(lost)}, max {max(lost)}")
    print(
        f"events lost over the last: median {median(windows):.2f} s, "
        f"min {min(windows):.2f} s, max {max(windows):.2f} s"
    )
    return 0


def _migrate(redis_url: str, database: dict[str, object]) -> None:
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=configure_django, args=(redis_url, database))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError("migrating the trial's database failed")


if __name__ == "__main__":
    sys.exit(main())
