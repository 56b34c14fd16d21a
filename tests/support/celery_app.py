"""The Celery app of the tests in ``tests/celery/``, and the locked tasks they run.

Broker and result backend are the suite's own Redis server (``DISTLOCK_TEST_REDIS_URL``,
set by ``tests/conftest.py`` in ``pytest_configure``: conftest files must not import this
module, which reads it when imported), in databases of their own:
:data:`BROKER_DB` and :data:`RESULTS_DB`. The locks live in database 0 (``CACHES`` of
``tests.settings``), and the tasks note what they did in :data:`NOTES_DB`, so a test can
check that database 0 holds nothing but keys under the lock prefix.

A worker process runs it with ``DJANGO_SETTINGS_MODULE=tests.settings`` (Celery's Django
fixup sets Django up)::

    python -m celery -A tests.support.celery_app worker --pool=solo

Environment variables change the app for one process:
``DISTLOCK_TEST_CELERY_VISIBILITY`` (the broker's ``visibility_timeout``, seconds, with
an unacknowledged message restored that often) and ``DISTLOCK_TEST_CELERY_BEAT`` (``KEY``:
``celery beat`` sends :func:`beat_tick` for ``KEY`` every :data:`BEAT_INTERVAL` seconds).

Each task notes its runs in ``NOTES_DB``: ``runs:KEY`` (a list of JSON objects: task id,
pid, start and end time), ``running:KEY`` (how many run right now) and
``overlaps:KEY`` (one entry per run that started while another was running).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, current_task
from celery.signals import task_retry

from django_distlock.celery import LockedTask, locked_task
from tests.settings import REDIS_URL_ENV_VAR, UNSET_REDIS_URL
from tests.support.celery_workers import (
    BEAT_ENV_VAR,
    BEAT_INTERVAL,
    BROKER_DB,
    NOTES_DB,
    RESULTS_DB,
    VISIBILITY_ENV_VAR,
    database_url,
)


def server_url(db: int) -> str:
    """The suite's server, database ``db``."""
    return database_url(os.environ.get(REDIS_URL_ENV_VAR, UNSET_REDIS_URL), db)


app = Celery("distlock_tests")
app.conf.update(
    broker_url=server_url(BROKER_DB),
    result_backend=server_url(RESULTS_DB),
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_expires=600,
)
if os.environ.get(VISIBILITY_ENV_VAR):
    app.conf.broker_transport_options = {
        "visibility_timeout": float(os.environ[VISIBILITY_ENV_VAR]),
        "unacked_restore_interval": 0.2,
        "unacked_restore_throttle": 1,
    }
if os.environ.get(BEAT_ENV_VAR):
    app.conf.beat_schedule = {
        "overlapping": {
            "task": "tests.support.celery_app.beat_tick",
            "schedule": BEAT_INTERVAL,
            "args": (os.environ[BEAT_ENV_VAR],),
        }
    }


def notes() -> redis.Redis:
    """A client of the database where tasks note their runs."""
    return redis.Redis.from_url(server_url(NOTES_DB), decode_responses=True)


def _body(key: str, seconds: float) -> dict[str, Any]:
    """What every test task does: note that it runs, sleep, note that it ran."""
    client = notes()
    started = time.time()
    if client.incr(f"running:{key}") > 1:
        client.rpush(f"overlaps:{key}", started)
    try:
        time.sleep(seconds)
    finally:
        client.decr(f"running:{key}")
    request = current_task.request
    lock = getattr(request, "distlock", None)
    run = {
        "id": request.id,
        "pid": os.getpid(),
        "started": started,
        "ended": time.time(),
        "retries": request.retries,
        "fence": None if lock is None else lock.fence,
    }
    client.rpush(f"runs:{key}", json.dumps(run))
    client.close()
    return run


@app.task
@locked_task("storm:{key}", on_busy="wait", timeout=5)
def wait_in_turn(key: str, seconds: float = 0.05) -> dict[str, Any]:
    """Waits for the lock as long as it takes (a storm of these runs one at a time)."""
    return _body(key, seconds)


@app.task
@locked_task("skip:{key}", on_busy="skip")
def skip_if_busy(key: str, seconds: float = 0.0) -> dict[str, Any]:
    """Skipped while another holds the lock."""
    return _body(key, seconds)


@app.task(bind=True, max_retries=10)
@locked_task("retry:{key}", on_busy="retry")
def retry_if_busy(self: Any, key: str, seconds: float = 0.0) -> dict[str, Any]:
    """Retried after the holder's remaining lease (``bind=True`` on purpose)."""
    return _body(key, seconds)


@app.task(max_retries=10)
@locked_task("retry:{key}", on_busy="retry", max_retry_countdown=0.5)
def retry_capped(key: str, seconds: float = 0.0) -> dict[str, Any]:
    """Retried at most 0.5 s later, whatever the holder's lease."""
    return _body(key, seconds)


@app.task(max_retries=None)
@locked_task("need:{key}", on_busy="retry", max_retry_countdown=3)
def retry_by_need(key: str, seconds: float = 0.0) -> dict[str, Any]:
    """Retried as soon as the holder lets go, 3 s later at most."""
    return _body(key, seconds)


@app.task(max_retries=1)
@locked_task("retry:{key}", on_busy="retry", max_retry_countdown=0.2)
def retry_once(key: str) -> dict[str, Any]:
    """Retried once, then a failure."""
    return _body(key, 0.0)


@app.task
@locked_task("wait:{key}", on_busy="wait", blocking_timeout=0.5)
def wait_briefly(key: str, seconds: float = 0.0) -> dict[str, Any]:
    """Waits up to 0.5 s for the lock, then fails."""
    return _body(key, seconds)


@app.task
@locked_task("same:{account_id}", on_busy="skip")
def same_lock(account_id: int, key: str, seconds: float = 0.0) -> dict[str, Any]:
    """``same_lock(1, ...)`` and ``same_lock(account_id=1, ...)`` share one lock."""
    return _body(key, seconds)


@app.task(acks_late=True)
@locked_task("killed:{key}", on_busy="wait", timeout=1.5)
def survive_a_kill(key: str, seconds: float = 0.0) -> dict[str, Any]:
    """A short lease, so that a killed worker's lock frees soon; only the first attempt
    lasts ``seconds`` (the worker is killed during it)."""
    first = notes().incr(f"attempts:{key}") == 1
    return _body(key, seconds if first else 0.0)


@app.task(base=LockedTask, acks_late=True)
@locked_task("unique:{key}", on_busy="skip", unique_while_queued=True, timeout=2)
def unique(key: str, seconds: float = 0.0) -> dict[str, Any]:
    """Never queued twice for one key; a redelivered copy never runs it again."""
    return _body(key, seconds)


@app.task(base=LockedTask)
@locked_task("unique-wait:{key}", on_busy="wait", unique_while_queued=True, timeout=1.5)
def unique_wait(key: str, seconds: float = 0.0) -> dict[str, Any]:
    """Never queued twice for one key, and waits for its lock as long as it takes."""
    return _body(key, seconds)


class UniqueByClass(LockedTask):
    """The same as :func:`unique`, configured by class attributes."""

    name = "tests.support.celery_app.unique_by_class"
    acks_late = True
    lock_name = "unique:{key}"
    lock_on_busy = "retry"
    lock_unique_while_queued = True
    lock_timeout = 2

    def run(self, key: str, seconds: float = 0.0) -> dict[str, Any]:
        return _body(key, seconds)


unique_by_class = app.register_task(UniqueByClass())


@app.task
@locked_task("beat:{key}", on_busy="skip")
def beat_tick(key: str, seconds: float = 1.0) -> dict[str, Any]:
    """Sent by beat more often than it takes to run."""
    return _body(key, seconds)


@task_retry.connect
def _note_retry(request: Any = None, reason: Any = None, **kwargs: Any) -> None:
    """Note every retry's countdown (``Retry.when``) in ``retries:<task id>``."""
    client = notes()
    client.rpush(f"retries:{request.id}", json.dumps({"when": reason.when, "at": time.time()}))
    client.close()
