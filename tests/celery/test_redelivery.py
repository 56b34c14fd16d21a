"""What the broker does behind a task's back: ``unique_while_queued`` refusing a second
publish, messages delivered again after a short ``visibility_timeout`` (``acks_late``)
while their first run still runs, and a worker SIGKILLed in the middle of a run.

The workers here (a prefork pool of two and a solo worker) restore an unacknowledged
message after one second (``visibility_timeout=1``), so every run longer than that is
delivered a second time.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from django_distlock import distlock
from django_distlock.engine import LockKeys
from tests.support import celery_app as tasks
from tests.support.celery_workers import BROKER_DB, VISIBILITY_ENV_VAR, CeleryProcess, database_url
from tests.support.engine import lock_waiters, wait_until

RESULT_TIMEOUT = 30
VISIBILITY = {VISIBILITY_ENV_VAR: "1"}


@pytest.fixture(scope="module")
def workers(celery_processes) -> list[CeleryProcess]:
    return [
        celery_processes(
            CeleryProcess.worker, "prefork", name="prefork", concurrency=2, env=VISIBILITY
        ),
        celery_processes(CeleryProcess.worker, "solo", name="solo", env=VISIBILITY),
    ]


@pytest.fixture
def locks(redis_server) -> redis.Redis:
    """Database 0 of the suite's server, where the locks (and claims) live."""
    client = redis_server.client()
    yield client
    client.close()


def runs_of(note_client, key: str) -> list[dict[str, Any]]:
    return [json.loads(run) for run in note_client.lrange(f"runs:{key}", 0, -1)]


def claim_key(name: str) -> str:
    return LockKeys.for_name("distlock:", name).beside("celery-claim")


def broker_is_idle(redis_server) -> bool:
    """No message queued, held for a countdown or unacknowledged."""
    with redis.Redis.from_url(database_url(redis_server.url, BROKER_DB)) as broker:
        return not broker.llen("celery") and not broker.hlen("unacked")


@pytest.mark.parametrize("task", [tasks.unique, tasks.unique_by_class], ids=["decorator", "class"])
def test_a_task_queued_or_running_is_not_published_twice(task, workers, note_client, locks, key):
    first = task.delay(key, 1.0)
    assert task.delay(key, 1.0).id == first.id
    wait_until(lambda: note_client.get(f"running:{key}") == "1")
    # Running now: refused too, however the arguments are spelled (the name is the same).
    assert task.apply_async(kwargs={"key": key}).id == first.id
    other = task.delay(f"{key}-other")
    assert other.id != first.id
    assert locks.get(claim_key(f"unique:{key}")) == f"r:{first.id}".encode()

    assert first.get(timeout=RESULT_TIMEOUT)["id"] == first.id
    assert other.get(timeout=RESULT_TIMEOUT)["id"] == other.id
    assert not locks.exists(claim_key(f"unique:{key}"))  # its run gave the name back
    again = task.delay(key)
    assert again.id != first.id
    assert again.get(timeout=RESULT_TIMEOUT)["id"] == again.id
    assert [run["id"] for run in runs_of(note_client, key)] == [first.id, again.id]


def test_a_revoked_task_gives_its_claim_back_when_a_worker_discards_it(workers, locks, key):
    result = tasks.unique.apply_async((key,), countdown=1.5)
    claim = claim_key(f"unique:{key}")
    assert locks.get(claim) == f"q:{result.id}".encode()
    result.revoke()
    wait_until(lambda: not locks.exists(claim), timeout=10)
    again = tasks.unique.delay(key)
    assert again.id != result.id
    assert again.get(timeout=RESULT_TIMEOUT)["id"] == again.id
    assert result.state == "REVOKED"


def test_a_copy_delivered_again_while_the_run_runs_never_runs_the_body_twice(
    workers, note_client, redis_server, key
):
    result = tasks.unique.delay(key, 3.0)
    value = result.get(timeout=RESULT_TIMEOUT)
    wait_until(lambda: broker_is_idle(redis_server), timeout=15)
    logs = "".join(worker.log() for worker in workers)
    label = f"tests.support.celery_app.unique[{result.id}]"
    # The broker did deliver it again (more than once: every second while it ran): the
    # first copy was put back, later ones dropped (whether a put-back copy comes after
    # the run's end depends on the timing, so a late copy is sent below).
    assert f"{label} is already running (its message was delivered again)" in logs
    # A copy delivered once the run is over is dropped, its body not run.
    tasks.unique.apply_async((key, 3.0), task_id=result.id)
    wait_until(
        lambda: any(
            f"{label} already ran: this copy of its message is dropped" in worker.log()
            for worker in workers
        ),
        timeout=15,
    )
    wait_until(lambda: broker_is_idle(redis_server), timeout=15)
    runs = runs_of(note_client, key)
    assert [run["id"] for run in runs] == [result.id]
    assert note_client.lrange(f"overlaps:{key}", 0, -1) == []
    assert result.get() == value  # no copy overwrote the run's result
    assert result.state == "SUCCESS"


def test_a_killed_worker_frees_the_lock_at_its_lease_end_and_another_worker_runs_it(
    celery_processes, note_client, locks, key
):
    queue = f"kill-{key}"
    victim = celery_processes(
        CeleryProcess.worker, "solo", name=f"victim-{key}", queues=queue, env=VISIBILITY
    )
    result = tasks.survive_a_kill.apply_async((key, 60.0), queue=queue)
    wait_until(lambda: note_client.get(f"running:{key}") == "1", timeout=15)
    lock = LockKeys.for_name("distlock:", f"killed:{key}").lock
    assert 0 < locks.pttl(lock) <= 1500
    victim.kill()
    killed_at = time.time()
    # Nobody releases it: it frees when the lease (1.5 s, renewed every 0.5 s) runs out.
    wait_until(lambda: not locks.exists(lock), timeout=3)
    freed_at = time.time()
    assert freed_at - killed_at <= 1.5 + 0.1

    rescuer = celery_processes(
        CeleryProcess.worker, "solo", name=f"rescuer-{key}", queues=queue, env=VISIBILITY
    )
    value = result.get(timeout=RESULT_TIMEOUT)  # the message was not acknowledged
    assert value["pid"] == rescuer.pid
    assert value["started"] >= freed_at
    assert note_client.get(f"attempts:{key}") == "2"


def test_a_worker_killed_while_its_run_waits_frees_the_name_one_lease_later(
    workers, celery_processes, note_client, locks, key
):
    queue = f"wait-{key}"
    victim = celery_processes(CeleryProcess.worker, "solo", name=f"waiter-{key}", queues=queue)
    with distlock(f"unique-wait:{key}", timeout=60):
        doomed = tasks.unique_wait.apply_async((key,), queue=queue)
        wait_until(lambda: lock_waiters(locks) == 1, timeout=15)
        assert tasks.unique_wait.delay(key).id == doomed.id  # waiting: it holds the name
        victim.kill()
        killed_at = time.monotonic()
        # Its claim lasts one lease of the lock (1.5 s) after its last renewal, whether
        # the lock is held or not; until then the dead run's id is returned.
        while (fresh := tasks.unique_wait.delay(key)).id == doomed.id:
            assert time.monotonic() - killed_at < 1.5 + 0.5, "still refused"
            time.sleep(0.05)
    assert fresh.get(timeout=RESULT_TIMEOUT)["id"] == fresh.id
    assert [run["id"] for run in runs_of(note_client, key)] == [fresh.id]


def test_every_key_written_is_under_the_prefix(workers, locks):
    """Locks, claims and done records, after everything above: nothing outside the
    prefix in the locks' database."""
    keys = [key.decode() for key in locks.scan_iter(count=1000)]
    assert any(":celery-done:" in key for key in keys)
    assert all(key.startswith("distlock:") for key in keys), keys
