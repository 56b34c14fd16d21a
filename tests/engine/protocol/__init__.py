"""Tests of django_distlock.engine.protocol: test_<module>.py per module, and
test_<module>_<aspect>.py for its larger themes."""
