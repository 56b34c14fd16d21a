"""Locked tasks run by two real ``db_worker`` processes (django-tasks-db on a SQLite file
shared with them): storms of ``enqueue()``, ``skip``, ``defer`` and ``wait``, a SIGKILLed
worker, and ``unique_while_queued`` under concurrent enqueues."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import os
import random
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from django_distlock.engine import LockNotAcquired
from django_distlock.locks import distlock
from django_distlock.models import HeldLock
from django_distlock.tasks import DEFERRED, SKIPPED
from tests.support import locked_tasks
from tests.support.engine import lock_waiters

pytestmark = [
    pytest.mark.django_db(databases=["default", "tasks"], transaction=True),
    pytest.mark.timeout(60),
]


@pytest.fixture(scope="module")
def workers(task_workers):
    """Two workers, running for the whole module."""
    return [task_workers("w1"), task_workers("w2")]


@pytest.fixture(autouse=True)
def _workers_running(workers):
    for worker in workers:
        if worker.process is None or worker.process.poll() is not None:
            worker.start()


def finished(results, timeout=30.0):
    """Wait for every result to finish (refreshed from the database)."""
    deadline = time.monotonic() + timeout
    for result in results:
        while True:
            result.refresh()
            if result.is_finished:
                break
            assert time.monotonic() < deadline, f"{result.id} still {result.status}"
            time.sleep(0.05)
    connections.close_all()
    return results


def runs(note_client, key):
    return [json.loads(run) for run in note_client.lrange(f"runs:{key}", 0, -1)]


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_storm_of_enqueues_runs_one_at_a_time(note_client, key):
    results = [locked_tasks.wait_in_turn.enqueue(key) for _ in range(30)]
    finished(results)
    assert {result.status for result in results} == {"SUCCESSFUL"}
    done = runs(note_client, key)
    assert len(done) == 30
    assert note_client.llen(f"overlaps:{key}") == 0
    by_start = sorted(done, key=lambda run: run["started"])
    fences = [run["fence"] for run in by_start]
    assert fences == sorted(fences)
    assert len(set(fences)) == 30
    assert {run["id"] for run in done} == {result.id for result in results}
    assert len({run["pid"] for run in done}) == 2  # both workers took part


def test_skip_while_another_run_holds_the_lock(note_client, key):
    first = locked_tasks.skip_if_busy.enqueue(key, seconds=1.0)
    wait_until(lambda: distlock(f"skip:{key}").locked())
    label = f"tasks:tests.support.locked_tasks.skip_if_busy[{first.id}]"
    # The admin's model and the CLI show the run's lock like any other.
    assert HeldLock.objects.get(name=f"skip:{key}").context == label
    shown = io.StringIO()
    call_command("distlock", "show", f"skip:{key}", stdout=shown)
    assert label in shown.getvalue()
    second = locked_tasks.skip_if_busy.enqueue(key)
    finished([first, second])
    assert first.status == second.status == "SUCCESSFUL"
    assert second.return_value == SKIPPED
    (run,) = runs(note_client, key)
    assert run["context"] == f"tasks:tests.support.locked_tasks.skip_if_busy[{first.id}]"


def test_an_async_task_on_a_worker(key):
    (result,) = finished([locked_tasks.async_skip_if_busy.enqueue(key, seconds=0)])
    assert result.status == "SUCCESSFUL"
    assert result.return_value["context"].endswith(f"async_skip_if_busy[{result.id}]")


def test_defer_queues_the_task_again_after_the_holders_lease(note_client, key):
    first = locked_tasks.defer_if_busy.enqueue(key, seconds=1.0)
    wait_until(lambda: distlock(f"defer:{key}").locked())
    second = locked_tasks.defer_if_busy.enqueue(key)
    finished([first, second])
    assert second.return_value == DEFERRED
    wait_until(lambda: note_client.llen(f"runs:{key}") == 2)
    done = sorted(runs(note_client, key), key=lambda run: run["started"])
    assert done[0]["id"] == first.id
    assert done[1]["id"] not in (first.id, second.id)  # the deferred copy's own result
    assert done[1]["started"] >= done[0]["ended"]
    assert note_client.llen(f"overlaps:{key}") == 0
    again = locked_tasks.defer_if_busy.get_result(done[1]["id"])
    assert again.status == "SUCCESSFUL"
    assert again.args == [key]
    assert again.kwargs == {}


def test_a_deferred_run_runs_soon_after_the_holder_lets_go_not_at_its_lease_end(
    workers, note_client, key
):
    first = locked_tasks.defer_by_need.enqueue(key, seconds=1.0)
    wait_until(lambda: note_client.get(f"running:{key}") == "1")
    second = locked_tasks.defer_by_need.enqueue(key)
    finished([second])
    assert second.return_value == DEFERRED
    # Put off by the holder's lease (30 s) at most, and queued again once it let go.
    wait_until(lambda: note_client.llen(f"runs:{key}") == 2, timeout=5)
    held, after = sorted(runs(note_client, key), key=lambda run: run["started"])
    assert held["id"] == first.id
    assert 0 <= after["started"] - held["ended"] < 1.0
    from django_tasks_db.models import DBTaskResult

    (late,) = [
        row
        for row in DBTaskResult.objects.filter(task_path=locked_tasks.defer_by_need.module_path)
        if row.args_kwargs["args"] == [key]
        and str(row.id) not in (first.id, second.id, after["id"])
    ]
    assert after["id"] not in (first.id, second.id)  # the early copy, queued at release
    # The copy queued for the lease's end ends without running when its time comes.
    assert late.status == "READY"
    DBTaskResult.objects.filter(id=late.id).update(run_after=timezone.now())
    (late_result,) = finished([locked_tasks.defer_by_need.get_result(str(late.id))])
    assert late_result.return_value == DEFERRED
    assert note_client.llen(f"runs:{key}") == 2


def test_wait_up_to_blocking_timeout_then_fail(key):
    first = locked_tasks.wait_briefly.enqueue(key, seconds=1.5)
    wait_until(lambda: distlock(f"bounded:{key}").locked())
    second = locked_tasks.wait_briefly.enqueue(key)
    finished([first, second])
    assert first.status == "SUCCESSFUL"
    assert second.status == "FAILED"
    assert second.errors[0].exception_class is LockNotAcquired


def test_a_killed_worker_frees_the_lock_at_its_lease_end(workers, note_client, key):
    doomed = locked_tasks.crash_prone.enqueue(key, seconds=30)
    wait_until(lambda: distlock(f"crash:{key}").locked())
    doomed.refresh()
    (worker_id,) = doomed.worker_ids
    (worker,) = [worker for worker in workers if worker.name == worker_id]
    worker.kill()
    killed_at = time.time()
    after = locked_tasks.crash_prone.enqueue(key, seconds=0)
    finished([after])
    assert after.status == "SUCCESSFUL"
    (run,) = runs(note_client, key)
    # Not before the killed run's lease (1.5 s, renewed at a third) ran out.
    assert 0.5 < run["started"] - killed_at < 3.0
    doomed.refresh()
    assert doomed.status == "RUNNING"  # django-tasks-db does not notice a dead worker


def test_unique_while_queued_under_concurrent_enqueues(note_client, key):
    results = []

    def enqueue():
        results.append(locked_tasks.unique.enqueue(key))
        connections.close_all()

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({result.id for result in results}) == 1
    # While it is queued or running, enqueue(key=...) is the same lock name.
    wait_until(lambda: distlock(f"unique:{key}").locked())
    assert locked_tasks.unique.enqueue(key=key, seconds=0.2).id == results[0].id
    finished(results[:1])
    assert len(runs(note_client, key)) == 1
    later = locked_tasks.unique.enqueue(key)
    assert later.id != results[0].id
    finished([later])
    assert len(runs(note_client, key)) == 2


def test_a_killed_workers_claim_frees_the_name_at_its_lease_end(workers, note_client, key):
    doomed = locked_tasks.unique.enqueue(key, seconds=30)
    wait_until(lambda: distlock(f"unique:{key}").locked())
    doomed.refresh()
    (worker,) = [worker for worker in workers if worker.name in doomed.worker_ids]
    worker.kill()
    assert locked_tasks.unique.enqueue(key).id == doomed.id  # its lease is not over yet
    wait_until(lambda: not distlock(f"unique:{key}").locked(), timeout=5)
    fresh = locked_tasks.unique.enqueue(key, seconds=0)
    assert fresh.id != doomed.id
    finished([fresh])
    assert [run["id"] for run in runs(note_client, key)] == [fresh.id]


@pytest.mark.parametrize("task", ["unique", "async_unique"])
def test_a_worker_killed_while_its_run_waits_frees_the_name_one_lease_later(
    workers, note_client, redis_server, key, task
):
    task = getattr(locked_tasks, task)
    client = redis_server.client()
    with distlock(f"unique:{key}", timeout=60):
        doomed = task.enqueue(key)
        wait_until(lambda: lock_waiters(client) == 1)
        doomed.refresh()
        (worker,) = [worker for worker in workers if worker.name in doomed.worker_ids]
        assert task.enqueue(key).id == doomed.id  # waiting: it holds the name
        worker.kill()
        killed_at = time.monotonic()
        # Its claim lasts one lease of the lock (1.5 s) after its last renewal, whether
        # the lock is held or not; until then the dead run is returned.
        while (fresh := task.enqueue(key, seconds=0)).id == doomed.id:
            assert time.monotonic() - killed_at < 1.5 + 0.5, "still refused"
            time.sleep(0.05)
    finished([fresh])
    assert fresh.status == "SUCCESSFUL"
    assert [run["id"] for run in runs(note_client, key)] == [fresh.id]
    client.close()


@pytest.mark.parametrize("status", ["FAILED", "SUCCESSFUL"])
def test_a_claim_whose_result_is_finished_is_dropped_at_the_next_enqueue(note_client, key, status):
    from django_tasks_db.models import DBTaskResult

    # Queued for later, then finished by hand (an operator, or a run that failed before
    # its body ran): its claim is not given back by any run.
    later = timezone.now() + datetime.timedelta(hours=1)
    stuck = locked_tasks.unique.using(run_after=later).enqueue(key)
    DBTaskResult.objects.filter(id=stuck.id).update(status=status, finished_at=timezone.now())
    fresh = locked_tasks.unique.enqueue(key, seconds=0)
    assert fresh.id != stuck.id
    finished([fresh])
    assert fresh.status == "SUCCESSFUL"
    assert [run["id"] for run in runs(note_client, key)] == [fresh.id]


def test_a_deferred_run_hands_its_claim_to_the_task_queued_in_its_place(note_client, key):
    taken, done = threading.Event(), threading.Event()

    def hold():
        with distlock(f"unique-defer:{key}", timeout=30):
            taken.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(5)
    try:
        first = locked_tasks.unique_defer.enqueue(key)
        finished([first])
        assert first.return_value == DEFERRED
        again = locked_tasks.unique_defer.enqueue(key)  # the copy queued in its place
        assert again.id != first.id
        assert again.task.run_after is not None
    finally:
        done.set()
        holder.join()
    # It runs once the holder is gone (deferred again meanwhile if the machine is slow).
    wait_until(lambda: note_client.llen(f"runs:{key}") == 1)
    (run,) = runs(note_client, key)
    assert locked_tasks.unique_defer.get_result(run["id"]).status in ("RUNNING", "SUCCESSFUL")


async def test_aenqueue_is_unique_too(key):
    first = await locked_tasks.unique.aenqueue(key, seconds=0.2)
    second = await locked_tasks.unique.aenqueue(key)
    assert second.id == first.id
    await asyncio.to_thread(finished, [first])
    assert first.status == "SUCCESSFUL"


CLAIM_FAULTS = ("kill a waiting run", "kill a running run", "finish a queued result by hand")


def test_randomized_claim_faults_never_refuse_an_enqueue_past_one_lease(
    workers, note_client, redis_server, key
):
    """Rounds of faults drawn from a seed (``DISTLOCK_TEST_SEED`` replays one): after each,
    the dead or finished owner's claim refuses enqueues (sync or async, drawn too) for at
    most one lease of the lock (1.5 s) plus the polling's slack."""
    seed = int(os.environ.get("DISTLOCK_TEST_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    client = redis_server.client()
    for round_ in range(4):
        fault = rng.choice(CLAIM_FAULTS)
        task = rng.choice([locked_tasks.unique, locked_tasks.async_unique])
        round_key = f"{key}-{round_}"
        where = f"seed {seed}, round {round_}: {fault}"
        holder = distlock(f"unique:{round_key}", timeout=60)
        if fault == "finish a queued result by hand":
            from django_tasks_db.models import DBTaskResult

            later = timezone.now() + datetime.timedelta(hours=1)
            owner = task.using(run_after=later).enqueue(round_key)
            status = rng.choice(["FAILED", "SUCCESSFUL"])
            DBTaskResult.objects.filter(id=owner.id).update(
                status=status, finished_at=timezone.now()
            )
        else:
            if fault == "kill a waiting run":
                holder.acquire()
                owner = task.enqueue(round_key, seconds=30)
                wait_until(lambda: lock_waiters(client) == 1)
            else:
                owner = task.enqueue(round_key, seconds=30)
                wait_until(lambda key=round_key: note_client.get(f"running:{key}") == "1")
            owner.refresh()
            (worker,) = [worker for worker in workers if worker.name in owner.worker_ids]
            assert task.enqueue(round_key).id == owner.id, where
            time.sleep(rng.uniform(0, 0.5))
            worker.kill()
        ended = time.monotonic()
        release_after = rng.uniform(0, 2.5)
        while True:
            if holder.held and time.monotonic() - ended > release_after:
                holder.release()
            if rng.random() < 0.5:
                fresh = task.enqueue(round_key, seconds=0)
            else:
                fresh = async_to_sync(task.aenqueue)(round_key, seconds=0)
            if fresh.id != owner.id:
                break
            assert time.monotonic() - ended < 1.5 + 0.5, f"{where}: still refused"
            time.sleep(0.05)
        if holder.held:
            holder.release()
        for worker in workers:
            if worker.process.poll() is not None:
                worker.start()
        finished([fresh])
        assert fresh.status == "SUCCESSFUL", where
    client.close()
