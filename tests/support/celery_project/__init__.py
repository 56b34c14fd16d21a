"""A Django project that uses Celery the way Celery's Django guide lays it out, with one
mistake: ``billing.tasks.import_account`` asks for ``unique_while_queued`` without the
``LockedTask`` base. ``manage.py check`` and a worker are run on it in subprocesses
(``tests/celery/test_task_classes.py``), never imported by the test process, whose own
checks must stay clean.

As in the guide, the project package loads its Celery app, so Celery is loaded whenever
the settings are; the app finds ``billing/tasks.py`` by ``autodiscover_tasks()``.
"""

from .celery import app as celery_app

__all__ = ["celery_app"]
