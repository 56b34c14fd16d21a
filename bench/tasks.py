"""What ``django_distlock.tasks`` adds to a task of Django's tasks framework: the cost of
one run of a locked task against the same task unlocked.

    .venv/bin/python bench/tasks.py            # about a minute
    .venv/bin/python bench/tasks.py --quick    # about 20 s, noisier

One private server (``bench/server.py``) holds the locks; the tasks are those of
``tests/support/locked_tasks.py`` (``unlocked``: returns its argument; ``locked``: the same
under ``@locked_task("bench:{key}", on_busy="wait")``), with ``tests.settings``.

1. In process, ``ImmediateBackend``: ``task.enqueue(n)`` runs the task at once (the
   framework's result and signals included); ``lock alone`` is ``with distlock(name):``,
   no task, for reference. Rounds alternate the kinds, the order rotating each round;
   the median over rounds of the per-round means is reported, with p50 and p99.
2. One real worker: ``manage.py db_worker --batch`` (django-tasks-db, SQLite file on
   tmpfs)
   runs a batch of queued tasks of one kind and exits; each run's time is its
   ``finished_at - started_at`` as the worker stored it (the call, the lock, writing
   the result), and a batch's per-task time is its last ``finished_at`` minus its first
   ``started_at``, divided by the batch size (claiming rows included). Batches alternate
   the kinds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

from server import bench_server  # noqa: E402
from stats import median, percentile  # noqa: E402
from timing import rotated, timed  # noqa: E402

IMMEDIATE_KINDS = ("plain", "locked", "lock alone")
WORKER_KINDS = ("plain", "locked")


def configure(redis_url: str, database: str) -> None:
    """Django set up with ``tests.settings``: locks on ``redis_url``, the ``tasks``
    database in the file ``database`` (migrated), no events."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["DISTLOCK_TEST_REDIS_URL"] = redis_url
    os.environ["DISTLOCK_TEST_TASKS_DB"] = database
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="tasks", verbosity=0)


def immediate(rounds: int, count: int) -> None:
    from django_distlock.locks import distlock
    from tests.support import locked_tasks

    calls = {
        "plain": locked_tasks.unlocked.using(backend="default").enqueue,
        "locked": locked_tasks.locked.using(backend="default").enqueue,
        "lock alone": lambda n: distlock(f"bench:{n}").__enter__().__exit__(None, None, None),
    }

    def run(kind: str):
        call = calls[kind]
        return lambda n: call(str(n))

    for kind in IMMEDIATE_KINDS:
        timed(run(kind), 50)
    durations: dict[str, list[int]] = {kind: [] for kind in IMMEDIATE_KINDS}
    means: dict[str, list[float]] = {kind: [] for kind in IMMEDIATE_KINDS}
    cpu: dict[str, list[float]] = {kind: [] for kind in IMMEDIATE_KINDS}
    for r in range(rounds):
        for kind in rotated(IMMEDIATE_KINDS, r):
            loop = timed(run(kind), count)
            durations[kind].extend(loop.durations)
            means[kind].append(loop.mean_ns / 1000)
            cpu[kind].append(loop.cpu_ns / count / 1000)
    print(f"## 1. ImmediateBackend, in process: {rounds} rounds x {count} runs\n")
    print("| kind | mean µs | p50 µs | p99 µs | CPU µs | p50 over plain | CPU over plain |")
    print("|---|---|---|---|---|---|---|")
    plain_p50, plain_cpu = percentile(durations["plain"], 50) / 1000, median(cpu["plain"])
    for kind in IMMEDIATE_KINDS:
        p50, used = percentile(durations[kind], 50) / 1000, median(cpu[kind])
        print(
            f"| {kind} | {median(means[kind]):.0f} | {p50:.0f} "
            f"| {percentile(durations[kind], 99) / 1000:.0f} | {used:.0f} "
            f"| {p50 - plain_p50:+.0f} | {used - plain_cpu:+.0f} |"
        )


def worker(rounds: int, count: int) -> None:
    from django.db import connections

    from tests.support import locked_tasks

    tasks = {"plain": locked_tasks.unlocked, "locked": locked_tasks.locked}
    runs: dict[str, list[float]] = {kind: [] for kind in WORKER_KINDS}
    per_task: dict[str, list[float]] = {kind: [] for kind in WORKER_KINDS}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for r in range(rounds):
        for kind in rotated(WORKER_KINDS, r):
            results = [tasks[kind].enqueue(f"{r}-{n}") for n in range(count)]
            connections.close_all()
            subprocess.run(
                [sys.executable, "-m", "django", "db_worker", "--backend=db", "--batch",
                 "--interval=0", "--no-startup-delay", "--no-reload", "--verbosity=0"],
                cwd=ROOT, env=env, check=True,
            )  # fmt: skip
            for result in results:
                result.refresh()
                assert result.status == "SUCCESSFUL", result.status
            runs[kind].extend(
                (result.finished_at - result.started_at).total_seconds() * 1e6 for result in results
            )
            span = max(result.finished_at for result in results) - min(
                result.started_at for result in results
            )
            per_task[kind].append(span.total_seconds() * 1e6 / count)
    print(f"\n## 2. One db_worker (SQLite): {rounds} batches x {count} tasks per kind\n")
    print("| kind | run mean µs | run p50 µs | run p99 µs | per task in a batch µs "
          "| run over plain | per task over plain |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    plain_run, plain_task = median(runs["plain"]), median(per_task["plain"])
    for kind in WORKER_KINDS:
        mean = sum(runs[kind]) / len(runs[kind])
        p50 = median(runs[kind])
        p99 = sorted(runs[kind])[int(len(runs[kind]) * 0.99) - 1]
        task = median(per_task[kind])
        print(
            f"| {kind} | {mean:.0f} | {p50:.0f} | {p99:.0f} | {task:.0f} "
            f"| {p50 - plain_run:+.0f} | {task - plain_task:+.0f} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller batches")
    args = parser.parse_args()
    # On tmpfs where there is one: SQLite's fsyncs on a shared disk would drown the lock.
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with bench_server() as server, tempfile.TemporaryDirectory(dir=where) as directory:
        configure(server.url, str(Path(directory) / "tasks.sqlite3"))
        print("# Django tasks: a locked task's run against an unlocked one\n")
        if args.quick:
            immediate(4, 300)
            worker(2, 100)
        else:
            immediate(10, 1000)
            worker(6, 300)
    return 0


if __name__ == "__main__":
    sys.exit(main())
