"""The pytest plugin, registered as the ``pytest11`` entry point ``django_distlock``: the
``distlock_server`` and ``distlock_locks`` fixtures. Nothing starts unless a test asks
for one of them.

Under pytest-xdist each worker is a session of its own, so it starts a server of its own
(or uses ``$DISTLOCK_TEST_URL``); every test writes under a fresh key prefix either way.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from .server import TEST_URL_ENV_VAR, LockServer

if TYPE_CHECKING:
    from .helper import LockTestHelper

__all__ = ["distlock_locks", "distlock_server"]

_SERVER = pytest.StashKey[tuple[LockServer, int]]()


@pytest.fixture(scope="session")
def distlock_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a private, real lock server for this session (``$DISTLOCK_TEST_URL``
    instead, when set), stopped when the session ends."""
    url = os.environ.get(TEST_URL_ENV_VAR)
    if url:
        yield url
        return
    server = LockServer().start()
    request.config.stash[_SERVER] = (server, server.pid or 0)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def distlock_locks(distlock_server: str) -> Iterator[LockTestHelper]:
    """``DISTLOCK`` pointed at ``distlock_server`` under a key prefix of this test's own,
    with ``EVENTS="sync"``, restored afterwards: a :class:`LockTestHelper`."""
    from .helper import LockTestHelper  # Django's test utilities: only when used

    helper = LockTestHelper(distlock_server)
    helper.apply()
    try:
        yield helper
    finally:
        helper.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """With ``-v``: which server ``distlock_server`` started, and how long it took."""
    started = terminalreporter.config.stash.get(_SERVER, None)
    if started is None or terminalreporter.verbosity < 1:
        return
    server, pid = started
    terminalreporter.write_line(
        f"django-distlock: lock server {server.binary} (pid {pid}, port {server.port}) "
        f"started in {(server.started_in or 0) * 1000:.0f} ms"
    )
