"""Celery tasks that never run twice at once: ``locked_task`` and ``LockedTask``.

Stack :func:`locked_task` under ``@app.task`` (or ``@shared_task``)::

    from celery import shared_task
    from django_distlock.celery import locked_task

    @shared_task
    @locked_task("import:{account_id}", on_busy="retry")
    def import_account(account_id): ...

or give a task the :class:`LockedTask` base and the same options as class attributes
(``@app.task(base=LockedTask, lock_name="import:{account_id}", lock_on_busy="retry")``).
Each run holds the lock named by the template filled from the task's arguments (bound to
its signature with defaults, so ``import_account.delay(1)`` and
``import_account.delay(account_id=1)`` take the same lock), renewed while it runs and
released by token when it ends, whatever the outcome. ``on_busy`` says what a run does
when another holds the lock: ``"skip"``, ``"retry"`` or ``"wait"``. With
``unique_while_queued``, publishing the task again while a run with the same lock name is
queued or running returns that run's ``AsyncResult`` instead (LockedTask only: see
:class:`LockedTask`; ``manage.py check`` reports a task without it as
``django_distlock.E007``, and a worker refuses to start with one). Guide:
``docs/celery.md``.

Importing this package imports Celery; importing ``django_distlock`` does not. Its
modules: :mod:`.options` (the options, validated), :mod:`.runs` (what one run does),
:mod:`.tasks` (the decorator and the base class, with the publishing side of
``unique_while_queued``), :mod:`.workers` (``E007`` and the worker guard); the Redis
side of ``unique_while_queued`` is ``django_distlock.runs.claims.TaskClaims``.
"""

from __future__ import annotations

from .tasks import LockedTask, locked_task

__all__ = ["LockedTask", "locked_task"]
