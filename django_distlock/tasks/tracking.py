"""What the framework's signals tell a locked task: which ``TaskResult`` is running in
this thread (or task) now, and the id a backend gave a task being queued.

A task function is called without its ``TaskResult`` (unless it takes the context), but
every backend sends ``task_started`` with it just before, on the same thread, and
``task_enqueued`` as soon as the result exists (the ``ImmediateBackend`` runs the task
right after, inside ``enqueue()``). The receivers are connected when the first task is
locked (:func:`connect`).
"""

from __future__ import annotations

import contextvars
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .framework import framework

__all__ = ["Binding", "binding", "connect", "known_result", "running_result"]

_running: contextvars.ContextVar[Any] = contextvars.ContextVar("distlock_task_result", default=None)

binding: contextvars.ContextVar[Binding | None] = contextvars.ContextVar(
    "distlock_task_binding", default=None
)
"""The enqueue under way in this context whose result id is still to be told."""

# Results queued by this process and not finished, by id: a second enqueue of a unique
# task finds the first one's TaskResult here when its backend cannot fetch results.
_known: OrderedDict[str, Any] = OrderedDict()
KNOWN_MAX = 1000


class Binding:
    """An enqueue of ``func``'s task that waits for its result: ``on_result`` is called
    once, with the first ``TaskResult`` of that task a backend reports in this context."""

    __slots__ = ("func", "on_result", "result")

    def __init__(self, func: Callable[..., Any], on_result: Callable[[Any], None]) -> None:
        self.func = func
        self.on_result = on_result
        self.result: Any = None

    def bind(self, result: Any) -> None:
        """Report ``result`` (once: later calls do nothing)."""
        if self.result is None:
            self.result = result
            self.on_result(result)


def running_result(func: Callable[..., Any]) -> Any:
    """The ``TaskResult`` whose run of ``func``'s task is under way in this context, or
    ``None`` (the function is called directly, or by a backend that sends no signal)."""
    result = _running.get()
    if result is None or result.task.func is not func:
        return None
    return result


def known_result(result_id: str) -> Any:
    """A ``TaskResult`` this process queued and has not seen finish, by id."""
    return _known.get(result_id)


def _started(sender: Any = None, task_result: Any = None, **kwargs: Any) -> None:
    _running.set(task_result)


def _finished(sender: Any = None, task_result: Any = None, **kwargs: Any) -> None:
    _running.set(None)
    if task_result is not None:
        _known.pop(task_result.id, None)


def _enqueued(sender: Any = None, task_result: Any = None, **kwargs: Any) -> None:
    pending = binding.get()
    if task_result is None or pending is None or task_result.task.func is not pending.func:
        return
    _known[task_result.id] = task_result
    while len(_known) > KNOWN_MAX:
        _known.popitem(last=False)
    pending.bind(task_result)


def connect() -> None:
    """Connect the receivers (once; again after a test disconnects them)."""
    names = framework()
    names.task_started.connect(_started, weak=False, dispatch_uid=f"{__name__}.started")
    names.task_finished.connect(_finished, weak=False, dispatch_uid=f"{__name__}.finished")
    names.task_enqueued.connect(_enqueued, weak=False, dispatch_uid=f"{__name__}.enqueued")
