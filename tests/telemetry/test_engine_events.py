"""What the engine tells its observer for metrics: the name template, why an acquire
failed (busy, timeout, an error), why a lock was lost, the watchdog's renewals; and that
the kinds for metrics only become neither ``LockEvent`` rows nor signals."""

from __future__ import annotations

import gc
import threading

import pytest
from prometheus_client import REGISTRY

from django_distlock import distlock
from django_distlock import signals as distlock_signals
from django_distlock.engine import Lock, LockBackendUnavailable, LockLost, LostCause
from django_distlock.telemetry import flush_metrics
from tests.support.engine import await_until, lock_key, wait_until
from tests.support.events import events_mode, kinds
from tests.support.metrics import NAME, TEMPLATE, report_lock

FAST = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}
RENEWED = {"lock": "renewing", "result": "ok"}


async def test_events_carry_the_template_a_name_was_filled_from(api, make_backend, recorder):
    backend = make_backend(observer=recorder)

    @Lock(TEMPLATE, backend=backend)
    def build_report(day):
        pass

    build_report("2026-11-23")
    async with api.hold(Lock("invoice:42", backend=backend)):
        pass
    async with api.hold(report_lock(backend)):
        pass

    assert [(e.kind, e.name, e.template) for e in recorder.events] == [
        ("acquired", NAME, TEMPLATE),
        ("released", NAME, TEMPLATE),
        ("acquired", "invoice:42", ""),
        ("released", "invoice:42", ""),
        ("acquired", NAME, TEMPLATE),
        ("released", NAME, TEMPLATE),
    ]


def test_renamed_keeps_the_first_template_and_a_constant_name_is_its_own():
    lock = Lock(TEMPLATE, backend=lambda: None)  # type: ignore[arg-type,return-value]
    assert lock.template == ""
    assert lock.renamed(NAME).template == TEMPLATE
    assert lock.renamed(NAME).renamed("report:other").template == TEMPLATE
    constant = Lock("nightly", backend=lambda: None)  # type: ignore[arg-type,return-value]
    assert constant.renamed("nightly").template == "nightly"


async def test_a_failed_acquire_says_busy_or_timeout(api, make_backend, recorder):
    backend = make_backend(observer=recorder)
    holder = Lock("busy", backend=backend)
    await api.acquire(holder)
    await api.acquire(Lock("busy", backend=backend), blocking=False)
    await api.acquire(Lock("busy", backend=backend, blocking=False))
    await api.acquire(Lock("busy", backend=backend), blocking_timeout=0)
    await api.acquire(Lock("busy", backend=backend), blocking_timeout=0.05)
    await api.release(holder)

    contended = recorder.of("contended")
    assert [event.cause for event in contended] == ["busy", "busy", "busy", "timeout"]
    assert contended[-1].waited >= 0.05


async def test_an_acquire_that_raises_is_an_error_event(api, dead_backend, recorder):
    dead_backend.observer = recorder
    with pytest.raises(LockBackendUnavailable) as raised:
        await api.acquire(report_lock(dead_backend))

    [event] = recorder.events
    assert event.kind == "error"
    assert (event.name, event.template, event.fence) == (NAME, TEMPLATE, None)
    assert event.cause == "LockBackendUnavailable"
    assert event.reason == str(raised.value)
    assert event.waited > 0


async def test_a_release_that_raises_is_a_release_failed_event(
    api, make_backend, recorder, private_redis
):
    backend = make_backend(private_redis, client_kwargs=FAST, observer=recorder)
    lock = Lock("doomed", backend=backend, timeout=30, auto_renew=False)
    await api.acquire(lock)
    fence = lock.fence
    private_redis.kill()
    with pytest.raises(LockBackendUnavailable):
        await api.release(lock)

    assert recorder.kinds() == ["acquired", "release_failed"]
    failed = recorder.events[-1]
    assert failed.fence == fence
    assert failed.cause == "LockBackendUnavailable"
    assert failed.held > 0


async def test_the_watchdog_reports_its_renewals(api, make_backend, recorder):
    backend = make_backend(observer=recorder)
    lock = report_lock(backend, timeout=0.3)
    async with api.hold(lock):
        fence = lock.fence
        await await_until(lambda: len(recorder.of("renewed")) >= 2, within=3)
    renewed = recorder.of("renewed")[0]
    assert (renewed.name, renewed.template, renewed.fence) == (NAME, TEMPLATE, fence)
    assert renewed.thread == recorder.of("acquired")[0].thread


async def test_a_renewal_that_finds_the_lock_gone_reports_it_then_the_loss(
    api, make_backend, recorder, redis_client
):
    backend = make_backend(observer=recorder)

    async def hold_while_the_key_vanishes():
        async with api.hold(Lock("vanishing", backend=backend, timeout=0.6)):
            redis_client.delete(lock_key("vanishing"))
            await recorder.await_for("lost", within=3)

    with pytest.raises(LockLost):
        await hold_while_the_key_vanishes()

    kinds_seen = [kind for kind in recorder.kinds() if kind != "renewed"]
    assert kinds_seen == ["acquired", "renew_failed", "lost"]
    assert recorder.of("renew_failed")[0].cause == "gone"
    assert recorder.of("lost")[0].cause == "gone"


async def test_renewals_redis_does_not_answer_then_the_loss_at_the_lease_end(
    api, make_backend, recorder, private_redis
):
    backend = make_backend(private_redis, client_kwargs=FAST, observer=recorder)

    async def hold_while_redis_dies():
        async with api.hold(Lock("doomed", backend=backend, timeout=0.9)):
            private_redis.kill()
            await recorder.await_for("lost", within=3)

    with pytest.raises(LockLost):
        await hold_while_redis_dies()

    failed = recorder.of("renew_failed")
    assert failed
    assert {event.cause for event in failed} == {"error"}
    assert recorder.of("lost")[0].cause == "expired"


async def test_a_hold_whose_owner_ended_is_lost_abandoned(make_backend, recorder):
    backend = make_backend(observer=recorder)
    lock = Lock("forgotten", backend=backend, timeout=0.6)
    thread = threading.Thread(target=lock.acquire, name="careless-thread")
    thread.start()
    thread.join()
    event = await recorder.await_for("lost", within=3)
    assert event is not None
    assert event.cause == "abandoned"


async def test_a_hold_whose_lock_object_was_dropped_is_still_reported_lost(
    make_backend, recorder, redis_client
):
    backend = make_backend(observer=recorder)
    lock = report_lock(backend, timeout=0.6)
    lock.acquire()
    fence = lock.fence
    del lock
    gc.collect()
    event = await recorder.await_for("lost", within=3)
    assert event is not None
    assert (event.name, event.template, event.fence) == (NAME, TEMPLATE, fence)
    assert event.cause == "abandoned"
    assert "garbage-collected" in event.reason
    assert event.held > 0
    await await_until(lambda: redis_client.exists(lock_key(NAME)) == 0)


async def test_a_release_or_extend_that_finds_the_lock_gone_reports_it_gone(
    api, make_backend, recorder, redis_client
):
    backend = make_backend(observer=recorder)
    for operation in ("release", "extend"):
        lock = Lock(f"gone-at-{operation}", backend=backend, timeout=30)
        await api.acquire(lock)
        redis_client.delete(lock_key(lock.name))  # an operator's force release
        end = api.extend(lock, 5) if operation == "extend" else api.release(lock)
        with pytest.raises(LockLost):
            await end
        assert lock.lost_reason.startswith("its lease ended or another holder took it")
    assert [event.cause for event in recorder.of("lost")] == [LostCause.GONE] * 2


@pytest.mark.django_db
def test_kinds_for_metrics_only_are_neither_rows_nor_signals(redis_client, dead_redis_url):
    received = []

    def receiver(sender, event, **kwargs):
        received.append(event.kind)

    def renewals() -> float:
        assert flush_metrics()
        return REGISTRY.get_sample_value("distlock_renew_total", RENEWED) or 0.0

    signals = [getattr(distlock_signals, name) for name in distlock_signals.__all__]
    for signal in signals:
        signal.connect(receiver)
    try:
        with events_mode("sync", METRICS="prometheus"):
            before = renewals()
            with distlock("renewing", timeout=0.3):
                wait_until(lambda: renewals() >= before + 2)
        with (
            events_mode("sync", URL=dead_redis_url, METRICS="prometheus"),
            pytest.raises(LockBackendUnavailable),
        ):
            distlock("unreachable").acquire()
    finally:
        for signal in signals:
            signal.disconnect(receiver)

    assert kinds("renewing") == ["acquired", "released"]
    assert kinds("unreachable") == []
    assert received == ["acquired", "released"]
