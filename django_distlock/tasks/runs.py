"""One run of a locked task: take the lock (or do what ``on_busy`` says), run the body,
give the lock back, whatever the outcome."""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from ..engine import LockError, LockNotAcquired
from ..runs.claims import TaskClaims
from ..runs.deferrals import Parked, serve_when_free
from ..runs.locking import end_run, holder_of, lease_of, run_label, run_lock
from ..runs.waiting import start_waiting, stop_waiting, waiting
from .options import Locking
from .queueing import PENDING_TIMEOUT, claim_lasts, claims_for, hand_over, placeholder

__all__ = ["DEFERRED", "SKIPPED", "Run"]

logger = logging.getLogger("django_distlock.tasks")

SKIPPED = "django_distlock.tasks.SKIPPED"
"""The return value of a run that ``on_busy="skip"`` ended because the lock was busy."""
DEFERRED = "django_distlock.tasks.DEFERRED"
"""The return value of a run that ``on_busy="defer"`` put off: the task was queued again
to run when the holder lets go (at the latest when the holder's lease ends); also that of
the copy queued for the lease's end when an earlier one was queued in its place."""

PREFIX = "tasks:"


class Run:
    """One run of a locked task's body ``func`` with ``args`` and ``kwargs``, for the
    ``TaskResult`` ``result`` (``None``: called directly)."""

    def __init__(
        self,
        locking: Locking,
        result: Any,
        func: Callable[..., Any],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> None:
        self.locking = locking
        self.name = locking.name_for(args, kwargs)
        self.result = result
        task_name = f"{func.__module__}.{func.__qualname__}"
        self.label = run_label(PREFIX, task_name, None if result is None else result.id)
        self.lock = run_lock(self.name, locking, PREFIX, self.label, logger)
        # The run's claim on the lock name (unique_while_queued), when it runs from a queue.
        self.claims: TaskClaims | None = None
        if locking.unique_while_queued and result is not None:
            self.claims = claims_for(self.name, result.id)

    def served_early(self) -> bool:
        """Whether this run is a put-off copy in whose place an early one was queued when
        the lock was released (it must not run: :meth:`ran_early`). One round trip, for
        a task that defers and runs with a ``run_after``."""
        result = self.result
        if self.locking.on_busy != "defer" or result is None or result.task.run_after is None:
            return False
        return claims_for(self.name, result.id).take_parked() == "s"

    def ran_early(self) -> str:
        """What a run that :meth:`served_early` returns instead of running."""
        logger.info(
            "%s: not run, an early copy was queued in its place when lock %r was released",
            self.label,
            self.name,
        )
        return DEFERRED

    def begin(self) -> bool:
        """Take the lock for the body; ``False`` if it stayed busy (see :meth:`busy`).
        A run that waits for it holds its claim as waiting meanwhile (renewed by this
        worker, so that a killed worker's claim ends one lease later)."""
        wait = self.locking.wait
        if self.claims is None or wait == 0:
            acquired = self.lock.acquire(blocking_timeout=wait)
        else:
            with waiting(self.claims, lease_of(self.lock)):
                acquired = self.lock.acquire(blocking_timeout=wait)
        if not acquired:
            return False
        try:
            self._start()
        except BaseException as exc:
            self.lock.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return True

    async def abegin(self) -> bool:
        """:meth:`begin` for an ``async def`` task (the lock belongs to the calling task)."""
        wait = self.locking.wait
        if self.claims is None or wait == 0:
            acquired = await self.lock.aacquire(blocking_timeout=wait)
        else:
            kept = await sync_to_async(start_waiting, thread_sensitive=False)(
                self.claims, lease_of(self.lock)
            )
            try:
                acquired = await self.lock.aacquire(blocking_timeout=wait)
            finally:
                stop_waiting(kept)
        if not acquired:
            return False
        try:
            await sync_to_async(self._start, thread_sensitive=False)()
        except BaseException as exc:
            await self.lock.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return True

    def end(self, exc: BaseException | None) -> None:
        """After the body: give the claim back, then the lock. The body's own exception
        is never replaced."""
        end_run(self.lock, exc, self._finish_after_body)

    async def aend(self, exc: BaseException | None) -> None:
        """:meth:`end` for an ``async def`` task."""
        try:
            finish_error = await sync_to_async(self._finish_after_body, thread_sensitive=False)()
        finally:
            if exc is None:
                await self.lock.__aexit__(None, None, None)
            else:
                await self.lock.__aexit__(type(exc), exc, exc.__traceback__)
        if finish_error is not None and exc is None:
            raise finish_error

    def _start(self) -> None:
        if self.claims is not None:
            # Its return value (whether this id already ran) matters only to brokers that
            # deliver a message twice; a task backend runs a result once.
            self.claims.start(self.locking.unique_timeout)

    def _finish_after_body(self) -> LockError | None:
        try:
            self._finish()
        except LockError as error:
            logger.error("%s: could not record the end of its run: %s", self.label, error)
            return error
        return None

    def busy(self) -> Any:
        """The lock stayed busy: skip, defer or fail, as ``on_busy`` says."""
        on_busy = self.locking.on_busy
        if on_busy == "skip":
            logger.info(
                "%s skipped: lock %r is held by %s", self.label, self.name, holder_of(self.lock)
            )
            self._finish()
            return SKIPPED
        if on_busy == "defer":
            deferred = self._defer()
            if deferred is not None:
                return deferred
        self._finish()
        wait = self.locking.wait
        how = f"still held after {wait:g}s" if wait else "held by someone else"
        raise LockNotAcquired(
            f"could not acquire lock {self.name!r} for {self.label}: {how}",
            name=self.name,
            retry_after=self.lock.retry_after,
        )

    def _defer(self) -> str | None:
        """Queue the task again to run when the holder's lease ends (at most the lock's
        lease from now); ``None`` when it cannot be (called directly, or its backend
        cannot put a task off: the run then fails)."""
        result = self.result
        if result is None:
            return None
        task = result.task
        backend = task.get_backend()
        if not getattr(backend, "supports_defer", False):
            logger.error(
                "%s cannot be deferred: backend %r does not support run_after",
                self.label,
                task.backend,
            )
            return None
        cap = lease_of(self.lock)
        delay = min(max(self.lock.retry_after or 0.0, 0.0), cap)
        later = task.using(run_after=timezone.now() + datetime.timedelta(seconds=delay))

        def enqueue() -> Any:
            return backend.enqueue(later, result.args, result.kwargs)

        if self.claims is None:
            queued = enqueue()
        else:
            lasts = claim_lasts(self.locking, later.run_after)
            standin = placeholder()
            if not self.claims.pass_to(standin, PENDING_TIMEOUT):
                logger.info(
                    "%s skipped: lock %r is held, and another task is queued for it",
                    self.label,
                    self.name,
                )
                return SKIPPED
            queued = hand_over(claims_for(self.name, standin), later, lasts, enqueue)
        logger.info(
            "%s deferred: lock %r is held by %s; queued again as %s to run when it is "
            "released, in %.3gs at the latest",
            self.label,
            self.name,
            holder_of(self.lock),
            queued.id,
            delay,
        )
        self._queue_early_when_free(later, queued, delay)
        return DEFERRED

    def _queue_early_when_free(self, later: Any, queued: Any, delay: float) -> None:
        """Have ``queued`` (the copy put off by ``delay`` seconds) queued again at once if
        the lock is released before then (:mod:`~django_distlock.runs.deferrals`)."""
        result = self.result
        backend = later.get_backend()
        early = dataclasses.replace(later, run_after=None)
        parked = claims_for(self.name, queued.id)

        def enqueue() -> Any:
            return backend.enqueue(early, result.args, result.kwargs)

        def queue_early() -> Any:
            if self.claims is None:
                return enqueue()
            standin = placeholder()
            if not parked.pass_to(standin, PENDING_TIMEOUT):
                return enqueue()
            lasts = claim_lasts(self.locking, None)
            return hand_over(claims_for(self.name, standin), early, lasts, enqueue)

        label = run_label(PREFIX, early.module_path, queued.id)
        try:
            serve_when_free(
                Parked(parked, time.monotonic() + delay, queue_early, label),
                lease_of(self.lock),
                f"{PREFIX}{label} put off",
            )
        except LockError as error:
            logger.warning("%s runs in %.3gs: %s", label, delay, error)

    def _finish(self) -> None:
        # No done record (Celery's guard against a message delivered twice): a task
        # backend runs a result once.
        if self.claims is not None:
            self.claims.forget()
