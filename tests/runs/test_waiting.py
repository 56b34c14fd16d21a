"""The claims of runs waiting for their lock, kept alive by their worker's thread while
the wait lasts, and not a lease longer."""

from __future__ import annotations

import time

import pytest

from django_distlock.engine import Backend, LockKeys
from django_distlock.runs.claims import TaskClaims
from django_distlock.runs.waiting import start_waiting, stop_waiting, waiting

NAME = "import:7"


@pytest.fixture
def backend(redis_client):
    backend = Backend(redis_client)
    yield backend
    backend.close()


def claim_of(redis_client, name: str = NAME) -> bytes | None:
    return redis_client.get(LockKeys.for_name("distlock:", name).beside("tasks-claim"))


def test_a_waiting_claim_is_renewed_while_the_wait_lasts_and_lapses_a_lease_after(
    backend, redis_client
):
    claims = TaskClaims(backend, NAME, "a", namespace="tasks")
    with waiting(claims, 0.3):
        time.sleep(1.0)  # more than three leases
        assert claim_of(redis_client) == b"w:a"
    time.sleep(0.4)
    assert claim_of(redis_client) is None


def test_several_waits_are_kept_at_once_and_another_tasks_claim_is_left_alone(
    backend, redis_client
):
    first = start_waiting(TaskClaims(backend, NAME, "a", namespace="tasks"), 0.3)
    second = start_waiting(TaskClaims(backend, "import:8", "b", namespace="tasks"), 0.6)
    assert start_waiting(TaskClaims(backend, NAME, "c", namespace="tasks"), 0.3) is None
    time.sleep(1.0)
    assert claim_of(redis_client) == b"w:a"
    assert claim_of(redis_client, "import:8") == b"w:b"
    stop_waiting(first)
    stop_waiting(second)
    stop_waiting(None)
    time.sleep(0.7)
    assert claim_of(redis_client) is None
    assert claim_of(redis_client, "import:8") is None
