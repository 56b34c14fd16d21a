"""What ``django_distlock.celery`` adds to a Celery task: the cost of one run of a locked
task against the same task unlocked, and of publishing with ``unique_while_queued``.

    .venv/bin/python bench/celery_tasks.py            # about 30 s
    .venv/bin/python bench/celery_tasks.py --quick    # a few seconds, noisier

One process, one private server (``bench/server.py``): locks in database 0, the broker
in database 1 (nothing consumes it; it is emptied after every round). A run is
``task.apply(args)``, what a worker's pool process does with a message it received
(Celery's tracer, the task's body, result handling in memory), so the difference between
two kinds is what the lock costs per run:

- ``plain``: ``@app.task``, the body does nothing;
- ``locked``: ``@app.task @locked_task("bench:{n}", on_busy="skip")`` (acquire and
  release: two round trips);
- ``unique``: the same with ``base=LockedTask`` and ``unique_while_queued=True`` (also
  marking the run started and done: two more);
- ``lock alone``: ``with distlock(name): pass``, no task, for reference: what is left of
  ``locked`` minus ``plain`` after it is the Celery layer's own work.

A publish is ``task.delay(n)``: ``plain`` against ``unique`` (which claims the name first:
one more round trip). Rounds alternate the kinds, the order rotating each round; the
median over rounds of the per-round means is reported, with p50 and p99 of all runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

from server import bench_server  # noqa: E402
from stats import median, percentile  # noqa: E402
from timing import place, rotated, timed  # noqa: E402

RUN_KINDS = ("plain", "locked", "unique", "lock alone")
PUBLISH_KINDS = ("plain", "unique")


def configure(redis_url: str) -> dict[str, Any]:
    """Django settings with the locks on ``redis_url``, and the three tasks."""
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_distlock"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}},
        DISTLOCK={"EVENTS": "off"},
        USE_TZ=True,
    )
    django.setup()
    from celery import Celery

    from django_distlock.celery import LockedTask, locked_task

    app = Celery("bench", broker=redis_url.rsplit("/", 1)[0] + "/1")
    app.conf.task_ignore_result = True

    @app.task(name="bench.plain")
    def plain(n: int) -> int:
        return n

    @app.task(name="bench.locked")
    @locked_task("bench:{n}", on_busy="skip")
    def locked(n: int) -> int:
        return n

    @app.task(name="bench.unique", base=LockedTask)
    @locked_task("bench:{n}", on_busy="skip", unique_while_queued=True)
    def unique(n: int) -> int:
        return n

    from django_distlock import distlock

    def lock_alone(n: int) -> None:
        with distlock(f"bench:{n}"):
            pass

    return {
        "app": app,
        "plain": plain,
        "locked": locked,
        "unique": unique,
        "lock alone": lock_alone,
    }


def _run_call(task: Any) -> Callable[[int], Any]:
    """One run of ``task`` (a Celery task: ``apply``; a plain function: a call)."""
    apply = getattr(task, "apply", None)
    if apply is None:
        return task
    return lambda n: apply((n,))


def timed_runs(call: Callable[[int], Any], count: int) -> tuple[list[int], float, float]:
    """``count`` calls: each one's ns, the mean in µs and this process's CPU µs per call
    (the watchdog thread's included)."""
    loop = timed(call, count)
    return loop.durations, loop.mean_ns / 1000, loop.cpu_ns / count / 1000


def _table(
    title: str,
    kinds: tuple[str, ...],
    durations: dict[str, list[int]],
    means: dict[str, list[float]],
    cpu: dict[str, list[float]],
) -> None:
    print(f"| {title} | mean µs | p50 µs | p99 µs | CPU µs | mean over plain | CPU over plain |")
    print("|---|---|---|---|---|---|---|")
    plain_mean, plain_cpu = median(means["plain"]), median(cpu["plain"])
    for kind in kinds:
        mean, used = median(means[kind]), median(cpu[kind])
        print(
            f"| {kind} | {mean:.0f} | {percentile(durations[kind], 50) / 1000:.0f} "
            f"| {percentile(durations[kind], 99) / 1000:.0f} | {used:.0f} "
            f"| {mean - plain_mean:+.0f} | {used - plain_cpu:+.0f} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="4 rounds x 300 runs")
    parser.add_argument(
        "--pin",
        choices=("split", "none"),
        default="split",
        help="benchmark on the first CPU, server on the second (split, default), or no pinning",
    )
    args = parser.parse_args()
    rounds, count = (4, 300) if args.quick else (args.rounds, args.runs)

    with bench_server() as server:
        if args.pin == "split" and len(os.sched_getaffinity(0)) >= 2:
            place("split", server)
        tasks = configure(server.url)
        broker = server.client()
        runs: dict[str, list[int]] = {kind: [] for kind in RUN_KINDS}
        run_means: dict[str, list[float]] = {kind: [] for kind in RUN_KINDS}
        run_cpu: dict[str, list[float]] = {kind: [] for kind in RUN_KINDS}
        publishes: dict[str, list[int]] = {kind: [] for kind in PUBLISH_KINDS}
        publish_means: dict[str, list[float]] = {kind: [] for kind in PUBLISH_KINDS}
        publish_cpu: dict[str, list[float]] = {kind: [] for kind in PUBLISH_KINDS}
        calls = {kind: _run_call(tasks[kind]) for kind in RUN_KINDS}
        for kind in RUN_KINDS:  # warm up: connections, scripts loaded
            timed_runs(calls[kind], 50)
        for r in range(rounds):
            for kind in rotated(RUN_KINDS, r):
                durations, mean, cpu = timed_runs(calls[kind], count)
                runs[kind].extend(durations)
                run_means[kind].append(mean)
                run_cpu[kind].append(cpu)
            for kind in rotated(PUBLISH_KINDS, r):
                task = tasks[kind]
                first = (r + 1) * 1_000_000  # names of their own: every publish claims one
                durations, mean, cpu = timed_runs(
                    lambda n, task=task, first=first: task.delay(first + n), count
                )
                publishes[kind].extend(durations)
                publish_means[kind].append(mean)
                publish_cpu[kind].append(cpu)
                broker.execute_command("SELECT", 1)
                broker.flushdb()
                broker.execute_command("SELECT", 0)
        broker.close()

    print(
        f"# Celery tasks: {rounds} rounds x {count}, locks and broker on one private "
        f"server, pin={args.pin}\n"
    )
    _table("one run (`task.apply()`)", RUN_KINDS, runs, run_means, run_cpu)
    print()
    _table("one publish (`task.delay()`)", PUBLISH_KINDS, publishes, publish_means, publish_cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
