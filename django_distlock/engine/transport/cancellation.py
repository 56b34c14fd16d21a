"""Carrying async operations through cancellation: a task that was cancelled stays
cancelled, and work that must finish (a release, a clean-up) does, whatever happens to
the task that started it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["cancellations", "completed", "keep_cancellation"]

T = TypeVar("T")


def cancellations() -> tuple[asyncio.Task[Any] | None, int]:
    """The running task and how many cancellations of it are pending now."""
    task = asyncio.current_task()
    return task, 0 if task is None else task.cancelling()


def keep_cancellation(task: asyncio.Task[Any] | None, requested: int) -> None:
    """Raise ``CancelledError`` if ``task`` was cancelled since it had ``requested``
    cancellations pending, although nothing raised it: the client library lost it.

    On Python 3.11 ``asyncio.wait_for`` returns the result when the cancellation arrives
    as the awaited operation finishes, and redis-py awaits every write that way when the
    connection has a socket timeout. The task would go on as if never cancelled, with a
    lock it was cancelled while taking.
    """
    if task is not None and task.cancelling() > requested:
        raise asyncio.CancelledError


async def completed(awaitable: Awaitable[T]) -> tuple[T, bool]:
    """Await ``awaitable`` to the end even if the caller is cancelled meanwhile.

    Returns its result and whether a cancellation arrived; the caller re-raises it once
    its own bookkeeping is done, so cancelled tasks stay cancelled.
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
            if task.done():
                return task.result(), cancelled
