"""``tests.support.pipes.finish`` keeps what ``readline`` buffered (``communicate`` loses it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.pipes import finish

# Three lines in one write: the first readline buffers all three.
CHILD = "import sys; sys.stdout.write('one\\ntwo\\nthree\\n'); sys.stdout.flush()"


def start() -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    child.wait(timeout=30)  # all three lines are in the pipe before the first read
    assert child.stdout is not None
    assert child.stdout.readline() == "one\n"
    return child


def test_communicate_loses_lines_readline_buffered() -> None:
    """The trap the helper exists for (the CI failure of test_close_books_refuses_a_second_run)."""
    child = start()
    out, _ = child.communicate(timeout=30)
    assert out == ""


def test_finish_returns_the_buffered_lines() -> None:
    child = start()
    out, err = finish(child, timeout=30)
    assert out == "two\nthree\n"
    assert err == ""
    assert child.returncode == 0


def test_finish_times_out_on_a_child_that_runs_on() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            finish(child, timeout=0.2)
    finally:
        child.kill()
        child.wait()
        for pipe in (child.stdout, child.stderr):
            assert pipe is not None
            pipe.close()
