"""Prometheus metrics of locks, fed from lock events (``DISTLOCK["METRICS"] =
"prometheus"``; needs ``prometheus_client``: ``pip install prometheus-client``, the
``prometheus`` extra).

- ``distlock_acquire_wait_seconds`` (histogram; ``lock``, ``result``): the time an
  acquire took, waiting included;
- ``distlock_acquire_total`` (counter; ``lock``, ``result``): acquires;
- ``distlock_hold_seconds`` (histogram; ``lock``): from acquire to release or loss;
- ``distlock_lost_total`` (counter; ``lock``, ``reason``): holds lost;
- ``distlock_renew_total`` (counter; ``lock``, ``result``): the watchdog's renewals;
- ``distlock_held`` (gauge, multiprocess mode ``livesum``; ``lock``): locks held now.

``result`` of an acquire: ``acquired``, ``busy`` (held, and the caller did not wait),
``timeout`` (waited ``blocking_timeout`` in vain), ``error`` (raised). ``reason`` of a
loss: ``gone``, ``expired``, ``abandoned``, ``forced`` (:class:`~django_distlock.engine.LostCause`).
``result`` of a renewal: ``ok``, ``error``, ``lost``. ``lock``: see
:func:`~django_distlock.telemetry.readings.labeller`.

The lock's path only queues the event: the metrics thread of the process
(:mod:`django_distlock.telemetry.recorder`) updates them within a tenth of a second, a dict
lookup and an ``inc``/``observe`` each (in multiprocess mode, a write to a
memory-mapped file); :func:`~django_distlock.telemetry.flush_metrics` waits for it.
They work in
prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, gunicorn), where
``distlock_held`` sums the live processes only. Exposing them (a ``/metrics`` view,
django-prometheus) is yours: see docs/metrics.md.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from ..engine import Event, Observer
from .readings import HOLD_BUCKETS, WAIT_BUCKETS, Recorder, acquire_result, renew_result
from .recorder import deferred

__all__ = ["PrometheusMetrics", "observer"]


_COUNTERS = (
    ("distlock_acquire", "Lock acquires, by result: acquired, busy, timeout, error.", "result"),
    (
        "distlock_lost",
        "Locks lost by their holder, by reason: gone, expired, abandoned, forced.",
        "reason",
    ),
    ("distlock_renew", "Lease renewals by the watchdog, by result: ok, error, lost.", "result"),
)
"""The counters of :class:`PrometheusMetrics` (``acquires``, ``lost``, ``renewals``):
name, documentation, and the label beside ``lock``."""


class PrometheusMetrics:
    """The metrics, registered in ``registry`` (default: prometheus_client's ``REGISTRY``;
    ``None``: none), and :meth:`observer` to feed them. Make one per registry: registering
    the same names twice is an error (:func:`observer` shares one for the default
    registry).

    >>> metrics = PrometheusMetrics(CollectorRegistry())
    >>> backend = Backend(redis.Redis(), observer=metrics.observer())  # doctest: +SKIP
    """

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        histogram = functools.partial(Histogram, registry=registry)
        counter = functools.partial(Counter, registry=registry)
        self.acquire_wait = histogram(
            "distlock_acquire_wait_seconds",
            "Seconds an acquire took, waiting included, by result.",
            ["lock", "result"],
            buckets=WAIT_BUCKETS,
        )
        self.hold = histogram(
            "distlock_hold_seconds",
            "Seconds a lock was held, from acquire to release or loss.",
            ["lock"],
            buckets=HOLD_BUCKETS,
        )
        self.acquires, self.lost, self.renewals = (
            counter(name, documentation, ["lock", label])
            for name, documentation, label in _COUNTERS
        )
        self.held = Gauge(
            "distlock_held",
            "Locks held right now (live processes only in multiprocess mode).",
            ["lock"],
            multiprocess_mode="livesum",
            registry=registry,
        )

    def observer(self, label: str = "template") -> Observer:
        """An observer that updates these metrics from lock events, with the ``lock``
        label of mode ``label`` (``"template"``, ``"prefix"`` or ``"none"``), on the
        metrics thread (:func:`~django_distlock.telemetry.recorder.deferred`)."""
        return deferred(_Recorder(self, label))


class _Series:
    """The children of one ``lock`` label that every acquire and release updates."""

    __slots__ = ("acquired", "acquired_wait", "held", "hold")

    def __init__(self, metrics: PrometheusMetrics, lock: str) -> None:
        self.acquired = metrics.acquires.labels(lock, "acquired")
        self.acquired_wait = metrics.acquire_wait.labels(lock, "acquired")
        self.held = metrics.held.labels(lock)
        self.hold = metrics.hold.labels(lock)


class _Recorder(Recorder[bool]):
    """Turns events into metric updates; label children are looked up once each."""

    __slots__ = ("_children", "_metrics", "_series")

    def __init__(self, metrics: PrometheusMetrics, label: str) -> None:
        super().__init__(label)
        self._metrics = metrics
        self._series: dict[str, _Series] = {}
        self._children: dict[tuple[Any, ...], Any] = {}

    def _series_of(self, lock: str) -> _Series:
        series = self._series.get(lock)
        if series is None:
            series = self._series[lock] = _Series(self._metrics, lock)
        return series

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def acquired(self, event: Event, noted: object) -> None:
        series = self._series_of(self._label(event))
        series.acquired_wait.observe(event.waited or 0.0)
        series.acquired.inc()
        self._live.start(event, True)
        series.held.inc()

    def failed(self, event: Event, noted: object) -> None:
        metrics, lock, result = self._metrics, self._label(event), acquire_result(event)
        assert result is not None
        self._child(metrics.acquire_wait, lock, result).observe(event.waited or 0.0)
        self._child(metrics.acquires, lock, result).inc()

    def ended(self, event: Event, noted: object) -> None:
        lock = self._label(event)
        series = self._series_of(lock)
        if self._live.end(event):  # else taken before these metrics observed it
            series.held.dec()
        if event.kind == "release_failed":
            return  # the holder gave it up; how long it stays taken is up to its lease
        series.hold.observe(event.held or 0.0)
        if event.kind == "lost":
            self._child(self._metrics.lost, lock, event.cause or "gone").inc()

    def renewed(self, event: Event, noted: object) -> None:
        result = renew_result(event)
        assert result is not None
        self._child(self._metrics.renewals, self._label(event), result).inc()


_default: PrometheusMetrics | None = None
_default_lock = threading.Lock()


def observer(label: str = "template") -> Observer:
    """An observer that feeds the process's metrics in prometheus_client's default
    registry (created at the first call); what ``DISTLOCK["METRICS"] = "prometheus"``
    installs, with ``DISTLOCK["METRICS_LABEL"]`` as ``label``."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PrometheusMetrics()
    return _default.observer(label)
