"""Holds a test left behind: auto-renewing locks whose lock object is gone, or whose
owning thread or task ended, without a release; and locks still held when the test is
over (a lock object the test acquired and never released, whose thread, the main
thread, lives on).

The watchdog releases an abandoned hold at its next renewal and reports it lost; it
renews a left-over one for ever, and reports it lost once it finds it gone (an operator's
force release in the test, the next test's flush). Either way a later test sees a
``lost`` event, a WARNING or a script call it did not cause (CI once failed on a
``lost`` row of lock "job" written into a later test's database). The suite therefore
fails the test that leaves one (and releases it at once, so the damage stays there).

Loss reports a test's holds queued on the notifier thread run before the next test
starts (:func:`wait_for_loss_reports`): a report reads the settings of the moment, and one
run during a later test that records events (``EVENTS`` ``"sync"``) wrote its ``lost`` row
there, committed by the notifier thread's own connection (CI once failed 11 admin event
tests on a ``lost`` row of "kinds:limited", a lock a force-release test had let go).
"""

from __future__ import annotations

import contextlib
import gc

from django_distlock.engine import LockError, process
from django_distlock.engine.protocol.hold import Hold
from django_distlock.engine.renewal import watchdog
from django_distlock.engine.renewal.decisions import (
    abandoned_reason,
    abandoned_release_call,
    settled,
)
from django_distlock.engine.transport.drivers import SyncDriver


def _watched() -> list[Hold]:
    renewer = watchdog._thread_watchdogs.made
    if renewer is None:
        return []
    # list() of a list or deque is one step under the GIL: a consistent snapshot.
    entries = list(renewer._incoming) + list(renewer._heap)
    unique = {id(entry[-1]): entry[-1] for entry in entries}
    generation = process.generation()
    return [hold for hold in unique.values() if not settled(hold) and hold.generation == generation]


def wait_for_loss_reports(timeout: float = 10.0) -> bool:
    """Wait until the loss reports queued so far have run; ``False`` if they had not
    within ``timeout`` seconds."""
    return watchdog.notifier().wait_for_reports(timeout)


def release_left_holds() -> list[str]:
    """Release the holds a test left: those nobody can release any more, and those a lock
    object still holds when the test is over; return their names and why. The locks of
    failed acquires that the watchdog is still giving back (their server was down) are no
    test's fault: they are dropped quietly, so that no later test sees their releases."""
    if not _watched():
        return []
    gc.collect()
    for hold in _watched():
        if hold.giving_back:
            hold.released = True
    left = [(hold, abandoned_reason(hold) or "still held") for hold in _watched()]
    for hold, _ in left:
        hold.released = True  # the watchdog leaves it alone from now on
        # A test that stopped its server: the lease runs out there.
        with contextlib.suppress(LockError):
            SyncDriver(hold.backend, hold.name).call(abandoned_release_call(hold))
    return sorted(f"{hold.name!r} ({why})" for hold, why in left)
