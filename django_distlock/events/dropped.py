"""Lock events the recording dropped, counted and logged, rate-limited, from whichever
thread drops them: the async writer's thread (database errors), the code recording an
event (a full buffer: the writer thread may be the one stuck), the caller of a ``"sync"``
write.

Every loss is logged at WARNING on the ``django_distlock.events`` logger, with how many
and why, and never raised into the lock.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["REPORT_INTERVAL", "LostEventCounter", "logger"]

logger = logging.getLogger("django_distlock.events")
"""The logger the documentation names for lost events, whichever module loses them."""

REPORT_INTERVAL = 60.0
"""Repeated losses (dropped events, database errors) are logged at most this often."""


class LostEventCounter:
    """Counts lost events and logs them at WARNING, at most once per
    ``REPORT_INTERVAL`` seconds: the first loss at once, the ones in the following quiet
    interval summed up in the next report.

    ``capacity`` is the size of the buffer whose overflow :meth:`dropped` counts.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.dropped_total = 0
        """Events dropped because the buffer was full."""
        self.failed_total = 0
        """Events lost to database errors."""
        self._lock = threading.Lock()
        self._dropped = 0
        self._failed = 0
        self._last_error = ""
        self._quiet_until = 0.0

    def dropped(self) -> None:
        """Count one event dropped because the buffer was full (reported later)."""
        with self._lock:
            self._dropped += 1
            self.dropped_total += 1

    def failed(self, count: int, error: str) -> None:
        """Count ``count`` events lost to ``error`` (reported later, with the last error)."""
        with self._lock:
            self._failed += count
            self.failed_total += count
            self._last_error = error

    def report(self, *, force: bool = False) -> None:
        """Log the losses counted since the last report, unless one was logged less than
        ``REPORT_INTERVAL`` seconds ago (and not ``force``)."""
        now = time.monotonic()
        with self._lock:
            if not (self._dropped or self._failed) or (now < self._quiet_until and not force):
                return
            dropped, failed, error = self._dropped, self._failed, self._last_error
            self._dropped = self._failed = 0
            self._quiet_until = now + REPORT_INTERVAL
        if dropped:
            logger.warning(
                "django-distlock: the lock event buffer is full (%d events, the writer "
                "cannot keep up): dropped %d lock event(s)",
                self.capacity,
                dropped,
            )
        if failed:
            logger.warning(
                "django-distlock: could not record %d lock event(s), they are lost (%s)",
                failed,
                error,
            )
