"""One handoff at a time: two processes pass one lock back and forth, interleaved in rounds.

    .venv/bin/python bench/handoff.py                 # about a minute
    .venv/bin/python bench/handoff.py --handoffs 300 --rounds 5

The contended scenario (``bench/run.py --only contended``) runs 8 or 64 processes on the
machine's cores, so a handoff there also measures who gets a CPU. Here exactly one
process waits, blocked in its ``acquire()``, when the other releases: the time from the
holder's ``release()`` call (and from its return) to the waiter's ``acquire()`` return
is the protocol's handoff (the release's round trip, the wake-up's way to the waiter,
and what the waiter does then), with one server and two client processes on two cores.
Both clocks are ``CLOCK_MONOTONIC``, which the processes share.

Each round runs every implementation once, in a rotated order; the handoffs of all
rounds are pooled. redis-py's ``Lock`` is left out: it sleeps 0.1 s between polls, so
its handoff is its sleep.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

import impls  # noqa: E402
from server import bench_server  # noqa: E402
from stats import median, percentile, table  # noqa: E402
from timing import rotated  # noqa: E402

KEYS = ("distlock", "distlock-norenew", "distlock-fair", "python-redis-lock")
GAP = 0.005
"""Seconds the holder keeps the lock after the other process said it goes to wait."""


def _worker(key: str, port: int, me: int, count: int, turn: Any, out: Any) -> None:
    """Take the lock ``count`` times; after each take, let the other process start its
    acquire (it blocks), then release, and wait until the other took the lock."""
    handle = impls.make(key, port, f"handoff-{key}", lease=10.0)
    times = []
    for number in range(count):
        handle.acquire()
        taken = time.monotonic()
        turn.value = me  # the other leaves its loop below and blocks in acquire()
        time.sleep(GAP)
        called = time.monotonic()
        handle.release()
        times.append((taken, called, time.monotonic()))
        while turn.value == me and number < count - 1:
            time.sleep(0.0002)
    out.put((me, times))


def handoffs(key: str, port: int, count: int) -> tuple[list[float], list[float]]:
    """Microseconds of each handoff between the two processes: from the release call and
    from its return to the other's acquire return (the first 10 are warm-up)."""
    context = multiprocessing.get_context("spawn")
    turn, out = context.Value("i", -1), context.Queue()
    workers = [
        context.Process(target=_worker, args=(key, port, me, count, turn, out)) for me in (0, 1)
    ]
    for worker in workers:
        worker.start()
    times = dict(out.get(timeout=600) for _ in workers)
    for worker in workers:
        worker.join(60)
    events = sorted(
        (taken, me, called, returned) for me in times for taken, called, returned in times[me]
    )
    from_call, from_return = [], []
    for held, then in itertools.pairwise(events):
        if held[1] != then[1]:
            from_call.append((then[0] - held[2]) * 1e6)
            from_return.append((then[0] - held[3]) * 1e6)
    return from_call[10:], from_return[10:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handoffs", type=int, default=200, help="per process and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pooled: dict[str, tuple[list[float], list[float]]] = {key: ([], []) for key in KEYS}
    with bench_server() as server:
        for number in range(args.rounds):
            for key in rotated(KEYS, number):
                from_call, from_return = handoffs(key, server.port, args.handoffs)
                pooled[key][0].extend(from_call)
                pooled[key][1].extend(from_return)
    rows = []
    for key in KEYS:
        from_call, from_return = pooled[key]
        rows.append(
            [
                impls.IMPLS[key].label,
                f"{median(from_call):.0f}",
                f"{percentile(from_call, 99):.0f}",
                f"{median(from_return):.0f}",
                f"{percentile(from_return, 99):.0f}",
                str(len(from_call)),
            ]
        )
    print(
        f"Handoff between two processes, one waiting ({args.rounds} interleaved rounds x "
        f"{2 * args.handoffs} acquisitions; µs):\n"
    )
    headers = ["implementation", "from release call p50", "p99", "from release return p50"]
    print(table([*headers, "p99", "handoffs"], rows))


if __name__ == "__main__":
    main()
