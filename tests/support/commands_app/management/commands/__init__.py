"""Example ``LockedCommand`` subclasses used by tests/commands/test_locked.py."""
