"""How a Celery task is locked: the options of ``locked_task`` (or ``LockedTask``'s
``lock_`` attributes) validated once, where the task is defined, with the name template
bound to the task function's signature; and the function a task class runs."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from celery import Task

from ..engine import NameTemplate, validate_name, validate_seconds

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
class Locking:
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
    ) -> Locking:
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
