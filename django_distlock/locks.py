"""``distlock()``: a lock configured from the Django settings."""

from __future__ import annotations

import inspect
from typing import Any

from .connections import get_backend
from .engine import Lock

__all__ = ["distlock"]


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


# What help(), IDEs and the docs' signature checks show: Lock's own options, one source.
_lock_signature = inspect.signature(Lock)
distlock.__signature__ = _lock_signature.replace(  # type: ignore[attr-defined]
    parameters=[p for p in _lock_signature.parameters.values() if p.name != "backend"],
    return_annotation=Lock,
)
