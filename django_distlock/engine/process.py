"""What a process must not share with the children it forks.

A forked child inherits its parent's memory: its locks' holds, its connection pools
and sockets, its watchdog's state. None of it is the child's: a hold is the parent's
(the child releasing it would free a lock the parent still uses), and a socket shared
by two processes mixes up their replies. Modules register what to forget with
:func:`forget_after_fork`; holds remember the :func:`generation` they were taken in and
count as absent in any other.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PerProcess", "forget_after_fork", "generation"]

T = TypeVar("T")

_generation = 0
_forgetters: list[Callable[[], None]] = []


def generation() -> int:
    """A number that changes in a forked child (and never in the process itself)."""
    return _generation


def forget_after_fork(callback: Callable[[], None]) -> None:
    """Call ``callback`` in every child forked from now on, before it runs anything else.
    A no-op where ``os.fork`` does not exist."""
    _forgetters.append(callback)


class PerProcess(Generic[T]):
    """One ``make()`` per process, made on first use; :meth:`forget` it after a fork so
    that the child makes its own."""

    __slots__ = ("_lock", "_make", "made")

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self.made: T | None = None
        """The one made so far in this process, else ``None``."""
        self._lock = threading.Lock()

    def get(self) -> T:
        """The process's one, made now if it was not yet."""
        made = self.made
        if made is None:
            with self._lock:
                made = self.made
                if made is None:
                    made = self.made = self._make()
        return made

    def forget(self) -> None:
        """Forget the one made (a forked child's lock is new too)."""
        self.made = None
        self._lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _generation
    _generation += 1
    for callback in _forgetters:
        callback()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
