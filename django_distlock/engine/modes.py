"""How a lock is held: the three modes, named once for the whole package."""

from __future__ import annotations

__all__ = ["EXCLUSIVE", "LIMITED", "MODES", "SHARED"]

EXCLUSIVE = "exclusive"
"""A hold nobody else may have at the same time (the default)."""
SHARED = "shared"
"""A shared (read) hold: any number at once, none together with an exclusive one."""
LIMITED = "limited"
"""One of at most ``limit`` holds at once."""
MODES = (EXCLUSIVE, SHARED, LIMITED)
