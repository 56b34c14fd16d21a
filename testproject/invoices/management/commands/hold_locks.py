"""``manage.py hold_locks``: worker processes that hold locks, for the admin's live page."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand


def _worker(number: int, seconds: float) -> None:
    """Hold ``report:<n>`` and ``cart:<n>`` (different leases, renewed) until ``seconds``
    have passed, dropping and retaking a cart lock now and then. A lock taken away (the
    demo invites a force release from the admin) is reported in one line as soon as the
    watchdog notices, and the worker goes on: it takes ``report:<n>`` again and moves on
    to the next cart."""
    import django

    # `terminate()` from the parent: leave through the `finally`s, releasing the locks.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    django.setup()
    from django_distlock import LockError, LockLost, distlock
    from django_distlock.signals import lock_lost

    worker = f"worker {number} (pid {os.getpid()})"
    context = f"hold_locks worker {number}"
    rng = random.Random(number)
    deadline = time.monotonic() + seconds

    def notice(sender: Any, event: Any, **kwargs: Any) -> None:
        """The notice the demo page promises, sent as soon as the watchdog (or a release)
        finds one of this process's locks gone."""
        print(f"{worker} lost {event.name}: {event.reason}; going on", flush=True)

    lock_lost.connect(notice, weak=False)
    report = distlock(f"report:{number}", timeout=30 + 10 * number, context=context)
    if not report.acquire():
        print(f"{worker}: report:{number} is busy", flush=True)
        return
    try:
        print(f"{worker} holds report:{number}", flush=True)
        while time.monotonic() < deadline:
            if report.lost and report.acquire(blocking=False):
                print(f"{worker} holds report:{number} again", flush=True)
            cart = f"cart:{number * 10 + rng.randint(0, 2)}"
            hold = min(rng.uniform(2, 6), max(deadline - time.monotonic(), 0))
            try:
                with distlock(
                    cart,
                    timeout=rng.choice([5, 10, 20]),
                    blocking_timeout=1,
                    context=context,
                ) as lock:
                    print(f"{worker} holds {cart} (fence {lock.fence}) for {hold:.1f}s", flush=True)
                    time.sleep(hold)
            except LockLost:
                pass  # noticed (and said) by `notice` already
            except LockError as exc:
                print(f"{worker}: {cart}: {exc}", flush=True)
                time.sleep(0.5)
    finally:
        if report.held:
            try:
                report.release()
            except LockLost:
                pass  # taken away at the last moment: `notice` said so
            else:
                print(f"{worker} released report:{number}", flush=True)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


class Command(BaseCommand):
    help = "Start worker processes that hold report:<n> and cart:<n> locks for a while."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--workers",
            type=int,
            default=3,
            help="number of worker processes; worker <n> holds report:<n> (default: %(default)s)",
        )
        parser.add_argument(
            "--seconds",
            type=float,
            default=60,
            help="how long the workers hold locks, in seconds (default: %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        workers, seconds = options["workers"], options["seconds"]
        self.stdout.write(
            f"{workers} workers holding locks for {seconds:g}s; watch "
            "/admin/django_distlock/heldlock/ (Ctrl-C stops them)"
        )
        # `kill` or a closed terminal stop the workers as Ctrl-C does, instead of
        # orphaning them.
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _interrupt)
        context = multiprocessing.get_context("spawn")
        processes = [
            context.Process(target=_worker, args=(n, seconds), daemon=True)
            for n in range(1, workers + 1)
        ]
        for process in processes:
            process.start()
        try:
            for process in processes:
                process.join()
        except KeyboardInterrupt:
            for process in processes:
                process.terminate()
                process.join()
        self.stdout.write("all workers done")
