"""Real ``manage.py db_worker`` processes (django-tasks-db) running the tasks of
:mod:`tests.support.locked_tasks` against the suite's Redis and the ``tasks`` database
(:class:`~tests.support.logged_processes.LoggedProcess`: a process group, a log file,
killed at exit if still running)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.logged_processes import LoggedProcess


class TaskWorker(LoggedProcess):
    """``python -m django db_worker --backend db`` with the ``tasks`` database at
    ``database`` (the test database's file)."""

    def __init__(self, *, name: str, log_dir: Path, database: str, interval: float = 0.02) -> None:
        super().__init__(
            [
                sys.executable,
                "-m",
                "django",
                "db_worker",
                "--backend=db",
                f"--interval={interval}",
                "--no-startup-delay",
                "--no-reload",
                f"--worker-id={name}",
            ],
            ready="Starting worker",
            log_path=log_dir / f"{name}.log",
            env={"DISTLOCK_TEST_TASKS_DB": database},
        )
        self.name = name

    def __repr__(self) -> str:
        return f"<db_worker {self.name}>"
