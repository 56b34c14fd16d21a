"""Asking the watchdog to check a lock's holds now rather than at their next renewal: a
test that takes a lock away wants its holder told at once."""

from __future__ import annotations

from typing import Any

from . import process
from .hold import Hold
from .notifier import notifier
from .renewal import settled
from .watchdog import renew_now, watched_holds

__all__ = ["check_holds_now"]


def check_holds_now(name: str, *, prefix: str | None = None, timeout: float = 5.0) -> int:
    """Renew at once, from this thread, every auto-renewed hold this process has of lock
    ``name`` (under key ``prefix``, or any), instead of at its next renewal; return once
    the holders found to have lost it were told (``lock.lost``, ``on_lost``, the ``lost``
    event; an async ``on_lost`` is started on its hold's loop), or ``timeout`` seconds
    passed. Returns how many holds were checked.

    A hold renewed here keeps its own renewal schedule. Holds without ``auto_renew`` are
    not watched, so not checked: their holders find out when they next use the lock.

    >>> check_holds_now("invoice:42", prefix="distlock:")  # doctest: +SKIP
    1
    """
    generation = process.generation()
    by_backend: dict[Any, dict[Hold, None]] = {}
    for hold in watched_holds():
        if hold.name != name or (prefix is not None and hold.backend.prefix != prefix):
            continue
        if not settled(hold) and not hold.giving_back and hold.generation == generation:
            by_backend.setdefault(hold.backend, {})[hold] = None
    for holds in by_backend.values():
        # A hold kept is renewed again when its own renewal comes: nothing to schedule.
        renew_now(list(holds), notifier().submit, lambda hold, due: None, timeout)
    notifier().wait_for_reports(timeout)
    return sum(len(holds) for holds in by_backend.values())
