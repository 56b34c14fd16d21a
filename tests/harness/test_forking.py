"""Functions run in forked children (``tests/support/forking.py``)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tests.support.forking import ChildFailed, ChildTimeout, run_in_fork


def test_a_forked_child_returns_its_result(private_redis):
    parent = os.getpid()
    assert run_in_fork(lambda: (os.getpid() != parent, "x" * 200_000)) == (True, "x" * 200_000)
    # The child left through os._exit: the parent's servers (stopped by atexit) live on.
    assert private_redis.running
    with private_redis.client() as client:
        assert client.ping()


def test_a_forked_child_reports_what_it_raised():
    def fail() -> None:
        raise KeyError("in the child")

    with pytest.raises(ChildFailed, match="KeyError") as caught:
        run_in_fork(fail)
    assert "in the child" in caught.value.child_traceback
    assert "def fail" in caught.value.child_traceback or "fail" in caught.value.child_traceback


def test_a_forked_child_that_hangs_is_killed(fork):
    child = fork(lambda: time.sleep(30))
    started = time.monotonic()
    with pytest.raises(ChildTimeout):
        child.result(timeout=0.3)
    assert time.monotonic() - started < 2
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # already reaped


def test_forking_with_threads_running_does_not_warn():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert run_in_fork(lambda: threading.active_count()) == 1
    finally:
        stop.set()
        thread.join()


def test_a_child_killed_by_a_signal_is_reported(fork):
    child = fork(lambda: os.kill(os.getpid(), 9))
    with pytest.raises(ChildFailed, match="signal 9"):
        child.result(timeout=5)
