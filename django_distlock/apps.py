"""Django app configuration."""

from __future__ import annotations

from django.apps import AppConfig


class DistlockConfig(AppConfig):
    """The ``django_distlock`` app."""

    name = "django_distlock"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401 - registers the system checks
            settings,  # noqa: F401 - connects the setting_changed receiver
        )
