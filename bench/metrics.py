"""What metrics cost: uncontended acquire+release through ``distlock()`` with
``DISTLOCK["METRICS"]`` off, ``"prometheus"``, ``"otel"`` and both.

    .venv/bin/python bench/metrics.py                   # about a minute
    .venv/bin/python bench/metrics.py --quick           # a few seconds, noisier
    .venv/bin/python bench/metrics.py --multiprocess    # prometheus_client in multiprocess
                                                        # mode (PROMETHEUS_MULTIPROC_DIR)

One process, one private server (``bench/server.py``), Django configured here with
``EVENTS="off"`` (so only the metrics differ). OpenTelemetry runs with the SDK installed
as the global providers, as an application that exports would have it: spans go through
a ``BatchSpanProcessor`` to an exporter that drops them, metrics to a reader that is
never collected (recording is the cost on the lock's path; exporting runs elsewhere).
Two measurements, each against the 5% target:

- End to end: rounds alternate the four modes (the order rotating each round); a round is
  ``cycles`` x ``with lock: pass`` of a lock made from a template
  (``distlock("bench:{mode}").renamed(...)``), labelled by it. The ratio mode/off is
  taken per round (of the mean and the p50 cycle time, and of the process CPU per cycle)
  and the median over rounds is reported.
- What metrics add: the time spent in the backend's observer (timed around each call, in
  the same rounds) minus that with metrics off, which is all they add to the lock's
  path, and the CPU time of the metrics thread (which records the queued events off the
  path; each round ends with ``flush_metrics()``), each per cycle and as a share of the
  p50 cycle with metrics off. Both are measured in ways other processes on the machine
  disturb far less than the end-to-end times.

The load average is printed: on a shared machine the end-to-end ratios are noise.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

from server import bench_server  # noqa: E402
from stats import median, percentile  # noqa: E402
from timing import PLACEMENTS, place, rotated  # noqa: E402

MODES = ("off", "prometheus", "otel", "both")
SETTINGS = {"off": None, "prometheus": "prometheus", "otel": "otel", "both": ["prometheus", "otel"]}
TARGET = 0.05


def configure_django(redis_url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_distlock"],
        DATABASES={},
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url}},
        DISTLOCK={"EVENTS": "off"},
        USE_TZ=True,
    )
    django.setup()


def install_otel_sdk() -> None:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


def metrics_thread_cpu_ns() -> int:
    """CPU time of the metrics thread so far (0 before it started)."""
    for thread in threading.enumerate():
        if thread.name == "distlock-metrics" and thread.ident is not None:
            return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
    return 0


def run_round(mode: str, cycles: int) -> tuple[list[int], int, int, int, int]:
    """``cycles`` acquire+release with metrics ``mode``: per-cycle ns, total ns, process
    CPU ns, ns spent in the backend's observer (timed where the lock calls it), and the
    metrics thread's CPU ns for those cycles."""
    from django.test.utils import override_settings

    from django_distlock import distlock
    from django_distlock.connections import get_backend
    from django_distlock.telemetry import flush_metrics

    template = distlock("bench:{mode}")
    name = f"bench:{mode}"
    with override_settings(DISTLOCK={"EVENTS": "off", "METRICS": SETTINGS[mode]}):
        lock = template.renamed(name)
        for _ in range(50):  # the settings change rebuilt the backend: warm it up
            with lock:
                pass
        backend = get_backend()
        observe, in_observer = backend.observer, [0]
        clock = time.perf_counter_ns

        def timed(event):
            start = clock()
            observe(event)
            in_observer[0] += clock() - start

        backend.observer = timed
        flush_metrics()
        gc.collect()
        thread_before = metrics_thread_cpu_ns()

        def cycle(_: int) -> None:
            with lock:
                pass

        loop = timed(cycle, cycles, collect=False)
        flush_cpu = time.process_time_ns()
        flush_metrics()
        thread_cpu = metrics_thread_cpu_ns() - thread_before
        cpu = loop.cpu_ns + time.process_time_ns() - flush_cpu
        backend.observer = observe
    return loop.durations, loop.total_ns, cpu, in_observer[0], thread_cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="6 rounds x 500 cycles")
    parser.add_argument(
        "--multiprocess",
        action="store_true",
        help="prometheus_client in multiprocess mode (values in memory-mapped files)",
    )
    parser.add_argument(
        "--pin",
        choices=PLACEMENTS,
        default="split",
        help="benchmark on the first CPU, server on the second (split, default), both on "
        "the first (same), or no pinning",
    )
    args = parser.parse_args()
    rounds, cycles = (6, 500) if args.quick else (args.rounds, args.cycles)
    with tempfile.TemporaryDirectory(prefix="distlock-prom-") as directory:
        if args.multiprocess:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # before prometheus_client loads
        with bench_server() as server:
            usable = len(os.sched_getaffinity(0))
            pin = args.pin if usable >= 2 or args.pin != "split" else "same"
            place(pin, server)
            configure_django(server.url)
            install_otel_sdk()
            return measure(rounds, cycles, pin, args.multiprocess)


def measure(rounds: int, cycles: int, pin: str, multiprocess: bool) -> int:
    durations: dict[str, list[int]] = {mode: [] for mode in MODES}
    means: dict[str, list[float]] = {mode: [] for mode in MODES}
    p50s: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpus: dict[str, list[float]] = {mode: [] for mode in MODES}
    observers: dict[str, list[float]] = {mode: [] for mode in MODES}
    threads: dict[str, list[float]] = {mode: [] for mode in MODES}
    for r in range(rounds):
        for mode in rotated(MODES, r):
            cycle_ns, total, cpu_ns, observer_ns, thread_ns = run_round(mode, cycles)
            durations[mode].extend(cycle_ns)
            means[mode].append(total / cycles)
            p50s[mode].append(percentile(cycle_ns, 50))
            cpus[mode].append(cpu_ns / cycles)
            observers[mode].append(observer_ns / cycles)
            threads[mode].append(thread_ns / cycles)

    from prometheus_client import REGISTRY

    from django_distlock.telemetry import flush_metrics

    flush_metrics()
    counted = REGISTRY.get_sample_value(
        "distlock_acquire_total", {"lock": "bench:{mode}", "result": "acquired"}
    )
    prometheus = "multiprocess" if multiprocess else "in memory"
    print(
        f"# Metrics: {rounds} rounds x {cycles} acquire+release, pin={pin}, "
        f"prometheus_client {prometheus}, OpenTelemetry SDK (batch spans, dropped)\n"
    )
    print("| METRICS | mean µs | p50 µs | p99 µs | CPU µs/cycle | overhead: mean | p50 | CPU |")
    print("|---|---|---|---|---|---|---|---|")
    end_to_end = []

    def overhead(values: dict[str, list[float]], mode: str) -> float:
        return median([m / o for m, o in zip(values[mode], values["off"], strict=True)]) - 1

    for mode in MODES:
        mean_us = sum(means[mode]) / len(means[mode]) / 1000
        by_mean, by_p50, by_cpu = (overhead(values, mode) for values in (means, p50s, cpus))
        if mode != "off":
            end_to_end.append(by_mean < TARGET)
        print(
            f"| {mode} | {mean_us:.1f} "
            f"| {percentile(durations[mode], 50) / 1000:.1f} "
            f"| {percentile(durations[mode], 99) / 1000:.1f} "
            f"| {median(cpus[mode]) / 1000:.1f} "
            f"| {by_mean:+.1%} | {by_p50:+.1%} | {by_cpu:+.1%} |"
        )
    print()
    print(
        "overhead: median over rounds of (mode / off) - 1, of the mean and p50 cycle time "
        "and of the process CPU per cycle"
    )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    expected = 2 * rounds * (cycles + 50)  # the prometheus and both rounds, warm-ups included
    print(f"acquires counted by prometheus_client: {counted:,.0f} of {expected:,}")

    off_p50 = median(p50s["off"])
    print()
    print("## What metrics add per cycle (medians of rounds)\n")
    print(
        "| METRICS | on the lock's path µs | share of the cycle "
        "| metrics thread CPU µs | path + thread, share of the cycle |"
    )
    print("|---|---|---|---|---|")
    on_path = []
    for mode in MODES:
        added = median(observers[mode]) - median(observers["off"])
        thread = median(threads[mode])
        if mode != "off":
            on_path.append(added / off_p50 < TARGET)
        print(
            f"| {mode} | {added / 1000:+.1f} | {added / off_p50:+.1%} "
            f"| {thread / 1000:.1f} | {(added + thread) / off_p50:+.1%} |"
        )
    print()
    print(
        f"(the uncontended cycle: p50 with metrics off, median of rounds, {off_p50 / 1000:.1f} µs)"
    )
    print(f"target, end to end (mean): {'PASS' if all(end_to_end) else 'FAIL'}")
    print(f"target, on the lock's path: {'PASS' if all(on_path) else 'FAIL'}")
    return 0 if counted == expected else 1


if __name__ == "__main__":
    sys.exit(main())
