"""Force release: an operator ends a hold they saw in a listing, by its token."""

from __future__ import annotations

from .backend import Backend
from .core import release_steps
from .io import SyncDriver
from .keys import LockKeys, validate_name
from .modes import EXCLUSIVE, LIMITED, SHARED

__all__ = ["force_release"]


def force_release(backend: Backend, name: str, token: str, mode: str | None = None) -> bool:
    """End the hold of lock ``name`` with ``token`` (the one an operator saw), if it is
    still there, and wake a waiter: the lock itself for an exclusive hold, that holder's
    slot of a shared or limited lock (the other holders keep theirs). ``False`` when it
    was released or changed hands since: nothing is touched then. The evicted holder
    learns it through its watchdog.

    ``mode`` is the hold's (a :class:`~.records.LockRecord`'s ``mode``); unknown
    (``None``), both ways are tried, each a compare-and-delete on the token (two round
    trips at most)."""
    name = validate_name(name)
    if not isinstance(token, str) or not token:
        raise ValueError(f"force-releasing {name!r} needs the token it was read with")
    if mode not in (None, EXCLUSIVE, SHARED, LIMITED):
        raise ValueError(f"mode must be {EXCLUSIVE!r}, {SHARED!r}, {LIMITED!r} or None")
    keys = LockKeys.for_name(backend.prefix, name)
    liveness_ms = backend.tuning.waiter_liveness_ms
    driver = SyncDriver(backend, name)
    if mode is not None:
        return driver.run(release_steps(keys, token, liveness_ms, mode))
    # The exclusive script leaves a lock held shared alone, and the holders' script a
    # lock held exclusively: at most one of them can release anything.
    return driver.run(release_steps(keys, token, liveness_ms, EXCLUSIVE)) or driver.run(
        release_steps(keys, token, liveness_ms, SHARED)
    )
