"""Example ``LockedCommand`` subclasses used by tests/test_lockedcommand.py."""
