"""Clients of the admin tests, each logged in as a user with the permissions its name
says."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.support.admin import logged_in, make_user


@pytest.fixture
def admin_user(db: None) -> User:
    return make_user("root", superuser=True)


@pytest.fixture
def admin(admin_user: User) -> Client:
    """A superuser."""
    return logged_in(admin_user)


@pytest.fixture
def viewer(db: None) -> Client:
    """May view held locks and lock events."""
    return logged_in(make_user("viewer", "view_heldlock", "view_lockevent"))


@pytest.fixture
def operator(db: None) -> Client:
    """May view held locks and lock events, and force-release locks."""
    return logged_in(
        make_user("operator", "view_heldlock", "view_lockevent", "force_release_heldlock")
    )
