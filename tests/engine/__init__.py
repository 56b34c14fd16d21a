"""Tests of django_distlock.engine: tests/engine/test_<module>.py per module, and
test_lock_<aspect>.py for the lock's larger themes."""
