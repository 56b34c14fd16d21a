"""Who owns a hold: the thread that took it with the sync API, the task that took it
with the async API (captured when the async method is *called*, so that ``wait_for``
and friends give it to the caller), and how a loss is delivered to an async owner's
loop from the notifier thread."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from typing import Any

from .hold import Hold
from .keys import clean_label

__all__ = ["current_task_or_thread", "owner_name", "run_on_loop_of", "running_task"]

logger = logging.getLogger("django_distlock")


def running_task() -> asyncio.Task[Any] | None:
    """The task running in this thread, if any."""
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop runs in this thread
        return None


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def current_task_or_thread() -> Any:
    """The running task, else the current thread."""
    task = running_task()
    return task if task is not None else threading.current_thread()


_callback_tasks: set[Any] = set()


def run_on_loop_of(hold: Hold, awaitable: Any) -> None:
    """Run the awaitable an async ``on_lost`` returned: here if a loop runs in this
    thread, else on the loop the hold was taken on (losses are reported off the loop)."""
    if _loop_running():
        task = asyncio.ensure_future(awaitable)
        _callback_tasks.add(task)
        task.add_done_callback(_callback_tasks.discard)
        return
    loop = hold.loop
    if loop is None or loop.is_closed():
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        logger.warning("django-distlock: on_lost of %r is async but its loop is gone", hold.name)
        return
    asyncio.run_coroutine_threadsafe(_awaited(awaitable), loop)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def owner_name(owner: Any) -> str:
    """The name of a thread or task, as a hold stores it (made storable)."""
    get_name = getattr(owner, "get_name", None)
    return clean_label(get_name() if get_name is not None else owner.name)
