"""Django's tasks framework, wherever it comes from: ``django.tasks`` (Django 6.0 and
later), else the ``django-tasks`` backport (the ``tasks`` extra).

Imported when a task is first locked, never when ``django_distlock.tasks`` is: a project
without the framework can import the package, and meets a clear ``ImportError`` only when
it uses :func:`~django_distlock.tasks.locked_task`.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

__all__ = ["Framework", "framework"]

MISSING = (
    "django_distlock.tasks needs Django's tasks framework: Django 6.0 or later "
    "(django.tasks), or the django-tasks backport: pip install django-tasks django-tasks-db"
)


@dataclass(frozen=True)
class Framework:
    """The names of the framework that the integration uses."""

    Task: type[Any]
    TaskResultStatus: Any
    TaskResultDoesNotExist: type[Exception]
    task_enqueued: Any
    task_started: Any
    task_finished: Any


@functools.cache
def framework() -> Framework:
    """The framework's names (``ImportError`` saying what to install when it is absent)."""
    for package in ("django.tasks", "django_tasks"):
        try:
            base = importlib.import_module(f"{package}.base")
        except ImportError:
            continue
        exceptions = importlib.import_module(f"{package}.exceptions")
        signals = importlib.import_module(f"{package}.signals")
        break
    else:
        raise ImportError(MISSING)
    return Framework(
        Task=base.Task,
        TaskResultStatus=base.TaskResultStatus,
        TaskResultDoesNotExist=exceptions.TaskResultDoesNotExist,
        task_enqueued=signals.task_enqueued,
        task_started=signals.task_started,
        task_finished=signals.task_finished,
    )
