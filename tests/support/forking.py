"""Run a function in a forked child process and get its result back, for tests of what a
library does across ``os.fork()`` (as gunicorn and Celery's prefork pool do).

The child inherits the parent's memory as it was at the fork (open sockets, Backend
objects, lock state) but only the thread that forked. It runs the function, sends back
the pickled result or the traceback of what it raised through a pipe, and leaves with
``os._exit``: no ``atexit`` handler, ``finally`` of the caller or pytest finalizer of
the parent runs in the child (they would stop the parent's servers).

Example::

    child = fork_child(lambda: lock.held)
    ...                      # the parent carries on meanwhile
    assert child.result(timeout=10) is False

Django-free on purpose.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ChildFailed", "ChildTimeout", "ForkedChild", "fork_child", "run_in_fork"]

T = TypeVar("T")

_DEFAULT_TIMEOUT = 30.0


class ChildFailed(AssertionError):
    """The child raised (``child_traceback`` is its formatted traceback) or died without
    reporting (killed by a signal, crashed)."""

    def __init__(self, message: str, child_traceback: str = "") -> None:
        super().__init__(message if not child_traceback else f"{message}\n{child_traceback}")
        self.child_traceback = child_traceback


class ChildTimeout(ChildFailed, TimeoutError):
    """The child did not report within the timeout; it has been killed."""


class ForkedChild(Generic[T]):
    """A running forked child; :meth:`result` waits for what its function returned."""

    def __init__(self, pid: int, reader: int) -> None:
        self.pid = pid
        self._reader = reader
        self._data = bytearray()
        self._status: int | None = None

    def __repr__(self) -> str:
        return f"<ForkedChild pid={self.pid}>"

    def result(self, timeout: float = _DEFAULT_TIMEOUT) -> T:
        """The child's return value. Raises :class:`ChildFailed` with the child's
        traceback if it raised, and :class:`ChildTimeout` (after killing it with SIGKILL)
        if it did not finish within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise ChildTimeout(f"forked child {self.pid} did not finish in {timeout}s")
                ready, _, _ = select.select([self._reader], [], [], left)
                if ready:
                    chunk = os.read(self._reader, 1 << 16)
                    if not chunk:
                        break
                    self._data += chunk
        finally:
            self._close_reader()
        status = self._wait()
        if not self._data:
            raise ChildFailed(
                f"forked child {self.pid} died without reporting ({_describe(status)})"
            )
        outcome = pickle.loads(bytes(self._data))  # our own child wrote it
        if outcome[0] == "ok":
            value: T = outcome[1]
            return value
        raise ChildFailed(f"forked child {self.pid} raised {outcome[2]}", outcome[1])

    def kill(self) -> None:
        """SIGKILL the child (never SIGTERM: the child inherited the parent's handlers,
        which stop the parent's servers) and reap it."""
        if self._status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._wait()
        self._close_reader()

    def _wait(self) -> int:
        if self._status is None:
            _, self._status = os.waitpid(self.pid, 0)
        return self._status

    def _close_reader(self) -> None:
        if self._reader >= 0:
            os.close(self._reader)
            self._reader = -1


def fork_child(func: Callable[[], T]) -> ForkedChild[T]:
    """Fork; the child runs ``func()`` and exits. Returns at once in the parent.

    The result must be picklable. Python 3.12+ warns that forking a process with
    threads may deadlock the child; that is the situation under test, so the warning is
    silenced here (and only here).
    """
    reader, writer = os.pipe()
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r".*use of fork\(\) may lead to deadlocks",
            category=DeprecationWarning,
        )
        pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(reader)
            _report(writer, func)
            code = 0
        finally:
            os._exit(code)
    os.close(writer)
    return ForkedChild(pid, reader)


def run_in_fork(func: Callable[[], T], timeout: float = _DEFAULT_TIMEOUT) -> T:
    """Run ``func()`` in a forked child and return its result (see :func:`fork_child`)."""
    return fork_child(func).result(timeout)


def _report(writer: int, func: Callable[[], Any]) -> None:
    try:
        outcome: tuple[Any, ...] = ("ok", func())
        payload = pickle.dumps(outcome)
    except BaseException as exc:  # everything goes back to the parent
        payload = pickle.dumps(("error", traceback.format_exc(), repr(exc)))
    view = memoryview(payload)
    while view:
        view = view[os.write(writer, view) :]
    os.close(writer)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
