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

The program's work is its whole process group, not its PID: a script's commands run in
its group, and may outlive it. Signals go to the group, and the lock is released only
once no process of the group is left (``killpg(pgid, 0)`` finds none). On Linux we also
become the group's "child subreaper" meanwhile (:func:`adopting_orphans`), so that its
processes whose parent is gone are reparented to us and reaped by us: a zombie is still a
member of its group, and PID 1 of a container may never reap it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import FrameType
from typing import Any

from ..engine import Lock, LockError, LockLost, LockNotAcquired

__all__ = [
    "EXIT_BUSY",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_UNAVAILABLE",
    "FORWARDED_SIGNALS",
    "OWN_PROCESS_GROUP",
    "LockedProgram",
    "adopting_orphans",
    "available_signals",
    "exit_status",
    "forward_signal",
    "process_group_exists",
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


GROUP_POLL_INTERVAL = 0.05
"""Seconds between two looks at whether the program's process group is gone: its
members need not be our children, so no wait call can tell us."""

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def forward_signal(child: subprocess.Popen[bytes], signum: int, *, group: bool) -> None:
    """Pass signal ``signum`` on to ``child``: to its whole process group if it leads one
    (``group``), else to it alone. Nothing happens if the group (or the child) is gone,
    or if the platform cannot send that signal to another process (on Windows, anything
    but ``SIGTERM``: its console delivers Ctrl-C to the program itself)."""
    with contextlib.suppress(ProcessLookupError, ValueError):
        if group:
            os.killpg(child.pid, signum)
        else:
            child.send_signal(signum)


def process_group_exists(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is left, after reaping those of our children
    in it that have exited (a zombie is still a member of its group).

    Call it only once the group's leader has been reaped (``Popen.wait``): the reaping
    here must not take the leader's exit status from ``subprocess``."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # processes we may not signal are members all the same
    return True


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # no C library to load, or one without prctl
        return None


@contextlib.contextmanager
def adopting_orphans() -> Iterator[bool]:
    """Be a "child subreaper" (Linux's ``PR_SET_CHILD_SUBREAPER``) meanwhile, and
    yield whether we are; on other platforms, or if refused, nothing changes (``False``).

    A process whose parent exits is reparented to its nearest subreaper ancestor, else
    to PID 1, which reaps it once it exits. PID 1 of a container is often no init and
    never reaps; then the zombies of the program's group would keep the group in
    existence for ever, and ``distlock run`` waiting for it with them. As their
    subreaper, we reap them ourselves (:func:`process_group_exists`). The previous
    setting is restored afterwards. (A few lines of ``ctypes``: the PyPI wrappers of
    ``prctl`` are unmaintained.)"""
    prctl = _prctl()
    previous = ctypes.c_int(0)
    unused = (ctypes.c_ulong(0),) * 3  # prctl(2) reads unsigned longs
    if prctl is None or prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), *unused) != 0:
        yield False
        return
    if prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), *unused) != 0:
        yield False
        return
    try:
        yield True
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(previous.value), *unused)


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
    the program (``SIGTERM``, then ``SIGKILL`` after ``grace`` seconds). On POSIX "the
    program" is its whole process group: signals go to the group, and the lock is
    released only once no process of it is left, even if the program itself exited
    long before (what it started in the background still works under the lock).
    ``report`` receives one line per problem, for stderr.
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
        self._own_group = OWN_PROCESS_GROUP
        self._acquiring = True
        self._pending: list[int] = []
        self._exited = threading.Event()  # the program itself exited (and was reaped)
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
        forward_signal(child, signum, group=self._own_group)

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
        with adopting_orphans() if self._own_group else contextlib.nullcontext(False):
            try:
                options: dict[str, Any] = {"process_group": 0} if self._own_group else {}
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
                forward_signal(child, signum, group=self._own_group)
            threading.Thread(target=self._reap, name="distlock-run-reaper", daemon=True).start()
            self._done.wait()
            if not self._lost.is_set():
                self._outlived_by_its_group(child)
            if self._lost.is_set():
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

    def _outlived_by_its_group(self, child: subprocess.Popen[bytes]) -> None:
        """Once the program exited: wait until no process of its group is left (they
        work under the lock: a script's commands started in the background), or until
        the lock is lost."""
        while self._own_group and process_group_exists(child.pid):
            if self._lost.wait(GROUP_POLL_INTERVAL):
                return

    def _stop_program(self, child: subprocess.Popen[bytes]) -> None:
        what = f"process group {child.pid}" if self._own_group else f"pid {child.pid}"
        self.report(f"lock {self.lock.name!r} was lost; stopping the program ({what}) with SIGTERM")
        self._terminate(child, kill=False)
        if not self._gone(child, self.grace):
            self.report(f"the program did not stop within {self.grace:g}s; sending SIGKILL")
            self._terminate(child, kill=True)
            self._gone(child, None)

    def _terminate(self, child: subprocess.Popen[bytes], *, kill: bool) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self._own_group:
                os.killpg(child.pid, signal.SIGKILL if kill else signal.SIGTERM)
            elif kill:
                child.kill()
            else:
                child.terminate()

    def _gone(self, child: subprocess.Popen[bytes], within: float | None) -> bool:
        """Whether the program ended, and with it every process of its group, waiting up
        to ``within`` seconds for it (``None``: as long as it takes)."""
        deadline = None if within is None else time.monotonic() + within
        if not self._exited.wait(within):
            return False
        while self._own_group and process_group_exists(child.pid):
            pause = GROUP_POLL_INTERVAL
            if deadline is not None:
                pause = min(pause, deadline - time.monotonic())
                if pause <= 0:
                    return False
            time.sleep(pause)
        return True

    def _release_quietly(self) -> None:
        if self.lock.token is not None:
            with contextlib.suppress(LockError):
                self.lock.release()
