"""Locked tasks run by real Celery workers, a prefork pool and a solo one, on the suite's
own Redis as broker and result backend: storms of delay(), skip, retry and wait, one lock
for ``task(1)`` and ``task(account_id=1)``, the admin's view of a running task, and
``celery beat`` sending a task faster than it runs."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from typing import Any

import pytest

from django_distlock import LockNotAcquired, distlock
from django_distlock.models import HeldLock
from tests.support import celery_app as tasks
from tests.support.celery_app import BEAT_ENV_VAR
from tests.support.celery_workers import CeleryProcess
from tests.support.engine import lock_waiters, wait_until

RESULT_TIMEOUT = 30


@pytest.fixture(scope="module")
def workers(celery_processes) -> list[CeleryProcess]:
    """Three prefork pool processes and a solo worker, all on the default queue."""
    return [
        celery_processes(CeleryProcess.worker, "prefork", name="prefork", concurrency=3),
        celery_processes(CeleryProcess.worker, "solo", name="solo"),
    ]


def runs_of(note_client, key: str) -> list[dict[str, Any]]:
    return [json.loads(run) for run in note_client.lrange(f"runs:{key}", 0, -1)]


def assert_one_at_a_time(note_client, key: str) -> list[dict[str, Any]]:
    """The runs noted for ``key``, checked never to overlap: none started while another
    ran, and each started after the one before ended."""
    runs = sorted(runs_of(note_client, key), key=lambda run: run["started"])
    assert note_client.lrange(f"overlaps:{key}", 0, -1) == []
    for before, after in itertools.pairwise(runs):
        assert after["started"] >= before["ended"], (before, after)
    fences = [run["fence"] for run in runs]
    assert fences == sorted(fences)
    assert len(set(fences)) == len(fences)
    return runs


def delay_concurrently(task, count: int, *args: Any) -> list[Any]:
    """``task.delay(*args)`` ``count`` times at once, from as many threads."""
    results: list[Any] = [None] * count
    go = threading.Event()

    def send(i: int) -> None:
        go.wait()
        results[i] = task.delay(*args)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join()
    return results


def test_a_storm_of_delays_runs_one_body_at_a_time(workers, note_client, key):
    results = delay_concurrently(tasks.wait_in_turn, 20, key, 0.05)
    values = [result.get(timeout=RESULT_TIMEOUT) for result in results]
    runs = assert_one_at_a_time(note_client, key)
    assert len(runs) == 20
    assert {value["id"] for value in values} == {result.id for result in results}
    # They really contended: the runs came from several processes of both pools.
    assert len({run["pid"] for run in runs}) >= 3
    assert workers[1].pid in {run["pid"] for run in runs}


def test_a_storm_of_skipping_tasks_runs_one_at_a_time_and_skips_the_rest(workers, note_client, key):
    results = delay_concurrently(tasks.skip_if_busy, 20, key, 0.3)
    values = [result.get(timeout=RESULT_TIMEOUT) for result in results]
    skipped = [value for value in values if value.get("distlock") == "skipped"]
    runs = assert_one_at_a_time(note_client, key)
    assert len(runs) + len(skipped) == 20
    assert runs
    assert skipped
    assert all(value["lock"] == f"skip:{key}" for value in skipped)


def test_a_skipped_run_is_a_visible_result_and_a_log_line(workers, key):
    with distlock(f"skip:{key}", timeout=60, auto_renew=False):
        result = tasks.skip_if_busy.delay(key)
        value = result.get(timeout=RESULT_TIMEOUT)
    assert result.state == "SUCCESS"
    assert value["distlock"] == "skipped"
    assert value["lock"] == f"skip:{key}"
    assert 55 < value["retry_after"] <= 60
    logs = workers[0].log() + workers[1].log()
    line = f"tests.support.celery_app.skip_if_busy[{result.id}] skipped: lock 'skip:{key}' is held"
    assert f"{line} by " in logs
    assert f":{os.getpid()} MainThread since " in logs


def test_retry_waits_the_holders_remaining_lease(workers, note_client, key):
    holder = distlock(f"retry:{key}", timeout=2, auto_renew=False)
    assert holder.acquire()
    lease_end = time.time() + 2
    result = tasks.retry_if_busy.delay(key)
    value = result.get(timeout=RESULT_TIMEOUT)
    retries = [json.loads(r) for r in note_client.lrange(f"retries:{result.id}", 0, -1)]
    first = retries[0]
    # Countdown = what was left of the 2 s lease when the worker found it busy.
    assert 1.0 < first["when"] <= 2.0
    assert abs(first["at"] + first["when"] - lease_end) < 0.3
    assert value["retries"] == len(retries) >= 1
    assert value["started"] >= lease_end - 0.05
    assert not holder.owned()  # its lease ran out; nobody took it from under the task


def test_retry_runs_soon_after_the_holder_lets_go_not_after_its_countdown(
    workers, note_client, key
):
    holder = distlock(f"need:{key}", timeout=60, auto_renew=False)
    assert holder.acquire()
    result = tasks.retry_by_need.delay(key)
    wait_until(lambda: note_client.llen(f"retries:{result.id}") == 1)
    published = time.time()
    time.sleep(0.3)
    holder.release()
    released = time.time()
    value = result.get(timeout=RESULT_TIMEOUT)
    (when,) = [json.loads(r)["when"] for r in note_client.lrange(f"retries:{result.id}", 0, -1)]
    assert when == 3  # the countdown it was published with: the upper bound
    assert 0 <= value["started"] - released < 1.0
    assert value["started"] < published + 3
    # The retry published with that countdown is dropped when its time comes.
    label = f"tests.support.celery_app.retry_by_need[{result.id}]"
    wait_until(
        lambda: any(f"{label}: not run, an early copy" in worker.log() for worker in workers),
        timeout=10,
    )
    assert [run["id"] for run in runs_of(note_client, key)] == [result.id]
    assert result.get() == value


def test_retry_countdown_is_capped(workers, note_client, key):
    with distlock(f"retry:{key}", timeout=60, auto_renew=False):
        result = tasks.retry_capped.delay(key)
        wait_until(lambda: note_client.llen(f"retries:{result.id}") >= 2, timeout=10)
    value = result.get(timeout=RESULT_TIMEOUT)
    whens = [json.loads(r)["when"] for r in note_client.lrange(f"retries:{result.id}", 0, -1)]
    assert whens == [0.5] * len(whens)
    assert value["retries"] == len(whens) >= 2


def test_retry_respects_max_retries(workers, note_client, key):
    with distlock(f"retry:{key}", timeout=60, auto_renew=False):
        result = tasks.retry_once.delay(key)
        error = result.get(timeout=RESULT_TIMEOUT, propagate=False)
    assert result.state == "FAILURE"
    assert isinstance(error, LockNotAcquired)
    assert f"could not acquire lock 'retry:{key}'" in str(error)
    assert note_client.llen(f"retries:{result.id}") == 1
    assert runs_of(note_client, key) == []


def test_wait_runs_once_the_holder_lets_go(workers, key, redis_server):
    client = redis_server.client()
    with distlock(f"wait:{key}", timeout=60, auto_renew=False):
        result = tasks.wait_briefly.delay(key)
        wait_until(lambda: lock_waiters(client) == 1)
        released = time.time()
    value = result.get(timeout=RESULT_TIMEOUT)
    assert 0 <= value["started"] - released < 0.2
    client.close()


def test_wait_fails_clearly_when_the_lock_stays_busy(workers, key):
    with distlock(f"wait:{key}", timeout=60, auto_renew=False):
        result = tasks.wait_briefly.delay(key)
        error = result.get(timeout=RESULT_TIMEOUT, propagate=False)
    assert result.state == "FAILURE"
    assert isinstance(error, LockNotAcquired)
    assert f"could not acquire lock 'wait:{key}'" in str(error)
    assert "still held after 0.5s" in str(error)


def test_task_1_and_task_account_id_1_take_one_lock(workers, note_client, key):
    account = int(time.time() * 1000)  # an account of this test's own
    first = tasks.same_lock.delay(account, key, 1.5)
    wait_until(lambda: note_client.get(f"running:{key}") == "1")
    second = tasks.same_lock.delay(account_id=account, key=key)
    third = tasks.same_lock.apply_async(kwargs={"key": key, "account_id": account})
    for skipped in (second, third):
        value = skipped.get(timeout=RESULT_TIMEOUT)
        assert (value["distlock"], value["lock"]) == ("skipped", f"same:{account}")
    assert first.get(timeout=RESULT_TIMEOUT)["id"] == first.id


def test_a_running_task_shows_in_held_locks_with_its_name_and_id(workers, note_client, key):
    result = tasks.skip_if_busy.delay(key, 1.0)
    wait_until(lambda: note_client.get(f"running:{key}") == "1")
    held = HeldLock.objects.get(name=f"skip:{key}")
    assert held.context == f"celery:tests.support.celery_app.skip_if_busy[{result.id}]"
    assert held.pid != os.getpid()
    assert held.auto_renew is True
    value = result.get(timeout=RESULT_TIMEOUT)
    assert held.pid == value["pid"]
    assert not HeldLock.objects.filter(name=f"skip:{key}").exists()


def test_beat_sending_faster_than_the_task_runs_never_overlaps(
    workers, celery_processes, note_client, key
):
    beat = celery_processes(CeleryProcess.beat, env={BEAT_ENV_VAR: key})
    time.sleep(4)
    beat.stop()
    sent = beat.log().count("Scheduler: Sending due task overlapping")

    def skipped() -> int:
        return sum(worker.log().count(f"skipped: lock 'beat:{key}' is held") for worker in workers)

    # Every tick sent either ran (1 s) or was skipped.
    wait_until(lambda: len(runs_of(note_client, key)) + skipped() == sent, timeout=10)
    runs = assert_one_at_a_time(note_client, key)
    assert sent >= 6  # every 0.4 s for 4 s, less beat's start
    assert 2 <= len(runs) <= 5
    assert skipped() == sent - len(runs) > 0
