"""Recording lock events as ``LockEvent`` rows, and sending the matching signals.

The lock backend of the settings calls :func:`observer_for`'s observer on every lock
event. Signals are sent in every mode; rows are written according to
``DISTLOCK["EVENTS"]``:

- ``"async"`` (default): by a background thread, in batches, within about a second;
- ``"sync"``: before the lock call returns, inside the caller's transaction;
- ``"off"``: no rows.

How the rows are written, and what happens when the database fails, is the business of
:mod:`django_distlock.events.writer`. Events older than ``DISTLOCK["EVENT_RETENTION"]``
seconds are deleted by the background thread, and by :func:`prune_events` (``manage.py
distlock prune-events``, the way to prune in ``"sync"`` mode).

>>> flush_events()                                    # doctest: +SKIP
>>> LockEvent.objects.filter(name="invoice:42").order_by("-at")[:10]  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from django.dispatch import Signal
from django.utils import timezone

from .. import signals
from ..engine import EXCLUSIVE, Event, Lock, Observer
from ..settings import get_config
from ..telemetry import metrics_observer
from .rows import Item, delete_events_before
from .writer import current_writer, write_later, write_now

if TYPE_CHECKING:
    from ..models import HeldLock
    from ..settings import Config

__all__ = [
    "flush_events",
    "observer_for",
    "prune_events",
    "record_force_release",
]

_SIGNALS: dict[str, Signal] = {
    "acquired": signals.lock_acquired,
    "released": signals.lock_released,
    "extended": signals.lock_extended,
    "contended": signals.lock_contended,
    "lost": signals.lock_lost,
    "not_replicated": signals.lock_not_replicated,
}
"""The engine's event kinds that become rows and signals. The others (``error``,
``release_failed``, ``renewed``, ``renew_failed``) are for metrics only: a row per
renewal would flood the table."""

_WRITERS: dict[str, Callable[[Item], None]] = {"async": write_later, "sync": write_now}
"""How each ``DISTLOCK["EVENTS"]`` mode writes a row (``"off"``: not at all)."""


def observer_for(config: Config) -> Observer:
    """The observer to give a :class:`~django_distlock.engine.Backend` built for
    ``config``: it records each event as ``config.events`` says, sends its signal, and
    feeds the metrics backends ``config.metrics`` enables (:mod:`.telemetry`).

    It is called on the lock's hot path, so it does as little as possible there: in
    ``"async"`` mode it appends the event to a buffer and returns.

    >>> Backend(client, observer=observer_for(get_config()))  # doctest: +SKIP
    """
    mode = config.events
    write = _WRITERS.get(mode)
    measure = metrics_observer(config.metrics, config.metrics_label)

    def observe(event: Event) -> None:
        signal = _SIGNALS.get(event.kind)
        if signal is not None:
            if write is not None:
                write((event, None))
            if signal.receivers:
                _send(signal, Lock, event=event)
        if measure is not None:
            measure(event)

    observe.__qualname__ = f"observer_for.<{mode}>"
    return observe


def record_force_release(held_lock: HeldLock, user: Any, *, released: bool) -> None:
    """Record that ``user`` (or ``None``: a script, the CLI) force-released ``held_lock``
    and send ``lock_force_released``.

    ``released`` is ``False`` when the hold had ended or the lock changed hands since it
    was read, so nothing was deleted: that attempt is not a force release, and the
    history only records what happened, so it writes no row (the operator was told, and
    the signal still goes out, with ``released=False``, for those who audit attempts).

    Called by ``HeldLock.release(force=True, by=user)``; the row is written like every
    other event (``DISTLOCK["EVENTS"]``), with the hold's ``mode`` and ``limit``.

    >>> record_force_release(held_lock, request.user, released=True)  # doctest: +SKIP
    """
    user_pk = getattr(user, "pk", None)
    write = _WRITERS.get(get_config().events)
    if released and write is not None:
        username = (
            user.get_username() if user_pk is not None and hasattr(user, "get_username") else ""
        )
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
            reason=f"force-released by {username}" if username else "force-released",
            at=time.time(),
            mode=held_lock.mode or EXCLUSIVE,
            limit=held_lock.limit,
        )
        write((event, user_pk))
    if signals.lock_force_released.receivers:
        _send(
            signals.lock_force_released,
            type(held_lock),
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
    return delete_events_before(timezone.now() - older_than)


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
    writer = current_writer()
    if writer is not None:
        writer.flush(timeout)


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
