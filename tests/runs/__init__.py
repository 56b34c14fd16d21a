"""Tests of django_distlock.runs: test_<module>.py per module."""
