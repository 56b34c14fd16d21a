"""How a Celery task is locked: the options of ``locked_task`` (or ``LockedTask``'s
``lock_`` attributes) validated once, where the task is defined, with the name template
bound to the task function's signature; and the function a task class runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from celery import Task

from ..engine import validate_seconds
from ..runs.locking import RunOptions

__all__ = [
    "NEEDS_LOCKED_TASK",
    "NEEDS_LOCKED_TASK_HINT",
    "ON_BUSY",
    "Locking",
    "OnBusy",
    "body_of",
]

OnBusy = Literal["skip", "retry", "wait"]
ON_BUSY: tuple[str, ...] = ("skip", "retry", "wait")


@dataclass(frozen=True, slots=True)
class Locking(RunOptions):
    """How a task is locked: :class:`~django_distlock.runs.locking.RunOptions` and
    Celery's own (the cap on a retry's countdown, and whether ``LockedTask``'s ``lock_``
    attributes said it)."""

    max_retry_countdown: float = 60.0
    from_class: bool = False

    @classmethod
    def of(
        cls,
        name: Any,
        func: Callable[..., Any],
        *,
        max_retry_countdown: Any,
        from_class: bool = False,
        argument: str = "",
        **options: Any,
    ) -> Locking:
        """The options of ``locked_task(name, ...)`` (or of ``LockedTask``'s attributes,
        ``argument="lock_"``) on the task function ``func``, checked now."""
        countdown = validate_seconds(
            max_retry_countdown, f"{argument}max_retry_countdown", allow_zero=True
        )
        return cls.build(
            name,
            func,
            choices=ON_BUSY,
            argument=argument,
            max_retry_countdown=countdown,
            from_class=from_class,
            **options,
        )

    def countdown(self, retry_after: float | None) -> float:
        """Seconds until a busy lock is worth trying again: the holder's remaining lease,
        at most ``max_retry_countdown``."""
        if retry_after is None:
            return self.max_retry_countdown
        return min(max(retry_after, 0.0), self.max_retry_countdown)


def body_of(task_class: type[Task]) -> Any:
    """The function a task class runs (its ``run``, unwrapped from ``staticmethod``).
    Read on the class: Celery's ``autoretry_for`` wraps ``run`` on the instance."""
    for klass in task_class.__mro__:
        run = klass.__dict__.get("run")
        if run is not None:
            return run.__func__ if isinstance(run, staticmethod) else run
    return None


NEEDS_LOCKED_TASK = (
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
