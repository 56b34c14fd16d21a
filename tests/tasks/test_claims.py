"""``unique_while_queued`` without workers: what the claim on a lock name holds in Redis,
how long, and what becomes of it when the queued task is lost."""

from __future__ import annotations

import pytest

from django_distlock.engine import LockKeys
from django_distlock.locks import distlock
from tests.support import locked_tasks
from tests.support.tasks_router import TASKS_ALIAS

pytestmark = pytest.mark.django_db(databases=["default", TASKS_ALIAS], transaction=True)


def claim_key(name):
    backend = distlock(name).backend
    return LockKeys.for_name(backend.prefix, name).beside("tasks-claim")


def test_the_claim_names_the_queued_result_and_lasts_unique_timeout(redis_client, key):
    result = locked_tasks.unique.enqueue(key)
    name = f"unique:{key}"
    assert redis_client.get(claim_key(name)) == f"q:{result.id}".encode()
    assert 3590_000 < redis_client.pttl(claim_key(name)) <= 3600_000
    assert locked_tasks.unique.enqueue(key).id == result.id


def test_a_claim_whose_task_was_lost_is_dropped(redis_client, key):
    from django_tasks_db.models import DBTaskResult

    lost = locked_tasks.unique.enqueue(key)
    DBTaskResult.objects.filter(id=lost.id).delete()
    fresh = locked_tasks.unique.enqueue(key)
    assert fresh.id != lost.id
    assert redis_client.get(claim_key(f"unique:{key}")) == f"q:{fresh.id}".encode()


def test_an_enqueue_that_fails_gives_the_claim_back(redis_client, key):
    with pytest.raises(TypeError):
        locked_tasks.unique.enqueue(key, seconds=object())  # not JSON
    assert redis_client.get(claim_key(f"unique:{key}")) is None


def test_a_run_leaves_no_claim_behind(redis_client, key):
    result = locked_tasks.unique.using(backend="default").enqueue(key, seconds=0)
    assert result.status == "SUCCESSFUL"
    name = f"unique:{key}"
    backend = distlock(name).backend
    keys = LockKeys.for_name(backend.prefix, name)
    assert redis_client.exists(keys.beside("tasks-claim"), keys.beside("tasks-done")) == 0
