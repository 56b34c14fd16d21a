"""The liveness invariants of the randomized fault runs (``tests/support/liveness.py``) on
hand-made histories and probe reads: holds that end in time, free locks that are taken,
and faults that are ridden out pass; each kind of violation is found and names its
operations; the excuses hold only where their fault is."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from tests.support.chaos.nemesis import Fault
from tests.support.history import Kind, Operation, Outcome
from tests.support.liveness import (
    Bounds,
    LivenessReport,
    LivenessType,
    Probe,
    Sample,
    check_liveness,
)

LEASE = 1.0
BOUNDS = Bounds(lease=LEASE)
PID = 4242
PIDS = {PID: "c1", 4343: "c2"}


def op(
    kind: Kind,
    client: str,
    start: float,
    end: float,
    outcome: Outcome = "ok",
    *,
    hold: int = 1,
    lock: str = "lock",
    **fields: Any,
) -> Operation:
    """One record."""
    return Operation(
        client=client,
        hold=hold,
        kind=kind,
        lock=lock,
        start=start,
        end=end,
        outcome=outcome,
        lease=LEASE,
        **fields,
    )


def reads(
    start: float, end: float, holders: Iterable[tuple[str, int | None]] | None, lock: str = "lock"
) -> list[Sample]:
    """Probe reads every 0.05 s from ``start`` to ``end``, all showing ``holders``."""
    found = None if holders is None else tuple(holders)
    samples = []
    moment = start
    while moment <= end + 1e-9:
        samples.append(Sample(lock, moment, moment + 0.001, found))
        moment += 0.05
    return samples


def judge(
    history: list[Operation],
    samples: list[Sample],
    faults: Iterable[Fault] = (),
    *,
    topology: str = "single",
    **kwargs: Any,
) -> LivenessReport:
    return check_liveness(
        sorted(history, key=lambda o: o.start),
        sorted(samples, key=lambda s: s.start),
        list(faults),
        bounds=BOUNDS,
        topology=topology,
        pids=PIDS,
        **kwargs,
    )


def fault(kind: str, start: float, end: float) -> Fault:
    return Fault(kind, "target", start, end)


# -- a hold is gone within a lease after its owner lets go --------------------------------


def test_a_hold_gone_after_its_release_passes() -> None:
    history = [
        op("acquire", "c1", 0.0, 0.01, token="t1"),
        op("release", "c1", 0.5, 0.51),
    ]
    report = judge(history, reads(0.0, 0.5, [("t1", PID)]) + reads(0.55, 3.0, []))
    assert report.ok, report.violations
    assert report.holds_seen == 1


def test_a_hold_renewed_after_its_release_failed_is_found() -> None:
    history = [
        op("acquire", "c1", 0.0, 0.01, token="t1"),
        op("release", "c1", 0.5, 0.51, "info", detail="LockBackendUnavailable(BUSY)"),
    ]
    report = judge(history, reads(0.0, 4.0, [("t1", PID)]))
    (violation,) = report.of_type(LivenessType.HOLD_OUTLIVED_OWNER)
    assert "BUSY" in violation.message
    assert [o.kind for o in violation.operations] == ["acquire", "release"]


def test_a_hold_may_last_one_lease_after_its_release_failed() -> None:
    history = [
        op("acquire", "c1", 0.0, 0.01, token="t1"),
        op("release", "c1", 0.5, 0.51, "info", detail="LockBackendUnavailable(BUSY)"),
    ]
    # Renewed just before the release: its lease runs to 1.5.
    report = judge(history, reads(0.0, 0.51 + LEASE + BOUNDS.slack - 0.01, [("t1", PID)]))
    assert report.ok, report.violations


def test_the_names_a_cancelled_group_release_left_held_are_found() -> None:
    # A group's names share a token: the first name released, the others left held.
    history = []
    for hold, name in enumerate(["a", "b"], start=1):
        history += [
            op("acquire", "c1", 0.0, 0.01, hold=hold, lock=name, token="g1"),
            op(
                "release",
                "c1",
                0.5,
                0.51,
                "info",
                hold=hold,
                lock=name,
                detail="interrupted: CancelledError()",
                extra={"interrupted": "taskgroup"},
            ),
        ]
    samples = reads(0.0, 0.5, [("g1", PID)], lock="a") + reads(0.55, 3.0, [], lock="a")
    samples += reads(0.0, 3.0, [("g1", PID)], lock="b")
    report = judge(history, samples)
    (violation,) = report.violations
    assert violation.type is LivenessType.HOLD_OUTLIVED_OWNER
    assert "'b'" in violation.message


def test_a_token_taken_back_by_a_later_acquire_is_judged_by_that_hold() -> None:
    # The release failed, the same lock object's next acquire took it back (same token)
    # and released it in time.
    history = [
        op("acquire", "c1", 0.0, 0.01, hold=1, token="t1"),
        op("release", "c1", 0.5, 0.51, "info", hold=1, detail="LockBackendUnavailable()"),
        op("acquire", "c1", 1.0, 1.01, hold=2, token="t1"),
        op("release", "c1", 2.5, 2.51, hold=2),
    ]
    report = judge(history, reads(0.0, 2.5, [("t1", PID)]) + reads(2.55, 4.0, []))
    assert report.ok, report.violations


def test_an_orphan_of_an_interrupted_acquire_is_found_by_its_owners_pid() -> None:
    history = [
        op(
            "acquire",
            "c1",
            0.0,
            0.02,
            "info",
            detail="interrupted: KeyboardInterrupt()",
            extra={"interrupted": "KeyboardInterrupt"},
            blocking_timeout=2.0,
        ),
    ]
    report = judge(history, reads(0.01, 3.0, [("orphan", PID)]))
    (violation,) = report.of_type(LivenessType.HOLD_OUTLIVED_OWNER)
    assert "returned no hold" in violation.message


def test_an_unknown_token_of_a_client_still_acquiring_is_no_orphan() -> None:
    history = [op("acquire", "c1", 0.0, 3.0, token="t9", blocking_timeout=None)]
    report = judge(history, reads(0.0, 2.9, [("granted", PID)]))
    assert report.ok, report.violations


def test_a_token_of_a_client_killed_in_an_unrecorded_acquire_is_judged_from_the_kill() -> None:
    """The 2026-11-28 long run on Sentinel (``many``, issue 27): c1 released its last
    hold at 1.0 and was killed at 4.0 inside its next acquire, which rode out a failover
    (taking its names and giving them back while no replica acknowledged); that acquire
    never returned, so it left no record. Its token is no orphan before the kill, and must
    be gone within the bound after it."""
    history = [
        op("acquire", "c1", 0.0, 0.01, "fail", detail="busy", blocking_timeout=0.0),
        op("acquire", "c1", 0.5, 0.6, lock="other", token="t1", hold=2),
        op("release", "c1", 0.99, 1.0, lock="other", hold=2),
    ]
    in_flight = reads(2.0, 3.95, [("granted", PID)])
    gone = reads(4.0, 6.0, [])
    assert judge(history, in_flight + gone, killed={"c1": 4.0}).ok
    outlived = reads(2.0, 5.5, [("granted", PID)])
    (violation,) = judge(history, outlived, killed={"c1": 4.0}).violations
    assert "killed" in violation.message
    # Not killed: every acquire it made is recorded, so the token is an orphan.
    assert not judge(history, in_flight + gone).ok


def test_a_token_of_no_known_process_is_counted_not_judged() -> None:
    report = judge([], reads(0.0, 3.0, [("stranger", 999)]))
    assert report.ok
    assert report.unmatched == 1


def test_a_killed_owner_stops_believing_when_it_is_killed() -> None:
    history = [op("acquire", "c1", 0.0, 0.01, token="t1")]
    report = judge(history, reads(0.0, 3.0, [("t1", PID)]), killed={"c1": 0.5})
    (violation,) = report.violations
    assert "killed" in violation.message


def test_a_renewal_held_back_by_a_stalled_proxy_extends_the_bound() -> None:
    history = [
        op("acquire", "c1", 0.0, 0.01, token="t1"),
        op("release", "c1", 0.5, 0.51, "info", detail="LockBackendUnavailable()"),
    ]
    samples = reads(0.0, 2.5, [("t1", PID)])
    assert not judge(history, samples).ok
    assert judge(history, samples, [fault("proxy-stall", 0.3, 1.5)]).ok


def test_the_longest_a_hold_outlived_its_owner_is_measured() -> None:
    history = [
        op("acquire", "c1", 0.0, 0.01, token="t1"),
        op("release", "c1", 0.5, 0.51, "info", detail="LockBackendUnavailable(BUSY)"),
        op("acquire", "c2", 2.0, 2.01, token="t2"),
        op("release", "c2", 2.5, 2.51),
    ]
    # t1 was seen until 1.2 (0.69 s after its release failed), t2 not after its release.
    samples = reads(0.0, 1.2, [("t1", PID)]) + reads(2.0, 2.5, [("t2", 4343)])
    report = judge(history, samples + reads(2.55, 3.0, []))
    assert report.ok, report.violations
    assert report.holds_after_owner == 1
    assert abs(report.longest_hold_after_owner - 0.69) < 1e-6


# -- a free lock with a live waiter is taken ----------------------------------------------


def _waiting(start: float, end: float, client: str = "c2", **fields: Any) -> Operation:
    return op(
        "acquire", client, start, end, "fail", detail="timeout", blocking_timeout=2.0, **fields
    )


def test_a_free_lock_left_to_a_live_waiter_is_found() -> None:
    history = [
        op("acquire", "c1", 0.0, 0.01, token="t1"),
        op("release", "c1", 0.5, 0.51),
        _waiting(0.2, 2.2),
    ]
    report = judge(history, reads(0.0, 0.5, [("t1", PID)]) + reads(0.55, 2.5, []))
    (violation,) = report.of_type(LivenessType.FREE_LOCK_NOT_TAKEN)
    assert violation.operations[0].client == "c2"


def test_a_free_lock_taken_within_the_bound_passes() -> None:
    history = [
        op("acquire", "c1", 0.0, 0.01, token="t1"),
        op("release", "c1", 0.5, 0.51),
        op("acquire", "c2", 0.2, 0.6, token="t2", blocking_timeout=2.0),
    ]
    samples = (
        reads(0.0, 0.5, [("t1", PID)]) + reads(0.55, 0.6, []) + reads(0.65, 1.0, [("t2", 4343)])
    )
    assert judge(history, samples).ok


def test_a_waiter_arriving_at_a_free_lock_and_left_waiting_is_found() -> None:
    report = judge([_waiting(1.0, 3.0)], reads(0.0, 3.5, []))
    assert report.of_type(LivenessType.FREE_LOCK_NOT_TAKEN)


def test_a_free_span_is_broken_where_the_probe_missed_reads() -> None:
    # Free at every read, but no read for 0.6 s in the middle: a hold may have come
    # and gone unseen.
    samples = reads(0.0, 0.9, []) + reads(1.5, 2.4, [])
    assert judge([_waiting(0.0, 3.0)], samples).ok
    assert not judge([_waiting(0.0, 3.0)], reads(0.0, 3.0, [])).ok


def test_a_paused_or_killed_waiter_is_not_live() -> None:
    samples = reads(0.0, 3.5, [])
    assert judge([_waiting(1.0, 3.0)], samples, paused={"c2": [(1.5, 2.0)]}).ok
    assert judge([_waiting(1.0, 3.0)], samples, killed={"c2": 2.0}).ok


def test_non_blocking_acquires_and_group_waiters_are_not_waiters() -> None:
    samples = reads(0.0, 3.5, [])
    busy = op("acquire", "c2", 1.0, 3.0, "fail", detail="busy", blocking_timeout=0.0)
    assert judge([busy], samples).ok
    group = _waiting(1.0, 3.0, extra={"group": ["lock", "other"]})
    assert judge([group], samples).ok


def test_a_free_span_is_excused_near_a_server_fault_or_a_dead_client_only() -> None:
    samples = reads(0.0, 3.5, [])
    history = [_waiting(1.0, 3.0)]
    assert judge(history, samples, [fault("server-restart", 0.0, 0.5)]).ok
    # A queued waiter killed shortly before holds a fair queue up to 3 s.
    assert judge(history, samples, [fault("client-kill", 0.5, 0.5)]).ok
    # The caller's own interruptions excuse nothing.
    assert not judge(history, samples, [fault("client-interrupt", 0.9, 0.9)]).ok
    # A server fault long before excuses nothing either.
    later = [_waiting(6.0, 8.0)]
    assert not judge(later, reads(5.0, 8.5, []), [fault("server-pause", 0.0, 0.5)]).ok


def test_the_longest_free_wait_of_a_live_waiter_is_measured_outside_faults() -> None:
    history = [
        op("acquire", "c1", 0.0, 0.01, token="t1"),
        op("release", "c1", 0.5, 0.51),
        op("acquire", "c2", 0.2, 0.9, token="t2", blocking_timeout=2.0),
    ]
    # Free from the read at 0.55 to the one at 0.85: the waiter waited 0.3 s of it.
    samples = (
        reads(0.0, 0.5, [("t1", PID)]) + reads(0.55, 0.85, []) + reads(0.9, 1.2, [("t2", 4343)])
    )
    report = judge(history, samples)
    assert report.ok, report.violations
    assert abs(report.longest_free_wait - (0.85 - 0.551)) < 1e-6
    # Near a server fault the span is not judged, nor measured.
    assert judge(history, samples, [fault("server-pause", 0.0, 0.4)]).longest_free_wait == 0.0


# -- ridden-out faults raise nothing ------------------------------------------------------


def _error(start: float, end: float, kind: Kind = "acquire", **fields: Any) -> Operation:
    fields.setdefault("blocking_timeout", 2.0)
    return op(kind, "c1", start, end, "info", detail="LockBackendUnavailable(MovedError)", **fields)


def test_an_error_during_a_slot_migration_is_found() -> None:
    migration = fault("slot-migration", 1.0, 2.2)
    report = judge([_error(0.9, 1.5), _error(1.6, 2.0, "release")], [], [migration])
    assert len(report.of_type(LivenessType.RIDDEN_OUT_FAULT_RAISED)) == 2
    assert report.ridden_out == 2


def test_a_hold_lost_during_a_migration_shorter_than_its_lease_is_found() -> None:
    def losses(lease: float) -> list[Operation]:
        lost = op("lost", "c1", 1.5, 1.5, detail="lost")
        failed = op("release", "c1", 1.6, 1.61, "fail", detail="lost: LockLost")
        return [replace(o, lease=lease) for o in (lost, failed)]

    migration = fault("slot-migration", 1.0, 2.2)
    assert len(judge(losses(3.0), [], [migration]).violations) == 2
    # Renewals refused for longer than a 1 s lease may lose it.
    assert judge(losses(1.0), [], [migration]).ok


def test_what_a_migration_does_not_cover_is_not_judged() -> None:
    migration = fault("slot-migration", 1.0, 2.2)
    busy = op("acquire", "c1", 1.1, 1.2, "fail", detail="busy", blocking_timeout=0.0)
    interrupted = _error(1.1, 1.2, extra={"interrupted": "timeout"})
    after = _error(2.0, 3.0)  # ended past the migration's end
    assert judge([busy, interrupted, after], [], [migration]).ok
    # A fault shortly before the migration may be what the error came from.
    crash = fault("primary-crash", 0.0, 0.5)
    assert judge([_error(1.1, 1.5)], [], [crash, migration]).ok
    # A migration longer than the budget promises nothing.
    assert judge([_error(1.1, 1.5)], [], [fault("slot-migration", 1.0, 4.5)]).ok


def test_an_error_from_the_next_fault_is_not_the_ridden_out_faults() -> None:
    # The long runs' sentinel/mutex run (seed 2711): a maxmemory fault began as a planned
    # failover ended, and the acquires it refused (OOM) within the failover's slack were
    # taken for errors the failover raised.
    failover = fault("failover", 1.0, 2.0)
    oom = _error(1.9, 2.1, blocking_timeout=2.0)
    assert judge([oom], [], [failover], topology="sentinel").of_type(
        LivenessType.RIDDEN_OUT_FAULT_RAISED
    )
    squeeze = fault("maxmemory", 2.0, 2.5)
    assert judge([oom], [], [failover, squeeze], topology="sentinel").ok
    # One that ended before the next fault began is still judged.
    early = _error(1.5, 1.95, blocking_timeout=2.0)
    assert not judge([early], [], [failover, squeeze], topology="sentinel").ok
    # Another client's pause, or the caller's own interruption, explains nothing.
    for other in (Fault("client-pause", "c2", 2.0, 2.5), Fault("client-interrupt", "c1", 2.0, 2.0)):
        assert not judge([oom], [], [failover, other], topology="sentinel").ok
    assert judge(
        [oom], [], [failover, Fault("client-pause", "c1", 2.0, 2.5)], topology="sentinel"
    ).ok


def test_a_planned_sentinel_failover_is_ridden_out_by_waiting_acquires() -> None:
    failover = fault("failover", 1.0, 1.8)
    waiting = _error(0.9, 1.7, blocking_timeout=2.0)
    assert judge([waiting], [], [failover], topology="sentinel").of_type(
        LivenessType.RIDDEN_OUT_FAULT_RAISED
    )
    # Not a wait, not long enough to ride it out, or not on Sentinel: nothing promised.
    assert judge([_error(0.9, 1.7, blocking_timeout=0.0)], [], [failover], topology="sentinel").ok
    assert judge([_error(1.0, 1.5, blocking_timeout=0.5)], [], [failover], topology="sentinel").ok
    assert judge([waiting], [], [failover], topology="cluster").ok


# -- the probe ----------------------------------------------------------------------------


def test_the_probe_reads_every_name_and_marks_failed_reads() -> None:
    calls: list[str] = []

    def read(name: str) -> list[tuple[str, int | None]]:
        calls.append(name)
        if name == "down":
            raise ConnectionError("unreachable")
        return [("t1", PID)]

    probe = Probe(read, ["up", "down"], interval=0.01).start()
    time.sleep(0.1)
    samples = probe.stop()
    assert {"up", "down"} <= set(calls)
    assert all(s.holders == (("t1", PID),) for s in samples if s.lock == "up")
    assert all(s.holders is None for s in samples if s.lock == "down")
    assert all(s.start <= s.end for s in samples)
