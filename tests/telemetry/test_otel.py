"""django_distlock.telemetry.otel: ``distlock.acquire`` and ``distlock.hold`` spans and the
instruments, read back from the SDK's in-memory span exporter and metric reader."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from django_distlock.engine import LockBackendUnavailable, LockLost
from django_distlock.telemetry import otel
from django_distlock.telemetry.readings import HOLD_BUCKETS, WAIT_BUCKETS
from tests.support.engine import await_until, lock_key
from tests.support.metrics import NAME, TEMPLATE, OtelSink, report_lock


@pytest.fixture
def sink() -> OtelSink:
    return OtelSink()


@pytest.fixture
def request_span(sink):
    """A recorded span made current, as a traced request's would be."""
    with sink.tracer_provider.get_tracer("the-app").start_as_current_span("request") as span:
        yield span


@pytest.fixture
def traced(make_backend, redis_client, sink):
    """``traced(label="template")``: a backend on the shared server (flushed) observed
    by ``otel.observer`` with ``sink``'s providers."""

    def make(label: str = "template"):
        return make_backend(
            observer=otel.observer(
                label, tracer_provider=sink.tracer_provider, meter_provider=sink.meter_provider
            )
        )

    return make


async def test_an_acquire_and_its_release_are_two_spans_under_the_callers(
    api, traced, sink, request_span
):
    lock = report_lock(traced())
    await api.acquire(lock)
    fence = lock.fence
    assert sink.value("distlock.held", lock=TEMPLATE) == 1
    await asyncio.sleep(0.05)
    await api.release(lock)

    [acquire] = sink.spans("distlock.acquire")
    [hold] = sink.spans("distlock.hold")
    for span in (acquire, hold):
        assert span.parent is not None
        assert span.parent.span_id == request_span.get_span_context().span_id
        assert span.attributes["distlock.lock"] == TEMPLATE
        assert span.attributes["distlock.name"] == NAME
        assert span.attributes["distlock.fence"] == fence
        assert span.status.status_code is StatusCode.UNSET
    assert acquire.attributes["distlock.result"] == "acquired"
    assert hold.attributes["distlock.result"] == "released"
    assert acquire.start_time < acquire.end_time == hold.start_time < hold.end_time
    assert (hold.end_time - hold.start_time) / 1e9 >= 0.05

    assert sink.value("distlock.acquire.duration", lock=TEMPLATE, result="acquired") == 1
    assert sink.value("distlock.hold.duration", lock=TEMPLATE) == 1
    assert sink.value("distlock.held", lock=TEMPLATE) == 0


async def test_histograms_use_second_buckets(api, traced, sink):
    async with api.hold(report_lock(traced())):
        pass
    [wait] = sink.points("distlock.acquire.duration").values()
    [held] = sink.points("distlock.hold.duration").values()
    assert tuple(wait.explicit_bounds) == WAIT_BUCKETS
    assert tuple(held.explicit_bounds) == HOLD_BUCKETS


async def test_failed_acquires_are_spans_with_their_result(
    api, traced, sink, dead_backend, request_span
):
    backend = traced()
    holder = report_lock(backend)
    await api.acquire(holder)
    await api.acquire(report_lock(backend), blocking=False)
    await api.acquire(report_lock(backend), blocking_timeout=0.05)
    await api.release(holder)
    dead_backend.observer = backend.observer
    with pytest.raises(LockBackendUnavailable):
        await api.acquire(report_lock(dead_backend))

    results = [span.attributes["distlock.result"] for span in sink.spans("distlock.acquire")]
    assert results == ["acquired", "busy", "timeout", "error"]
    timeout, error = sink.spans("distlock.acquire")[2:]
    assert (timeout.end_time - timeout.start_time) / 1e9 >= 0.05
    assert "distlock.fence" not in timeout.attributes
    assert timeout.status.status_code is StatusCode.UNSET
    assert error.status.status_code is StatusCode.ERROR
    assert "Redis" in error.status.description
    for result in ("acquired", "busy", "timeout", "error"):
        assert sink.value("distlock.acquire.duration", lock=TEMPLATE, result=result) == 1
    assert len(sink.spans("distlock.hold")) == 1


async def test_a_lost_lock_ends_its_hold_span_in_error(
    api, traced, sink, redis_client, request_span
):
    async def hold_while_the_key_vanishes():
        async with api.hold(report_lock(traced(), timeout=0.6)):
            redis_client.delete(lock_key(NAME))
            await await_until(lambda: sink.spans("distlock.hold"), within=3)

    with pytest.raises(LockLost):
        await hold_while_the_key_vanishes()

    [hold] = sink.spans("distlock.hold")
    assert hold.attributes["distlock.result"] == "lost"
    assert hold.attributes["distlock.lost.reason"] == "gone"
    assert hold.status.status_code is StatusCode.ERROR
    assert sink.value("distlock.losses", lock=TEMPLATE, lost_reason="gone") == 1
    assert sink.value("distlock.renewals", lock=TEMPLATE, result="lost") == 1
    assert sink.value("distlock.held", lock=TEMPLATE) == 0


async def test_renewals_are_counted(api, traced, sink):
    async with api.hold(report_lock(traced(), timeout=0.3)):
        await await_until(
            lambda: sink.value("distlock.renewals", lock=TEMPLATE, result="ok") >= 2, within=3
        )


@pytest.mark.parametrize(("mode", "label"), [("prefix", "report"), ("none", "")])
async def test_label_modes(api, traced, sink, request_span, mode, label):
    async with api.hold(report_lock(traced(mode))):
        pass
    assert sink.value("distlock.acquire.duration", lock=label, result="acquired") == 1
    [span] = sink.spans("distlock.hold")
    assert span.attributes["distlock.lock"] == label


async def test_a_lock_taken_outside_any_trace_makes_a_trace_of_its_own(api, traced, sink):
    """Spans used to be made only under a recorded span, so a lock taken in a thread, a
    management command or an uninstrumented task had none. Now the application's sampler
    decides, as OpenTelemetry's own instrumentations let it (``ParentBased`` by default:
    a root span is recorded). The hold is then the acquire's child: one trace per lock,
    sampled as one."""
    assert not trace.get_current_span().get_span_context().is_valid
    lock = report_lock(traced())
    await api.acquire(lock)
    fence = lock.fence
    await api.release(lock)

    [acquire] = sink.spans("distlock.acquire")
    [hold] = sink.spans("distlock.hold")
    assert acquire.parent is None
    assert hold.parent is not None
    assert hold.parent.span_id == acquire.context.span_id
    assert hold.context.trace_id == acquire.context.trace_id
    assert acquire.attributes["distlock.result"] == "acquired"
    assert hold.attributes["distlock.result"] == "released"
    assert hold.attributes["distlock.fence"] == fence


async def test_in_a_trace_that_is_not_sampled_no_span_is_made_and_metrics_still_are(
    api, traced, sink
):
    """The sampler (``ParentBased``) follows the caller's trace: not sampled there, not
    sampled here."""
    backend = traced()
    unsampled = trace.NonRecordingSpan(
        trace.SpanContext(
            trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=trace.TraceFlags(0)
        )
    )
    with trace.use_span(unsampled):
        async with api.hold(report_lock(backend)):
            assert sink.value("distlock.held", lock=TEMPLATE) == 1
        async with api.hold(report_lock(backend)):
            pass

    assert sink.spans("distlock.acquire") == []
    assert sink.spans("distlock.hold") == []
    assert sink.value("distlock.acquire.duration", lock=TEMPLATE, result="acquired") == 2
    assert sink.value("distlock.hold.duration", lock=TEMPLATE) == 2
    assert sink.value("distlock.held", lock=TEMPLATE) == 0
