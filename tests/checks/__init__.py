"""Tests of django_distlock.checks."""
