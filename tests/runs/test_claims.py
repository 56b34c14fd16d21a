"""The Redis side of ``unique_while_queued``: claims, done records and put-back copies,
script by script, on one server and on a Redis Cluster."""

from __future__ import annotations

import time

import pytest
import redis

from django_distlock.engine import Backend, LockKeys
from django_distlock.runs.claims import TaskClaims
from tests.support.engine import close_backend

NAME = "import:42"


@pytest.fixture
def backend(redis_client):
    backend = Backend(redis_client)
    yield backend
    backend.close()


def claims(backend: Backend, task_id: str, name: str = NAME) -> TaskClaims:
    return TaskClaims(backend, name, task_id)


def keys(name: str = NAME) -> LockKeys:
    return LockKeys.for_name("distlock:", name)


def hold_lock(client: redis.Redis, task_id: str, name: str = NAME, lease_ms: int = 5000) -> None:
    """Write the lock key as a run of ``task_id`` holding it would."""
    owner = (
        '{"host":"h","pid":1,"thread":"MainThread",'
        f'"context":"celery:tasks.x[{task_id}]","auto_renew":true}}'
    )
    client.set(keys(name).lock, f"tok\n1\n1\n{lease_ms}\n{owner}", px=lease_ms)


def test_the_first_task_takes_the_claim_and_others_are_told_who_holds_it(backend, redis_client):
    assert claims(backend, "a").take(60) is None
    assert claims(backend, "b").take(60) == "a"
    assert redis_client.get(keys().beside("celery-claim")) == b"q:a"
    assert 59_000 < redis_client.pttl(keys().beside("celery-claim")) <= 60_000


def test_the_same_task_may_claim_again_and_never_shortens_its_claim(backend, redis_client):
    first = claims(backend, "a")
    assert first.take(60) is None
    assert first.take(600) is None  # a retry with a countdown: the claim lasts longer
    assert 599_000 < redis_client.pttl(keys().beside("celery-claim")) <= 600_000
    assert first.take(1) is None
    assert redis_client.pttl(keys().beside("celery-claim")) > 599_000


def test_an_expired_queued_claim_frees_the_name(backend):
    assert claims(backend, "a").take(0.05) is None
    time.sleep(0.1)
    assert claims(backend, "b").take(60) is None


def test_a_running_claim_holds_while_the_lock_is_held_and_frees_when_it_is_gone(
    backend, redis_client
):
    run = claims(backend, "a")
    assert run.take(60) is None
    hold_lock(redis_client, "a")
    assert run.start(60)
    assert redis_client.get(keys().beside("celery-claim")) == b"r:a"
    assert claims(backend, "b").take(60) == "a"
    # A worker killed mid-run: its lock's lease ends, and the name is free again.
    redis_client.delete(keys().lock)
    assert claims(backend, "b").take(60) is None


def test_a_waiting_claim_lasts_one_lease_unless_its_worker_renews_it(backend, redis_client):
    run = claims(backend, "a")
    assert run.take(60) is None
    assert run.wait(0.2)
    claim = keys().beside("celery-claim")
    assert redis_client.get(claim) == b"w:a"
    assert 0 < redis_client.pttl(claim) <= 200
    # The lock is free (between two holders), yet the waiting run holds the name.
    assert claims(backend, "b").take(60) == "a"
    time.sleep(0.15)
    assert run.still_waiting(0.2)
    time.sleep(0.15)
    assert claims(backend, "b").take(60) == "a"
    time.sleep(0.1)  # not renewed for a lease: a killed worker's claim is gone
    assert not run.still_waiting(0.2)
    assert claims(backend, "b").take(60) is None
    assert not run.wait(0.2)  # another task's claim is left alone
    assert redis_client.get(claim) == b"q:b"


def test_a_waiting_claim_turns_running_or_queued_again(backend, redis_client):
    run = claims(backend, "a")
    claim = keys().beside("celery-claim")
    assert run.wait(5)
    assert run.take(60) is None  # a retry of the waiting run: queued again
    assert redis_client.get(claim) == b"q:a"
    assert 59_000 < redis_client.pttl(claim) <= 60_000
    assert not run.still_waiting(5)  # renewing it no more
    assert redis_client.get(claim) == b"q:a"
    assert run.wait(5)
    hold_lock(redis_client, "a")
    assert run.start(60)  # it got the lock
    assert redis_client.get(claim) == b"r:a"


def test_a_parked_copy_is_served_early_once_or_runs_at_its_time(backend, redis_client):
    deferral = keys().beside("celery-deferral")
    late = claims(backend, "a:2")
    late.park(60)
    assert redis_client.hget(deferral, "a:2") == b"p"
    other = claims(backend, "b:1")
    other.park(1)
    assert redis_client.pttl(deferral) > 59_000  # parking never shortens the record
    assert late.serve_early()  # the lock was released: an early copy is queued
    assert not late.serve_early()  # once
    assert late.take_parked() == "s"  # its time came: it must not run
    assert redis_client.hget(deferral, "a:2") is None
    # Run at its time before being served: no early copy is queued for it.
    assert other.take_parked() == "p"
    assert not other.serve_early()
    assert other.take_parked() == ""  # never parked (or already run)
    # An early copy that could not be queued: the parked copy runs at its time after all.
    third = claims(backend, "c:1")
    third.park(1)
    assert third.serve_early()
    third.unserve()
    assert third.take_parked() == "p"
    assert not redis_client.exists(deferral)  # nothing parked is left


def test_a_run_does_not_start_twice(backend, redis_client):
    run = claims(backend, "a")
    hold_lock(redis_client, "a")
    assert run.start(60)
    run.finish(requeued=False, lasts=60)
    assert not run.start(60)  # a copy of its message, delivered again
    assert claims(backend, "b").start(60)


def test_a_run_does_not_take_a_claim_queued_by_another_task(backend, redis_client):
    assert claims(backend, "b").take(60) is None  # taken after a's claim expired
    assert claims(backend, "a").start(60)
    assert redis_client.get(keys().beside("celery-claim")) == b"q:b"
    claims(backend, "a").finish(requeued=False, lasts=60)
    assert redis_client.get(keys().beside("celery-claim")) == b"q:b"


def test_a_run_replaces_the_running_claim_of_a_run_that_died(backend, redis_client):
    assert claims(backend, "dead").start(60)
    assert claims(backend, "a").start(60)
    assert redis_client.get(keys().beside("celery-claim")) == b"r:a"


def test_finishing_gives_back_only_its_own_claim_and_remembers_the_task(backend, redis_client):
    run = claims(backend, "a")
    assert run.start(60)
    run.finish(requeued=False, lasts=60)
    assert not redis_client.exists(keys().beside("celery-claim"))
    done = keys().beside("celery-done")
    assert redis_client.zrange(done, 0, -1) == [b"a"]
    assert 59_000 < redis_client.pttl(done) <= 60_001


def test_done_records_are_forgotten_after_their_time(backend, redis_client):
    claims(backend, "a").finish(requeued=False, lasts=0.05)
    time.sleep(0.1)
    claims(backend, "b").finish(requeued=False, lasts=60)
    assert redis_client.zrange(keys().beside("celery-done"), 0, -1) == [b"b"]
    assert claims(backend, "a").start(60)


def test_a_retried_run_is_queued_again(backend, redis_client):
    run = claims(backend, "a")
    assert run.start(60)
    run.finish(requeued=True, lasts=120)
    assert redis_client.get(keys().beside("celery-claim")) == b"q:a"
    assert 119_000 < redis_client.pttl(keys().beside("celery-claim")) <= 120_000
    assert not redis_client.exists(keys().beside("celery-done"))
    assert run.start(60)  # the retry runs


def test_forget_gives_back_a_claim_whose_message_was_not_published(backend, redis_client):
    assert claims(backend, "a").take(60) is None
    claims(backend, "b").forget()
    assert redis_client.get(keys().beside("celery-claim")) == b"q:a"
    claims(backend, "a").forget()
    assert not redis_client.exists(keys().beside("celery-claim"))


def test_one_copy_at_a_time_is_put_back(backend):
    assert claims(backend, "a").defer_once(0.05)
    assert not claims(backend, "a").defer_once(0.05)
    time.sleep(0.1)
    assert claims(backend, "a").defer_once(0.05)


def test_a_run_holding_the_lock_is_recognised_by_its_task_id(backend, redis_client):
    assert not claims(backend, "a").held_by_a_run()
    hold_lock(redis_client, "a")
    assert claims(backend, "a").held_by_a_run()
    assert not claims(backend, "b").held_by_a_run()
    assert not claims(backend, "a]").held_by_a_run()


async def test_every_script_runs_on_a_cluster(cluster_setup):
    """Each script's keys share the lock's slot: no CROSSSLOT, whichever node serves it."""
    cluster_setup.flushall()
    backend = Backend(cluster=cluster_setup.urls)
    try:
        for name in ("import:1", "import:2", "report:{day}", "x"):
            run = TaskClaims(backend, name, "a")
            assert run.take(60) is None
            assert TaskClaims(backend, name, "b").take(60) == "a"
            assert not run.held_by_a_run()
            assert run.wait(1)
            assert run.still_waiting(1)
            run.park(1)
            assert run.serve_early()
            assert run.take_parked() == "s"
            assert run.start(60)
            assert run.defer_once(1)
            run.finish(requeued=False, lasts=60)
            assert not run.start(60)
            run.forget()
    finally:
        await close_backend(backend)


def test_pass_to_hands_the_claim_over_only_while_it_is_still_the_givers(backend, redis_client):
    assert claims(backend, "pending:1").take(30) is None
    assert claims(backend, "pending:1").pass_to("r1", 60)
    assert redis_client.get(keys().beside("celery-claim")) == b"q:r1"
    assert 59_000 < redis_client.pttl(keys().beside("celery-claim")) <= 60_000
    assert claims(backend, "b").take(60) == "r1"
    # No longer the placeholder's (handed over, or expired and taken by another): untouched.
    assert not claims(backend, "pending:1").pass_to("r2", 60)
    assert redis_client.get(keys().beside("celery-claim")) == b"q:r1"
    assert not claims(backend, "nobody", name="free:1").pass_to("r3", 60)
    assert redis_client.get(keys("free:1").beside("celery-claim")) is None


def test_each_integration_has_claims_of_its_own(backend, redis_client):
    tasks = TaskClaims(backend, NAME, "a", namespace="tasks")
    assert tasks.take(60) is None
    assert claims(backend, "b").take(60) is None  # Celery's claim on the same name
    assert redis_client.get(keys().beside("tasks-claim")) == b"q:a"
    assert redis_client.get(keys().beside("celery-claim")) == b"q:b"
