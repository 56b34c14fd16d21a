"""Real ``manage.py db_worker`` processes (django-tasks-db) running the tasks of
:mod:`tests.support.locked_tasks` against the suite's Redis and the ``tasks`` database.

Each runs in its own process group with its output in a log file, and counts as started
once that log says so; :meth:`TaskWorker.kill` SIGKILLs it, as a crash would. Processes
still running at interpreter exit are killed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

from tests.support import REPO_ROOT

STARTUP_TIMEOUT = 30.0
STOP_GRACE = 10.0
_live: set[TaskWorker] = set()


class TaskWorker:
    """``python -m django db_worker --backend db`` with ``DJANGO_SETTINGS_MODULE`` =
    ``tests.settings`` and the ``tasks`` database at ``database`` (the test database's
    file)."""

    def __init__(self, *, name: str, log_dir: Path, database: str, interval: float = 0.02) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.database = database
        self.interval = interval
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(REPO_ROOT),
            "DISTLOCK_TEST_TASKS_DB": self.database,
        }
        args = [
            sys.executable,
            "-m",
            "django",
            "db_worker",
            "--backend=db",
            f"--interval={self.interval}",
            "--no-startup-delay",
            "--no-reload",
            f"--worker-id={self.name}",
        ]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                args,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _live.add(self)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while "Starting worker" not in self.log():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"db_worker {self.name} did not start:\n{self.log()[-4000:]}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        """Everything the process wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """SIGTERM (the running task finishes), then SIGKILL after :data:`STOP_GRACE`."""
        if self.process is None or self.process.poll() is not None:
            _live.discard(self)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the worker at once, as a crash would."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        _live.discard(self)


@atexit.register
def _kill_leftovers() -> None:
    for worker in list(_live):
        worker.kill()
