"""A worker process for the Prometheus multiprocess test (``tests/telemetry/test_multiprocess
.py``), started with ``multiprocessing``'s spawn method: a fresh interpreter that sets
Django up from ``DJANGO_SETTINGS_MODULE`` and reaches the suite's Redis through
``DISTLOCK_TEST_REDIS_URL`` (both inherited from the test process), with
``PROMETHEUS_MULTIPROC_DIR`` set before ``prometheus_client`` is first imported, as a
gunicorn worker would have it.
"""

from __future__ import annotations

import time
from multiprocessing.synchronize import Event

JOB = "job:{n}"
"""The template of the locks every worker takes and releases."""

BUSY = "busy-target"
"""A lock the test process holds: each worker's one attempt on it is ``busy``."""

HELD = "held:{worker}"
"""The template of the lock the holding worker keeps until told to release it."""


def work(worker: int, cycles: int, hold: bool, holding: Event) -> None:
    """Take and release ``JOB`` ``cycles`` times (names ``job:0`` ...), try ``BUSY`` once
    without waiting; with ``hold``, then take ``HELD``, set ``holding`` and keep it until
    killed (a minute at most)."""
    import django

    django.setup()
    from django.test.utils import override_settings

    from django_distlock import distlock
    from django_distlock.telemetry import flush_metrics

    with override_settings(DISTLOCK={"EVENTS": "off", "METRICS": "prometheus"}):

        @distlock(JOB, timeout=10)
        def job(n: int) -> None:
            pass

        for n in range(cycles):
            job(n)
        assert not distlock(BUSY).acquire(blocking=False)
        if hold:
            with distlock(HELD).renamed(HELD.format(worker=worker)):
                flush_metrics()  # what the test scrapes next
                holding.set()
                time.sleep(60)
