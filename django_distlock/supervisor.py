"""Run a program under a lock, the way ``flock(1)`` does: ``manage.py distlock run``.

:class:`LockedProgram` takes the lock, starts the program, passes signals on to it,
stops it if the lock is lost, releases the lock and says what to exit with. It needs an
engine :class:`~django_distlock.engine.Lock` and nothing of Django.

Portability: the package says "Operating System :: OS Independent", so instead of
declaring POSIX this module uses the POSIX parts only where they exist, and imports and
runs everywhere:

- :data:`FORWARDED_SIGNALS` holds only the signals the platform has (Windows has no
  ``SIGHUP`` or ``SIGQUIT``).
- On POSIX the program gets a process group of its own, so that a terminal's Ctrl-C
  reaches it once, through us, rather than twice. ``subprocess``'s ``process_group``
  exists only there; elsewhere the program shares our console, which hands it Ctrl-C
  directly, and a signal the platform cannot send to another process (Windows sends
  only ``SIGTERM``, as ``TerminateProcess``) is not passed on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any

from .engine import Lock
from .engine.exceptions import LockError, LockLost, LockNotAcquired

__all__ = [
    "EXIT_BUSY",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "FORWARDED_SIGNALS",
    "OWN_PROCESS_GROUP",
    "LockedProgram",
    "available_signals",
    "exit_status",
    "forward_signal",
]

EXIT_UNAVAILABLE = 69
"""Redis could not be reached (``EX_UNAVAILABLE``); the program did not run."""
EXIT_LOST = 70
"""The lock was lost while the program ran (``EX_SOFTWARE``); the program was stopped."""
EXIT_BUSY = 75
"""The lock stayed busy (``EX_TEMPFAIL``: cron may simply try again later)."""
EXIT_CANNOT_EXECUTE = 126
"""The program exists but could not be executed (as in a shell)."""
EXIT_NOT_FOUND = 127
"""The program was not found (as in a shell)."""


def available_signals(names: Iterable[str]) -> tuple[signal.Signals, ...]:
    """The signals called ``names`` that this platform has, in that order.

    >>> available_signals(["SIGTERM", "SIGNOSUCH"])
    (<Signals.SIGTERM: 15>,)
    """
    return tuple(getattr(signal, name) for name in names if hasattr(signal, name))


FORWARDED_SIGNALS = available_signals(["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"])
"""Signals passed on to the program (those of SIGINT, SIGTERM, SIGHUP and SIGQUIT that
this platform has)."""


OWN_PROCESS_GROUP = os.name == "posix"
"""Whether the program gets a process group of its own (``subprocess``'s
``process_group`` exists on POSIX only; see the module docstring)."""


def forward_signal(child: subprocess.Popen[bytes], signum: int) -> None:
    """Pass signal ``signum`` on to ``child``, unless it has just exited or it is a
    signal the platform cannot send to another process (on Windows, anything but
    ``SIGTERM``: its console delivers Ctrl-C to the program itself)."""
    with contextlib.suppress(ProcessLookupError, ValueError):
        child.send_signal(signum)


def exit_status(returncode: int) -> int:
    """The shell's exit status for a program's ``returncode``: ``128 + N`` if it was
    killed by signal N (a negative ``returncode``), else ``returncode`` itself.

    >>> exit_status(-9), exit_status(3)
    (137, 3)
    """
    return 128 - returncode if returncode < 0 else returncode


class _Interrupted(BaseException):
    """A forwarded signal arrived while the lock was being taken."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class LockedProgram:
    """One program run under one lock, signals passed on, the lease watched.

    ::

        lock = Lock("nightly-report", backend=backend, auto_renew=True)
        status = LockedProgram(lock, ["./report.sh"], grace=10, report=print).run()

    The lock should renew itself (``auto_renew=True``): the program may run for longer
    than a lease. This object replaces the lock's ``on_lost``, so that a lost lock stops
    the program (``SIGTERM``, then ``SIGKILL`` after ``grace`` seconds). ``report``
    receives one line per problem, for stderr.
    """

    def __init__(
        self,
        lock: Lock,
        program: Sequence[str],
        *,
        grace: float,
        report: Callable[[str], None],
    ) -> None:
        self.lock = lock
        self.program = list(program)
        self.grace = grace
        self.report = report
        self.child: subprocess.Popen[bytes] | None = None
        self._acquiring = True
        self._pending: list[int] = []
        self._exited = threading.Event()
        self._lost = threading.Event()
        self._done = threading.Event()  # the program exited or the lock was lost
        lock.on_lost = self._lock_lost

    def run(self) -> int:
        """Take the lock, run the program, release the lock; return the exit status
        (:func:`exit_status` of the program's, or one of the ``EXIT_*`` codes).

        Raises :class:`~django_distlock.engine.LockNotAcquired` if the lock stayed busy;
        errors taking the lock (Redis unreachable) propagate. A forwarded signal that
        arrives while the lock is being taken ends the run before the program starts,
        with ``128 + N``."""
        previous: dict[int, Any] = {}
        try:
            for signum in FORWARDED_SIGNALS:
                previous[signum] = signal.signal(signum, self._on_signal)
        except ValueError:
            pass  # not the main thread (call_command from a thread): nothing to forward
        try:
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def _lock_lost(self, lock: Lock) -> None:
        self._lost.set()
        self._done.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._acquiring:
            raise _Interrupted(signum)
        child = self.child
        if child is None:
            self._pending.append(signum)
            return
        forward_signal(child, signum)

    def _run(self) -> int:
        try:
            try:
                acquired = self.lock.acquire()
            finally:
                self._acquiring = False
        except _Interrupted as interrupted:
            return self._interrupted(interrupted.signum)
        if not acquired:
            raise LockNotAcquired(f"lock {self.lock.name!r} is busy", name=self.lock.name)
        if self._pending:
            return self._interrupted(self._pending[0])
        return self._supervise()

    def _interrupted(self, signum: int) -> int:
        self._release_quietly()
        self.report(f"interrupted by signal {signum} before the program started")
        return 128 + signum

    def _supervise(self) -> int:
        name = self.lock.name
        env = {**os.environ, "DISTLOCK_NAME": name, "DISTLOCK_FENCE": str(self.lock.fence)}
        # The program writes to the same stdout and stderr: what we wrote comes first.
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            options: dict[str, Any] = {"process_group": 0} if OWN_PROCESS_GROUP else {}
            child = subprocess.Popen(self.program, env=env, **options)
        except FileNotFoundError as exc:
            self._release_quietly()
            self.report(f"program not found: {exc}")
            return EXIT_NOT_FOUND
        except OSError as exc:
            self._release_quietly()
            self.report(f"cannot execute the program: {exc}")
            return EXIT_CANNOT_EXECUTE
        self.child = child
        for signum in self._pending:  # arrived while the program was starting
            forward_signal(child, signum)
        threading.Thread(target=self._reap, name="distlock-run-reaper", daemon=True).start()
        self._done.wait()
        if not self._exited.is_set():
            self._stop_program(child)
        code = exit_status(child.returncode)
        try:
            self.lock.release()
        except LockLost:
            self._lost.set()
        except LockError as exc:
            self.report(f"could not release lock {name!r} (it expires with its lease): {exc}")
        if self._lost.is_set():
            self.report(
                f"lock {name!r} was lost while the program ran, so another process may "
                f"have run at the same time (program exit status {code})"
            )
            return EXIT_LOST
        return code

    def _reap(self) -> None:
        assert self.child is not None
        self.child.wait()
        self._exited.set()
        self._done.set()

    def _stop_program(self, child: subprocess.Popen[bytes]) -> None:
        self.report(
            f"lock {self.lock.name!r} was lost; stopping the program (pid {child.pid}) with SIGTERM"
        )
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        if not self._exited.wait(self.grace):
            self.report(f"the program did not stop within {self.grace:g}s; sending SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            self._exited.wait()

    def _release_quietly(self) -> None:
        if self.lock.token is not None:
            with contextlib.suppress(LockError):
                self.lock.release()
