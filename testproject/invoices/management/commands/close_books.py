"""``manage.py close_books``: a long ``LockedCommand``; a second run at once is refused."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django_distlock import LockedCommand

from ...models import Invoice


class Command(LockedCommand):
    help = "Close the books (a slow demo job); run it twice at once to see the second refused."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--steps", type=int, default=20, help="number of steps (default: %(default)s)"
        )
        parser.add_argument(
            "--step-seconds",
            type=float,
            default=0.5,
            help="seconds per step (default: %(default)s)",
        )
        parser.add_argument(
            "--hold-while",
            metavar="FILE",
            help="after the steps, keep the lock for as long as FILE exists (tests remove "
            "it to let go: no race with another run's start-up time)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        steps = options["steps"]
        self.stdout.write(
            f"closing the books under lock {self.lock.name!r} (fence {self.lock.fence}); "
            f"{Invoice.objects.count()} invoices"
        )
        for step in range(1, steps + 1):
            if self.lock.lost:
                self.stderr.write("lock lost: stopping early")
                return
            time.sleep(options["step_seconds"])
            self.stdout.write(f"step {step}/{steps}", ending="\n")
            self.stdout.flush()
        if options["hold_while"]:
            flag = Path(options["hold_while"])
            while flag.exists() and not self.lock.lost:
                time.sleep(0.05)
        self.stdout.write(self.style.SUCCESS("books closed"))
