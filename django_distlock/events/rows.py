"""How lock events become ``LockEvent`` rows: one ``COPY`` or ``executemany`` per batch,
a refused batch written again row by row, and the deletion of old rows.

Used by the event writer (:mod:`django_distlock.events.writer`) for both of its modes,
and by :func:`django_distlock.events.prune_events`.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from django.db import DatabaseError, DataError, IntegrityError, connections, router, transaction
from django.utils import timezone

from ..engine import Event
from ..models import LockEvent

__all__ = [
    "WRITTEN_FIELDS",
    "Item",
    "Written",
    "delete_events_before",
    "describe_failure",
    "events_database",
    "insert",
    "timestamp_adapter",
    "write_in_batches",
]

Item = tuple[Event, Any]
"""An event to write, and the primary key of the user behind it, if any."""

_STR_LIMIT = 255  # max_length of LockEvent's host, thread and context

# The columns the writer fills, in the order of its INSERT and of _row (tests read every
# column of LockEvent but its primary key back).
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
    "mode",
    "limit",
)


def _row(event: Event, user_pk: Any, at: Any) -> tuple[Any, ...]:
    """The values of ``event``'s row, in ``WRITTEN_FIELDS`` order (``at`` as stored)."""
    return (
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
        at,
        event.mode,
        event.limit,
    )


class Written(NamedTuple):
    """What :func:`write_in_batches` could not write."""

    lost: int = 0
    """Rows not written."""
    error: str = ""
    """The last failure: the database's error, and the lock of the row it refused."""
    gave_up: bool = False
    """The database itself failed: the rows after the failure were not tried."""


def events_database() -> str:
    """The database alias ``LockEvent`` rows are written to (database routers apply)."""
    return router.db_for_write(LockEvent)


def describe_failure(error: Exception, event: Event | None = None) -> str:
    """``error`` as the loss report shows it, naming the lock of ``event`` if given."""
    about = f"lock {event.name!r}: " if event is not None else ""
    return f"{about}{type(error).__name__}: {error}"


def timestamp_adapter(connection: Any) -> Callable[[float], Any]:
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


def _statements(connection: Any) -> tuple[str, str]:
    """The ``COPY`` and the ``INSERT`` of ``WRITTEN_FIELDS`` into the events' table."""
    meta = LockEvent._meta
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    columns = ", ".join(quote(meta.get_field(name).column) for name in WRITTEN_FIELDS)
    placeholders = ", ".join(["%s"] * len(WRITTEN_FIELDS))
    # Identifiers from the model, quoted by the backend; values are parameters.
    return (
        f"COPY {table} ({columns}) FROM STDIN",
        f"INSERT INTO {table} ({columns}) VALUES ({placeholders})",  # noqa: S608
    )


def insert(items: Sequence[Item], alias: str) -> None:
    """Insert ``items`` as LockEvent rows in one transaction (raises on database errors):
    ``COPY`` on PostgreSQL with psycopg 3, one ``executemany`` elsewhere.

    Not ``bulk_create``: building and compiling model instances takes several times the
    CPU per row (bench/results.md, 2026-11-26), CPU the writer thread would take from
    the locks of its own process. Values are plain ``str``/``int``/``float``/``None``,
    and the datetime goes through the backend's own adaptation, as the ORM does
    (:func:`timestamp_adapter`).
    """
    connection = connections[alias]
    stored_at = timestamp_adapter(connection)
    now = time.time()
    rows = [_row(event, user_pk, stored_at(event.at or now)) for event, user_pk in items]
    copy_sql, insert_sql = _statements(connection)
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        copy = getattr(cursor.cursor, "copy", None) if connection.vendor == "postgresql" else None
        if copy is not None and len(rows) > 1:  # psycopg 3
            with copy(copy_sql) as stream:
                for row in rows:
                    stream.write_row(row)
        else:
            cursor.executemany(insert_sql, rows)


def _row_error(error: Exception, alias: str) -> bool:
    """Whether ``error`` is about the rows sent rather than about the database: a value
    it refuses (``DataError``, raised by the driver or at ``COPY``) or a constraint
    (``IntegrityError``, possibly at ``COMMIT`` for a deferred foreign key). Anything
    else (unreachable, busy, table missing) would fail every row again."""
    driver = connections[alias].Database
    refused = (DataError, IntegrityError, driver.DataError, driver.IntegrityError)
    return isinstance(error, refused) or not isinstance(error, (DatabaseError, driver.Error))


def write_in_batches(items: Sequence[Item], batch_size: int) -> Written:
    """Write ``items`` from the writer thread, ``batch_size`` rows per statement (each in
    its own transaction); return what could not be written.

    A batch refused for its rows is written again row by row: only the rows the database
    refuses are lost. When the database itself fails, the rows not yet written are lost
    and the rest is not tried (each try could wait for a timeout).
    """
    alias = events_database()
    lost, last_error = 0, ""
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        try:
            insert(batch, alias)
            continue
        except Exception as error:  # noqa: BLE001 - sorted out below
            if not _row_error(error, alias):
                return Written(lost + len(items) - start, describe_failure(error), gave_up=True)
        for offset, item in enumerate(batch):
            try:
                insert([item], alias)
            except Exception as error:  # noqa: BLE001
                if not _row_error(error, alias):
                    unwritten = len(items) - start - offset
                    return Written(lost + unwritten, describe_failure(error), gave_up=True)
                lost += 1
                last_error = describe_failure(error, item[0])
    return Written(lost, last_error)


def delete_events_before(cutoff: datetime.datetime) -> int:
    """Delete the events that happened before ``cutoff``; return how many were deleted."""
    deleted, _ = LockEvent.objects.filter(at__lt=cutoff).delete()
    return deleted
