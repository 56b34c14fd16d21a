"""Tests of django_distlock.views."""
