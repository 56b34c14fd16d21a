"""Signals sent when something happens to a lock, in every ``DISTLOCK["EVENTS"]`` mode.

Engine events are sent with ``sender=django_distlock.engine.Lock`` (the class) and one
keyword argument, ``event``: the :class:`django_distlock.engine.Event` (``kind``,
``name``, ``fence``, ``context``, ``host``, ``pid``, ``thread``, ``waited``, ``held``,
``retry_after``, ``reason``, ``at``, ``mode``, ``limit``; seconds, ``at`` in epoch
seconds). ``event.mode`` is the kind of hold, ``"exclusive"``, ``"shared"`` or
``"limited"`` (``event.limit``: the limit of a limited lock, else ``None``); each holder
of a shared or limited lock sends its own signals, with its own fence. Taking a
re-entrant lock again, and releasing it but the last time, send nothing::

    from django.dispatch import receiver
    from django_distlock.engine import Lock
    from django_distlock.signals import lock_lost

    @receiver(lock_lost, sender=Lock)
    def page_someone(sender, event, **kwargs):
        alert(f"lock {event.name} lost by {event.host}:{event.pid}: {event.reason}")

Receivers run in the thread that produced the event: the caller's thread for acquire,
release, extend, contended and not_replicated, the renewal thread (or task) for
``lock_lost``. Keep them quick. Inside a running event loop, sync receivers are called
right away and async receivers are scheduled as tasks on that loop; elsewhere async
receivers run through ``async_to_sync``. A receiver that raises is logged (logger
``django.dispatch``), never raised into the lock.
"""

from __future__ import annotations

from django.dispatch import Signal

__all__ = [
    "lock_acquired",
    "lock_contended",
    "lock_extended",
    "lock_force_released",
    "lock_lost",
    "lock_not_replicated",
    "lock_released",
]

lock_acquired = Signal()
"""A lock was acquired. ``event.waited``: seconds spent acquiring it."""

lock_released = Signal()
"""A lock was released by its holder. ``event.held``: seconds it was held."""

lock_extended = Signal()
"""A holder extended its lock with ``extend()`` (watchdog renewals are not sent)."""

lock_contended = Signal()
"""An acquire failed: the lock was held (non-blocking) or the wait timed out.
``event.fence`` is ``None``; ``event.retry_after``: seconds left on the holder's lease."""

lock_lost = Signal()
"""A holder lost its lock: the lease ended or another holder took it (for example after a
force release). ``event.reason`` says why; ``event.held``: seconds it had been held."""

lock_not_replicated = Signal()
"""An acquire took the lock on the primary, but fewer replicas than ``min_replicas``
acknowledged it within ``replica_timeout``, so it was given back and the caller got
``LockNotReplicated``. ``event.fence`` is ``None``; ``event.reason`` says how many
acknowledged (``"0 of 1 replicas acknowledged"``); ``event.waited``: seconds spent."""

lock_force_released = Signal()
"""An operator force-released a hold of a lock (admin, ``distlock release --force`` or
``HeldLock.release(force=True, by=user)``). Sent with ``sender=HeldLock`` (the model
class) and keyword arguments ``held_lock`` (the :class:`~django_distlock.models.HeldLock`
as it was read: ``held_lock.mode`` and ``held_lock.token`` say which hold), ``user`` (or
``None``) and ``released``: ``False`` when the hold had already ended or the lock
changed hands, so nothing was deleted (such an attempt is sent, but not recorded as a
``force_released`` event)."""
