"""``locked_task``: a ``Task`` of Django's tasks framework whose runs hold a lock."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async

from .framework import framework
from .options import Locking, OnBusy
from .queueing import enqueue_unique
from .runs import Run
from .tracking import connect, running_result

__all__ = ["locked_task"]

T = TypeVar("T")


def locked_task(
    name: str,
    *,
    on_busy: OnBusy,
    blocking_timeout: float | None = None,
    timeout: float | None = None,
    unique_while_queued: bool = False,
    unique_timeout: float = 3600.0,
) -> Callable[[T], T]:
    """Run a task of Django's tasks framework under the distributed lock ``name``; apply
    it above ``@task()``::

        @locked_task("import:{account_id}", on_busy="defer", unique_while_queued=True)
        @task()
        def import_account(account_id): ...

    It returns a ``Task`` of the same class (workers find it by its module path, as
    usual). ``name`` is a template filled from the task's arguments bound to its
    signature with defaults (``.enqueue(1)`` and ``.enqueue(account_id=1)`` take the
    same lock); a field that is no parameter is a ``ValueError`` here. Each run holds
    the lock, renewed by the watchdog (``timeout``, default ``DISTLOCK["TIMEOUT"]``,
    only bounds how long a killed worker keeps it), and gives it back by token when it
    ends. Its context label is ``tasks:<module path>[<result id>]``. An ``async def``
    task holds it from the asyncio task that runs it.

    ``on_busy`` (required: say what your task needs) is what a run does when the lock is
    still held after
    ``blocking_timeout`` seconds (default: 0 for ``"skip"`` and ``"defer"``, forever
    for ``"wait"``): ``"skip"`` ends it at once with the return value
    :data:`SKIPPED` (and a ``contended`` lock event); ``"defer"`` queues the task again
    to run as soon as the holder lets go, with ``run_after`` = the holder's remaining
    lease (at most the lock's lease) as the upper bound (:mod:`~django_distlock.runs.deferrals`),
    and ends this run with :data:`DEFERRED`; ``"wait"`` fails it with ``LockNotAcquired``.

    ``unique_while_queued=True``: ``enqueue()``/``aenqueue()`` while a task with the same
    lock name is queued or running returns that task's ``TaskResult`` (same id) and
    queues nothing; the claim lasts ``unique_timeout`` seconds after the task may run,
    so a task lost from the queue stops blocking the name then (a run waiting for the
    lock holds it for one lease at a time, renewed by its worker; a finished result's
    claim is dropped at the next enqueue).
    """

    def decorate(task: T) -> T:
        names = framework()
        if not isinstance(task, names.Task):
            raise TypeError(
                "locked_task decorates a Task: put @locked_task(...) above @task(), "
                f"not below it (got {type(task).__name__})"
            )
        if getattr(task.func, "__distlock__", None) is not None:
            raise TypeError(f"{task.module_path} is locked already")
        func = task.func
        locking = Locking.of(
            name,
            func,
            on_busy=on_busy,
            blocking_timeout=blocking_timeout,
            timeout=timeout,
            unique_while_queued=unique_while_queued,
            unique_timeout=unique_timeout,
        )
        connect()
        fields = {field.name: getattr(task, field.name) for field in dataclasses.fields(task)}
        run = _locked(func, locking, takes_context=task.takes_context)
        return _locked_class(type(task))(**{**fields, "func": run})

    return decorate


def _locked(
    func: Callable[..., Any], locking: Locking, *, takes_context: bool
) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(func):
        return _alocked(func, locking, takes_context=takes_context)

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        # A task taking the context is called with it: its TaskResult is there.
        result = args[0].task_result if takes_context else running_result(run)
        this = Run(locking, result, func, args, kwargs)
        if this.served_early():
            return this.ran_early()
        if not this.begin():
            return this.busy()
        try:
            value = func(*args, **kwargs)
        except BaseException as exc:
            this.end(exc)
            raise
        this.end(None)
        return value

    run.__distlock__ = locking  # type: ignore[attr-defined]
    return run


def _alocked(
    func: Callable[..., Any], locking: Locking, *, takes_context: bool
) -> Callable[..., Any]:
    """:func:`_locked` for an ``async def`` task: the lock is taken and given back by the
    task running it; what ``on_busy`` does (a log line, a claim, an enqueue) runs in a
    thread."""

    @functools.wraps(func)
    async def run(*args: Any, **kwargs: Any) -> Any:
        result = args[0].task_result if takes_context else running_result(run)
        this = Run(locking, result, func, args, kwargs)
        if await sync_to_async(this.served_early, thread_sensitive=False)():
            return this.ran_early()
        if not await this.abegin():
            return await sync_to_async(this.busy, thread_sensitive=True)()
        try:
            value = await func(*args, **kwargs)
        except BaseException as exc:
            await this.aend(exc)
            raise
        await this.aend(None)
        return value

    run.__distlock__ = locking  # type: ignore[attr-defined]
    return run


@functools.cache
def _locked_class(base: type[Any]) -> type[Any]:
    """The class of locked tasks whose backend's task class is ``base``: the same, but
    ``enqueue()``/``aenqueue()`` honour ``unique_while_queued``."""

    def enqueue(self: Any, *args: Any, **kwargs: Any) -> Any:
        locking: Locking = self.func.__distlock__
        if not locking.unique_while_queued:
            return base.enqueue(self, *args, **kwargs)
        return enqueue_unique(
            self, locking, args, kwargs, lambda: base.enqueue(self, *args, **kwargs)
        )

    async def aenqueue(self: Any, *args: Any, **kwargs: Any) -> Any:
        locking: Locking = self.func.__distlock__
        if not locking.unique_while_queued:
            return await base.aenqueue(self, *args, **kwargs)
        # Claims are sync Redis calls, and the wait for another enqueue's hand-over sleeps.
        return await sync_to_async(enqueue, thread_sensitive=True)(self, *args, **kwargs)

    enqueue.__doc__ = base.enqueue.__doc__
    aenqueue.__doc__ = base.aenqueue.__doc__
    return type(
        f"Locked{base.__name__}",
        (base,),
        {
            "__slots__": (),
            "__module__": __name__,
            "__qualname__": f"Locked{base.__qualname__}",
            "__doc__": f"A locked {base.__qualname__} (see locked_task).",
            "enqueue": enqueue,
            "aenqueue": aenqueue,
        },
    )
