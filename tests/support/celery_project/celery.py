"""The project's Celery app, configured from ``CELERY_*`` settings."""

from celery import Celery

app = Celery("celery_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
