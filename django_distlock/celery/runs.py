"""One run of a locked Celery task: take the lock (or skip, retry or fail, as
``on_busy`` says), run the body, give the lock back; with ``unique_while_queued``, the
run's side of its claims (a redelivered copy of a running task's message is dropped or
put back)."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from ..engine import LockError, LockNotAcquired
from ..runs.claims import TaskClaims
from ..runs.deferrals import Parked, serve_when_free
from ..runs.locking import end_run, holder_of, lease_of, run_label, run_lock
from ..runs.waiting import waiting
from .options import NEEDS_LOCKED_TASK, NEEDS_LOCKED_TASK_HINT, Locking

__all__ = ["COPY_WAIT", "DEFAULT_VISIBILITY_TIMEOUT", "Run", "logger", "skipped_result"]

logger = logging.getLogger("django_distlock.celery")

# How long a redelivered copy of a running task waits for the lock before it is put back
# on the queue: long enough for the run that holds it to hand it over if it is ending
# (a retry it published itself arrives that early), short enough to free the worker.
COPY_WAIT = 1.0

# Seconds a broker keeps an unacknowledged message before delivering it again, when the
# app does not say (kombu's default for Redis and SQS).
DEFAULT_VISIBILITY_TIMEOUT = 3600.0

PREFIX = "celery:"


def skipped_result(name: str, retry_after: float | None) -> dict[str, Any]:
    """The result of a run skipped because lock ``name`` was busy."""
    return {"distlock": "skipped", "lock": name, "retry_after": retry_after}


class Run:
    """One run of a locked task: take the lock (or do what ``on_busy`` says), run the
    body, give the lock back."""

    def __init__(
        self,
        locking: Locking,
        task: Task | None,
        func: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        *,
        claims_published: bool,
    ) -> None:
        self.locking = locking
        self.task = task
        self.name = locking.name_for(args, kwargs)
        request = None if task is None else task.request
        self.request = request
        self.task_id: str | None = (
            None if request is None or request.called_directly else request.id
        )
        task_name = f"{func.__module__}.{func.__qualname__}" if task is None else str(task.name)
        self.label = run_label(PREFIX, task_name, self.task_id)
        self.lock = run_lock(self.name, locking, PREFIX, self.label, logger)
        # With unique_while_queued, the run's claims on the lock name (None when the
        # task was called directly: there is no queue then).
        self.claims: TaskClaims | None = None
        if locking.unique_while_queued and self.task_id is not None:
            if not claims_published:  # E007, where no check or worker saw it
                raise TypeError(f"{self.label}: {NEEDS_LOCKED_TASK} {NEEDS_LOCKED_TASK_HINT}")
            self.claims = TaskClaims(self.lock.backend, self.name, self.task_id)

    def served_early(self) -> bool:
        """Whether this run is a retry put off by a countdown in whose place an early copy
        was queued when the lock was released: it must not run (nor store a result: the
        early copy has the same task id). One round trip, for a retry with an ``eta``."""
        request = self.request
        if (
            self.locking.on_busy != "retry"
            or self.task_id is None
            or request is None
            or getattr(request, "eta", None) is None
        ):
            return False
        parked = TaskClaims(self.lock.backend, self.name, f"{self.task_id}:{request.retries}")
        if parked.take_parked() != "s":
            return False
        logger.info(
            "%s: not run, an early copy was queued in its place when lock %r was released",
            self.label,
            self.name,
        )
        return True

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
        if wait == 0:
            return False
        # Waiting: the claim is held as waiting meanwhile, renewed by this worker, so
        # that a killed worker's claim ends one lease later.
        with waiting(claims, lease_of(lock)):
            return lock.acquire(blocking_timeout=wait)

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
                holder_of(self.lock),
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
            except Retry as retry:
                self._retry_early_when_free(retry)
                raise
            except BaseException:  # retries exhausted (or called directly): a failure
                self._finish(requeued=False)
                raise
        self._finish(requeued=False)
        raise error

    def _retry_early_when_free(self, retry: Retry) -> None:
        """Have the retry ``retry`` published (put off by its countdown) published again
        at once if the lock is released before then (:mod:`~django_distlock.runs.deferrals`)."""
        request = self.request
        if retry.sig is None or retry.is_eager or request is None or self.task_id is None:
            return
        early = retry.sig.clone()
        early.options.pop("countdown", None)
        early.options.pop("eta", None)
        countdown = float(retry.when or 0.0)
        parked = TaskClaims(self.lock.backend, self.name, f"{self.task_id}:{request.retries + 1}")
        try:
            serve_when_free(
                Parked(parked, time.monotonic() + countdown, early.apply_async, self.label),
                lease_of(self.lock),
                f"{PREFIX}{self.label} put off",
            )
        except LockError as error:
            logger.warning("%s: its retry runs after its countdown: %s", self.label, error)

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
        end_run(self.lock, exc, functools.partial(self._finish_after_body, exc))

    def _finish_after_body(self, exc: BaseException | None) -> LockError | None:
        try:
            self._finish(requeued=_published_again(exc))
        except LockError as error:
            logger.error("%s: could not record the end of its run: %s", self.label, error)
            return error
        return None


def _published_again(exc: BaseException | None) -> bool:
    """Whether a run that ended with ``exc`` will run again under the same task id."""
    return isinstance(exc, Retry) or (isinstance(exc, Reject) and bool(exc.requeue))
