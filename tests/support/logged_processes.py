"""Processes of ours that the tests start (Celery workers, ``db_worker``\\ s): each in its
own process group, with its output in a log file, counted as started once that log shows
its ``ready`` line; :meth:`LoggedProcess.kill` SIGKILLs the whole group, as a crash would.
Processes still running at interpreter exit are killed."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.support import REPO_ROOT

STARTUP_TIMEOUT = 30.0
STOP_GRACE = 10.0
_live: set[LoggedProcess] = set()


class LoggedProcess:
    """``argv`` run from the repository root with ``DJANGO_SETTINGS_MODULE`` =
    ``tests.settings`` (and ``env`` on top), started once its log shows ``ready``."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        ready: str,
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.ready = ready
        self.log_path = log_path
        self.env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

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
                self.argv,
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
                raise RuntimeError(f"{self} did not start:\n{self.log()[-4000:]}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        """Everything the process wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        """SIGTERM (running work finishes), then SIGKILL after :data:`STOP_GRACE`."""
        if self.process is None or self.process.poll() is not None:
            _live.discard(self)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE)
        self.kill()

    def kill(self) -> None:
        """SIGKILL the process and its children at once, as a crash would."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        _live.discard(self)


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_live):
        process.kill()
