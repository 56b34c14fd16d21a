"""Telling a holder: the one place a lost hold is reported (its ``lost`` event, then its
lock's ``on_lost``), and the one way an event about a hold (or an acquire) is built."""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from .backend import Event
from .core import HOSTNAME
from .hold import Hold
from .modes import LIMITED
from .ownership import run_on_loop_of

__all__ = ["REPORTING", "attempt_event", "hold_event", "report_loss", "tell", "tell_attempt"]

logger = logging.getLogger("django_distlock")

REPORTING: contextvars.ContextVar[Hold | None] = contextvars.ContextVar(
    "distlock_reporting", default=None
)
"""The hold whose loss ``on_lost`` is being told: the callback runs on the watchdog's
thread (or its hold's loop), and its lock's properties describe that hold there."""


def hold_event(hold: Hold, kind: str, **details: Any) -> Event:
    """An event about ``hold``, for its backend's observer."""
    return _event(hold, kind, fence=hold.fence, at=time.time(), **details)


def attempt_event(hold: Hold, kind: str, **details: Any) -> Event:
    """An event about an acquire that did not take the lock (``hold`` was prepared for
    it): no fence."""
    return _event(hold, kind, fence=None, **details)


def tell(hold: Hold, kind: str, **details: Any) -> None:
    """Tell ``hold``'s backend's observer, if it has one, the :func:`hold_event`."""
    if hold.backend.observer is not None:
        hold.backend.emit(hold_event(hold, kind, **details))


def tell_attempt(hold: Hold, kind: str, **details: Any) -> None:
    """Tell ``hold``'s backend's observer, if it has one, the :func:`attempt_event`."""
    if hold.backend.observer is not None:
        hold.backend.emit(attempt_event(hold, kind, **details))


def _event(hold: Hold, kind: str, **details: Any) -> Event:
    return Event(
        kind=kind,
        name=hold.name,
        context=hold.context,
        host=HOSTNAME,
        pid=os.getpid(),
        thread=hold.thread,
        template=hold.template,
        mode=hold.mode,
        limit=hold.limit if hold.mode == LIMITED else None,
        **details,
    )


def report_loss(hold: Hold, on_lost: Callable[[Any], Any] | None = None, lock: Any = None) -> None:
    """Report, once, that ``hold`` was lost: its ``lost`` event (cause and reason as
    recorded on it), then ``on_lost(lock)`` if its lock object still has one (an async
    callback runs on the hold's event loop)."""
    hold.lost = True
    if hold.lost_reported:
        return
    hold.lost_reported = True
    tell(hold, "lost", held=hold.held_for, reason=hold.lost_reason, cause=hold.lost_cause.value)
    if on_lost is None:
        return
    reporting = REPORTING.set(hold)
    try:
        outcome = on_lost(lock)
        if inspect.isawaitable(outcome):
            run_on_loop_of(hold, _reporting(hold, outcome))
    except Exception:
        logger.exception("django-distlock: on_lost callback of %r failed", hold.name)
    finally:
        REPORTING.reset(reporting)


async def _reporting(hold: Hold, awaitable: Any) -> Any:
    reporting = REPORTING.set(hold)
    try:
        return await awaitable
    finally:
        REPORTING.reset(reporting)
