"""Routes django-tasks-db's results to the ``tasks`` database of ``tests.settings`` (a
SQLite file shared with the ``db_worker`` processes), and nothing else there."""

from __future__ import annotations

from typing import Any

TASKS_ALIAS = "tasks"
TASKS_APP_LABEL = "django_tasks_database"


class TasksRouter:
    """Database router: django-tasks-db's models in ``tasks``, every other model
    elsewhere."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return TASKS_ALIAS if model._meta.app_label == TASKS_APP_LABEL else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self.db_for_read(model, **hints)

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return (db == TASKS_ALIAS) == (app_label == TASKS_APP_LABEL)
