"""django_distlock.telemetry.prometheus: every Prometheus metric moves as it should, for each way an
acquire ends (acquired, busy, timeout, error), for holds that end (released, lost, a
release Redis did not answer) and for renewals, sync and async, on real servers."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from django_distlock.engine import Lock, LockBackendUnavailable, LockLost
from django_distlock.telemetry.prometheus import PrometheusMetrics, observer
from tests.support.engine import await_until, lock_key
from tests.support.metrics import NAME, TEMPLATE, report_lock

FAST = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}


async def test_an_acquire_and_its_release(api, observed, samples):
    lock = report_lock(observed())
    await api.acquire(lock)
    assert samples("distlock_held", lock=TEMPLATE) == 1
    await asyncio.sleep(0.05)
    await api.release(lock)

    acquired = {"lock": TEMPLATE, "result": "acquired"}
    assert samples("distlock_acquire_total", **acquired) == 1
    assert samples("distlock_acquire_wait_seconds_count", **acquired) == 1
    assert 0 < samples("distlock_acquire_wait_seconds_sum", **acquired) < 1
    assert samples("distlock_acquire_wait_seconds_bucket", **acquired, le="+Inf") == 1
    assert samples("distlock_hold_seconds_count", lock=TEMPLATE) == 1
    assert 0.05 <= samples("distlock_hold_seconds_sum", lock=TEMPLATE) < 1
    assert samples("distlock_held", lock=TEMPLATE) == 0
    assert samples("distlock_lost_total", lock=TEMPLATE, reason="gone") == 0


async def test_a_busy_lock_counts_busy_without_waiting_and_timeout_after_waiting(
    api, observed, samples
):
    backend = observed()
    holder = report_lock(backend)
    await api.acquire(holder)
    assert not await api.acquire(report_lock(backend), blocking=False)
    assert not await api.acquire(report_lock(backend), blocking_timeout=0)
    assert not await api.acquire(report_lock(backend), blocking_timeout=0.1)
    await api.release(holder)

    assert samples("distlock_acquire_total", lock=TEMPLATE, result="acquired") == 1
    assert samples("distlock_acquire_total", lock=TEMPLATE, result="busy") == 2
    assert samples("distlock_acquire_total", lock=TEMPLATE, result="timeout") == 1
    assert samples("distlock_acquire_wait_seconds_sum", lock=TEMPLATE, result="timeout") >= 0.1
    assert samples("distlock_acquire_wait_seconds_sum", lock=TEMPLATE, result="busy") < 0.1
    assert samples("distlock_held", lock=TEMPLATE) == 0
    assert samples("distlock_hold_seconds_count", lock=TEMPLATE) == 1


async def test_an_acquire_that_raises_counts_an_error(api, dead_backend, prometheus, samples):
    dead_backend.observer = prometheus.observer()
    with pytest.raises(LockBackendUnavailable):
        await api.acquire(report_lock(dead_backend))

    assert samples("distlock_acquire_total", lock=TEMPLATE, result="error") == 1
    assert samples("distlock_acquire_wait_seconds_count", lock=TEMPLATE, result="error") == 1
    assert samples("distlock_acquire_total", lock=TEMPLATE, result="acquired") == 0
    assert samples("distlock_held", lock=TEMPLATE) == 0


async def test_renewals_count_ok(api, observed, samples):
    async with api.hold(report_lock(observed(), timeout=0.3)):
        await await_until(
            lambda: samples("distlock_renew_total", lock=TEMPLATE, result="ok") >= 2, within=3
        )
    assert samples("distlock_renew_total", lock=TEMPLATE, result="error") == 0
    assert samples("distlock_held", lock=TEMPLATE) == 0


async def test_a_lock_whose_key_vanished_is_lost_gone_at_the_next_renewal(
    api, observed, samples, redis_client
):
    async def hold_while_the_key_vanishes():
        async with api.hold(report_lock(observed(), timeout=0.6)):
            assert samples("distlock_held", lock=TEMPLATE) == 1
            redis_client.delete(lock_key(NAME))
            await await_until(
                lambda: samples("distlock_lost_total", lock=TEMPLATE, reason="gone") == 1,
                within=3,
            )

    with pytest.raises(LockLost):
        await hold_while_the_key_vanishes()

    assert samples("distlock_renew_total", lock=TEMPLATE, result="lost") == 1
    assert samples("distlock_held", lock=TEMPLATE) == 0
    assert samples("distlock_hold_seconds_count", lock=TEMPLATE) == 1
    assert samples("distlock_lost_total", lock=TEMPLATE, reason="gone") == 1


async def test_with_redis_gone_renewals_fail_and_the_lock_is_lost_expired(
    api, observed, samples, private_redis
):
    lock = report_lock(observed(private_redis, client_kwargs=FAST), timeout=0.9)

    async def hold_while_redis_dies():
        async with api.hold(lock):
            private_redis.kill()
            await await_until(
                lambda: samples("distlock_lost_total", lock=TEMPLATE, reason="expired") == 1,
                within=3,
            )

    with pytest.raises(LockLost):
        await hold_while_redis_dies()

    assert samples("distlock_renew_total", lock=TEMPLATE, result="error") >= 1
    assert samples("distlock_held", lock=TEMPLATE) == 0
    assert samples("distlock_lost_total", lock=TEMPLATE, reason="gone") == 0


async def test_a_release_redis_did_not_answer_ends_the_hold_in_the_gauge(
    api, observed, samples, private_redis
):
    lock = report_lock(observed(private_redis, client_kwargs=FAST), timeout=30)
    with pytest.raises(LockBackendUnavailable):
        async with api.hold(lock):
            private_redis.kill()

    assert samples("distlock_held", lock=TEMPLATE) == 0
    assert samples("distlock_hold_seconds_count", lock=TEMPLATE) == 0  # it ends at lease end
    assert samples("distlock_lost_total", lock=TEMPLATE, reason="expired") == 0


async def test_a_decorator_labels_its_locks_by_its_template(api, observed, samples):
    backend = observed()

    @Lock("sync:{account}", backend=backend)
    def sync_account(account):
        return account

    @Lock("async:{account}", backend=backend)
    async def async_sync_account(account):
        return account

    for account in range(3):
        sync_account(account)
        await async_sync_account(account)

    assert samples("distlock_acquire_total", lock="sync:{account}", result="acquired") == 3
    assert samples("distlock_acquire_total", lock="async:{account}", result="acquired") == 3
    assert samples("distlock_acquire_total", lock="sync", result="acquired") == 0


@pytest.mark.parametrize(
    ("mode", "labels"),
    [
        ("template", [TEMPLATE, "invoice", "nightly-cleanup"]),
        ("prefix", ["report", "invoice", "nightly-cleanup"]),
        ("none", ["", "", ""]),
    ],
)
async def test_label_modes(api, observed, samples, mode, labels):
    backend = observed(label=mode)
    for lock in (
        report_lock(backend),
        Lock("invoice:42", backend=backend),  # a name given as is: not its own series
        Lock("nightly-cleanup", backend=backend),
    ):
        async with api.hold(lock):
            pass

    for label, count in Counter(labels).items():
        assert samples("distlock_acquire_total", lock=label, result="acquired") == count
    assert samples("distlock_acquire_total", lock="invoice:42", result="acquired") == 0


def test_one_metrics_set_per_registry_and_a_shared_default():
    registry = CollectorRegistry()
    PrometheusMetrics(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        PrometheusMetrics(registry)
    assert observer("template") is not observer("template")  # one recorder each, one set


def test_an_unknown_label_mode_is_refused(registry):
    with pytest.raises(ValueError, match="unknown label mode 'name'"):
        PrometheusMetrics(registry).observer("name")


def test_the_metrics_follow_prometheus_naming(registry):
    PrometheusMetrics(registry)
    names = {metric.name: metric.type for metric in registry.collect()}
    assert names == {
        "distlock_acquire_wait_seconds": "histogram",
        "distlock_hold_seconds": "histogram",
        "distlock_acquire": "counter",  # exposed as distlock_acquire_total
        "distlock_lost": "counter",
        "distlock_renew": "counter",
        "distlock_held": "gauge",
    }
