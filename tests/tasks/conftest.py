"""Fixtures of the tests of Django's tasks integration: the notes database, a key of the
test's own, and real ``db_worker`` processes (stopped at the end of the module that
started them)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.support.celery_workers import database_url
from tests.support.locked_tasks import NOTES_DB
from tests.support.redis_servers import RedisServer
from tests.support.task_workers import TaskWorker


@pytest.fixture
def note_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """The database where the test tasks note their runs."""
    client = redis.Redis.from_url(database_url(redis_server.url, NOTES_DB), decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def key() -> str:
    """A key of this test's own, for the tasks' lock names and notes."""
    return uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def task_workers(
    tmp_path_factory: pytest.TempPathFactory, django_db_setup: None
) -> Iterator[Callable[[str], TaskWorker]]:
    """``start("w1")``: a started ``db_worker`` on the ``tasks`` test database; every one
    is stopped at the end of the module."""
    from django.db import connections

    log_dir = tmp_path_factory.mktemp("db_workers")
    database = connections["tasks"].settings_dict["NAME"]
    started: list[TaskWorker] = []

    def start(name: str) -> TaskWorker:
        worker = TaskWorker(name=name, log_dir=log_dir, database=database)
        started.append(worker)
        return worker.start()

    yield start
    for worker in reversed(started):
        worker.stop()
