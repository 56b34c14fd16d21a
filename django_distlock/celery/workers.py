"""What ``django_distlock.E007`` reports (a task asking for ``unique_while_queued``
whose class is not ``LockedTask``), for ``manage.py check`` and for the guard that has a
worker refuse to start with such a task."""

from __future__ import annotations

from typing import Any

from celery import Celery, current_app
from celery.signals import worker_init
from django.apps import apps

from .options import NEEDS_LOCKED_TASK_HINT, Locking, body_of
from .tasks import LockedTask

__all__ = [
    "NEEDS_LOCKED_TASK_HINT",
    "check_current_app",
    "guard_workers",
    "unique_tasks_without_locked_task",
]


def unique_tasks_without_locked_task(app: Celery) -> list[str]:
    """What ``django_distlock.E007`` reports: one line per task of ``app`` whose body asks
    for ``unique_while_queued`` but whose class is not :class:`LockedTask` (its duplicates
    would be queued, and its first run would fail). Finalizes ``app``."""
    problems = []
    for name, task in sorted(app.tasks.items()):
        locking: Locking | None = getattr(body_of(type(task)), "__distlock__", None)
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
