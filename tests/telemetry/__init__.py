"""Tests of django_distlock.telemetry: the engine's events the metrics read
(test_engine_events), what they read from them (test_readings), Prometheus
(test_prometheus, test_multiprocess), OpenTelemetry (test_otel), and the settings and
checks that enable them (test_telemetry)."""
