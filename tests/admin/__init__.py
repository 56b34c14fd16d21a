"""Tests of django_distlock.admin: the held-locks and lock-events admins."""
