"""Celery tasks that never run twice at once: ``locked_task`` and ``LockedTask``.

Stack :func:`locked_task` under ``@app.task`` (or ``@shared_task``)::

    from celery import shared_task
    from django_distlock.celery import locked_task

    @shared_task
    @locked_task("import:{account_id}", on_busy="retry")
    def import_account(account_id): ...

or give a task the :class:`LockedTask` base and the same options as class attributes
(``@app.task(base=LockedTask, lock_name="import:{account_id}", lock_on_busy="retry")``).
Each run holds the lock named by the template filled from the task's arguments (bound to
its signature with defaults, so ``import_account.delay(1)`` and
``import_account.delay(account_id=1)`` take the same lock), renewed while it runs and
released by token when it ends, whatever the outcome. ``on_busy`` says what a run does
when another holds the lock: ``"skip"``, ``"retry"`` or ``"wait"``. With
``unique_while_queued``, publishing the task again while a run with the same lock name is
queued or running returns that run's ``AsyncResult`` instead (LockedTask only: see
:class:`LockedTask`; ``manage.py check`` reports a task without it as
``django_distlock.E007``, and a worker refuses to start with one). Guide:
``docs/celery.md``.

Importing this module imports Celery; importing ``django_distlock`` does not.

Why this module is long: it is one feature whose two faces (the decorator and the base
class) share one run procedure, whose branches (skip, retry, wait, a redelivered copy)
only make sense read together with the publishing side they answer; the Redis side of
``unique_while_queued`` lives in :mod:`.engine.claims`.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NoReturn, ParamSpec, TypeVar

from celery import Celery, Task, current_app, current_task
from celery.exceptions import Ignore, Reject, Retry
from celery.result import AsyncResult
from celery.signals import task_revoked, worker_init
from django.apps import apps
from kombu.utils.uuid import uuid

from ..commands.terminal import holder_label, timestamp_and_age
from ..connections import get_backend
from ..engine import (
    MAX_CONTEXT_LENGTH,
    Lock,
    LockError,
    LockNotAcquired,
    NameTemplate,
    TaskClaims,
    clean_label,
    current_holder,
    validate_name,
    validate_seconds,
)
from ..locks import distlock

__all__ = ["LockedTask", "locked_task"]

P = ParamSpec("P")
R = TypeVar("R")

OnBusy = Literal["skip", "retry", "wait"]
ON_BUSY: tuple[str, ...] = ("skip", "retry", "wait")

logger = logging.getLogger("django_distlock.celery")

# How long a redelivered copy of a running task waits for the lock before it is put back
# on the queue: long enough for the run that holds it to hand it over if it is ending
# (a retry it published itself arrives that early), short enough to free the worker.
COPY_WAIT = 1.0

# Seconds a broker keeps an unacknowledged message before delivering it again, when the
# app does not say (kombu's default for Redis and SQS).
DEFAULT_VISIBILITY_TIMEOUT = 3600.0


@dataclass(frozen=True, slots=True)
class _Locking:
    """How a task is locked: the name template bound to the task function's signature,
    and the options of :func:`locked_task`, validated."""

    template: str
    name_for: Callable[[Sequence[Any], Mapping[str, Any]], str]
    on_busy: str
    wait: float | None
    timeout: float | None
    max_retry_countdown: float
    unique_while_queued: bool
    unique_timeout: float
    from_class: bool

    @classmethod
    def build(
        cls,
        name: Any,
        func: Callable[..., Any],
        *,
        on_busy: Any,
        blocking_timeout: Any,
        timeout: Any,
        max_retry_countdown: Any,
        unique_while_queued: Any,
        unique_timeout: Any,
        from_class: bool = False,
        argument: str = "",
    ) -> _Locking:
        """Validate everything now (``TypeError``/``ValueError`` naming the option), so
        that a task that cannot work fails where it is defined."""
        if on_busy not in ON_BUSY:
            raise ValueError(
                f"{argument}on_busy must be one of {', '.join(map(repr, ON_BUSY))}, not {on_busy!r}"
            )
        if not isinstance(unique_while_queued, bool):
            raise TypeError(
                f"{argument}unique_while_queued must be a bool, "
                f"not {type(unique_while_queued).__name__}"
            )
        template = NameTemplate(name)
        if template.is_constant:
            validate_name(name, f"{argument}name")
        if blocking_timeout is not None:
            wait = validate_seconds(
                blocking_timeout, f"{argument}blocking_timeout", allow_zero=True
            )
        else:
            wait = None if on_busy == "wait" else 0.0
        return cls(
            template=name,
            name_for=template.namer(inspect.signature(func), f"{func.__qualname__}()"),
            on_busy=on_busy,
            wait=wait,
            timeout=None if timeout is None else validate_seconds(timeout, f"{argument}timeout"),
            max_retry_countdown=validate_seconds(
                max_retry_countdown, f"{argument}max_retry_countdown", allow_zero=True
            ),
            unique_while_queued=unique_while_queued,
            unique_timeout=validate_seconds(unique_timeout, f"{argument}unique_timeout"),
            from_class=from_class,
        )

    def countdown(self, retry_after: float | None) -> float:
        """Seconds until a busy lock is worth trying again: the holder's remaining lease,
        at most ``max_retry_countdown``."""
        if retry_after is None:
            return self.max_retry_countdown
        return min(max(retry_after, 0.0), self.max_retry_countdown)


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
      most ``max_retry_countdown`` seconds; the task's ``max_retries`` applies, and the
      last attempt fails with ``LockNotAcquired``;
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
        locking = _Locking.build(
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


def _locked(func: Callable[P, R], locking: _Locking) -> Callable[P, R]:
    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        this = _Run(locking, _task_running(run, args), func, args, kwargs)
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


def _body_of(task_class: type[Task]) -> Any:
    """The function a task class runs (its ``run``, unwrapped from ``staticmethod``).
    Read on the class: Celery's ``autoretry_for`` wraps ``run`` on the instance."""
    for klass in task_class.__mro__:
        run = klass.__dict__.get("run")
        if run is not None:
            return run.__func__ if isinstance(run, staticmethod) else run
    return None


def _task_running(run: Callable[..., Any], args: Sequence[Any]) -> Task | None:
    """The task whose body ``run`` is, running now (``None`` when ``run`` is called as a
    plain function)."""
    if args and isinstance(args[0], Task) and _body_of(type(args[0])) is run:
        return args[0]  # bind=True
    task = current_task._get_current_object()
    if task is not None and _body_of(type(task)) is run:
        return task
    return None


def skipped_result(name: str, retry_after: float | None) -> dict[str, Any]:
    """The result of a run skipped because lock ``name`` was busy."""
    return {"distlock": "skipped", "lock": name, "retry_after": retry_after}


class _Run:
    """One run of a locked task: take the lock (or do what ``on_busy`` says), run the
    body, give the lock back."""

    def __init__(
        self,
        locking: _Locking,
        task: Task | None,
        func: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> None:
        self.locking = locking
        self.task = task
        self.name = locking.name_for(args, kwargs)
        request = None if task is None else task.request
        self.request = request
        self.task_id: str | None = (
            None if request is None or request.called_directly else request.id
        )
        self.label = _label(task, self.task_id, func)
        self.lock = distlock(
            self.name,
            timeout=locking.timeout,
            auto_renew=True,
            on_lost=functools.partial(_report_lost, self.label),
            context=f"celery:{self.label}",
        )
        # With unique_while_queued, the run's claims on the lock name (None when the
        # task was called directly: there is no queue then).
        self.claims: TaskClaims | None = None
        if locking.unique_while_queued and self.task_id is not None:
            if not isinstance(task, LockedTask):  # E007, where no check or worker saw it
                raise TypeError(f"{self.label}: {_NEEDS_LOCKED_TASK} {NEEDS_LOCKED_TASK_HINT}")
            self.claims = TaskClaims(self.lock.backend, self.name, self.task_id)

    def begin(self) -> bool:
        """Take the lock for the body; ``False`` if it is busy (see :meth:`busy`).
        Raises ``Ignore`` for a copy of a message whose task already ran or runs."""
        if not self._acquire():
            return False
        try:
            if self.claims is not None and not self.claims.start(self.locking.unique_timeout):
                self.lock.release()
                logger.info("%s already ran: this copy of its message is dropped", self.label)
                raise Ignore
        except BaseException as exc:
            self.lock.__exit__(type(exc), exc, exc.__traceback__)
            raise
        if self.request is not None:
            self.request.distlock = self.lock
        return True

    def _acquire(self) -> bool:
        lock, claims, wait = self.lock, self.claims, self.locking.wait
        if claims is None:
            return lock.acquire(blocking_timeout=wait)
        if lock.acquire(blocking_timeout=0):
            return True
        if claims.held_by_a_run():
            # The broker delivered this message again while the run it started still
            # holds the lock (or was killed and its lease has not run out yet).
            if lock.acquire(blocking_timeout=COPY_WAIT):
                return True
            self._put_back(claims)
        return wait != 0 and lock.acquire(blocking_timeout=wait)

    def _put_back(self, claims: TaskClaims) -> NoReturn:
        """Send this copy back to the queue to run after the holder's lease (a holder
        that was killed leaves the lock then; if the task is done by then, the copy is
        dropped). Other copies delivered meanwhile are dropped at once."""
        task = self.task
        countdown = self.locking.countdown(self.lock.retry_after)
        if task is not None and claims.defer_once(countdown / 2):
            task.signature_from_request(task.request, countdown=countdown).apply_async()
            logger.info(
                "%s is already running (its message was delivered again): put back to "
                "run in %.3gs if that run does not end",
                self.label,
                countdown,
            )
        raise Ignore

    def busy(self) -> Any:
        """The lock stayed busy: skip, retry or fail, as ``on_busy`` says."""
        locking = self.locking
        retry_after = self.lock.retry_after
        if locking.on_busy == "skip":
            logger.info(
                "%s skipped: lock %r is held by %s",
                self.label,
                self.name,
                self._holder(),
            )
            self._finish(requeued=False)
            return skipped_result(self.name, retry_after)
        how = f"still held after {locking.wait:g}s" if locking.wait else "held by someone else"
        error = LockNotAcquired(
            f"could not acquire lock {self.name!r} for {self.label}: {how}",
            name=self.name,
            retry_after=retry_after,
        )
        if locking.on_busy == "retry" and self.task is not None:
            try:
                raise self.task.retry(countdown=locking.countdown(retry_after), exc=error)
            except Retry:
                raise
            except BaseException:  # retries exhausted (or called directly): a failure
                self._finish(requeued=False)
                raise
        self._finish(requeued=False)
        raise error

    def _holder(self) -> str:
        """``web-3 pid 4242 since 2026-11-22 10:01:02 UTC (12s ago)``, for a log line."""
        try:
            record = current_holder(self.lock.backend, self.name)
        except LockError:
            record = None
        if record is None:
            return "someone else (who has just let go)"
        since = datetime.datetime.fromtimestamp(record.acquired_at, datetime.UTC)
        return f"{holder_label(record.host, record.pid)} since {timestamp_and_age(since)}"

    def _finish(self, *, requeued: bool) -> None:
        if self.claims is not None:
            lasts = self.locking.unique_timeout if requeued else self._done_for()
            self.claims.finish(requeued=requeued, lasts=lasts)

    def _done_for(self) -> float:
        """How long a finished run's task id is remembered: as long as the broker may
        deliver a copy of its message again (or put back a copy, see :meth:`_put_back`)."""
        visibility = DEFAULT_VISIBILITY_TIMEOUT
        if self.task is not None:
            options = self.task.app.conf.broker_transport_options or {}
            visibility = float(options.get("visibility_timeout", visibility))
        return max(self.locking.unique_timeout, visibility + self.locking.max_retry_countdown)

    def end(self, exc: BaseException | None) -> None:
        """After the body: mark the task done (or queued again, after a retry) and give
        the lock back. The body's own exception is never replaced."""
        finish_error: LockError | None = None
        try:
            self._finish(requeued=_published_again(exc))
        except LockError as error:
            finish_error = error
            logger.error("%s: could not record the end of its run: %s", self.label, error)
        finally:
            if exc is None:
                self.lock.__exit__(None, None, None)
            else:
                self.lock.__exit__(type(exc), exc, exc.__traceback__)
        if finish_error is not None and exc is None:
            raise finish_error


def _report_lost(label: str, lock: Lock) -> None:
    """``on_lost`` of a task's lock (a function, not a method of the run: the lock must
    not keep the run alive, nor the run the lock, through a cycle)."""
    logger.warning(
        "%s lost its lock %r while it ran (%s): another run may start now",
        label,
        lock.name,
        lock.lost_reason or "its lease ended",
    )


def _published_again(exc: BaseException | None) -> bool:
    """Whether a run that ended with ``exc`` will run again under the same task id."""
    return isinstance(exc, Retry) or (isinstance(exc, Reject) and bool(exc.requeue))


def _label(task: Task | None, task_id: str | None, func: Callable[..., Any]) -> str:
    """``tasks.import_account[<id>]``, short enough for a context label (the id is kept
    whole: a redelivered copy recognises its own run by it)."""
    if task is None:
        return f"{func.__module__}.{func.__qualname__}"[: MAX_CONTEXT_LENGTH - len("celery:")]
    suffix = "" if task_id is None else f"[{task_id}]"
    room = MAX_CONTEXT_LENGTH - len("celery:") - len(suffix)
    return clean_label(f"{str(task.name)[: max(room, 0)]}{suffix}")


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

    _distlock: ClassVar[_Locking | None] = None
    _distlock_bound: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        raw = inspect.getattr_static(cls, "run")
        static = isinstance(raw, staticmethod)
        func = _body_of(cls)
        locking: _Locking | None = getattr(func, "__distlock__", None)
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
            locking = _Locking.build(
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
        self, locking: _Locking, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
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


_NEEDS_LOCKED_TASK = (
    "unique_while_queued=True needs the task's class to be django_distlock.celery.LockedTask, "
    "which refuses duplicates when they are published."
)
NEEDS_LOCKED_TASK_HINT = (
    "Give the task the LockedTask base, @shared_task(base=LockedTask) or "
    "@app.task(base=LockedTask) (from django_distlock.celery import LockedTask), or make it "
    "the class of every task of the app: Celery('proj', "
    "task_cls='django_distlock.celery:LockedTask')."
)
"""How to fix ``django_distlock.E007``."""


def unique_tasks_without_locked_task(app: Celery) -> list[str]:
    """What ``django_distlock.E007`` reports: one line per task of ``app`` whose body asks
    for ``unique_while_queued`` but whose class is not :class:`LockedTask` (its duplicates
    would be queued, and its first run would fail). Finalizes ``app``."""
    problems = []
    for name, task in sorted(app.tasks.items()):
        locking: _Locking | None = getattr(_body_of(type(task)), "__distlock__", None)
        if locking is not None and locking.unique_while_queued and not isinstance(task, LockedTask):
            problems.append(
                f"Celery task {name!r} uses unique_while_queued=True, but its class is not "
                "LockedTask: its duplicates would be queued, and its first run would fail"
            )
    return problems


def check_current_app() -> list[str]:
    """E007 for Celery's current app (the project's: Celery's Django guide has the project
    package load it with the settings), once each installed app's ``tasks`` module is
    imported, as ``app.autodiscover_tasks()`` has a worker do: so ``manage.py check`` sees
    the tasks a worker will run, not only those the project's URLs happen to import."""
    current_app.loader.autodiscover_tasks([config.name for config in apps.get_app_configs()])
    return unique_tasks_without_locked_task(current_app)


def guard_workers() -> None:
    """Have every worker of this process refuse to start while one of its tasks is
    ``django_distlock.E007`` (``AppConfig.ready()`` calls this where Celery is loaded)."""
    worker_init.connect(_refuse_to_start, weak=False, dispatch_uid=f"{__name__}.guard_workers")


def _refuse_to_start(sender: Any = None, **kwargs: Any) -> None:
    """``worker_init`` receiver: the worker has imported its task modules and takes no
    message yet. ``SystemExit``, because Celery's signal dispatch logs any ``Exception``
    a receiver raises and goes on; the worker exits with status 1 and says why on stderr
    (its logging is not set up yet)."""
    app = getattr(sender, "app", None)
    problems = [] if app is None else unique_tasks_without_locked_task(app)
    if problems:
        lines = [f"(django_distlock.E007) {problem}" for problem in problems]
        raise SystemExit(
            "celery worker refuses to start:\n"
            + "\n".join(lines)
            + f"\n\tHINT: {NEEDS_LOCKED_TASK_HINT}"
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
