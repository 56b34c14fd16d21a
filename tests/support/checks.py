"""Helpers of the tests of the system checks."""

from __future__ import annotations

from django.core.checks import CheckMessage, run_checks


def deploy_messages() -> list[CheckMessage]:
    """The deploy checks' messages, by id (Django runs checks in no set order)."""
    messages = run_checks(tags=["distlock"], include_deployment_checks=True)
    return sorted(messages, key=lambda message: message.id)
