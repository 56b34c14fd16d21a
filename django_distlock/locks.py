"""``distlock()``: a lock configured from the Django settings."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from .connections import get_backend
from .engine import Lock, LockGroup

__all__ = ["check_kind", "distlock", "distlock_many"]


def distlock(name: str, **options: Any) -> Lock:
    """A distributed lock named ``name`` on the Redis of the ``DISTLOCK`` settings.

    Use it as a context manager (``with`` or ``async with``), as a decorator whose name
    is a template filled from the call's arguments, or through ``acquire``/``release``::

        with distlock("invoice:42", timeout=30, blocking_timeout=5) as lock:
            charge(invoice, fence=lock.fence)

        @distlock("report:{day}")
        def build_report(day): ...

    ``options`` are those of :class:`django_distlock.engine.Lock` (all but ``backend``):
    ``timeout`` (lease seconds) and ``auto_renew`` default to ``DISTLOCK['TIMEOUT']`` and
    ``DISTLOCK['AUTO_RENEW']``. Settings are read when the lock is used, so a lock built
    at import time (a decorator) follows ``override_settings``.
    """
    if "backend" in options:
        raise TypeError("distlock() takes its backend from the settings; use Lock(backend=...)")
    return Lock(name, backend=get_backend, **options)


def distlock_many(names: Iterable[str], **options: Any) -> LockGroup:
    """Exclusive locks on several names at once, all or none, on the Redis of the
    ``DISTLOCK`` settings::

        with distlock_many([f"account:{src}", f"account:{dst}"], blocking_timeout=5) as group:
            transfer(src, dst, amount, fences=group.fences)

    The names may come in any order: they are taken in one global order, so two callers
    passing the same names in different orders never deadlock. ``options`` are those of
    :class:`django_distlock.engine.LockGroup` (``timeout``, ``blocking``,
    ``blocking_timeout``, ``auto_renew``, ``on_lost``, ``context``, ``raise_on_lost``,
    ``min_replicas``: the group waits for replicas as one lock does).
    See docs/kinds.md for what it promises on a single server and on a Cluster.
    """
    if "backend" in options:
        raise TypeError(
            "distlock_many() takes its backend from the settings; use LockGroup(backend=...)"
        )
    return LockGroup(names, backend=get_backend, **options)


def check_kind(*, limit: int | None = None, shared: bool = False, reentrant: bool = False) -> None:
    """Raise the ``TypeError``/``ValueError`` that ``distlock(..., limit=limit,
    shared=shared, reentrant=reentrant)`` would, without a lock name or a backend: so
    that ``lock_view`` and ``LockedCommand`` refuse bad kind options when a view is
    decorated or a command class is defined, not on the first request or run.

    >>> check_kind(limit=3, shared=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: limit and shared cannot be combined: ...
    """
    Lock("kind", backend=get_backend, limit=limit, shared=shared, reentrant=reentrant)


# What help(), IDEs and the docs' signature checks show: Lock's own options, one source.
_lock_signature = inspect.signature(Lock)
distlock.__signature__ = _lock_signature.replace(  # type: ignore[attr-defined]
    parameters=[p for p in _lock_signature.parameters.values() if p.name != "backend"],
    return_annotation=Lock,
)
