"""E007 (only where Celery is loaded): every task of Celery's current app that asks for
``unique_while_queued`` has the ``LockedTask`` class."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error

__all__ = ["check_celery_tasks"]


def check_celery_tasks(
    app_configs: Sequence[AppConfig] | None, **kwargs: Any
) -> list[CheckMessage]:
    """E007: every task of Celery's current app that asks for ``unique_while_queued``
    has the ``LockedTask`` class. Only where Celery is loaded already: a project that uses
    it loads its app with its settings, and a process without Celery must not import it
    for a check (so :mod:`django_distlock.celery` is loaded by name, only then)."""
    if "celery" not in sys.modules:
        return []
    celery_tasks = importlib.import_module("django_distlock.celery.workers")
    return [
        Error(problem, hint=celery_tasks.NEEDS_LOCKED_TASK_HINT, id="django_distlock.E007")
        for problem in celery_tasks.check_current_app()
    ]
