"""Tests of django_distlock.events."""
