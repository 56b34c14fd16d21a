"""Enabling metrics from the settings: ``DISTLOCK["METRICS"]`` and ``["METRICS_LABEL"]``
validated like every key (E001), a backend whose library is missing (E006, and the first
lock says so too), the observer the settings' backend gets (django_distlock.telemetry,
through events.observer_for), and nothing imported while metrics are off."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from prometheus_client import REGISTRY

from django_distlock import distlock, lock_view
from django_distlock.settings import DEFAULTS, _build
from django_distlock.telemetry import BACKENDS, flush_metrics, metrics_observer, missing_library
from tests.support import REPO_ROOT
from tests.support.events import events_mode
from tests.support.metrics import OtelSink

# -- settings ------------------------------------------------------------------------------


def test_metrics_are_off_by_default():
    config = _build({})
    assert (DEFAULTS["METRICS"], DEFAULTS["METRICS_LABEL"]) == (None, "template")
    assert (config.metrics, config.metrics_label) == ((), "template")
    assert metrics_observer(config.metrics, config.metrics_label) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ()),
        ([], ()),
        ("prometheus", ("prometheus",)),
        ("otel", ("otel",)),
        (["prometheus", "otel"], ("prometheus", "otel")),
        (("otel", "otel"), ("otel",)),
    ],
)
def test_metrics_accepts_a_backend_or_a_list(value, expected):
    assert _build({"METRICS": value}).metrics == expected


@pytest.mark.parametrize("mode", ["template", "prefix", "none"])
def test_metrics_label_modes(mode):
    assert _build({"METRICS_LABEL": mode}).metrics_label == mode


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("METRICS", "statsd", "DISTLOCK['METRICS'] must be 'prometheus' or 'otel', a list"),
        ("METRICS", ["prometheus", 3], "a list of them, or None; not ['prometheus', 3]"),
        ("METRICS", {"prometheus"}, "must be 'prometheus' or 'otel'"),
        ("METRICS", [["otel"]], "must be 'prometheus' or 'otel'"),
        ("METRICS", True, "must be 'prometheus' or 'otel'"),
        ("METRICS_LABEL", "name", "DISTLOCK['METRICS_LABEL'] must be one of 'template'"),
        ("METRICS_LABEL", None, "must be one of 'template', 'prefix', 'none'"),
    ],
)
def test_bad_values_are_refused_and_reported_by_the_check(key, value, message):
    with pytest.raises(ImproperlyConfigured, match=message.replace("[", r"\[")):
        _build({key: value})
    with events_mode("off", **{key: value}):
        [error] = run_checks(tags=["distlock"])
    assert error.id == "django_distlock.E001"
    assert message in error.msg
    assert error.hint.startswith("Use ")


@pytest.mark.parametrize("metrics", ["prometheus", "otel", ["prometheus", "otel"]])
def test_an_installed_backend_passes_the_check(metrics):
    with events_mode("off", METRICS=metrics, METRICS_LABEL="prefix"):
        assert run_checks(tags=["distlock"]) == []


def test_every_backend_is_found_without_importing_it():
    assert sorted(BACKENDS) == ["otel", "prometheus"]
    assert not any(missing_library(name) for name in BACKENDS)


def python_without(library: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``library`` cannot be imported, with the
    suite's Django settings (and Redis)."""
    script = textwrap.dedent(
        f"""
        import sys

        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name == {library!r} or name.startswith({library!r} + "."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}")
                return None

        sys.meta_path.insert(0, Missing())
        import django
        django.setup()
        """
    ) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    ("backend", "library", "distribution"),
    [
        ("prometheus", "prometheus_client", "prometheus-client"),
        ("otel", "opentelemetry", "opentelemetry-api"),
    ],
)
def test_a_backend_whose_library_is_missing_is_a_check_error_and_so_is_the_first_lock(
    redis_server, backend, library, distribution
):
    result = python_without(
        library,
        f"""
        from django.core.checks import run_checks
        from django.core.exceptions import ImproperlyConfigured
        from django.test.utils import override_settings
        from django_distlock import distlock

        with override_settings(DISTLOCK={{"EVENTS": "off", "METRICS": {backend!r}}}):
            for message in run_checks(tags=["distlock"]):
                print(message.id, message.msg, "|", message.hint)
            try:
                distlock("first").acquire()
            except ImproperlyConfigured as exc:
                print("ImproperlyConfigured:", exc)
        """,
    )
    assert result.returncode == 0, result.stderr
    check, first_lock = result.stdout.splitlines()
    assert check.startswith(f"django_distlock.E006 DISTLOCK['METRICS'] enables {backend!r}, but ")
    assert f"pip install {distribution};" in check
    assert first_lock.startswith(f"ImproperlyConfigured: DISTLOCK['METRICS'] enables {backend!r}")
    assert f"pip install {distribution};" in first_lock


def test_with_metrics_off_neither_backend_is_imported(redis_server):
    """Nor prometheus_client. (opentelemetry may be: redis-py 8 imports it, when it is
    installed, for observability of its own.)"""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys
                import django
                django.setup()
                from django.core.checks import run_checks
                from django_distlock import distlock

                run_checks()
                with distlock("metrics-off"):
                    pass
                names = (
                    "prometheus_client",
                    "django_distlock.telemetry.prometheus",
                    "django_distlock.telemetry.otel",
                )
                print(sorted(set(names) & set(sys.modules)))
                """
            ),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- the settings' backend ------------------------------------------------------------------


def acquired(lock: str) -> float:
    assert flush_metrics()
    return (
        REGISTRY.get_sample_value("distlock_acquire_total", {"lock": lock, "result": "acquired"})
        or 0.0
    )


def test_prometheus_from_the_settings_labels_views_and_decorators_by_template(redis_client, rf):
    @lock_view("invoice:{invoice_id}")
    def pay(request, invoice_id):
        return HttpResponse("paid")

    @distlock("report:{day}")
    def build_report(day):
        pass

    with events_mode("off", METRICS="prometheus"):
        before = {
            lock: acquired(lock) for lock in ("invoice:{invoice_id}", "report:{day}", "adhoc")
        }
        assert pay(rf.post("/"), invoice_id=42).status_code == 200
        assert pay(rf.post("/"), invoice_id=43).status_code == 200
        build_report("2026-11-23")
        with distlock("adhoc:7"):
            pass
        after = {lock: acquired(lock) for lock in before}
    assert {lock: after[lock] - before[lock] for lock in before} == {
        "invoice:{invoice_id}": 2,
        "report:{day}": 1,
        "adhoc": 1,
    }
    assert acquired("invoice:42") == 0


def test_otel_from_the_settings_uses_the_global_providers(redis_client, global_otel):
    global_otel.clear()
    tracer = global_otel.tracer_provider.get_tracer("the-app")
    with (
        events_mode("off", METRICS=["prometheus", "otel"], METRICS_LABEL="prefix"),
        tracer.start_as_current_span("request"),
    ):
        before = acquired("invoice")
        with distlock("invoice:42"):
            pass
        assert acquired("invoice") == before + 1
    [span] = global_otel.spans("distlock.hold")
    assert span.attributes["distlock.lock"] == "invoice"
    assert span.attributes["distlock.name"] == "invoice:42"


@pytest.fixture(scope="module")
def global_otel() -> OtelSink:
    """An SDK installed as the process's global providers (which can be set only once
    per process: every test of this module that needs them shares it)."""
    from opentelemetry import metrics, trace

    sink = OtelSink()
    trace.set_tracer_provider(sink.tracer_provider)
    metrics.set_meter_provider(sink.meter_provider)
    return sink
