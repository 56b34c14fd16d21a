"""The one exception tree every lock failure belongs to."""

from __future__ import annotations

import pytest

from django_distlock.engine import (
    LockBackendUnavailable,
    LockError,
    LockLost,
    LockNotAcquired,
    LockNotOwned,
)


@pytest.mark.parametrize("error", [LockNotAcquired, LockNotOwned, LockLost, LockBackendUnavailable])
def test_every_error_is_a_lock_error_carrying_the_name(error):
    exc = error("boom", name="invoice:42")
    assert isinstance(exc, LockError)
    assert exc.name == "invoice:42"
    assert str(exc) == "boom"


def test_a_lost_lock_is_also_not_owned():
    # Code that only cares that it no longer holds the lock can catch LockNotOwned.
    assert issubclass(LockLost, LockNotOwned)
    assert not issubclass(LockNotOwned, LockLost)
    assert not issubclass(LockBackendUnavailable, LockNotOwned)


def test_lock_not_acquired_carries_retry_after():
    assert LockNotAcquired("busy", name="n", retry_after=1.5).retry_after == 1.5
    assert LockNotAcquired("busy").retry_after is None
    assert LockError("x").name is None
