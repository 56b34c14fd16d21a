"""Tests of django_distlock.commands."""
