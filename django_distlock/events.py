"""Recording lock events as ``LockEvent`` rows, and sending the matching signals.

The lock backend of the settings calls :func:`observer_for`'s observer on every lock
event. Signals are sent in every mode; rows are written according to
``DISTLOCK["EVENTS"]``:

- ``"async"`` (default): the observer appends the event to an in-memory buffer, and one
  background thread per process inserts the buffer in batches on its own database
  connection, closed after each flush. It flushes when the buffer holds
  ``FLUSH_SIZE`` events, every ``FLUSH_INTERVAL`` seconds, on :func:`flush_events` and at
  process exit (waiting at most ``EXIT_TIMEOUT`` seconds). The buffer holds at most
  ``BUFFER_CAPACITY`` events: beyond that events are dropped, counted and logged. Database
  errors are logged at WARNING with the number of events lost, never raised into the
  lock. A batch the database refuses is written again row by row, so that a row it
  cannot store (say, text with a NUL on PostgreSQL) loses itself only; when the database
  itself fails (unreachable, busy, table missing) the rest of the buffer is given up.
- ``"sync"``: each event is written before the lock call returns, on the caller's
  connection and inside its transaction (a savepoint, so that a failed insert never
  breaks the caller's transaction). In a running event loop, where the ORM may not be
  called, the row is written by the background thread while the loop waits.
- ``"off"``: no rows.

Events older than ``DISTLOCK["EVENT_RETENTION"]`` seconds are deleted by the background
thread (after its first flush, then at most once per ``PRUNE_INTERVAL`` seconds), and by
``manage.py distlock prune-events`` (the way to prune in ``"sync"`` mode).

>>> flush_events()                                    # doctest: +SKIP
>>> LockEvent.objects.filter(name="invoice:42").order_by("-at")[:10]  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import atexit
import datetime
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import DatabaseError, DataError, IntegrityError, connections, router, transaction
from django.dispatch import Signal
from django.utils import timezone

from . import signals
from .engine import Event, Lock, Observer

if TYPE_CHECKING:
    from .models import HeldLock
    from .settings import Config

__all__ = [
    "flush_events",
    "observer_for",
    "prune_events",
    "record_force_release",
]

logger = logging.getLogger("django_distlock.events")

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
REPORT_INTERVAL = 60.0
"""Repeated losses (dropped events, database errors) are logged at most this often."""

_STR_LIMIT = 255  # max_length of LockEvent's host, thread and context

_SIGNALS: dict[str, Signal] = {
    "acquired": signals.lock_acquired,
    "released": signals.lock_released,
    "extended": signals.lock_extended,
    "contended": signals.lock_contended,
    "lost": signals.lock_lost,
}

Item = tuple[Event, Any]
"""What the buffer holds: the event and the primary key of the user behind it, if any."""


def observer_for(config: Config) -> Observer:
    """The observer to give a :class:`~django_distlock.engine.Backend` built for
    ``config``: it records each event as ``config.events`` says and sends its signal.

    It is called on the lock's hot path, so it does as little as possible there: in
    ``"async"`` mode it appends the event to a buffer and returns.

    >>> Backend(client, observer=observer_for(get_config()))  # doctest: +SKIP
    """
    mode = config.events
    if mode == "async":

        def observe(event: Event) -> None:
            (_writer or _async_writer()).append((event, None))
            signal = _SIGNALS.get(event.kind)
            if signal is not None and signal.receivers:
                _send(signal, Lock, event=event)

    elif mode == "sync":

        def observe(event: Event) -> None:
            _write_sync((event, None))
            signal = _SIGNALS.get(event.kind)
            if signal is not None and signal.receivers:
                _send(signal, Lock, event=event)

    else:

        def observe(event: Event) -> None:
            signal = _SIGNALS.get(event.kind)
            if signal is not None and signal.receivers:
                _send(signal, Lock, event=event)

    observe.__qualname__ = f"observer_for.<{mode}>"
    return observe


def record_force_release(held_lock: HeldLock, user: Any, *, released: bool) -> None:
    """Record that ``user`` (or ``None``: a script, the CLI) force-released ``held_lock``
    and send ``lock_force_released``. ``released`` is ``False`` when the lock had changed
    hands or expired since it was read, so nothing was deleted; the attempt is recorded
    anyway, with that said in ``reason``.

    Called by ``HeldLock.release(force=True, by=user)``; the row is written like every
    other event (``DISTLOCK["EVENTS"]``).

    >>> record_force_release(held_lock, request.user, released=True)  # doctest: +SKIP
    """
    from .models import HeldLock
    from .settings import get_config

    user_pk = getattr(user, "pk", None)
    username = user.get_username() if user_pk is not None and hasattr(user, "get_username") else ""
    by = f" by {username}" if username else ""
    if released:
        reason = f"force-released{by}"
    else:
        reason = f"force release{by} found the lock changed hands or expired: nothing released"
    try:
        held = (timezone.now() - held_lock.acquired_at).total_seconds()
    except TypeError:  # not read from Redis, or naive vs aware
        held = None
    event = Event(
        kind="force_released",
        name=held_lock.name,
        fence=held_lock.fence,
        context=held_lock.context or "",
        host=held_lock.host or "",
        pid=held_lock.pid,  # type: ignore[arg-type]
        thread=held_lock.thread or "",
        held=held,
        reason=reason,
        at=time.time(),
    )
    mode = get_config().events
    if mode == "async":
        _async_writer().append((event, user_pk))
    elif mode == "sync":
        _write_sync((event, user_pk))
    if signals.lock_force_released.receivers:
        _send(
            signals.lock_force_released,
            HeldLock,
            held_lock=held_lock,
            user=user,
            released=released,
        )


def prune_events(older_than: datetime.timedelta) -> int:
    """Delete the events older than ``older_than``; return how many were deleted.

    >>> prune_events(datetime.timedelta(days=30))  # doctest: +SKIP
    1234
    """
    if not isinstance(older_than, datetime.timedelta):
        raise TypeError(f"older_than must be a timedelta, not {type(older_than).__name__}")
    if older_than < datetime.timedelta(0):
        raise ValueError("older_than must not be negative")
    from .models import LockEvent

    deleted, _ = LockEvent.objects.filter(at__lt=timezone.now() - older_than).delete()
    return deleted


def flush_events(timeout: float = 5.0) -> None:
    """Write the buffered events now (``"async"`` mode) and wait up to ``timeout``
    seconds for it; returns at once when nothing is buffered. For tests, and for
    processes that end without running ``atexit`` handlers (``os._exit``).

    >>> with distlock("invoice:42"):
    ...     pass                                        # doctest: +SKIP
    >>> flush_events()                                  # doctest: +SKIP
    >>> LockEvent.objects.filter(name="invoice:42").count()  # doctest: +SKIP
    2
    """
    writer = _writer
    if writer is not None:
        writer.flush(timeout)


class AsyncWriter:
    """The buffer and background thread of the ``"async"`` mode (one per process).

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
        self.dropped_total = 0
        """Events dropped because the buffer was full."""
        self.failed_total = 0
        """Events lost to database errors."""
        self._buffer: deque[Item] = deque()
        self._wake = threading.Event()
        self._cond = threading.Condition()
        self._state_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._requested = 0
        self._served = 0
        self._closing = False
        self._dropped = 0
        self._failed = 0
        self._last_error = ""
        self._quiet_until = 0.0
        self._next_prune = 0.0

    def __repr__(self) -> str:
        return f"<AsyncWriter buffered={len(self._buffer)} dropped={self.dropped_total}>"

    def append(self, item: Item) -> None:
        """Buffer ``item`` (or count it as dropped when the buffer is full)."""
        buffer = self._buffer
        if len(buffer) >= self.capacity:
            with self._state_lock:
                self._dropped += 1
                self.dropped_total += 1
            return
        buffer.append(item)
        if self._thread is None:
            self._start()
        elif len(buffer) >= self.flush_size and not self._wake.is_set():
            self._wake.set()

    def flush(self, timeout: float) -> bool:
        """Have the thread write what is buffered now; wait up to ``timeout`` seconds.
        Returns whether it was written (or attempted: failures are logged)."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return not self._buffer
        with self._cond:
            self._requested += 1
            ticket = self._requested
            self._wake.set()
            return self._cond.wait_for(
                lambda: self._served >= ticket or not thread.is_alive(), timeout
            )

    def close(self, timeout: float) -> None:
        """Flush one last time and stop the thread (waiting at most ``timeout``)."""
        thread = self._thread
        if thread is None or self._closing:
            return
        with self._cond:
            self._closing = True
            self._wake.set()
        thread.join(timeout)
        if thread.is_alive():
            logger.warning(
                "django-distlock: gave up waiting %.1f s for the lock event writer at exit; "
                "%d buffered events may be lost",
                timeout,
                len(self._buffer),
            )

    def _start(self) -> None:
        with self._state_lock:
            if self._thread is not None:
                return
            self._thread = thread = threading.Thread(
                target=self._run, name="distlock-events", daemon=True
            )
        _register_exit_flush()
        try:
            thread.start()
        except RuntimeError:  # interpreter shutdown: nothing can be written any more
            self._closing = True

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            with self._cond:
                self._wake.clear()
                target = self._requested
                closing = self._closing
            try:
                self._cycle()
            except Exception:  # the writer must outlive anything
                logger.exception("django-distlock: the lock event writer failed")
            with self._cond:
                self._served = target
                self._cond.notify_all()
            if closing:
                self._report(force=True)
                return

    def _cycle(self) -> None:
        buffer = self._buffer
        failed = False
        try:
            while buffer:
                items = [buffer.popleft() for _ in range(min(len(buffer), self.capacity))]
                try:
                    written = _bulk_write(items, self.flush_size)
                except Exception as error:  # noqa: BLE001 - a router failing, ...
                    written = Written(lost=len(items), error=_describe(error), gave_up=True)
                if written.lost:
                    self._failed += written.lost
                    self.failed_total += written.lost
                    self._last_error = written.error
                if written.gave_up:
                    failed = True
                    break
                if len(buffer) < self.flush_size:
                    break
            if time.monotonic() >= self._next_prune:
                self._next_prune = time.monotonic() + PRUNE_INTERVAL
                self._prune()
        finally:
            # The thread's own connection is closed once it has caught up (or failed):
            # an idle process holds none, a busy one does not reconnect for every batch.
            if failed or not buffer or self._closing:
                connections.close_all()
        self._report()

    def _prune(self) -> None:
        from .settings import get_config

        try:
            retention = get_config().event_retention
            prune_events(datetime.timedelta(seconds=retention))
        except Exception as error:  # noqa: BLE001
            logger.warning("django-distlock: could not prune old lock events: %s", error)

    def _report(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not (self._dropped or self._failed) or (now < self._quiet_until and not force):
            return
        with self._state_lock:
            dropped, self._dropped = self._dropped, 0
        failed, self._failed = self._failed, 0
        if dropped:
            logger.warning(
                "django-distlock: the lock event buffer was full (%d events): "
                "%d events were dropped",
                self.capacity,
                dropped,
            )
        if failed:
            logger.warning(
                "django-distlock: could not record %d lock event(s), they are lost (%s)",
                failed,
                self._last_error,
            )
        self._quiet_until = now + REPORT_INTERVAL


_writer: AsyncWriter | None = None
_writer_lock = threading.Lock()
_exit_flush_registered = False


def _async_writer() -> AsyncWriter:
    global _writer
    writer = _writer
    if writer is None:
        with _writer_lock:
            if _writer is None:
                _writer = AsyncWriter()
            writer = _writer
    return writer


def _forget_writer_after_fork() -> None:
    # The parent's buffered events are the parent's to write: a child starts empty.
    global _writer, _writer_lock
    _writer = None
    _writer_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_writer_after_fork)


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


# The columns the writer fills, in the order of its INSERT (tests check that they cover
# every column of LockEvent but its primary key).
WRITTEN_FIELDS = (
    "name",
    "kind",
    "fence",
    "host",
    "pid",
    "thread",
    "context",
    "user",
    "waited_ms",
    "held_ms",
    "reason",
    "at",
)


def _columns(connection: Any) -> tuple[str, str]:
    from .models import LockEvent

    meta = LockEvent._meta
    quote = connection.ops.quote_name
    columns = ", ".join(quote(meta.get_field(name).column) for name in WRITTEN_FIELDS)
    return quote(meta.db_table), columns


def _insert_sql(connection: Any) -> str:
    table, columns = _columns(connection)
    placeholders = ", ".join(["%s"] * len(WRITTEN_FIELDS))
    # Identifiers from the model, quoted by the backend; values are parameters.
    return f"INSERT INTO {table} ({columns}) VALUES ({placeholders})"  # noqa: S608


def _timestamp_adapter(connection: Any) -> Callable[[float], Any]:
    """Epoch seconds -> the value the ORM would send for a ``DateTimeField`` holding that
    instant, on ``connection``.

    The backend's own adaptation (naive, in the connection's time zone) runs once per
    whole second; the microseconds are added to its result. Formatting a datetime is
    most of the cost of a row otherwise.
    """
    adapt = connection.ops.adapt_datetimefield_value
    tz = connection.timezone or timezone.get_default_timezone()
    fromtimestamp = datetime.datetime.fromtimestamp
    seconds: dict[int, Any] = {}

    def stored_at(timestamp: float) -> Any:
        second, micro = divmod(round(timestamp * 1_000_000), 1_000_000)
        base = seconds.get(second)
        if base is None:
            base = seconds[second] = adapt(fromtimestamp(second, tz).replace(tzinfo=None))
        if not micro:
            return base
        if isinstance(base, str) and len(base) == 19:  # "YYYY-MM-DD HH:MM:SS", as str()
            return f"{base}.{micro:06d}"
        if type(base) is datetime.datetime:
            return base.replace(microsecond=micro)
        return adapt(fromtimestamp(timestamp, tz).replace(tzinfo=None))

    return stored_at


def _insert(items: Sequence[Item], alias: str) -> None:
    """Insert ``items`` as LockEvent rows in one transaction (raises on database errors):
    ``COPY`` on PostgreSQL with psycopg 3, one ``executemany`` elsewhere.

    Not ``bulk_create``: building and compiling model instances costs about 15 times more
    CPU per row than this, and psycopg's ``executemany`` about 6 times more than ``COPY``:
    CPU the writer thread would take from the locks of its own process. Values are plain
    ``str``/``int``/``float``/``None``, and the datetime goes through the backend's own
    adaptation, as the ORM does (:func:`_timestamp_adapter`).
    """
    connection = connections[alias]
    stored_at = _timestamp_adapter(connection)
    now = time.time()
    rows = [
        (
            event.name,
            event.kind,
            None if event.kind == "contended" else event.fence,
            event.host[:_STR_LIMIT],
            event.pid,
            event.thread[:_STR_LIMIT],
            event.context[:_STR_LIMIT],
            user_pk,
            None if event.waited is None else event.waited * 1000,
            None if event.held is None else event.held * 1000,
            event.reason,
            stored_at(event.at or now),
        )
        for event, user_pk in items
    ]
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        copy = getattr(cursor.cursor, "copy", None) if connection.vendor == "postgresql" else None
        if copy is not None and len(rows) > 1:  # psycopg 3
            with copy("COPY {} ({}) FROM STDIN".format(*_columns(connection))) as stream:
                for row in rows:
                    stream.write_row(row)
        else:
            cursor.executemany(_insert_sql(connection), rows)


class Written(NamedTuple):
    """What :func:`_bulk_write` could not write."""

    lost: int = 0
    """Rows not written."""
    error: str = ""
    """The last failure: the database's error, and the lock of the row it refused."""
    gave_up: bool = False
    """The database itself failed: the rows after the failure were not tried."""


def _row_error(error: Exception, alias: str) -> bool:
    """Whether ``error`` is about the rows sent rather than about the database: a value
    it refuses (``DataError``, raised by the driver or at ``COPY``) or a constraint
    (``IntegrityError``, possibly at ``COMMIT`` for a deferred foreign key). Anything
    else (unreachable, busy, table missing) would fail every row again."""
    driver = connections[alias].Database
    refused = (DataError, IntegrityError, driver.DataError, driver.IntegrityError)
    return isinstance(error, refused) or not isinstance(error, (DatabaseError, driver.Error))


def _describe(error: Exception, event: Event | None = None) -> str:
    about = f"lock {event.name!r}: " if event is not None else ""
    return f"{about}{type(error).__name__}: {error}"


def _bulk_write(items: Sequence[Item], batch_size: int) -> Written:
    """Write ``items`` from the writer thread, ``batch_size`` rows per statement (each in
    its own transaction); return what could not be written.

    A batch refused for its rows is written again row by row: only the rows the database
    refuses are lost. When the database itself fails, the rows not yet written are lost
    and the rest is not tried (each try could wait for a timeout).
    """
    from .models import LockEvent

    alias = router.db_for_write(LockEvent)
    lost, last_error = 0, ""
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        try:
            _insert(batch, alias)
            continue
        except Exception as error:  # noqa: BLE001 - sorted out below
            if not _row_error(error, alias):
                return Written(lost + len(items) - start, _describe(error), gave_up=True)
        for offset, item in enumerate(batch):
            try:
                _insert([item], alias)
            except Exception as error:  # noqa: BLE001
                if not _row_error(error, alias):
                    unwritten = len(items) - start - offset
                    return Written(lost + unwritten, _describe(error), gave_up=True)
                lost += 1
                last_error = _describe(error, item[0])
    return Written(lost, last_error)


_sync_failures = {"count": 0, "quiet_until": 0.0}
_sync_failures_lock = threading.Lock()


def _write_sync(item: Item) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:  # the ORM may not run on an event loop: the writer thread writes it
        writer = _async_writer()
        writer.append(item)
        writer.flush(SYNC_TIMEOUT)
        return
    from .models import LockEvent

    try:
        alias = router.db_for_write(LockEvent)
        connection = connections[alias]
        opened_here = connection.connection is None
        try:
            _insert([item], alias)
        finally:
            if opened_here and not connection.in_atomic_block:
                connection.close()
    except Exception as error:  # noqa: BLE001 - never break the lock
        _report_sync_failure(error, item[0])


def _report_sync_failure(error: Exception, event: Event) -> None:
    now = time.monotonic()
    with _sync_failures_lock:
        _sync_failures["count"] += 1
        if now < _sync_failures["quiet_until"]:
            return
        count, _sync_failures["count"] = _sync_failures["count"], 0
        _sync_failures["quiet_until"] = now + REPORT_INTERVAL
    logger.warning(
        "django-distlock: could not record %d lock event(s), they are lost (%s)",
        count,
        _describe(error, event),
    )


_signal_tasks: set[asyncio.Task[Any]] = set()


def _send(signal: Signal, sender: Any, **named: Any) -> None:
    """``signal.send_robust``, also from inside a running event loop: sync receivers
    are called now, async ones are scheduled on the loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:
        signal.send_robust(sender=sender, **named)
        return
    # send_robust would run async receivers through async_to_sync, which cannot be used
    # on a loop's own thread.
    sync_receivers, async_receivers = signal._live_receivers(sender)
    for receiver in sync_receivers:
        try:
            receiver(signal=signal, sender=sender, **named)
        except Exception as error:  # noqa: BLE001 - as send_robust
            _log_receiver_failure(receiver, error)
    for receiver in async_receivers:
        task = loop.create_task(_call_async(receiver(signal=signal, sender=sender, **named)))
        _signal_tasks.add(task)
        task.add_done_callback(_signal_tasks.discard)


async def _call_async(call: Coroutine[Any, Any, Any]) -> None:
    try:
        await call
    except Exception as error:  # noqa: BLE001 - as send_robust
        _log_receiver_failure(call, error)


def _log_receiver_failure(receiver: Any, error: Exception) -> None:
    logging.getLogger("django.dispatch").error(
        "Error calling %s in Signal.send_robust() (%s)",
        getattr(receiver, "__qualname__", repr(receiver)),
        error,
        exc_info=error,
    )
