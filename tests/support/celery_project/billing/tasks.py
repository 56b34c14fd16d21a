"""The mistake: ``unique_while_queued=True`` on a task of the app's default class."""

from celery import shared_task

from django_distlock.celery import locked_task


@shared_task
@locked_task("import:{account_id}", on_busy="skip", unique_while_queued=True)
def import_account(account_id: int) -> int:
    return account_id
