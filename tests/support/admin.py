"""Helpers of the admin tests: users with django_distlock's permissions, logged-in
clients, and what the lock-events chart (an SVG) shows."""

from __future__ import annotations

import re

from django.contrib.auth.models import Permission, User
from django.test import Client


def make_user(username: str, *permissions: str, superuser: bool = False) -> User:
    """A staff user (password ``pw``) with these django_distlock permissions, or a
    superuser."""
    user = User.objects.create_user(username, password="pw", is_staff=True, is_superuser=superuser)
    for codename in permissions:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_distlock", codename=codename)
        )
    return user


def logged_in(user: User | None, **options: object) -> Client:
    """A test client logged in as ``user`` (anonymous for ``None``)."""
    client = Client(**options)  # type: ignore[arg-type]
    if user is not None:
        client.force_login(user)
    return client


def bars(content: str) -> list[str]:
    """The kinds of the bar segments in the chart, one per segment."""
    return re.findall(r'<rect class="bar" data-kind="([^"]*)"', content)


def legend(content: str) -> list[str]:
    """The kinds in the chart's legend, in order."""
    return re.findall(r'<g class="legend" data-kind="([^"]*)"', content)
