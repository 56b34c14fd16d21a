"""The metrics tests drive locks on the engine tests' backends (sync and async ``api``),
observed by Prometheus metrics in a registry of the test's own."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from django_distlock.engine import Backend
from django_distlock.telemetry.prometheus import PrometheusMetrics
from tests.engine.conftest import (  # noqa: F401 - fixtures shared with the engine tests
    api,
    backend,
    dead_backend,
    make_backend,
    recorder,
)
from tests.support.metrics import Samples


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def samples(registry: CollectorRegistry) -> Samples:
    """The values of the test's registry, by name and labels."""
    return Samples(registry)


@pytest.fixture
def prometheus(registry: CollectorRegistry) -> PrometheusMetrics:
    return PrometheusMetrics(registry)


@pytest.fixture
def observed(
    make_backend: Callable[..., Backend],  # noqa: F811 - the engine tests' fixture
    redis_client,
    prometheus: PrometheusMetrics,
) -> Callable[..., Backend]:
    """``observed(server=None, label="template", **options)``: a backend (on the shared
    server, flushed, by default) whose events feed ``prometheus``."""

    def make(server=None, label: str = "template", **options) -> Backend:
        return make_backend(server, observer=prometheus.observer(label), **options)

    return make
