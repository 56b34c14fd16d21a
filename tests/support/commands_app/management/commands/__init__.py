"""Example ``LockedCommand`` subclasses used by tests/test_commands.py."""
