"""Real ``celery worker`` and ``celery beat`` processes running
:mod:`tests.support.celery_app` against the suite's Redis server.

Each is a :class:`~tests.support.logged_processes.LoggedProcess`: its own process group
(a prefork worker's pool children too), its output in a log file, started once that log
says so::

    with CeleryProcess.worker("solo", log_dir=tmp_path) as worker:
        ...
        worker.kill()  # SIGKILL the whole group, as a crash would

Processes still running at interpreter exit are killed.

The app keeps its state in databases of the suite's server besides database 0, where the
locks live: the broker in :data:`BROKER_DB`, results in :data:`RESULTS_DB`, and the test
tasks' notes of their runs in :data:`NOTES_DB`. Celery-free, so that conftest files can
use it before the server's URL is known to the app.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from tests.support.logged_processes import LoggedProcess

BROKER_DB = 1
RESULTS_DB = 2
NOTES_DB = 3
BEAT_INTERVAL = 0.4
"""Seconds between two sends of the beat schedule ``DISTLOCK_TEST_CELERY_BEAT`` enables."""
VISIBILITY_ENV_VAR = "DISTLOCK_TEST_CELERY_VISIBILITY"
BEAT_ENV_VAR = "DISTLOCK_TEST_CELERY_BEAT"
DEFAULT_APP = "tests.support.celery_app"


def database_url(server_url: str, db: int) -> str:
    """``server_url`` (``redis://host:port/0``) pointed at database ``db``."""
    return (
        f"{server_url.rsplit('/', 1)[0]}/{db}" if server_url.startswith("redis://") else server_url
    )


class CeleryProcess(LoggedProcess):
    """A ``python -m celery -A APP ARGS`` process of ours (``APP``:
    :mod:`tests.support.celery_app` unless said)."""

    def __init__(
        self,
        args: list[str],
        *,
        ready: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        app: str = DEFAULT_APP,
    ) -> None:
        super().__init__(
            [sys.executable, "-m", "celery", "-A", app, *args],
            ready=ready,
            log_path=log_path,
            env=env,
        )
        self.args = args
        self.app = app

    def __repr__(self) -> str:
        return f"<celery {self.args[0]}>"

    @classmethod
    def worker(
        cls,
        pool: str,
        *,
        log_dir: Path,
        name: str,
        concurrency: int = 1,
        queues: str = "celery",
        env: Mapping[str, str] | None = None,
        app: str = DEFAULT_APP,
    ) -> CeleryProcess:
        """A worker ``name`` with ``--pool=pool`` consuming ``queues``."""
        args = [
            "worker",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            f"--hostname={name}@%h",
            f"--queues={queues}",
            "--loglevel=INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        return cls(args, ready=" ready.", log_path=log_dir / f"{name}.log", env=env, app=app)

    @classmethod
    def beat(cls, *, log_dir: Path, env: Mapping[str, str] | None = None) -> CeleryProcess:
        """``celery beat`` with a schedule file in ``log_dir``."""
        args = [
            "beat",
            f"--schedule={log_dir / 'beat-schedule'}",
            "--pidfile=",
            "--loglevel=INFO",
        ]
        return cls(args, ready="beat: Starting", log_path=log_dir / "beat.log", env=env)
