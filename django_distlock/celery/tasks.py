"""The two faces of a locked Celery task: the ``locked_task`` decorator and the
``LockedTask`` base class, whose ``apply_async`` is the publishing side of
``unique_while_queued`` (the lock name claimed for the task id before publishing)."""

from __future__ import annotations

import datetime
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, ParamSpec, TypeVar

from celery import Task, current_task
from celery.exceptions import Ignore
from celery.result import AsyncResult
from celery.signals import task_revoked
from kombu.utils.uuid import uuid

from ..connections import get_backend
from ..engine import LockError
from ..runs.claims import TaskClaims
from .options import Locking, OnBusy, body_of
from .runs import Run, logger

__all__ = ["LockedTask", "locked_task"]

P = ParamSpec("P")
R = TypeVar("R")


def locked_task(
    name: str,
    *,
    on_busy: OnBusy,
    blocking_timeout: float | None = None,
    timeout: float | None = None,
    max_retry_countdown: float = 60.0,
    unique_while_queued: bool = False,
    unique_timeout: float = 3600.0,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run a Celery task under the distributed lock ``name``; stack it under
    ``@app.task`` (or ``@shared_task``)::

        @app.task
        @locked_task("import:{account_id}", on_busy="retry")
        def import_account(account_id): ...

    ``name`` is a template filled from the task's arguments, bound to its signature with
    defaults (``import_account.delay(1)`` and ``.delay(account_id=1)`` take the same
    lock); a field that is not a parameter is a ``ValueError`` here. The lock is taken
    when a run starts, renewed while it runs (``timeout``, default
    ``DISTLOCK["TIMEOUT"]``, only bounds how long a killed worker keeps it) and released
    when it ends, whatever the outcome. Its context label is
    ``celery:<task name>[<task id>]``, and the body reaches it as
    ``self.request.distlock`` (``bind=True``) or ``current_task.request.distlock``.

    ``on_busy`` (required: say what your task needs) is what a run does when the lock
    is still held after ``blocking_timeout`` seconds (default: 0 for ``"skip"`` and
    ``"retry"``, forever for ``"wait"``):

    - ``"skip"``: the run ends without running the body; its result is
      ``{"distlock": "skipped", "lock": NAME, "retry_after": SECONDS}``, an INFO line
      is logged and a ``contended`` lock event recorded;
    - ``"retry"``: ``self.retry(countdown=...)`` with the holder's remaining lease, at
      most ``max_retry_countdown`` seconds, as the upper bound: the retry runs as soon
      as the holder lets go (:mod:`~django_distlock.runs.deferrals`); the task's
      ``max_retries`` applies (set ``max_retries=None`` to serve every request), and
      the last attempt fails with ``LockNotAcquired``;
    - ``"wait"``: the run fails with ``LockNotAcquired``.

    ``unique_while_queued=True`` also refuses to publish the task while a run with the
    same lock name is queued or running (for up to ``unique_timeout`` seconds in the
    queue), and keeps a copy of a message the broker delivers again from running twice;
    it needs the task's class to be :class:`LockedTask` (``@app.task(base=LockedTask)``),
    which does the publishing side (``django_distlock.E007`` otherwise).
    """

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if isinstance(func, Task) or inspect.isclass(func):
            raise TypeError(
                "locked_task decorates the task's function: put @locked_task(...) under "
                "@app.task (or @shared_task), not above it"
            )
        if not callable(func):
            raise TypeError(f"locked_task decorates functions, not {type(func).__name__}")
        if inspect.iscoroutinefunction(func):
            raise TypeError("Celery runs no async def tasks: locked_task needs a plain function")
        locking = Locking.of(
            name,
            func,
            on_busy=on_busy,
            blocking_timeout=blocking_timeout,
            timeout=timeout,
            max_retry_countdown=max_retry_countdown,
            unique_while_queued=unique_while_queued,
            unique_timeout=unique_timeout,
        )
        return _locked(func, locking)

    return decorate


def _locked(func: Callable[P, R], locking: Locking) -> Callable[P, R]:
    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        task = _task_running(run, args)
        claims = isinstance(task, LockedTask)
        this = Run(locking, task, func, args, kwargs, claims_published=claims)
        if this.served_early():
            raise Ignore
        if not this.begin():
            return this.busy()
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            this.end(exc)
            raise
        this.end(None)
        return result

    # Celery checks the arguments of delay() against the signature it reads from the
    # function without following __wrapped__.
    run.__signature__ = inspect.signature(func)  # type: ignore[attr-defined]
    run.__distlock__ = locking  # type: ignore[attr-defined]
    return run


def _task_running(run: Callable[..., Any], args: Sequence[Any]) -> Task | None:
    """The task whose body ``run`` is, running now (``None`` when ``run`` is called as a
    plain function)."""
    if args and isinstance(args[0], Task) and body_of(type(args[0])) is run:
        return args[0]  # bind=True
    task = current_task._get_current_object()
    if task is not None and body_of(type(task)) is run:
        return task
    return None


class LockedTask(Task):  # type: ignore[misc]
    """A Celery task base whose runs hold a distributed lock, configured by class
    attributes (the options of :func:`locked_task`, prefixed ``lock_``)::

        @app.task(base=LockedTask, lock_name="import:{account_id}", lock_on_busy="retry")
        def import_account(account_id): ...

        class ImportAccount(LockedTask):
            lock_name = "import:{account_id}"
            lock_on_busy = "skip"

            def run(self, account_id): ...

    It is also the base that makes ``unique_while_queued`` work: its
    :meth:`apply_async` (which ``delay()``, signatures, canvases, beat and retries all go
    through) claims the lock name for the task id before publishing, and while another
    task holds that claim (queued, or running) returns that task's ``AsyncResult``
    instead of publishing. So a task decorated with
    ``@locked_task(..., unique_while_queued=True)`` takes ``base=LockedTask``, or the app
    takes ``Celery(..., task_cls="django_distlock.celery:LockedTask")`` once for all its
    tasks (a task without a lock behaves as a plain ``Task``).

    A bad ``lock_name`` (a field that is no parameter of ``run``) or option fails when
    the class is created.
    """

    lock_name: ClassVar[str | None] = None
    """The lock's name template, filled from the arguments of ``run``; ``None``: no lock
    (unless ``run`` is decorated with :func:`locked_task`)."""
    lock_on_busy: ClassVar[str | None] = None
    """``"skip"``, ``"retry"`` or ``"wait"``: required with ``lock_name``."""
    lock_blocking_timeout: ClassVar[float | None] = None
    """Seconds to wait for a busy lock before ``lock_on_busy`` applies (default: 0 for
    skip and retry, forever for wait)."""
    lock_timeout: ClassVar[float | None] = None
    """Lease in seconds, renewed while the task runs (default ``DISTLOCK["TIMEOUT"]``)."""
    lock_max_retry_countdown: ClassVar[float] = 60.0
    """With ``"retry"``: the most seconds a retry waits (the holder's lease otherwise)."""
    lock_unique_while_queued: ClassVar[bool] = False
    """Refuse to publish while a task with the same lock name is queued or running."""
    lock_unique_timeout: ClassVar[float] = 3600.0
    """Seconds a queued task keeps its claim on the lock name (a message lost from the
    queue stops blocking new ones after that), plus any ``countdown``/``eta``."""

    _distlock: ClassVar[Locking | None] = None
    _distlock_bound: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        raw = inspect.getattr_static(cls, "run")
        static = isinstance(raw, staticmethod)
        func = body_of(cls)
        locking: Locking | None = getattr(func, "__distlock__", None)
        if locking is not None and locking.from_class:
            # Inherited from a LockedTask parent: lock the plain run anew, as cls says.
            func, locking = func.__wrapped__, None
            cls.run = staticmethod(func) if static else func  # type: ignore[method-assign]
        if locking is not None:
            if cls.lock_name is not None:
                raise TypeError(
                    f"{cls.__qualname__}: its run is decorated with @locked_task and it "
                    "sets lock_name too; configure the lock in one place"
                )
        elif cls.lock_name is not None:
            locking = Locking.of(
                cls.lock_name,
                func,
                on_busy=cls.lock_on_busy,
                blocking_timeout=cls.lock_blocking_timeout,
                timeout=cls.lock_timeout,
                max_retry_countdown=cls.lock_max_retry_countdown,
                unique_while_queued=cls.lock_unique_while_queued,
                unique_timeout=cls.lock_unique_timeout,
                from_class=True,
                argument="lock_",
            )
            run = _locked(func, locking)
            cls.run = staticmethod(run) if static else run  # type: ignore[method-assign]
        cls._distlock = locking
        cls._distlock_bound = not static

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Publish the task, as ``Task.apply_async`` does; with ``unique_while_queued``,
        first claim its lock name for ``task_id``. While another task holds the claim
        (queued, or running with its lock held) nothing is published and that task's
        ``AsyncResult`` is returned (its ``id`` is not the ``task_id`` you passed).
        A retry publishing the running task again under its own id is never refused.

        Raises ``LockBackendUnavailable`` if Redis cannot be reached (nothing is
        published)."""
        locking = self._distlock
        if locking is None or not locking.unique_while_queued:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        task_id = task_id or uuid()
        name = self._lock_name_for(locking, args, kwargs)
        claims = TaskClaims(get_backend(), name, task_id)
        holder = claims.take(locking.unique_timeout + _delay_of(options))
        if holder is not None and task_id != self.request.id:
            logger.info(
                "%s[%s] not published: %s[%s] holds lock name %r (queued or running)",
                self.name,
                task_id,
                self.name,
                holder,
                name,
            )
            return self.AsyncResult(holder)
        try:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        except BaseException:
            claims.forget()
            raise

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Give back the claim of a message a worker discards unrun (revoked, expired),
        rather than let it block the lock name until ``unique_timeout``."""
        super().on_bound(app)
        if cls._distlock is not None and cls._distlock.unique_while_queued:
            task_revoked.connect(_give_back_claim, weak=False, dispatch_uid=__name__)

    def _lock_name_for(
        self, locking: Locking, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
    ) -> str:
        """The lock name of a message's arguments (``self`` stands for a bound task's own
        first parameter)."""
        call_args = (self, *(args or ())) if self._distlock_bound else tuple(args or ())
        return locking.name_for(call_args, dict(kwargs or {}))


def _give_back_claim(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    """``task_revoked`` receiver: a revoked or expired message of a unique task will not
    run, so its claim goes (compare-and-delete: only if it is still that task's)."""
    if not isinstance(sender, LockedTask) or request is None or request.id is None:
        return
    locking = sender._distlock
    if locking is None or not locking.unique_while_queued:
        return
    try:
        name = sender._lock_name_for(locking, request.args, request.kwargs)
        TaskClaims(get_backend(), name, request.id).forget()
    except (LockError, TypeError, ValueError) as error:
        logger.warning(
            "%s[%s] revoked: could not give back its claim: %s", sender.name, request.id, error
        )


def _delay_of(options: Mapping[str, Any]) -> float:
    """Seconds until a message published with ``options`` may run (``countdown``/``eta``)."""
    countdown = options.get("countdown")
    if countdown:
        return max(float(countdown), 0.0)
    eta = options.get("eta")
    if isinstance(eta, str):
        eta = datetime.datetime.fromisoformat(eta)
    if isinstance(eta, datetime.datetime):
        now = datetime.datetime.now(eta.tzinfo or None)
        return max((eta - now).total_seconds(), 0.0)
    return 0.0
