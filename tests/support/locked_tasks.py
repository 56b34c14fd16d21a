"""The locked tasks of ``tests/tasks/``, run by real ``db_worker`` processes (backend
``db``: django-tasks-db on the ``tasks`` database) and, through
``.using(backend="default")``, by the ``ImmediateBackend`` in the test process.

Each task notes its runs in :data:`NOTES_DB` of the suite's Redis server: ``runs:KEY`` (a
list of JSON objects: result id, pid, start and end time, fence), ``running:KEY`` (how
many run right now) and ``overlaps:KEY`` (one entry per run that started while another
was running).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import redis

from django_distlock.engine import current_holder
from django_distlock.locks import distlock
from django_distlock.tasks import locked_task
from tests.settings import REDIS_URL_ENV_VAR, TASKS_FRAMEWORK, UNSET_REDIS_URL
from tests.support.celery_workers import database_url

if TASKS_FRAMEWORK == "django.tasks":
    from django.tasks import task  # type: ignore[import-not-found]
else:
    from django_tasks import task

NOTES_DB = 5


def notes() -> redis.Redis:
    """A client of the database where tasks note their runs."""
    url = database_url(os.environ.get(REDIS_URL_ENV_VAR, UNSET_REDIS_URL), NOTES_DB)
    return redis.Redis.from_url(url, decode_responses=True)


def _body(key: str, seconds: float, lock_name: str, result_id: str | None = None) -> dict[str, Any]:
    """Note that it runs (and who holds its lock), sleep, note that it ran."""
    client = notes()
    started = time.time()
    if client.incr(f"running:{key}") > 1:
        client.rpush(f"overlaps:{key}", started)
    holder = current_holder(distlock(lock_name).backend, lock_name)
    try:
        time.sleep(seconds)
    finally:
        client.decr(f"running:{key}")
    run = {
        "id": result_id,
        "pid": os.getpid(),
        "started": started,
        "ended": time.time(),
        "fence": None if holder is None else holder.fence,
        "context": None if holder is None else holder.context,
    }
    client.rpush(f"runs:{key}", json.dumps(run))
    client.close()
    return run


@locked_task("storm:{key}", on_busy="wait", timeout=5)
@task(backend="db", takes_context=True)
def wait_in_turn(context: Any, key: str, seconds: float = 0.02) -> dict[str, Any]:
    """Waits for the lock as long as it takes (a storm of these runs one at a time)."""
    return _body(key, seconds, f"storm:{key}", context.task_result.id)


@locked_task("skip:{key}", on_busy="skip")
@task(backend="db")
def skip_if_busy(key: str, seconds: float = 0.02) -> dict[str, Any]:
    """Skipped while another run holds the lock."""
    return _body(key, seconds, f"skip:{key}")


@locked_task("async:{key}", on_busy="skip")
@task(backend="db")
async def async_skip_if_busy(key: str, seconds: float = 0.02) -> dict[str, Any]:
    """An ``async def`` task, skipped while another run holds the lock: returns who
    holds its lock while it runs."""
    name = f"async:{key}"
    holder = await asyncio.to_thread(current_holder, distlock(name).backend, name)
    await asyncio.sleep(seconds)
    return {"context": holder.context, "fence": holder.fence}


@locked_task("defer:{key}", on_busy="defer", timeout=1)
@task(backend="db", takes_context=True)
def defer_if_busy(context: Any, key: str, seconds: float = 0.02) -> dict[str, Any]:
    """Put off while another run holds the lock (a lease of 1 s: deferred by at most 1 s)."""
    return _body(key, seconds, f"defer:{key}", context.task_result.id)


@locked_task("need:{key}", on_busy="defer", timeout=30)
@task(backend="db", takes_context=True)
def defer_by_need(context: Any, key: str, seconds: float = 0.02) -> dict[str, Any]:
    """Put off while another run holds the lock (a lease of 30 s: queued again once the
    holder lets go, long before the lease would end)."""
    return _body(key, seconds, f"need:{key}", context.task_result.id)


@locked_task("bounded:{key}", on_busy="wait", blocking_timeout=0.3)
@task(backend="db")
def wait_briefly(key: str, seconds: float = 0.02) -> dict[str, Any]:
    """Waits 0.3 s at most, then fails with LockNotAcquired."""
    return _body(key, seconds, f"bounded:{key}")


@locked_task("unique:{key}", on_busy="wait", unique_while_queued=True, timeout=1.5)
@task(backend="db", takes_context=True)
def unique(context: Any, key: str, seconds: float = 0.2) -> dict[str, Any]:
    """Queued once while queued or running."""
    return _body(key, seconds, f"unique:{key}", context.task_result.id)


@locked_task("unique:{key}", on_busy="wait", unique_while_queued=True, timeout=1.5)
@task(backend="db", takes_context=True)
async def async_unique(context: Any, key: str, seconds: float = 0.2) -> dict[str, Any]:
    """:func:`unique` as an ``async def`` task (the same lock name and claim)."""
    return await asyncio.to_thread(_body, key, seconds, f"unique:{key}", context.task_result.id)


@locked_task("unique-defer:{key}", on_busy="defer", unique_while_queued=True, timeout=1)
@task(backend="db", takes_context=True)
def unique_defer(context: Any, key: str, seconds: float = 0.02) -> dict[str, Any]:
    """Put off while the lock is held, the copy queued in its place keeping the claim."""
    return _body(key, seconds, f"unique-defer:{key}", context.task_result.id)


@locked_task("crash:{key}", on_busy="wait", timeout=1.5)
@task(backend="db", takes_context=True)
def crash_prone(context: Any, key: str, seconds: float = 0.02) -> dict[str, Any]:
    """A lease of 1.5 s: a worker killed mid-run frees it 1.5 s later at most."""
    return _body(key, seconds, f"crash:{key}", context.task_result.id)


@task(backend="db")
def unlocked(key: str) -> str:
    """No lock: the benchmark's baseline."""
    return key


@locked_task("bench:{key}", on_busy="wait")
@task(backend="db")
def locked(key: str) -> str:
    """The benchmark's locked task."""
    return key
