"""Fixtures of the Celery tests: the databases of ``tests.support.celery_app`` emptied for
each module, a client of its notes, a key of the test's own, and real worker processes
(``celery_processes``, stopped at the end of the module that started them)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.support.celery_workers import (
    BROKER_DB,
    NOTES_DB,
    RESULTS_DB,
    CeleryProcess,
    database_url,
)
from tests.support.redis_servers import RedisServer


@pytest.fixture(scope="module")
def celery_dbs(redis_server: RedisServer) -> Iterator[None]:
    """The broker, results and notes databases, empty at the start of the module (and
    emptied again at its end, so that no message outlives the workers that would take it),
    and the locks' database 0 at its start."""

    def flush(*dbs: int) -> None:
        for db in dbs:
            with redis.Redis.from_url(database_url(redis_server.url, db)) as client:
                client.flushdb()

    flush(0, BROKER_DB, RESULTS_DB, NOTES_DB)
    yield
    flush(BROKER_DB, RESULTS_DB, NOTES_DB)


@pytest.fixture(scope="module")
def celery_processes(
    celery_dbs: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., CeleryProcess]]:
    """``start(CeleryProcess.worker, "solo", name="w1", ...)``: a started worker (or
    ``CeleryProcess.beat``), logging under the module's temporary directory; every one is
    stopped at the end of the module."""
    log_dir: Path = tmp_path_factory.mktemp("celery")
    started: list[CeleryProcess] = []

    def start(kind: Callable[..., CeleryProcess], *args: object, **kwargs: object) -> CeleryProcess:
        process = kind(*args, log_dir=log_dir, **kwargs)
        started.append(process)
        return process.start()

    yield start
    for process in reversed(started):
        process.stop()


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
