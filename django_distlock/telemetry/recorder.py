"""The metrics thread: the lock's path only queues an event (:func:`deferred`), and one
thread per process records it for the metrics backends within :data:`INTERVAL` seconds
(:func:`flush_metrics` waits for it). Django-free, like the engine.
"""

from __future__ import annotations

import atexit
import collections
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

from ..engine import BackgroundWorker, Event, Observer, forget_after_fork

__all__ = ["CAPACITY", "INTERVAL", "deferred", "flush_metrics"]

logger = logging.getLogger("django_distlock")

INTERVAL = 0.1
"""Seconds at most between an event and the metrics it updates."""

CAPACITY = 10_000
"""Events waiting for the metrics thread at most; beyond, new ones are dropped (and the
drops logged), so that memory stays bounded if a backend falls behind."""

Record = Callable[[Event, Any], None]
"""What the metrics thread calls: ``record(event, noted)``."""


def deferred(record: Record, note: Callable[[], Any] = lambda: None) -> Observer:
    """An observer that only queues each event (with what ``note()`` returns then, in the
    thread of the event: OpenTelemetry's current context), for the process's metrics thread
    to call ``record(event, noted)`` within :data:`INTERVAL` seconds, in the order the
    events came. The lock's path pays for a queue append; a backend's own work (a few
    microseconds an update, more with cold caches) runs on that thread, which also
    means ``record`` never runs in two threads at once."""

    def observe(event: Event) -> None:
        _worker().put((record, event, note()))

    return observe


def flush_metrics(timeout: float = 5.0) -> bool:
    """Wait up to ``timeout`` seconds until the metrics thread has recorded every event
    queued so far; ``False`` if it has not. For tests, and before ``os._exit()`` (at a
    normal exit, and the end of a ``multiprocessing`` child, it is called for you)."""
    worker = _current
    return True if worker is None else worker.flush(timeout)


Queued = tuple[Record, Event, Any]


class _Drops:
    """Events the metrics thread could not take (its buffer was full), logged by it."""

    count = 0

    @classmethod
    def dropped(cls) -> None:
        cls.count += 1

    @classmethod
    def record_all(cls, queued: collections.deque[Queued]) -> None:
        while queued:
            record, event, noted = queued.popleft()
            try:
                record(event, noted)
            except Exception:  # the thread must outlive any backend's failure
                logger.exception("django-distlock: metrics failed on a %s event", event.kind)
        if cls.count:
            dropped, cls.count = cls.count, 0
            logger.warning(
                "django-distlock: %d lock event(s) not measured: the metrics fell behind",
                dropped,
            )


_current: BackgroundWorker[Queued] | None = None
_current_lock = threading.Lock()


def _worker() -> BackgroundWorker[Queued]:
    """The metrics thread of this process (a daemon), created on first use."""
    global _current
    worker = _current
    if worker is None:
        with _current_lock:
            if _current is None:
                _current = BackgroundWorker(
                    "distlock-metrics",
                    _Drops.record_all,
                    capacity=CAPACITY,
                    interval=INTERVAL,
                    on_drop=_Drops.dropped,
                )
                _flush_at_exit()
            worker = _current
    return worker


def _flush_at_exit() -> None:
    atexit.register(flush_metrics, 1.0)
    # A multiprocessing child ends with os._exit(), after its own exit finalizers but
    # without atexit handlers.
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None and multiprocessing.parent_process() is not None:
        from multiprocessing import util

        util.Finalize(None, flush_metrics, args=(1.0,), exitpriority=10)


def _forget_after_fork() -> None:
    # The parent's queued events are the parent's; a child starts a thread of its own.
    global _current, _current_lock
    _current = None
    _current_lock = threading.Lock()
    _Drops.count = 0


forget_after_fork(_forget_after_fork)
