"""OpenTelemetry spans and metrics of locks, fed from lock events (``DISTLOCK["METRICS"] =
"otel"``; needs ``opentelemetry-api``: ``pip install opentelemetry-api`` (the ``otel``
extra), and an SDK configured by the application to export anything).

Spans (tracer ``django_distlock``), made whether or not a trace is current where the
lock is acquired, as OpenTelemetry's own instrumentations do: the application's sampler
decides (``ParentBased`` by default: under a request's or a task's span they are its
children, sampled with it; with no span current the acquire is the root of a trace of
its own, the hold its child).

- ``distlock.acquire``: one per acquire, from its start to its end (waiting included),
  with ``distlock.lock`` (the label), ``distlock.name``, ``distlock.result``
  (``acquired``, ``busy``, ``timeout``, ``error``: status ERROR) and ``distlock.fence``;
- ``distlock.hold``: from the acquire to the release or loss, with ``distlock.lock``,
  ``distlock.name``, ``distlock.fence`` and ``distlock.result`` (``released``; ``lost``
  with ``distlock.lost.reason``, or ``release_failed``: status ERROR).

Instruments (meter ``django_distlock``), the Prometheus metrics' twins (see
:mod:`django_distlock.telemetry.prometheus`):

- ``distlock.acquire.duration`` (histogram, ``s``; ``distlock.lock``,
  ``distlock.result``): its count per result is also the count of acquires, so there is
  no separate counter (one measurement less on every acquire);
- ``distlock.hold.duration`` (histogram, ``s``; ``distlock.lock``);
- ``distlock.losses`` (counter; ``distlock.lock``, ``distlock.lost.reason``);
- ``distlock.renewals`` (counter; ``distlock.lock``, ``distlock.result``);
- ``distlock.held`` (observable up-down counter; ``distlock.lock``): locks held now,
  counted when the metrics are collected, not on the lock's path.

The SDK's work (several microseconds a measurement, a span more) runs off the lock's
path, on the metrics thread (:func:`django_distlock.telemetry.recorder.deferred`): the lock
only notes the event and the context current where it happened. Spans get the times the
events carry, so nothing is kept open while a lock is waited for; a held lock keeps one
open span.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry import context, metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode

from ..engine import Event, Observer
from .readings import HOLD_BUCKETS, WAIT_BUCKETS, Recorder, acquire_result, renew_result
from .recorder import deferred

__all__ = ["SCOPE", "observer"]

SCOPE = "django_distlock"
"""The name of the tracer and of the meter."""

_NS = 1_000_000_000


def observer(
    label: str = "template",
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> Observer:
    """An observer that makes spans and records metrics from lock events, with the
    ``distlock.lock`` attribute of mode ``label`` (``"template"``, ``"prefix"`` or
    ``"none"``). The providers default to the global ones (set by the application
    before or after this call: the API's proxies follow).

    >>> backend = Backend(redis.Redis(), observer=observer())  # doctest: +SKIP
    """
    tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
    meter = metrics.get_meter(SCOPE, meter_provider=meter_provider)
    # The context current where an event happens: asked then, since by the time the
    # metrics thread runs, its span may have ended.
    return deferred(_Recorder(label, tracer, meter), context.get_current)


def _histogram(meter: metrics.Meter, name: str, description: str, bounds: Sequence[float]) -> Any:
    try:
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=bounds
        )
    except TypeError:  # opentelemetry-api before 1.30 takes no advice: configure a View
        return meter.create_histogram(name, unit="s", description=description)


class _Recorder(Recorder[tuple[str, Span | None]]):
    """Turns events into spans and instrument updates; ``noted`` is the context current
    where an event happened, the parent of its spans (if any)."""

    __slots__ = (
        "_acquire_duration",
        "_attributes",
        "_hold_duration",
        "_labels",
        "_losses",
        "_renewals",
        "_tracer",
    )

    def __init__(self, label: str, tracer: trace.Tracer, meter: metrics.Meter) -> None:
        super().__init__(label)
        self._tracer = tracer
        self._labels: set[str] = set()
        self._attributes: dict[tuple[str, ...], dict[str, str]] = {}
        self._acquire_duration = _histogram(
            meter,
            "distlock.acquire.duration",
            "Time an acquire took, waiting included, by result (its count: the acquires).",
            WAIT_BUCKETS,
        )
        self._hold_duration = _histogram(
            meter,
            "distlock.hold.duration",
            "Time a lock was held, from acquire to release or loss.",
            HOLD_BUCKETS,
        )
        self._losses = meter.create_counter(
            "distlock.losses", unit="{loss}", description="Locks lost by their holder, by reason."
        )
        self._renewals = meter.create_counter(
            "distlock.renewals",
            unit="{renewal}",
            description="Lease renewals by the watchdog, by result.",
        )
        meter.create_observable_up_down_counter(
            "distlock.held",
            callbacks=[self._held],
            unit="{lock}",
            description="Locks held right now.",
        )

    def _attrs(self, lock: str, *pairs: str) -> dict[str, str]:
        """The (shared, never mutated) attributes ``distlock.lock=lock`` plus ``pairs``."""
        key = (lock, *pairs)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = {"distlock.lock": lock}
            attributes.update(zip(pairs[::2], pairs[1::2], strict=True))
            self._attributes[key] = attributes
        return attributes

    def acquired(self, event: Event, noted: Context) -> None:
        """Any end of an acquire: its span, and its duration by result."""
        lock, result = self._label(event), acquire_result(event)
        assert result is not None
        waited = event.waited or 0.0
        self._acquire_duration.record(waited, self._attrs(lock, "distlock.result", result))
        hold = self._spans(event, noted, lock, result, waited)
        if result == "acquired":
            self._labels.add(lock)
            self._live.start(event, (lock, hold))

    failed = acquired  # its result, on the span and the duration, says how it failed

    def _spans(
        self, event: Event, noted: Context, lock: str, result: str, waited: float
    ) -> Span | None:
        """The ``distlock.acquire`` span (ended), and an acquired lock's ``distlock.hold``
        span (open), children of the span current in ``noted``. With none, the acquire
        starts a trace and the hold is its child: one trace per lock, which the sampler
        keeps or drops whole. (Spans the sampler drops are non-recording: nothing to
        skip here.)"""
        end = int(event.at * _NS)
        attributes: dict[str, Any] = {
            "distlock.lock": lock,
            "distlock.name": event.name,
            "distlock.result": result,
        }
        if event.fence is not None:
            attributes["distlock.fence"] = event.fence
        span = self._tracer.start_span(
            "distlock.acquire",
            context=noted,
            start_time=end - int(waited * _NS),
            attributes=attributes,
        )
        if result == "error":
            span.set_status(Status(StatusCode.ERROR, event.reason))
        span.end(end_time=end)
        if result != "acquired":
            return None
        del attributes["distlock.result"]
        if not trace.get_current_span(noted).get_span_context().is_valid:
            noted = trace.set_span_in_context(span, noted)
        return self._tracer.start_span(
            "distlock.hold", context=noted, start_time=end, attributes=attributes
        )

    def ended(self, event: Event, noted: Context) -> None:
        kind = event.kind
        live = self._live.end(event)
        if live is not None and live[1] is not None:
            span = live[1]
            span.set_attribute("distlock.result", kind)
            if kind == "lost":
                span.set_attribute("distlock.lost.reason", event.cause)
            if kind != "released":
                span.set_status(Status(StatusCode.ERROR, event.reason))
            span.end(end_time=int(event.at * _NS))
        if kind == "release_failed":
            return
        lock = self._label(event)
        self._hold_duration.record(event.held or 0.0, self._attrs(lock))
        if kind == "lost":
            self._losses.add(1, self._attrs(lock, "distlock.lost.reason", event.cause or "gone"))

    def renewed(self, event: Event, noted: Context) -> None:
        result = renew_result(event)
        assert result is not None
        self._renewals.add(1, self._attrs(self._label(event), "distlock.result", result))

    def _held(self, options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
        counts = collections.Counter(lock for lock, _ in self._live.values())
        for lock in list(self._labels):
            yield metrics.Observation(counts[lock], self._attrs(lock))
