"""``distlock()``: a lock configured from the Django settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .connections import get_backend
from .engine import Lock

__all__ = ["distlock"]


def distlock(
    name: str,
    *,
    timeout: float | None = None,
    blocking: bool = True,
    blocking_timeout: float | None = None,
    auto_renew: bool | None = None,
    on_lost: Callable[[Lock], Any] | None = None,
    context: str = "",
    fair: bool = False,
    raise_on_lost: bool = True,
) -> Lock:
    """A distributed lock named ``name`` on the Redis of the ``DISTLOCK`` settings.

    Use it as a context manager (``with`` or ``async with``), as a decorator whose name
    is a template filled from the call's arguments, or through ``acquire``/``release``::

        with distlock("invoice:42", timeout=30, blocking_timeout=5) as lock:
            charge(invoice, fence=lock.fence)

        @distlock("report:{day}")
        def build_report(day): ...

    ``timeout`` (lease seconds) and ``auto_renew`` default to ``DISTLOCK['TIMEOUT']`` and
    ``DISTLOCK['AUTO_RENEW']``. Settings are read when the lock is used, so a lock built
    at import time (a decorator) follows ``override_settings``. See
    :class:`django_distlock.engine.Lock` for every method.
    """
    return Lock(
        name,
        backend=get_backend,
        timeout=timeout,
        blocking=blocking,
        blocking_timeout=blocking_timeout,
        auto_renew=auto_renew,
        on_lost=on_lost,
        context=context,
        fair=fair,
        raise_on_lost=raise_on_lost,
    )
