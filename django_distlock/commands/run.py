"""``manage.py distlock run NAME -- CMD ARGS...``: the lock of the options, the program
run under it (:class:`~django_distlock.commands.supervisor.LockedProgram`), and the exit
status, with a line on stderr for each reason the program did not run or was stopped."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError

from ..engine import Lock, LockBackendUnavailable, LockNotAcquired
from .durations import format_duration
from .holders import holder_description
from .locked import command_lock
from .supervisor import EXIT_BUSY, EXIT_UNAVAILABLE, LockedProgram

__all__ = ["program_lock", "run_program"]


def program_lock(
    name: str,
    program: list[str],
    *,
    wait: float,
    timeout: float | None,
    limit: int | None = None,
    shared: bool = False,
) -> Lock:
    """The lock ``run`` takes: renewed while the program runs, labelled with the
    program's name; ``CommandError`` for an invalid name or option."""
    try:
        return command_lock(
            name,
            wait=wait,
            timeout=timeout,
            context=f"distlock run {os.path.basename(program[0])}",
            limit=limit,
            shared=shared,
        )
    except (TypeError, ValueError) as exc:
        raise CommandError(f"invalid lock: {exc}") from None


def run_program(
    lock: Lock,
    program: list[str],
    *,
    wait: float,
    grace: float,
    report: Callable[[str], None],
) -> int:
    """The exit status of ``run``: the program's, or why it did not run (``report``
    receives a line for stderr)."""
    name = lock.name
    started = time.monotonic()
    try:
        return LockedProgram(lock, program, grace=grace, report=report).run()
    except LockBackendUnavailable as exc:
        report(f"cannot take lock {name!r}, Redis is unavailable: {exc}")
        return EXIT_UNAVAILABLE
    except ImproperlyConfigured as exc:
        report(f"cannot take lock {name!r}: {exc}")
        return EXIT_UNAVAILABLE
    except LockNotAcquired:
        # The program never started, so all the time since was spent waiting.
        waited = f" after waiting {format_duration(time.monotonic() - started)}" if wait > 0 else ""
        holder = holder_description(name)
        who = f"held by {holder}" if holder else "held by another process"
        report(
            f"lock {name!r} is {who}{waited}; not running {program[0]!r}"
            + ("" if wait > 0 else " (use --wait to wait)")
        )
        return EXIT_BUSY
