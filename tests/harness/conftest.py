"""Fixtures of the harness tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from tests.support import REPO_ROOT
from tests.support.servers import process_exists

ServerChild = Callable[..., tuple[list[int], int]]


@pytest.fixture
def run_server_child() -> ServerChild:
    """``run_server_child(code, terminate=False)``: run ``code`` in a child interpreter
    that prints the PIDs of the servers it started on one line (SIGTERM it then, with
    ``terminate``); return those PIDs and the child's exit status. Fails the test, after
    killing them, if any of the servers outlived the child."""

    def run(code: str, *, terminate: bool = False) -> tuple[list[int], int]:
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        pids = [int(pid) for pid in child.stdout.readline().split()]
        if terminate:
            child.terminate()
        returncode = child.wait(timeout=30)
        child.stdout.close()
        leaked = [pid for pid in pids if process_exists(pid)]
        for pid in leaked:
            os.kill(pid, signal.SIGKILL)
        assert not leaked, f"servers {leaked} outlived their test process"
        return pids, returncode

    return run
