"""Tests of django_distlock.engine.renewal: test_<module>.py per module, and
test_<module>_<aspect>.py for its larger themes."""
