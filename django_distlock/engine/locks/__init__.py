"""The lock objects users hold: ``Lock`` and ``LockGroup``, what a lock object keeps
and decides of its holds, and ``BesideLock``, where a layer built on locks keeps state
beside one."""
