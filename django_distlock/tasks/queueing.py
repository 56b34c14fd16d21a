"""``unique_while_queued``: one task per lock name in the queue (or running).

Enqueueing claims the lock name in Redis (:class:`~django_distlock.runs.claims.TaskClaims`,
keys ``PREFIX{bb}:tasks-claim:NAME`` beside the lock) before the backend queues
anything. A backend chooses the result id only as it queues the task, so the claim is
first taken under a placeholder id (``pending:<random>``) and handed to the result id as
soon as the backend reports it (``task_enqueued``). Another enqueue of the same name
meanwhile waits for that hand-over (a few milliseconds: one insert), then returns the
queued task's ``TaskResult``. A claim lasts ``unique_timeout`` seconds plus the task's
``run_after`` delay, so a task lost from the queue stops blocking the name then; a claim
whose result no longer exists, or is finished, is dropped at the next enqueue. The run
marks the claim running and gives it back when it ends (:mod:`.runs`).
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..engine import LockNotAcquired
from ..locks import distlock
from ..runs.claims import TaskClaims
from .framework import framework
from .options import Locking
from .tracking import Binding, binding, known_result

__all__ = ["NAMESPACE", "PENDING", "PENDING_TIMEOUT", "enqueue_unique", "hand_over"]

logger = logging.getLogger("django_distlock.tasks")

NAMESPACE = "tasks"
"""The claims' keys: ``tasks-claim``, beside the lock."""
PENDING = "pending:"
PENDING_TIMEOUT = 30.0
"""Seconds a placeholder claim lasts: an enqueue that died between claiming the name and
queueing its task blocks the name that long."""
FIRST_PAUSE = 0.002
LONGEST_PAUSE = 0.05


def claims_for(name: str, task_id: str) -> TaskClaims:
    """The claims of ``task_id`` on lock name ``name``, on the ``DISTLOCK`` Redis."""
    return TaskClaims(distlock(name).backend, name, task_id, namespace=NAMESPACE)


def placeholder() -> str:
    """A fresh placeholder id for a claim whose result id is not known yet."""
    return f"{PENDING}{uuid.uuid4().hex}"


def claim_lasts(locking: Locking, run_after: datetime.datetime | None) -> float:
    """How long a queued task's claim lasts: ``unique_timeout`` after it may run."""
    delay = 0.0
    if run_after is not None:
        now = datetime.datetime.now(run_after.tzinfo)
        delay = max((run_after - now).total_seconds(), 0.0)
    return locking.unique_timeout + delay


def enqueue_unique(
    task: Any, locking: Locking, args: Any, kwargs: Any, enqueue: Callable[[], Any]
) -> Any:
    """Queue ``task`` with ``enqueue()`` unless a task with the same lock name is queued
    or running: then return that one's ``TaskResult`` and queue nothing."""
    # A task taking the context gets it as its first argument when it runs.
    name = locking.name_for((None, *args) if task.takes_context else args, kwargs)
    claims = claims_for(name, placeholder())
    pause = FIRST_PAUSE
    while (holder := claims.take(PENDING_TIMEOUT)) is not None:
        if not holder.startswith(PENDING):
            existing = _existing(task, name, holder)
            if existing is not None:
                logger.info(
                    "%s not queued: %s holds lock name %r (queued or running)",
                    task.module_path,
                    holder,
                    name,
                )
                return existing
            continue
        time.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE)
    return hand_over(claims, task, claim_lasts(locking, task.run_after), enqueue)


def hand_over(claims: TaskClaims, task: Any, lasts: float, enqueue: Callable[[], Any]) -> Any:
    """Queue a task with ``enqueue()`` while ``claims`` (a placeholder) holds its lock
    name, and hand the claim to the id the backend gives it, queued for ``lasts``
    seconds. A claim whose task could not be queued, or already ran (the
    ``ImmediateBackend``), is given back."""

    def on_result(result: Any) -> None:
        if result.is_finished:
            claims.forget()
        elif not claims.pass_to(result.id, lasts):
            logger.warning(
                "%s[%s]: its claim on lock name %r expired before it was queued",
                task.module_path,
                result.id,
                claims.name,
            )

    pending = Binding(task.func, on_result)
    token = binding.set(pending)
    try:
        result = enqueue()
    except BaseException:
        claims.forget()
        raise
    finally:
        binding.reset(token)
    # A backend that sends no task_enqueued: hand over now.
    pending.bind(result)
    return result


def _existing(task: Any, name: str, holder: str) -> Any:
    """The ``TaskResult`` of ``holder``, the task holding the claim on ``name`` (fetched
    from the backend when it can, else the one this process queued); ``None`` if it no
    longer exists, or is finished (in any state: a run that ended gives its claim back
    itself, so this one failed before its body ran, or was marked by hand): its claim is
    then dropped, so the caller may take it."""
    backend = task.get_backend()
    if getattr(backend, "supports_get_result", False):
        try:
            existing = backend.get_result(holder)
        except framework().TaskResultDoesNotExist:
            existing = None
    else:
        existing = known_result(holder)
        if existing is None:
            raise LockNotAcquired(
                f"{task.module_path}: {holder} holds lock name {name!r} (queued or running), "
                f"and backend {task.backend!r} cannot fetch its result",
                name=name,
            )
    if existing is not None and not existing.is_finished:
        return existing
    logger.warning(
        "lock name %r was claimed by %s, which %s: claim dropped",
        name,
        holder,
        "no longer exists" if existing is None else f"is finished ({existing.status})",
    )
    claims_for(name, holder).forget()
    return None
