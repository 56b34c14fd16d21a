"""``close_books`` under its lock: refused while another run holds it, stopped when the
lock is taken away."""

from __future__ import annotations

import io
import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db(transaction=True)  # the command runs in a thread


def test_a_second_run_is_refused(distlock_locks):
    with (
        distlock_locks.hold("close_books"),
        pytest.raises(CommandError, match="lock 'close_books' is held by"),
    ):
        call_command("close_books", "--steps", "1", "--step-seconds", "0")


def test_a_run_whose_lock_is_taken_away_stops_and_fails(distlock_locks):
    failure: list[BaseException] = []
    stderr = io.StringIO()

    def close_books() -> None:
        try:
            call_command("close_books", "--steps", "200", "--step-seconds", "0.05", stderr=stderr)
        except CommandError as exc:
            failure.append(exc)

    run = threading.Thread(target=close_books)
    run.start()
    deadline = time.monotonic() + 10
    while "close_books" not in distlock_locks.held() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert distlock_locks.lose("close_books") == 1
    run.join(10)
    assert "lock lost: stopping early" in stderr.getvalue()
    assert "was lost while the command ran" in str(failure[0])
