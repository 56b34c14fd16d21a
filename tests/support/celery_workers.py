"""Real ``celery worker`` and ``celery beat`` processes running
:mod:`tests.support.celery_app` against the suite's Redis server.

Each runs in its own process group (a prefork worker's pool children too), with its
output in a log file, and counts as started once that log says so::

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

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.support import REPO_ROOT

_live: set[CeleryProcess] = set()
STARTUP_TIMEOUT = 30.0
STOP_GRACE = 10.0

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


class CeleryProcess:
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
        self.args = args
        self.app = app
        self.ready = ready
        self.log_path = log_path
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("not started")
        return self.process.pid

    def start(self) -> Self:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(REPO_ROOT),
            **self.env,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", self.app, *self.args],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _live.add(self)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while self.ready not in self.log():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"celery {self.args[0]} did not start:\n{self.log()[-4000:]}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        """Everything the process wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """Warm shutdown (SIGTERM: running tasks finish), then SIGKILL after
        :data:`STOP_GRACE` seconds."""
        if self.process is None or self.process.poll() is not None:
            self._reap()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the process and its pool children at once, as a crash would."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._reap()

    def _reap(self) -> None:
        _live.discard(self)


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_live):
        process.kill()
