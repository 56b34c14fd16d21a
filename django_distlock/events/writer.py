"""Writing lock events as ``LockEvent`` rows, the ``"async"`` and ``"sync"`` ways of
``DISTLOCK["EVENTS"]`` (:mod:`django_distlock.events` decides which; the SQL itself is
in :mod:`django_distlock.events.rows`).

- ``"async"`` (:func:`write_later`): the event is appended to an in-memory buffer, and
  one background thread per process (:class:`BufferedEventWriter`) inserts the buffer in
  batches on its own database connection, closed after each flush. It flushes when the
  buffer holds ``FLUSH_SIZE`` events, every ``FLUSH_INTERVAL`` seconds, when asked and at
  process exit (waiting at most ``EXIT_TIMEOUT`` seconds). The buffer holds at most
  ``BUFFER_CAPACITY`` events: beyond that events are dropped, counted and logged by the
  recording thread itself (the writer may be the one stuck). A batch the database
  refuses is written again row by row, so that a row it cannot store (say, text with a
  NUL on PostgreSQL) loses itself only; when the database itself fails (unreachable,
  busy, table missing) the rest of what was due is given up. On PostgreSQL the thread's
  own connection waits at most ``CONNECT_TIMEOUT`` seconds to open, unless ``OPTIONS``
  sets a ``connect_timeout``. The thread also deletes events older than
  ``DISTLOCK["EVENT_RETENTION"]`` seconds (after its first flush, then at most once per
  ``PRUNE_INTERVAL`` seconds).
- ``"sync"`` (:func:`write_now`): the event is written before the lock call returns, on
  the caller's connection and inside its transaction (a savepoint, so that a failed
  insert never breaks the caller's transaction). In a running event loop, where the ORM
  may not be called, the row is written by the background thread while the loop waits.

Lost events (database errors, a full buffer) are logged at WARNING on the
``django_distlock.events`` logger with how many and why, never raised into the lock
(:mod:`django_distlock.events.dropped`); when the writer is still stuck at exit, the last
WARNING counts every event the process lost.
"""

from __future__ import annotations

import asyncio
import atexit
import datetime
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from django.db import connections
from django.utils import timezone

from ..engine import BackgroundWorker, forget_after_fork
from ..settings import get_config
from .dropped import LostEventCounter, logger
from .rows import (
    Item,
    Written,
    delete_events_before,
    describe_failure,
    events_database,
    insert,
    write_in_batches,
)

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = [
    "BufferedEventWriter",
    "current_writer",
    "process_writer",
    "write_later",
    "write_now",
]

BUFFER_CAPACITY = 10_000
"""Events the async buffer holds at most; more are dropped (and counted)."""
FLUSH_SIZE = 1000
"""The async writer flushes as soon as the buffer holds this many events."""
FLUSH_INTERVAL = 1.0
"""... and at least this often (seconds) while it holds any."""
EXIT_TIMEOUT = 3.0
"""Seconds the process waits at exit for the last flush."""
SYNC_TIMEOUT = 5.0
"""Seconds a ``"sync"`` write from a running event loop waits for the writer thread."""
PRUNE_INTERVAL = 3600.0
"""Seconds between two retention prunes by one process."""
CONNECT_TIMEOUT = 5
"""Seconds the writer thread waits for its PostgreSQL connection to open (libpq's
``connect_timeout``, 2 at least), unless the database's ``OPTIONS`` set one. Django sets
none: a server that accepts TCP and never answers would hold the writer for 130 s with
psycopg 3, for ever with psycopg 2."""


class BufferedEventWriter:
    """The buffer and background thread of the ``"async"`` mode (one per process): a
    :class:`~django_distlock.engine.BackgroundWorker` whose drain writes the buffer in
    batches.

    ``append`` is all the lock path does: it never blocks and never raises. The thread
    starts with the first event.
    """

    def __init__(
        self,
        *,
        capacity: int | None = None,
        flush_size: int | None = None,
        interval: float | None = None,
    ) -> None:
        self.capacity = BUFFER_CAPACITY if capacity is None else capacity
        self.flush_size = FLUSH_SIZE if flush_size is None else flush_size
        self.interval = FLUSH_INTERVAL if interval is None else interval
        self.losses = LostEventCounter(self.capacity)
        """What this writer lost, and its reports of it."""
        self._worker: BackgroundWorker[Item] = BackgroundWorker(
            "distlock-events",
            self._cycle,
            capacity=self.capacity,
            interval=self.interval,
            batch=self.flush_size,
            on_drop=self._dropped,
            on_stop=lambda: self.losses.report(force=True),
        )
        self._buffer = self._worker.buffer
        self._next_prune = 0.0
        self._in_flight = 0

    @property
    def dropped_total(self) -> int:
        """Events dropped because the buffer was full."""
        return self.losses.dropped_total

    @property
    def failed_total(self) -> int:
        """Events lost to database errors."""
        return self.losses.failed_total

    def __repr__(self) -> str:
        return f"<BufferedEventWriter buffered={len(self._buffer)} dropped={self.dropped_total}>"

    def append(self, item: Item) -> None:
        """Buffer ``item`` (or count it as dropped when the buffer is full)."""
        if not self._worker.started:
            _register_exit_flush()
        self._worker.put(item)

    def _dropped(self) -> None:
        self.losses.dropped()
        # Reported from here, rate-limited: the writer thread, which reports the other
        # losses, may be the one stuck (a database that hangs).
        self.losses.report()

    def flush(self, timeout: float) -> bool:
        """Have the thread write what is buffered now; wait up to ``timeout`` seconds.
        Returns whether it was written (or attempted: failures are logged)."""
        return self._worker.flush(timeout)

    def close(self, timeout: float) -> None:
        """Flush one last time and stop the thread (waiting at most ``timeout``).

        A thread still busy then (a database that hangs) takes the buffer and its batch
        with it: the warning counts them with every event lost before, since the losses
        the thread had yet to report would otherwise go unsaid."""
        if not self._worker.started or self._worker.closing:
            return
        if self._worker.close(timeout):
            return
        buffered, writing = len(self._buffer), self._in_flight
        dropped, failed = self.dropped_total, self.failed_total
        logger.warning(
            "django-distlock: gave up waiting %.1f s for the lock event writer at exit: "
            "%d lock event(s) lost in all (%d buffered, %d being written, %d dropped "
            "from the full buffer, %d lost to database errors)",
            timeout,
            buffered + writing + dropped + failed,
            buffered,
            writing,
            dropped,
            failed,
        )

    def _cycle(self, buffer: deque[Item]) -> None:
        failed = False
        try:
            # What is buffered now is written; what comes meanwhile waits for the next
            # cycle unless it makes a full batch.
            due = len(buffer)
            while buffer and (due > 0 or len(buffer) >= self.flush_size):
                batch = [buffer.popleft() for _ in range(min(len(buffer), self.flush_size))]
                due -= len(batch)
                self._in_flight = len(batch)
                written = self._write(batch)
                lost = written.lost
                if written.gave_up:  # the database itself failed: the rest due is not tried
                    for _ in range(min(max(due, 0), len(buffer))):
                        buffer.popleft()
                        lost += 1
                if lost:
                    self.losses.failed(lost, written.error)
                self._in_flight = 0
                if written.gave_up:
                    failed = True
                    break
            # Not right after the database failed: the prune would wait for it again.
            if not failed and time.monotonic() >= self._next_prune:
                self._next_prune = time.monotonic() + PRUNE_INTERVAL
                self._prune()
        finally:
            # The thread's own connection is closed once it has caught up (or failed):
            # an idle process holds none, a busy one does not reconnect for every batch.
            if self._worker.closing:
                _close_thread_connections()
            elif failed or not buffer:
                connections.close_all()
        self.losses.report()

    def _write(self, batch: list[Item]) -> Written:
        try:
            alias = events_database()
            _bound_connect(alias)
            return write_in_batches(batch, self.flush_size)
        except Exception as error:  # noqa: BLE001 - a router failing, ...
            return Written(len(batch), describe_failure(error), gave_up=True)

    def _prune(self) -> None:
        try:
            _bound_connect(events_database())
            retention = datetime.timedelta(seconds=get_config().event_retention)
            delete_events_before(timezone.now() - retention)
        except Exception as error:  # noqa: BLE001
            logger.warning("django-distlock: could not prune old lock events: %s", error)


def _bound_connect(alias: str) -> None:
    """Give this thread's connection to ``alias`` a connect timeout, where the backend
    takes one and the settings give none: PostgreSQL's ``connect_timeout`` (SQLite opens
    a file; other backends connect as configured).

    The connection object is this thread's own, and it gets a copy of its settings: the
    application's connections, in other threads, keep theirs."""
    connection = connections[alias]
    options = connection.settings_dict.get("OPTIONS") or {}
    if connection.vendor == "postgresql" and "connect_timeout" not in options:
        connection.settings_dict = {
            **connection.settings_dict,
            "OPTIONS": {**options, "connect_timeout": CONNECT_TIMEOUT},
        }


_writer: BufferedEventWriter | None = None
_writer_lock = threading.Lock()
_exit_flush_registered = False


def current_writer() -> BufferedEventWriter | None:
    """This process's writer, or ``None`` before its first ``"async"`` event."""
    return _writer


def process_writer() -> BufferedEventWriter:
    """This process's writer, created on first use (its thread starts with its first
    event)."""
    global _writer
    writer = _writer
    if writer is None:
        with _writer_lock:
            if _writer is None:
                _writer = BufferedEventWriter()
            writer = _writer
    return writer


def write_later(item: Item) -> None:
    """The ``"async"`` mode: buffer ``item`` for this process's writer thread."""
    (_writer or process_writer()).append(item)


_sync_losses = LostEventCounter()


def write_now(item: Item) -> None:
    """The ``"sync"`` mode: write ``item`` before returning, in the caller's transaction
    (by the writer thread, waited for, when called on a running event loop). Failures are
    reported, never raised."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:  # the ORM may not run on an event loop: the writer thread writes it
        writer = process_writer()
        writer.append(item)
        writer.flush(SYNC_TIMEOUT)
        return
    try:
        alias = events_database()
        connection = connections[alias]
        opened_here = connection.connection is None
        try:
            insert([item], alias)
        finally:
            if opened_here and not connection.in_atomic_block:
                _close_fully(connection)
    except Exception as error:  # noqa: BLE001 - never break the lock
        _sync_losses.failed(1, describe_failure(error, item[0]))
        _sync_losses.report()


def _close_thread_connections() -> None:
    """Close every database connection this thread opened, before the thread ends.

    Django's ``close()`` leaves an in-memory SQLite database open (closing it would
    destroy the database), so such a connection would be collected unclosed with its
    thread (a ``ResourceWarning`` since Python 3.13). A thread's own connection is its
    own: closing it loses nothing another thread sees (Django's test databases in memory
    are shared-cache)."""
    for connection in connections.all(initialized_only=True):
        _close_fully(connection)


def _close_fully(connection: BaseDatabaseWrapper) -> None:
    """Close this thread's ``connection``, an SQLite database in memory too (whose
    ``close()`` Django makes a no-op: see :func:`_close_thread_connections`)."""
    connection.close()
    if connection.connection is not None:
        connection.connection.close()
        connection.connection = None


def _forget_writer_after_fork() -> None:
    # The parent's buffered events are the parent's to write: a child starts empty.
    global _writer, _writer_lock
    _writer = None
    _writer_lock = threading.Lock()


forget_after_fork(_forget_writer_after_fork)


def _flush_at_exit() -> None:
    writer = _writer
    if writer is not None:
        writer.close(EXIT_TIMEOUT)


def _register_exit_flush() -> None:
    global _exit_flush_registered
    if not _exit_flush_registered:
        _exit_flush_registered = True
        atexit.register(_flush_at_exit)
    # A multiprocessing child ends with os._exit(), after its own exit finalizers but
    # without atexit handlers.
    multiprocessing = sys.modules.get("multiprocessing")
    if multiprocessing is not None and multiprocessing.parent_process() is not None:
        from multiprocessing import util

        util.Finalize(None, _flush_at_exit, exitpriority=10)
