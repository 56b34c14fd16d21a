"""A test app with fenced models, for ``tests/test_fencing.py``."""
