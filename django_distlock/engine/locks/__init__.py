"""The lock objects users hold: ``Lock`` and ``LockGroup``, and what a lock object
keeps and decides of its holds."""
