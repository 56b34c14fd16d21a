"""BackgroundWorker: the one shape of the package's background jobs (the notifier, the
metrics thread, the event writer)."""

from __future__ import annotations

import logging
import threading
from collections import deque

import pytest

from django_distlock.engine import BackgroundWorker


def collector() -> tuple[list[int], BackgroundWorker[int]]:
    seen: list[int] = []

    def drain(buffer: deque[int]) -> None:
        while buffer:
            seen.append(buffer.popleft())

    return seen, BackgroundWorker("test-worker", drain, interval=60)


def test_a_flush_waits_for_everything_put_before_it():
    seen, worker = collector()
    for item in range(100):
        assert worker.put(item)
    assert worker.flush(5)
    assert seen == list(range(100))
    assert worker.close(5)


def test_past_its_capacity_an_item_is_dropped_and_counted():
    drops = []
    release = threading.Event()

    def drain(buffer: deque[int]) -> None:
        release.wait(5)
        buffer.clear()

    worker = BackgroundWorker(
        "test-worker", drain, capacity=3, interval=60, on_drop=lambda: drops.append(1)
    )
    assert [worker.put(item) for item in range(5)] == [True, True, True, False, False]
    assert len(drops) == 2
    release.set()
    assert worker.close(5)


def test_a_full_batch_wakes_the_thread_without_a_flush():
    seen: list[int] = []
    drained = threading.Event()

    def drain(buffer: deque[int]) -> None:
        while buffer:
            seen.append(buffer.popleft())
        if seen:
            drained.set()

    worker = BackgroundWorker("test-worker", drain, interval=60, batch=3)
    for item in range(3):
        worker.put(item)
    assert drained.wait(5)  # long before the 60 s interval
    assert seen == [0, 1, 2]
    worker.close(5)


def test_close_drains_once_more_then_stops():
    seen: list[int] = []
    stopped = []
    worker = BackgroundWorker(
        "test-worker",
        lambda buffer: seen.extend(buffer) or buffer.clear(),
        interval=60,
        on_stop=lambda: stopped.append(True),
    )
    worker.put(1)
    worker.put(2)
    assert worker.close(5)
    assert (seen, stopped) == ([1, 2], [True])
    assert worker.close(5)  # a second close is a no-op


def test_a_failing_drain_is_logged_and_the_thread_goes_on(caplog):
    calls = []

    def drain(buffer: deque[int]) -> None:
        calls.append(buffer.popleft())
        if len(calls) == 1:
            raise RuntimeError("boom")

    worker = BackgroundWorker("test-worker", drain, interval=60)
    with caplog.at_level(logging.ERROR, logger="django_distlock"):
        worker.put(1)
        assert worker.flush(5)
        worker.put(2)
        assert worker.flush(5)
    assert calls == [1, 2]
    assert "the test-worker thread failed" in caplog.text
    worker.close(5)


@pytest.mark.parametrize("capacity", [None, 10])
def test_a_flush_before_the_first_item_returns_at_once(capacity):
    worker = BackgroundWorker("test-worker", lambda buffer: None, capacity=capacity)
    assert worker.flush(0) is True
    assert worker.started is False
