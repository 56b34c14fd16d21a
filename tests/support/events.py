"""Helpers of the tests that record lock events: the ``DISTLOCK`` setting with an events
mode, the kinds of event recorded for a lock, and a database that hangs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.test import override_settings

from django_distlock.models import LockEvent


def events_mode(mode: str, **options: object) -> override_settings:
    """``DISTLOCK = {"EVENTS": mode, **options}`` while inside (or as a decorator)."""
    return override_settings(DISTLOCK={"EVENTS": mode, **options})


def kinds(name: str) -> list[str]:
    """The kinds of the events recorded for lock ``name``, oldest first."""
    return list(LockEvent.objects.filter(name=name).order_by("id").values_list("kind", flat=True))


class HungDatabase:
    """A database that hangs for the async writer: its writes block until :meth:`recover`
    (for the recording side and the exit, a database that never answers looks the same,
    without a timeout to wait for)."""

    def __init__(self) -> None:
        self.writing = threading.Event()
        """Set once the writer is stuck in a write."""
        self.recovered = threading.Event()
        """Set by :meth:`recover`; the writes go on then."""

    def hanging(self, write: Callable[..., Any]) -> Callable[..., Any]:
        """``write`` (the writer's row writing), made to wait for :meth:`recover` first."""

        def hung_write(*args: Any, **kwargs: Any) -> Any:
            self.writing.set()
            self.recovered.wait()
            return write(*args, **kwargs)

        return hung_write

    def recover(self) -> None:
        """Let the writes through."""
        self.recovered.set()
