"""``manage.py close_books``: a long ``LockedCommand``; a second run at once is refused."""

from __future__ import annotations

import time
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
        self.stdout.write(self.style.SUCCESS("books closed"))
