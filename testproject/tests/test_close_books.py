"""``close_books`` under its lock: refused while another run holds it, stopped when the
lock is taken away."""

from __future__ import annotations

import io
import threading
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

pytestmark = pytest.mark.django_db(transaction=True)  # another thread takes the lock


def test_a_second_run_is_refused(distlock_locks):
    with (
        distlock_locks.hold("close_books"),
        pytest.raises(CommandError, match="lock 'close_books' is held by"),
    ):
        call_command("close_books", "--steps", "1", "--step-seconds", "0")


def test_a_run_whose_lock_is_taken_away_stops_and_fails(distlock_locks):
    # The command runs here and the lock is taken away from a thread that only talks to
    # the lock server: a thread that used the database would end with its own connection
    # open (Django's close() keeps an SQLite database in memory open), which Python 3.13
    # reports as an unclosed database.
    lost: list[int] = []
    stderr = io.StringIO()

    def take_it_away() -> None:
        deadline = time.monotonic() + 10
        while "close_books" not in distlock_locks.held() and time.monotonic() < deadline:
            time.sleep(0.01)
        lost.append(distlock_locks.lose("close_books"))

    thief = threading.Thread(target=take_it_away)
    thief.start()
    try:
        with pytest.raises(CommandError, match="was lost while the command ran"):
            call_command("close_books", "--steps", "200", "--step-seconds", "0.05", stderr=stderr)
    finally:
        thief.join(10)
    assert lost == [1]
    assert "lock lost: stopping early" in stderr.getvalue()
