"""The admin: the locks held right now (live from Redis, :mod:`.heldlocks`) and their
history (:mod:`.events`). Importing this package registers both with the default site.
"""

from .events import LockEventAdmin
from .heldlocks import HeldLockAdmin

__all__ = ["HeldLockAdmin", "LockEventAdmin"]
