"""How a task is locked: the options of :func:`~django_distlock.tasks.locked_task`,
checked when the task is defined (:class:`~django_distlock.runs.locking.RunOptions`)."""

from __future__ import annotations

from typing import Any, Literal

from ..runs.locking import RunOptions

__all__ = ["ON_BUSY", "Locking", "OnBusy"]

OnBusy = Literal["skip", "defer", "wait"]
ON_BUSY: tuple[str, ...] = ("skip", "defer", "wait")


class Locking(RunOptions):
    """A locked task's options, checked (``TypeError``/``ValueError`` naming the option)."""

    __slots__ = ()

    @classmethod
    def of(cls, name: Any, func: Any, **options: Any) -> Locking:
        """The options of ``locked_task(name, **options)`` on the task function ``func``."""
        return cls.build(name, func, choices=ON_BUSY, **options)
