"""Tests of django_distlock.management."""
