"""Django app configuration: where the app is wired together, once, at start-up.

Modules do nothing when imported. ``ready()`` registers the system checks, has
``setting_changed`` reset the cached setting and backend, gives the lock backend the
observer that records events and sends signals, has force releases recorded, and, where
Celery is loaded, has workers refuse to start with a task the check E007 reports.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


class DistlockConfig(AppConfig):
    """The ``django_distlock`` app."""

    name = "django_distlock"
    verbose_name = "Distributed locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Wire the app (see the module docstring). The imports are here because this
        module is imported while Django loads apps, before models may be imported."""
        from . import checks, connections, events, managers, settings

        def reset_on_change(*, setting: str, **kwargs: Any) -> None:
            if setting in ("DISTLOCK", "CACHES"):
                settings.reset_config()
                connections.reset_backend()

        checks.register_checks()
        setting_changed.connect(reset_on_change, weak=False, dispatch_uid="django_distlock.reset")
        connections.observe_with(events.observer_for)
        managers.record_force_releases_with(events.record_force_release)
        if "celery" in sys.modules:
            # A worker (the celery command loaded Celery before it set Django up) or a
            # project that loads its Celery app with its settings. Loaded by name:
            # importing django_distlock must never import Celery.
            importlib.import_module("django_distlock.celery.workers").guard_workers()
