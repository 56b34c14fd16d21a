"""Helpers of the tests that record lock events: the ``DISTLOCK`` setting with an events
mode, and the kinds of event recorded for a lock."""

from __future__ import annotations

from django.test import override_settings

from django_distlock.models import LockEvent


def events_mode(mode: str, **options: object) -> override_settings:
    """``DISTLOCK = {"EVENTS": mode, **options}`` while inside (or as a decorator)."""
    return override_settings(DISTLOCK={"EVENTS": mode, **options})


def kinds(name: str) -> list[str]:
    """The kinds of the events recorded for lock ``name``, oldest first."""
    return list(LockEvent.objects.filter(name=name).order_by("id").values_list("kind", flat=True))
