"""Helpers of the metrics tests: the locks they drive, reading a Prometheus registry, and an
OpenTelemetry SDK that keeps what it gets."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from django_distlock.engine import Backend, Lock
from django_distlock.telemetry import flush_metrics

TEMPLATE = "report:{day}"
NAME = "report:2026-11-23"


def report_lock(backend: Backend, **options: object) -> Lock:
    """A lock named ``NAME``, filled from ``TEMPLATE`` as a decorator's would be."""
    return Lock(TEMPLATE, backend=backend, **options).renamed(NAME)  # type: ignore[arg-type]


class Samples:
    """The values of a registry: ``samples("distlock_held", lock="x")`` (0 when absent),
    once the metrics thread caught up."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def __call__(self, name: str, **labels: str) -> float:
        assert flush_metrics()
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


class OtelSink:
    """An OpenTelemetry SDK that keeps what it gets: finished spans (``spans()``) and
    metric points (``points()``), for ``django_distlock.telemetry.otel.observer(...)`` or as the
    global providers. Both wait for the metrics thread first."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """The finished spans (named ``name``), once the metrics thread caught up."""
        assert flush_metrics()
        return [s for s in self.exporter.get_finished_spans() if name in (None, s.name)]

    def points(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        """The points of instrument ``name``, by their sorted attributes, once the
        metrics thread caught up."""
        assert flush_metrics()
        found: dict[tuple[tuple[str, Any], ...], Any] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            found[tuple(sorted(point.attributes.items()))] = point
        return found

    def value(self, name: str, **attributes: str) -> Any:
        """The sum (counters) or the count (histograms) of one point; 0 when absent."""
        key = tuple(sorted((f"distlock.{k}".replace("_", "."), v) for k, v in attributes.items()))
        point = self.points(name).get(key)
        if point is None:
            return 0
        return point.count if hasattr(point, "bucket_counts") else point.value

    def clear(self) -> None:
        self.exporter.clear()
