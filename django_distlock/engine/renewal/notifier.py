"""Telling holders off the renewal path: one notifier thread per process runs the loss
reports (``on_lost``, the ``lost`` event, signals) and the watchdog's events, in order, so
that a slow callback or observer never delays a renewal or an event loop."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

from .. import process
from ..background import BackgroundWorker

__all__ = ["Notifier", "notifier"]

logger = logging.getLogger("django_distlock")

IDLE_WAIT = 60.0
"""Seconds the notifier's thread waits for a report before it looks again."""


class Notifier:
    """Runs loss reports of sync holders on a daemon thread of its own, in order, so
    that a slow ``on_lost`` or observer never delays a renewal."""

    def __init__(self) -> None:
        self._worker: BackgroundWorker[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            BackgroundWorker("distlock-notifier", _run_each, interval=IDLE_WAIT, batch=1)
        )

    def submit(self, function: Callable[..., Any], *args: Any) -> None:
        """Run ``function(*args)`` on the notifier thread."""
        self._worker.put((function, args))

    def wait_for_reports(self, timeout: float) -> bool:
        """Wait until every report submitted so far has run (they run in order); ``False``
        if they had not within ``timeout`` seconds."""
        done = threading.Event()
        self.submit(done.set)
        return done.wait(timeout)


def _run_each(reports: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    while reports:
        function, args = reports.popleft()
        try:
            function(*args)
        except Exception:  # the notifier thread must not die
            logger.exception("django-distlock: reporting a lost lock failed")


_notifiers = process.PerProcess(Notifier)


def notifier() -> Notifier:
    """The process's notifier, which tells holders of losses."""
    return _notifiers.get()


# A forked child has none of its parent's threads.
process.forget_after_fork(_notifiers.forget)
