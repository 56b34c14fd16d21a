"""What the metrics backends (:mod:`django_distlock.telemetry.prometheus` for Prometheus,
:mod:`django_distlock.telemetry.otel` for OpenTelemetry) share: the ``lock`` label of an event,
what the event counts as, which holds are still running, and the thread that feeds them
off the lock's path (:func:`deferred`, :func:`flush_metrics`).

Django-free, like the engine: both backends can observe a hand-built
:class:`~django_distlock.engine.Backend` too.

Labels carry a lock's name *template* (or a coarser group), never the name itself:
``invoice:{id}`` would otherwise make a time series per invoice.

>>> label = labeller("template")
>>> label(Event("acquired", "report:2026-11-23", 1, "", "h", 1, "t", template="report:{day}"))
'report:{day}'
>>> label(Event("acquired", "invoice:42", 1, "", "h", 1, "t"))
'invoice'
"""

from __future__ import annotations

import atexit
import collections
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..engine import BackgroundWorker, Event, Observer, forget_after_fork

__all__ = [
    "ACQUIRE_RESULTS",
    "CAPACITY",
    "HOLD_BUCKETS",
    "INTERVAL",
    "LABEL_MODES",
    "RENEW_RESULTS",
    "WAIT_BUCKETS",
    "LiveHolds",
    "acquire_result",
    "deferred",
    "flush_metrics",
    "labeller",
    "renew_result",
]

logger = logging.getLogger("django_distlock")

LABEL_MODES = ("template", "prefix", "none")
"""What ``DISTLOCK["METRICS_LABEL"]`` may say the ``lock`` label holds."""

ACQUIRE_RESULTS = ("acquired", "busy", "timeout", "error")
"""How an acquire ends: got the lock; busy and not waiting; waited ``blocking_timeout``
in vain; raised (Redis unreachable or refusing, too few replicas acknowledged)."""

RENEW_RESULTS = ("ok", "error", "lost")
"""How a watchdog renewal ends: the lease was renewed; Redis did not answer (retried
while the lease lasts); the lock was no longer ours."""

WAIT_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
)  # fmt: skip
"""Bucket bounds (seconds) of the acquire-time histograms: an uncontended acquire takes
well under a millisecond on a LAN, a contended one up to its ``blocking_timeout``."""

HOLD_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
)  # fmt: skip
"""Bucket bounds (seconds) of the hold-time histograms: a view holds its lock for
milliseconds, a nightly job for an hour."""

_ACQUIRE_OUTCOMES = {"acquired", "contended", "error", "not_replicated"}


def _template_label(event: Event) -> str:
    return event.template or event.name.partition(":")[0]


def _prefix_label(event: Event) -> str:
    return (event.template or event.name).partition(":")[0]


def _no_label(event: Event) -> str:
    return ""


_LABELLERS: dict[str, Callable[[Event], str]] = {
    "template": _template_label,
    "prefix": _prefix_label,
    "none": _no_label,
}


def labeller(mode: str) -> Callable[[Event], str]:
    """The ``lock`` label of an event for ``mode`` (one of :data:`LABEL_MODES`):

    - ``"template"``: the template the name was filled from (``"report:{day}"``, for
      the locks of a decorator or of ``lock_view``); for a name given as is, the name
      up to its first ``:`` (``"invoice:42"`` -> ``"invoice"``; the whole name when it
      has none), since nothing tells a constant from an f-string;
    - ``"prefix"``: the template (or name) up to its first ``:``;
    - ``"none"``: ``""`` for every lock (Prometheus treats an empty label as absent).
    """
    try:
        return _LABELLERS[mode]
    except KeyError:
        raise ValueError(f"unknown label mode {mode!r}; use one of {LABEL_MODES}") from None


def acquire_result(event: Event) -> str | None:
    """What ``event`` says about an acquire, one of :data:`ACQUIRE_RESULTS`; ``None``
    when it is not the end of one."""
    kind = event.kind
    if kind not in _ACQUIRE_OUTCOMES:
        return None
    if kind == "acquired":
        return "acquired"
    if kind == "contended":
        return "timeout" if event.cause == "timeout" else "busy"
    return "error"


def renew_result(event: Event) -> str | None:
    """What ``event`` says about a watchdog renewal, one of :data:`RENEW_RESULTS`;
    ``None`` when it is not one."""
    if event.kind == "renewed":
        return "ok"
    if event.kind == "renew_failed":
        return "lost" if event.cause == "gone" else "error"
    return None


T = TypeVar("T")


class LiveHolds(Generic[T]):
    """The holds of this process that have not ended yet, each with what a backend
    keeps for it (a span, a label).

    A hold starts with its ``acquired`` event and ends once, with the first of
    ``released``, ``lost`` or ``release_failed`` (a release Redis did not answer: the
    holder gave the lock up, and it expires at its lease end). Events of holds taken
    before the backend started observing end nothing. Kept by the metrics thread; read
    from others (:meth:`values`, for OpenTelemetry's collection).
    """

    __slots__ = ("_holds",)

    def __init__(self) -> None:
        self._holds: dict[tuple[str, int | None, str], T] = {}

    def start(self, event: Event, value: T) -> None:
        """Remember the hold ``event`` (an ``acquired`` one) starts, with ``value``."""
        self._holds[event.name, event.fence, event.thread] = value

    def end(self, event: Event) -> T | None:
        """Forget the hold ``event`` ends; return its value, ``None`` if it was not live."""
        return self._holds.pop((event.name, event.fence, event.thread), None)

    def values(self) -> list[T]:
        """What is kept for each live hold: a snapshot (one step under the GIL, safe
        while other threads start and end holds)."""
        return list(self._holds.values())

    def __len__(self) -> int:
        return len(self._holds)


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
