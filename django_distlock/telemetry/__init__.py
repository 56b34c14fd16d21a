"""Metrics of locks, fed from lock events: the backends ``DISTLOCK["METRICS"]`` enables,
loaded only then: ``"prometheus"`` (:mod:`.prometheus`) and ``"otel"`` (:mod:`.otel`).
With ``METRICS`` off, neither they nor their libraries are imported. What both read from
an event is in :mod:`.readings`, the thread that feeds them off the lock's path in
:mod:`.recorder` (:func:`flush_metrics` waits for it).

:func:`metrics_observer` is what :func:`django_distlock.events.observer_for` adds to the
rows and signals; :func:`missing_library` is what the system check ``E006`` asks.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from django.core.exceptions import ImproperlyConfigured

from ..engine import Event, Observer
from .recorder import flush_metrics

__all__ = ["BACKENDS", "MetricsBackend", "flush_metrics", "metrics_observer", "missing_library"]


@dataclass(frozen=True)
class MetricsBackend:
    """A metrics backend: the module of ours that feeds it, the library that module needs
    (its import name, and the distribution pip installs it from), and the extra that
    installs it."""

    name: str
    module: str
    library: str
    extra: str
    distribution: str

    @property
    def problem(self) -> str:
        """What ``manage.py check`` says when the library is missing."""
        return f"DISTLOCK['METRICS'] enables {self.name!r}, but {self.library} is not installed"

    @property
    def hint(self) -> str:
        """How to fix :attr:`problem`."""
        return (
            f"Install {self.distribution} (pip install {self.distribution}; it is what "
            f"the {self.extra!r} extra brings), or remove {self.name!r} from "
            "DISTLOCK['METRICS']."
        )


BACKENDS: dict[str, MetricsBackend] = {
    "prometheus": MetricsBackend(
        "prometheus",
        "django_distlock.telemetry.prometheus",
        "prometheus_client",
        "prometheus",
        "prometheus-client",
    ),
    "otel": MetricsBackend(
        "otel",
        "django_distlock.telemetry.otel",
        "opentelemetry.metrics",
        "otel",
        "opentelemetry-api",
    ),
}
"""Every value of ``DISTLOCK["METRICS"]``, and what it needs."""


def missing_library(name: str) -> bool:
    """True when backend ``name`` cannot run: its library is not installed (found
    without importing it)."""
    try:
        return importlib.util.find_spec(BACKENDS[name].library) is None
    except ImportError:  # a parent package is missing
        return True


def metrics_observer(metrics: Sequence[str], label: str) -> Observer | None:
    """One observer feeding every backend named in ``metrics`` (``DISTLOCK["METRICS"]``),
    with ``label`` labels (``DISTLOCK["METRICS_LABEL"]``); ``None`` when none is named.
    ``ImproperlyConfigured`` when a backend's library is missing."""
    observers = [_load(name).observer(label) for name in metrics]
    if not observers:
        return None
    if len(observers) == 1:
        return observers[0]
    return _fan_out(observers)


def _load(name: str) -> ModuleType:
    backend = BACKENDS[name]
    try:
        return importlib.import_module(backend.module)
    except ImportError as exc:
        raise ImproperlyConfigured(f"{backend.problem} ({exc}). {backend.hint}") from exc


def _fan_out(observers: Sequence[Observer]) -> Observer:
    def observe(event: Event) -> None:
        for observe_one in observers:
            observe_one(event)

    return observe
