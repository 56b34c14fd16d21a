"""The history checker of the randomized fault runs (``tests/support/checker.py``) and its
register linearizability search (``tests/support/linearizability.py``), on hand-made
histories: valid ones pass, each kind of violation is found and names its operations."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.chaos.nemesis import Fault
from tests.support.chaos.sites import ChaosSite
from tests.support.checker import Report, ViolationType, check
from tests.support.history import Kind, Operation, Outcome
from tests.support.linearizability import Verdict, check_register

STEP = 0.01
"""How long a hand-made acquire, release or register operation takes."""


def op(
    kind: Kind,
    client: str,
    start: float,
    end: float | None = None,
    outcome: Outcome = "ok",
    *,
    hold: int = 1,
    lock: str = "lock",
    **fields: Any,
) -> Operation:
    """One record; ``end`` defaults to ``start + STEP``."""
    return Operation(
        client=client,
        hold=hold,
        kind=kind,
        lock=lock,
        start=start,
        end=start + STEP if end is None else end,
        outcome=outcome,
        **fields,
    )


def held(
    client: str,
    acquired: float,
    released: float | None,
    *,
    hold: int = 1,
    fence: int | None = None,
    **fields: Any,
) -> list[Operation]:
    """An ``ok`` acquire ending at ``acquired`` and, unless ``released`` is ``None``, its
    ``ok`` release starting at ``released``."""
    records = [op("acquire", client, acquired - STEP, acquired, hold=hold, fence=fence, **fields)]
    if released is not None:
        records.append(op("release", client, released, hold=hold, **fields))
    return records


def increment(
    client: str, at: float, read: int, *, fence: int | None, **fields: Any
) -> list[Operation]:
    """A read of ``read`` then an accepted write of ``read + 1`` (fenced with ``fence``)."""
    return [
        op("read", client, at, value=read, **fields),
        op(
            "write",
            client,
            at + 2 * STEP,
            value=read + 1,
            fence=fence,
            fenced=fence is not None,
            **fields,
        ),
    ]


def final_read(at: float, value: int) -> Operation:
    return op("read", "checker", at, value=value, hold=0, extra={"final": True})


def fault(
    kind: str,
    target: str,
    start: float,
    end: float,
    *,
    reaches: tuple[str, ...] | None = None,
    serving: str = "port 1",
    serving_after: str | None = None,
) -> Fault:
    """A fault of the nemesis' log; ``serving`` (``serving_after``) is the node serving
    lock ``lock`` when it began (ended)."""
    return Fault(
        kind,
        target,
        start,
        end,
        reaches=(target,) if reaches is None else reaches,
        serving={"lock": serving},
        serving_after={"lock": serving if serving_after is None else serving_after},
    )


def types(report: Report) -> list[ViolationType]:
    return [violation.type for violation in report.violations]


def test_sequential_fenced_holds_pass() -> None:
    history = [
        *held("a", 1.0, 2.0, fence=1),
        *increment("a", 1.1, 0, fence=1),
        *held("b", 2.5, 3.5, fence=2),
        *increment("b", 2.6, 1, fence=2),
        final_read(4.0, 2),
    ]

    report = check(history)

    assert report.ok, report.violations
    assert (report.operations, report.holds, report.lost_updates) == (9, 2, 0)
    assert (report.double_holder_windows, report.longest_double_holder_window) == (0, 0.0)
    assert report.unchecked == []


def test_a_lost_hold_then_a_takeover_pass() -> None:
    history = [
        *held("a", 1.0, None, fence=1),
        op("lost", "a", 2.0, 3.0),
        *held("b", 3.0, 4.0, fence=2),
        op("release", "a", 3.5, outcome="fail"),  # told again at release: not a second end
    ]

    assert check(history).ok


def test_info_acquires_are_never_holders() -> None:
    history = [
        *held("a", 1.0, 3.0, fence=1),
        op("acquire", "b", 1.5, 2.0, "info"),
        op("release", "b", 2.1, outcome="info"),
        op("acquire", "c", 2.5, 2.6, "info"),  # never released: maybe never held
    ]

    report = check(history)

    assert report.ok, report.violations
    assert report.holds == 1


def test_info_acquires_hide_no_overlap() -> None:
    history = [
        *held("a", 1.0, 3.0, fence=1),
        op("acquire", "b", 1.5, 2.0, "info"),
        *held("c", 2.0, 4.0, fence=3),
    ]

    report = check(history)

    assert types(report) == [ViolationType.OVERLAP]
    assert report.violations[0].operations == (history[0], history[3])
    assert "a#1 acquire ok" in report.violations[0].message
    assert "c#1 acquire ok" in report.violations[0].message
    assert "b#1" not in report.violations[0].message


def test_shared_readers_overlap_each_other() -> None:
    history = [
        *held("r1", 1.0, 3.0, fence=1, mode="shared"),
        *held("r2", 1.5, 3.5, fence=2, mode="shared"),
        *held("r3", 2.0, 2.5, fence=3, mode="shared"),
        *held("w", 4.0, 5.0, fence=4),
    ]

    assert check(history).ok


def test_three_holders_of_a_limit_of_three() -> None:
    limited = {"mode": "limited", "limit": 3}
    history = [
        record
        for n in range(3)
        for record in held(f"c{n}", 1.0 + n / 10, 3.0 + n / 10, fence=n + 1, **limited)
    ]
    history += held("c3", 3.0, 4.0, fence=4, **limited)  # as c0 starts releasing

    report = check(history)

    assert report.ok, report.violations
    assert (report.holds, report.double_holder_windows) == (4, 0)


def test_a_fourth_holder_of_a_limit_of_three() -> None:
    history = [
        record
        for n in range(4)
        for record in held(f"c{n}", 1.0 + n, 10.0 + n / 2, fence=n + 1, mode="limited", limit=3)
    ]

    report = check(history)

    assert types(report) == [ViolationType.OVERLAP]
    violation = report.violations[0]
    assert [record.client for record in violation.operations] == ["c0", "c1", "c2", "c3"]
    assert violation.message.startswith("4 holds of limit 3 of 'lock' overlap for 6.000 s")
    assert report.double_holder_windows == 1
    assert report.longest_double_holder_window == pytest.approx(6.0)


def test_a_writer_overlapping_a_reader() -> None:
    history = [*held("r", 1.0, 3.0, fence=1, mode="shared"), *held("w", 2.0, 4.0, fence=2)]

    report = check(history)

    assert types(report) == [ViolationType.OVERLAP]
    assert report.violations[0].operations == (history[0], history[2])


def test_two_exclusive_holds_overlapping_with_valid_leases() -> None:
    history = [*held("a", 1.0, 3.0, fence=1, lease=10.0), *held("b", 2.0, 5.0, fence=2)]

    report = check(history)

    assert types(report) == [ViolationType.OVERLAP]
    assert (
        "two conflicting holds of 'lock' overlap for 1.000 s from 2.000"
        in report.violations[0].message
    )
    assert (report.double_holder_windows, report.longest_double_holder_window) == (1, 1.0)


def test_a_renewed_hold_is_valid_until_it_ends() -> None:
    # A lease of 1 s, but renewals (not recorded) keep it: b's acquire at 5 s is a bug.
    history = [*held("a", 1.0, 6.0, fence=1, lease=1.0), *held("b", 5.0, 7.0, fence=2)]

    assert types(check(history)) == [ViolationType.OVERLAP]


def test_an_overlap_after_a_pause_of_the_earlier_holder() -> None:
    # a's lease ended at 3.0 (its own record says so); b took the lock at 4.0 while a was
    # stopped, and a learned it at 6.0 when it ran again.
    history = [
        *held("a", 1.0, None, fence=1, lease=1.0),
        *held("b", 4.0, 5.0, fence=2),
        op("lost", "a", 5.9, 6.0, extra={"lease_until": 3.0}),
    ]
    pause = fault("client-pause", "a", 2.0, 5.5)

    report = check(history, faults=[pause])

    assert types(report) == [ViolationType.OVERLAP_AFTER_PAUSE]
    assert report.violations[0].operations == (history[0], history[1])
    assert report.violations[0].cause == pause
    assert report.violations[0].message.endswith("excused by client-pause of a [2.000, 5.500]")
    assert report.unexcused == []
    assert report.longest_double_holder_window == pytest.approx(1.0)


def test_a_short_pause_while_the_lease_still_ran_excuses_nothing() -> None:
    # The lock was taken from a stopped holder whose lease ran until 4.5: a lock that
    # treats a lock with half its lease left as free.
    history = [
        *held("a", 1.0, None, fence=1, lease=1.0),
        *held("b", 4.0, 5.0, fence=2),
        op("lost", "a", 4.7, 4.8, extra={"lease_until": 4.5}),
    ]

    report = check(history, faults=[fault("client-pause", "a", 3.8, 4.2)])

    assert types(report) == [ViolationType.OVERLAP]
    assert report.unexcused == report.violations


def test_a_pause_over_before_the_overlap_is_no_pause_excuse() -> None:
    # a was stopped from 2.0 to 3.5, its lease over at 3.0; b took the lock at 4.0, and a
    # was told only at 6.0: late, with no fault on its connections or server.
    history = [
        *held("a", 1.0, None, fence=1, lease=1.0),
        *held("b", 4.0, 5.0, fence=2),
        op("lost", "a", 5.9, 6.0, extra={"lease_until": 3.0}),
    ]

    assert types(check(history, faults=[fault("client-pause", "a", 2.0, 3.5)])) == [
        ViolationType.OVERLAP
    ]


def test_a_pause_of_the_later_holder_or_before_the_hold_excuses_nothing() -> None:
    history = [
        op("read", "a", 0.1, value=0, hold=0, extra={"paused": [[0.2, 0.5]]}),
        *held("a", 1.0, 3.0, fence=1),
        *held("b", 2.0, 4.0, fence=2, extra={"paused": [[1.0, 1.9]]}),
    ]

    assert types(check(history)) == [ViolationType.OVERLAP]


def test_an_overlap_after_an_unrenewed_lease_ran_out() -> None:
    # The lease counts from the acquire's start (0.99 s): it ran out at 2.99 s, while the
    # proxy stalled every connection; a's release at 3.5 found it lost.
    unrenewed = {"lease": 2.0, "extra": {"renewed": False}}
    stall = fault("proxy-stall", "proxy", 2.5, 3.2, reaches=("connections",))

    def history(taken: float) -> list[Operation]:
        return [
            *held("a", 1.0, None, fence=1, **unrenewed),
            op("release", "a", 3.5, outcome="fail"),
            *held("b", taken, 5.0, fence=2),
        ]

    expired = check(history(3.0), faults=[stall])
    assert types(expired) == [ViolationType.OVERLAP_AFTER_EXPIRY]
    assert expired.violations[0].cause == stall
    assert "excused by proxy-stall of proxy [2.500, 3.200]" in expired.violations[0].message
    assert types(check(history(2.98), faults=[stall])) == [ViolationType.OVERLAP]


def test_an_expiry_with_no_fault_near_it_excuses_nothing() -> None:
    history = [
        *held("a", 1.0, None, fence=1, lease=1.0),
        *held("b", 3.0, 5.0, fence=2),
        op("lost", "a", 3.3, 3.4, extra={"lease_until": 2.5}),
    ]
    before = fault("proxy-stall", "proxy", 0.2, 1.4, reaches=("connections",))
    elsewhere = fault("server-pause", "port 2", 1.6, 2.4)

    assert types(check(history)) == [ViolationType.OVERLAP]
    # A fault that ended before the last lease began, or on a node not serving the lock.
    assert types(check(history, faults=[before, elsewhere])) == [ViolationType.OVERLAP]
    reached = check(history, faults=[fault("server-pause", "port 1", 1.6, 2.4)])
    assert types(reached) == [ViolationType.OVERLAP_AFTER_EXPIRY]


def test_an_expiry_told_late_excuses_nothing() -> None:
    # The lease ended at 2.5 under a stall; the holder was told at 4.0, more than 1 s
    # later, and had not been paused meanwhile.
    stall = fault("proxy-stall", "proxy", 2.0, 2.6, reaches=("connections",))

    def history(told: float) -> list[Operation]:
        return [
            *held("a", 1.0, None, fence=1, lease=1.0),
            *held("b", 3.0, 5.0, fence=2),
            op("lost", "a", told - 0.1, told, extra={"lease_until": 2.5}),
        ]

    assert types(check(history(3.4), faults=[stall])) == [ViolationType.OVERLAP_AFTER_EXPIRY]
    assert types(check(history(4.0), faults=[stall])) == [ViolationType.OVERLAP]


def test_stale_fence_accepted_in_real_time_order() -> None:
    history = [
        *held("a", 1.0, None, fence=1),
        *held("b", 2.0, 3.0, fence=2),
        *increment("b", 2.1, 0, fence=2),
        *increment("a", 4.0, 1, fence=1),
        op("lost", "a", 4.1, 4.2, extra={"lease_until": 1.9}),
        final_read(5.0, 2),
    ]

    report = check(history, faults=[fault("client-pause", "a", 1.5, 4.0)])

    assert types(report) == [ViolationType.OVERLAP_AFTER_PAUSE, ViolationType.STALE_FENCE_ACCEPTED]
    stale = report.of_type(ViolationType.STALE_FENCE_ACCEPTED)[0]
    assert stale.operations == (history[4], history[6])
    assert (
        "b#1 write ok [2.120, 2.130] fence 2 value 1; a#1 write ok [4.020, 4.030] fence 1"
        in stale.message
    )


def test_a_refused_stale_write_is_fine() -> None:
    history = [
        *held("a", 1.0, None, fence=1),
        *held("b", 2.0, 3.0, fence=2),
        *increment("b", 2.1, 0, fence=2),
        op("read", "a", 4.0, value=1),
        op("write", "a", 4.1, outcome="fail", value=2, fence=1, fenced=True, detail="StaleFence"),
        op("lost", "a", 4.2, extra={"lease_until": 1.9}),
        final_read(5.0, 1),
    ]

    report = check(history, faults=[fault("client-pause", "a", 1.5, 4.0)])

    assert types(report) == [ViolationType.OVERLAP_AFTER_PAUSE]
    assert report.unexcused == []


def test_stale_fence_accepted_in_the_databases_order() -> None:
    # The writes overlap in time: only the row's version says which came first.
    writes = [
        op("write", "b", 2.0, 3.0, value=1, fence=2, fenced=True, hold=1, extra={"seq": 1}),
        op("write", "a", 2.5, 3.5, value=1, fence=1, fenced=True, hold=1, extra={"seq": 2}),
    ]
    without_seq = [
        op("write", "b", 2.0, 3.0, value=1, fence=2, fenced=True),
        op("write", "a", 2.5, 3.5, value=1, fence=1, fenced=True),
    ]

    stale = check(writes).of_type(ViolationType.STALE_FENCE_ACCEPTED)
    assert [violation.operations for violation in stale] == [tuple(writes)]
    assert check(without_seq).of_type(ViolationType.STALE_FENCE_ACCEPTED) == []


def test_one_hold_writes_many_times_with_its_fence() -> None:
    history = [
        *held("a", 1.0, 2.0, fence=4),
        *increment("a", 1.1, 0, fence=4),
        *increment("a", 1.5, 1, fence=4),
        op("write", "b", 3.0, value=3, fence=4, fenced=True, hold=2),  # another hold, same fence
    ]

    report = check(history)

    stale = report.of_type(ViolationType.STALE_FENCE_ACCEPTED)
    assert [violation.operations for violation in stale] == [(history[3], history[6])]


def test_fences_not_increasing_with_real_time() -> None:
    history = [
        *held("a", 1.0, 2.0, fence=7),
        *held("b", 3.0, 4.0, fence=7),
        *held("c", 5.0, 6.0, fence=5),
        *held("d", 7.0, 8.0, fence=8),
    ]

    report = check(history)

    assert types(report) == [ViolationType.FENCES_NOT_INCREASING] * 2
    assert [violation.operations for violation in report.violations] == [
        (history[0], history[2]),
        (history[0], history[4]),
    ]
    assert "a#1 acquire ok [0.990, 1.000] fence 7; c#1 acquire ok" in report.violations[1].message


def test_concurrent_acquires_may_take_fences_in_either_order() -> None:
    history = [
        op("acquire", "a", 1.0, 2.0, fence=2),
        op("acquire", "b", 1.5, 1.8, "fail", blocking_timeout=0),
        op("release", "a", 3.0),
        op("acquire", "c", 1.2, 4.0, fence=1, blocking_timeout=5.0),
        op("release", "c", 5.0),
    ]

    assert check(history).ok


def test_lost_updates_are_counted_in_unfenced_runs() -> None:
    history = [
        *held("a", 1.0, None),
        *increment("a", 1.1, 0, fence=None),
        *held("b", 3.0, 4.0),
        op("read", "b", 3.1, value=0),
        *increment("a", 3.2, 1, fence=None),  # a, paused, increments 0 -> 1 -> 2
        op("write", "b", 3.5, value=1),  # b writes 0 + 1
        op("release", "a", 5.0),
        final_read(6.0, 1),
    ]

    report = check(history)

    assert report.lost_updates == 2
    assert ViolationType.LOST_UPDATE not in types(report)
    assert types(report) == [ViolationType.OVERLAP]


def test_a_lost_update_in_a_fenced_run() -> None:
    history = [
        *held("a", 1.0, 2.0, fence=1),
        *held("b", 1.5, 2.5, fence=2),
        op("read", "a", 1.6, value=0),
        op("read", "b", 1.7, value=0),
        op("write", "a", 1.8, value=1, fence=1, fenced=True),
        op("write", "b", 1.9, value=1, fence=2, fenced=True),
        final_read(3.0, 1),
    ]

    report = check(history)

    lost = report.of_type(ViolationType.LOST_UPDATE)
    assert [violation.operations for violation in lost] == [(history[6], history[7], history[8])]
    assert lost[0].message.startswith("register 'lock' lost 1 of 2 accepted increments: a#1 write")
    assert report.lost_updates == 0


def test_a_lost_increment_behind_a_write_of_unknown_outcome() -> None:
    # Three writes took effect (the database counted them), one of them reported as
    # unknown (info); the register holds 2: one increment was lost, which the two ok
    # writes alone would hide.
    def history(accepted: int) -> list[Operation]:
        return [
            *held("a", 1.0, 2.0, fence=1),
            *increment("a", 1.1, 0, fence=1),
            *held("b", 3.0, 4.0, fence=2),
            op("read", "b", 3.1, value=1),
            op("write", "b", 3.2, outcome="info", value=2, fence=2, fenced=True),
            *held("c", 5.0, 6.0, fence=3, hold=2),
            *increment("c", 5.1, 1, fence=3, hold=2),
            op("read", "final", 7.0, value=2, hold=0, extra={"final": True, "accepted": accepted}),
        ]

    lost = check(history(3)).of_type(ViolationType.LOST_UPDATE)
    assert len(lost) == 1
    assert lost[0].message.startswith("register 'lock' lost 1 of 3 accepted increments")
    assert "b#1 write info" in lost[0].message
    # The info write did not take effect: nothing lost.
    assert check(history(2)).of_type(ViolationType.LOST_UPDATE) == []


def test_the_final_read_is_the_final_value() -> None:
    history = [
        *held("a", 1.0, 2.0),
        *increment("a", 1.1, 0, fence=None),
        *held("b", 3.0, 4.0),
        *increment("b", 3.1, 1, fence=None),
    ]

    assert check([*history, final_read(5.0, 2)]).lost_updates == 0
    # Someone wrote the register back after the last recorded write: the read says so.
    assert check([*history, final_read(5.0, 1)]).lost_updates == 1


def test_the_max_written_value_stands_in_for_a_final_read() -> None:
    history = [
        *held("a", 1.0, 2.0),
        *increment("a", 1.1, 0, fence=None, extra={"register": "row"}),
        *held("b", 3.0, 4.0),
        *increment("b", 3.1, 0, fence=None, extra={"register": "row"}),
    ]

    assert check(history).lost_updates == 1


def test_a_long_wait() -> None:
    history = [
        op("acquire", "a", 0.0, 2.5, "fail", blocking_timeout=1.0, detail="timeout"),
        op("acquire", "b", 0.0, 1.9, "fail", blocking_timeout=1.0, detail="timeout"),
        op("acquire", "c", 0.0, 60.0, "fail", blocking_timeout=None),
        op("acquire", "d", 0.0, 3.0, "info", blocking_timeout=0.0),
        op("acquire", "e", 0.0, 3.0, "fail", blocking_timeout=1.0, extra={"paused": [[0.5, 1.5]]}),
        op("release", "e", 4.0, extra={"paused": [[0.5, 1.5]]}),  # the same pause, counted once
    ]

    report = check(history, wait_bound=1.0)

    assert types(report) == [ViolationType.LONG_WAIT]
    assert report.violations[0].operations == (history[0],)
    assert "took 2.500 s, over 2.000 s" in report.violations[0].message
    assert types(check(history, wait_bound=2.0)) == []


def test_a_wait_over_the_documented_second() -> None:
    # docs/how-it-works.md: no acquire waits past its blocking_timeout plus 1 s.
    history = [
        op("acquire", "a", 0.0, 3.1, "fail", blocking_timeout=2.0, detail="timeout"),
        op("acquire", "b", 0.0, 2.9, "fail", blocking_timeout=2.0, detail="timeout"),
    ]

    report = check(history)

    assert types(report) == [ViolationType.LONG_WAIT]
    assert report.violations[0].operations == (history[0],)
    assert report.unexcused == report.violations


def test_a_long_wait_while_the_locks_slot_migrated() -> None:
    # TRYAGAIN is retried for up to 3 s while a slot's keys are split (docs/architecture.md).
    history = [
        op("acquire", "a", 0.0, 4.5, "fail", blocking_timeout=0.5, detail="timeout"),
        op("acquire", "b", 0.0, 5.0, "fail", blocking_timeout=0.5, detail="timeout"),
    ]
    here = fault("slot-migration", "slot 7", 0.5, 4.0, reaches=("port 1", "port 2"))
    elsewhere = fault("slot-migration", "slot 8", 0.5, 4.0, reaches=("port 3", "port 2"))

    report = check(history, faults=[here])

    assert types(report) == [ViolationType.LONG_WAIT] * 2
    assert [v.cause for v in report.violations] == [here, None]  # b: 3.5 s over
    assert "excused by slot-migration of slot 7" in report.violations[0].message
    assert [v.cause for v in check(history, faults=[elsewhere]).violations] == [None, None]


def test_a_group_waits_for_every_name_it_asked_for() -> None:
    # A distlock_many acquire waits on all its names: a migration of the slot of one of
    # them (on another node than the name the record is for) held the whole group up.
    group = {"group": ["lock", "other"]}
    history = [
        op("acquire", "a", 0.0, 2.5, "fail", lock="other", blocking_timeout=0.5, extra=group),
    ]
    here = Fault(
        "slot-migration",
        "slot 7",
        0.5,
        2.0,
        reaches=("port 1", "port 2"),
        serving={"lock": "port 1", "other": "port 3"},
        serving_after={"lock": "port 2", "other": "port 3"},
    )

    report = check(history, faults=[here])

    assert types(report) == [ViolationType.LONG_WAIT]
    assert report.violations[0].cause == here
    alone = [op("acquire", "a", 0.0, 2.5, "fail", lock="other", blocking_timeout=0.5)]
    assert [v.cause for v in check(alone, faults=[here]).violations] == [None]


def test_a_long_wait_no_longer_than_a_stall_it_met() -> None:
    # A non-blocking acquire sent into a stalled proxy gets its answer when the stall ends.
    history = [
        op("acquire", "a", 1.0, 2.4, "fail", blocking_timeout=0.0, detail="busy"),
        op("acquire", "b", 1.0, 3.5, "fail", blocking_timeout=0.0, detail="busy"),
    ]
    stall = fault("proxy-stall", "proxy", 0.9, 2.3, reaches=("connections",))

    report = check(history, faults=[stall])

    # a ran 0.4 s over, within the 1.3 s of stall it met; b ran 1.5 s over.
    assert [v.cause for v in report.violations] == [stall, None]
    assert [v.cause for v in check(history).violations] == [None, None]


class _Primary:
    port = 1


class _ReplicatedStub(ChaosSite):
    """A site whose one primary is ``port 1`` (nothing started)."""

    name = "stub"

    def primaries(self) -> list[Any]:
        return [_Primary()]


@pytest.mark.parametrize("min_replicas", ["auto", 1])
def test_a_replica_pause_excuses_a_wait_for_its_acknowledgement(
    min_replicas: int | str,
) -> None:
    # Locks that wait for a replica (min_replicas "auto" with a replica, or 1) wait as
    # long as it is paused: the pause reaches their primary. A run's min_replicas was
    # not passed to its site: with "auto" on Sentinel or Cluster (site default 0) a
    # replica's pause reached the replica only, and excused nothing on the primary.
    history = [op("acquire", "a", 1.0, 3.2, "fail", blocking_timeout=0.5, detail="timeout")]
    off = _ReplicatedStub(["lock"])
    on = _ReplicatedStub(["lock"], min_replicas=min_replicas)
    assert off.reaches("replica-pause", "port 2", "replica") == ("port 2",)
    reaches = on.reaches("replica-pause", "port 2", "replica")
    assert reaches == ("port 2", "port 1")
    pause = fault("replica-pause", "port 2", 0.9, 2.8, reaches=reaches)

    report = check(history, faults=[pause])

    assert [v.cause for v in report.violations] == [pause]
    unreached = fault("replica-pause", "port 2", 0.9, 2.8)
    assert [v.cause for v in check(history, faults=[unreached]).violations] == [None]


def test_a_hold_never_ended() -> None:
    history = [*held("a", 1.0, None, fence=1), *held("b", 5.0, 6.0, fence=2, hold=1)]

    report = check(history)

    assert types(report) == [ViolationType.OVERLAP, ViolationType.NEVER_ENDED]
    never = report.of_type(ViolationType.NEVER_ENDED)[0]
    assert never.operations == (history[0],)
    assert "a#1 acquire ok" in never.message


def test_a_killed_client_ends_its_holds() -> None:
    history = [
        *held("a", 1.0, None, fence=1, hold=3),
        op("lost", "a", 2.0, hold=0, detail="killed"),  # the killer does not know the hold
        *held("b", 3.0, 4.0, fence=2),
    ]

    report = check(history)

    assert report.ok, report.violations
    assert report.holds == 2


def test_a_register_that_is_not_linearizable() -> None:
    history = [
        *held("a", 1.0, 2.0, fence=1),
        op("write", "a", 1.1, value=1, fence=1, fenced=True),
        op("read", "a", 1.2, value=0),
        op("write", "a", 1.3, value=2, fence=1, fenced=True),
    ]

    report = check(history)

    assert types(report) == [ViolationType.NOT_LINEARIZABLE]
    assert report.violations[0].operations == (history[3],)
    assert "register 'lock' is not linearizable" in report.violations[0].message
    assert "the register holding 1: a#1 read ok" in report.violations[0].message


def test_a_register_too_long_to_check_is_listed() -> None:
    writes = [
        op("write", f"c{n}", 1.0 + n / 1000, 2.0, value=n, fence=1, fenced=True, hold=n)
        for n in range(101)
    ]

    report = check(writes)

    assert report.unchecked == [
        "register 'lock': too long to check (101 operations from 1.000 in flight together)"
    ]


def register(*records: tuple[Kind, float, float, int, Outcome]) -> list[Operation]:
    """Register operations of one client each: ``(kind, start, end, value, outcome)``."""
    return [
        op(kind, f"c{index}", start, end, outcome, value=value)
        for index, (kind, start, end, value, outcome) in enumerate(records)
    ]


@pytest.mark.parametrize(
    "history",
    [
        pytest.param([], id="empty"),
        pytest.param(register(("write", 0, 1, 1, "ok"), ("read", 2, 3, 1, "ok")), id="sequential"),
        pytest.param(
            register(("read", 0, 1, 0, "ok"), ("write", 2, 3, 5, "ok")), id="initial value"
        ),
        pytest.param(
            register(("write", 0, 4, 1, "ok"), ("read", 1, 2, 0, "ok"), ("read", 2.5, 3, 1, "ok")),
            id="concurrent write seen only by the second read",
        ),
        pytest.param(
            register(("write", 0, 1, 1, "ok"), ("write", 0.5, 3, 2, "ok"), ("read", 2, 4, 1, "ok")),
            id="reads the write that overlaps the later one",
        ),
        pytest.param(
            register(("write", 0, 1, 1, "info"), ("read", 5, 6, 1, "ok")),
            id="info write taking effect",
        ),
        pytest.param(
            register(("write", 0, 1, 1, "info"), ("read", 5, 6, 0, "ok")),
            id="info write never taking effect",
        ),
        pytest.param(
            register(
                ("write", 0, 1, 1, "ok"),
                ("write", 2, 3, 7, "info"),
                ("read", 4, 5, 1, "ok"),
                ("write", 6, 7, 2, "ok"),
                ("read", 8, 9, 7, "ok"),
            ),
            id="info write taking effect segments later",
        ),
        pytest.param(
            register(
                ("write", 0, 1, 3, "fail"), ("read", 2, 3, 0, "ok"), ("read", 4, 5, 9, "info")
            ),
            id="fail writes and info reads ignored",
        ),
    ],
)
def test_linearizable_registers(history: list[Operation]) -> None:
    assert check_register(history).verdict is Verdict.LINEARIZABLE


@pytest.mark.parametrize(
    ("history", "stuck"),
    [
        pytest.param(
            register(("write", 0, 1, 1, "ok"), ("read", 2, 3, 0, "ok")), [1], id="stale read"
        ),
        pytest.param(register(("read", 0, 1, 4, "ok")), [0], id="value never written"),
        pytest.param(
            register(("write", 0, 4, 1, "ok"), ("read", 1, 2, 1, "ok"), ("read", 2.5, 3, 0, "ok")),
            [2],
            id="a concurrent write seen, then unseen",
        ),
        pytest.param(
            register(
                ("write", 0, 1, 1, "ok"),
                ("write", 2, 3, 2, "ok"),
                ("read", 2.5, 4, 1, "ok"),
                ("read", 5, 6, 2, "ok"),
                ("read", 5.5, 7, 1, "ok"),
            ),
            [4],
            id="value goes back",
        ),
        pytest.param(
            register(("write", 0, 1, 1, "fail"), ("read", 2, 3, 1, "ok")),
            [1],
            id="a refused write seen",
        ),
        pytest.param(
            register(
                ("write", 0, 1, 1, "info"),
                ("read", 2, 3, 1, "ok"),
                ("write", 4, 5, 2, "ok"),
                ("read", 6, 7, 1, "ok"),
            ),
            [3],
            id="info write taking effect twice",
        ),
        pytest.param(
            register(("read", 0, 1, 1, "ok"), ("write", 2, 3, 1, "info")),
            [0],
            id="info write seen before it started",
        ),
    ],
)
def test_registers_that_are_not_linearizable(history: list[Operation], stuck: list[int]) -> None:
    found = check_register(history)

    assert found.verdict is Verdict.NOT_LINEARIZABLE
    assert found.operations == tuple(history[index] for index in stuck)


def test_a_segment_too_long_to_check() -> None:
    history = register(*[("write", 0, 1, n, "ok") for n in range(5)], ("read", 2, 3, 9, "ok"))

    assert check_register(history, max_operations=4).verdict is Verdict.TOO_LONG
    assert check_register(history, max_operations=5).verdict is Verdict.NOT_LINEARIZABLE


def test_a_search_past_its_states_gives_up() -> None:
    history = register(*[("write", 0, 1, n, "ok") for n in range(12)], ("read", 2, 3, 99, "ok"))

    assert check_register(history, max_states=1000).verdict is Verdict.TOO_LONG


def test_info_writes_nobody_read_are_left_out() -> None:
    unseen = [("write", 0.5, 1, 9, "info")] * 5
    history = register(("write", 0, 1, 1, "ok"), *unseen, ("read", 2, 3, 1, "ok"))

    assert check_register(history, max_operations=2).verdict is Verdict.LINEARIZABLE


def test_an_acquire_returning_a_spent_lease_is_reported():
    spent = Operation(
        client="c1",
        hold=1,
        kind="acquire",
        lock="l",
        start=0.0,
        end=2.0,
        outcome="ok",
        fence=1,
        lease=1.0,
        extra={"granted_until": 1.0},
    )
    fresh = Operation(
        client="c2",
        hold=1,
        kind="acquire",
        lock="m",
        start=0.0,
        end=0.1,
        outcome="ok",
        fence=1,
        lease=1.0,
        extra={"granted_until": 1.0},
    )
    releases = [
        Operation(client=c, hold=1, kind="release", lock=lock, start=s, end=s + 0.01, outcome="ok")
        for c, lock, s in (("c1", "l", 2.1), ("c2", "m", 0.5))
    ]
    report = check([spent, fresh, *releases])
    assert [(v.type, v.operations) for v in report.violations] == [
        (ViolationType.SPENT_LEASE, (spent,))
    ]


def failover_history(*, released_ok: bool = False) -> list[Operation]:
    """c1 granted at 0.1 by port 1; c2 takes the lock at 0.6, after a failover at 0.4."""
    return [
        op("acquire", "c1", 0.0, 0.1, fence=1, lease=1.0),
        op("acquire", "c2", 0.5, 0.6, fence=2, lease=1.0),
        op("release", "c1", 0.9, outcome="ok" if released_ok else "fail"),
        op("release", "c2", 1.2),
    ]


@pytest.mark.parametrize("kind", ["failover", "primary-crash", "server-restart"])
def test_an_overlap_after_a_data_loss_names_its_fault(kind: str) -> None:
    # A holder granted before the node serving its key failed over (or restarted empty);
    # another takes the lock on the new primary before the first learns it.
    loss = fault(kind, "port 1", 0.4, 0.45, serving_after="port 2")

    report = check(failover_history(), faults=[loss])

    assert types(report) == [ViolationType.OVERLAP_AFTER_FAILOVER]
    assert report.violations[0].cause == loss
    assert report.violations[0].message.endswith(f"excused by {kind} of port 1 [0.400, 0.450]")


def test_a_failover_does_not_excuse_what_it_cannot_explain() -> None:
    history = failover_history()
    # No fault; a failover on another shard; one before the hold was granted; one of a
    # node that did not grant the hold (the key had moved to port 3 before it).
    assert types(check(history)) == [ViolationType.OVERLAP]
    other_shard = fault("failover", "port 2", 0.4, 0.45, serving="port 1")
    assert types(check(history, faults=[other_shard])) == [ViolationType.OVERLAP]
    before = fault("failover", "port 1", -1.0, -0.5, serving_after="port 2")
    assert types(check(history, faults=[before])) == [ViolationType.OVERLAP]
    moved = fault("slot-migration", "slot 7", -1.0, -0.5, serving_after="port 3")
    later = fault("failover", "port 1", 0.4, 0.45, serving="port 3")
    assert types(check(history, faults=[moved, later])) == [ViolationType.OVERLAP]
    # A fault that loses nothing a node granted.
    pause = fault("server-pause", "port 1", 0.4, 0.45)
    assert types(check(history, faults=[pause])) == [ViolationType.OVERLAP]


def test_a_failover_after_which_the_earlier_release_succeeded_excuses_nothing() -> None:
    # c1's release found its token at 0.9: the failover lost nothing, so c2's hold beside
    # it is a double holder.
    loss = fault("failover", "port 1", 0.4, 0.45, serving_after="port 2")

    assert types(check(failover_history(released_ok=True), faults=[loss])) == [
        ViolationType.OVERLAP
    ]


def spent_during_a_pause() -> list[Operation]:
    """The Cluster ``reentrant`` run of 2026-11-28 (issue 27), times shifted: c3's acquire
    was granted at 1.604 (its lease to 2.604), its process stopped from 1.605 to 3.091 by
    the nemesis, and its acquire returned at 3.091 a hold already spent; c1 took the lock
    at 3.088, after the lease was over on the server, and c3's watchdog told it at 3.094.
    """
    return [
        op(
            "acquire",
            "c3",
            1.5735,
            3.0912,
            hold=613,
            fence=2,
            lease=1.0,
            extra={"depth": 2, "granted_until": 2.6037},
        ),
        op("lost", "c3", 3.0945, 3.0946, hold=613, extra={"lease_until": 2.6036}),
        op("release", "c3", 3.0949, 3.0953, "fail", hold=613),
        op("acquire", "c1", 2.9, 3.088, hold=7, fence=3, lease=1.0),
        op("release", "c1", 3.3, hold=7),
    ]


def test_a_hold_spent_while_its_acquire_was_stopped_names_the_pause() -> None:
    """The nemesis stopped the client between the grant and the return, past the lease
    end: no lock can prevent a SIGSTOP after its last check (fencing covers it), so the
    spent hold and the overlap it completes are excused by that pause, and named."""
    pause = fault("client-pause", "c3", 1.6047, 3.0910)
    history = spent_during_a_pause()

    report = check(history, faults=[pause])

    assert sorted(types(report)) == sorted(
        [ViolationType.SPENT_LEASE, ViolationType.OVERLAP_AFTER_PAUSE]
    )
    assert all(violation.cause == pause for violation in report.violations)
    assert report.unexcused == []


@pytest.mark.parametrize(
    "pause",
    [
        None,  # no pause: a lock that hands out a spent hold
        fault("client-pause", "c1", 1.6047, 3.0910),  # another client's pause
        fault("client-pause", "c3", 1.0, 3.0910),  # began before the acquire
        fault("client-pause", "c3", 1.6047, 2.5),  # over before the lease ended
    ],
    ids=["no-pause", "other-client", "before-the-acquire", "over-before-the-lease-end"],
)
def test_a_spent_hold_no_pause_explains_is_a_violation(pause: Fault | None) -> None:
    history = spent_during_a_pause()

    report = check(history, faults=[] if pause is None else [pause])

    assert sorted(types(report)) == sorted([ViolationType.SPENT_LEASE, ViolationType.OVERLAP])
    assert report.excused == []
