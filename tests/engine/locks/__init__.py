"""Tests of django_distlock.engine.locks: test_<module>.py per module, and
test_<module>_<aspect>.py for its larger themes."""
