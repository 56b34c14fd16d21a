"""Tasks of Django's tasks framework that never run twice at once: ``locked_task``.

Apply :func:`locked_task` above ``@task()``::

    from django.tasks import task          # Django 6; on 5.2: from django_tasks import task
    from django_distlock.tasks import locked_task

    @locked_task("import:{account_id}", on_busy="defer", unique_while_queued=True)
    @task()
    def import_account(account_id): ...

Importing this package needs no tasks framework: ``locked_task`` raises ``ImportError``
saying what to install when neither ``django.tasks`` (Django 6) nor the ``django-tasks``
backport is there. Guide: ``docs/tasks.md``.
"""

from .decorator import locked_task
from .options import ON_BUSY
from .runs import DEFERRED, SKIPPED

__all__ = ["DEFERRED", "ON_BUSY", "SKIPPED", "locked_task"]
