"""``django_distlock.events.writer``'s ``"sync"`` mode in a thread of the caller's: the
database connection it opens there, it closes."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from django.db.backends.signals import connection_created

from django_distlock import distlock
from tests.support.events import events_mode, kinds


@pytest.mark.django_db(transaction=True)
def test_a_sync_event_written_in_a_thread_closes_the_connection_it_opened(redis_client):
    # The test database is SQLite in memory, whose connections Django's close() leaves
    # open: the thread ended with it open and left it to the garbage collector (Python
    # 3.13 warns "unclosed database": the demo's close_books test failed so).
    opened = []

    def created(sender, connection, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            opened.append(connection.connection)

    def hold() -> None:
        with distlock("sync-thread"):
            pass

    connection_created.connect(created)
    try:
        with events_mode("sync"):
            thread = threading.Thread(target=hold)
            thread.start()
            thread.join(10)
    finally:
        connection_created.disconnect(created)
    assert kinds("sync-thread") == ["acquired", "released"]
    assert opened, "the thread opened no connection"
    for raw in opened:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            raw.execute("SELECT 1")
