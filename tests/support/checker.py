"""The checker of the randomized fault runs (issue 20): :func:`check` reads a history
(:mod:`tests.support.history`) and returns a :class:`Report` of its violations, each with
the operations involved, and a few counters.

Holds. An ``ok`` acquire starts a hold of its ``(client, hold)``. The hold's interval runs
from the acquire's ``end`` to the first of: the ``start`` of the hold's release (whatever
its outcome: the holder stops there), the ``end`` of a ``lost`` record of the hold (the
holder learned it then), the kill of its client (below); failing all three, to the end of
the history (its latest ``end``). Intervals are half-open. An ``info`` acquire may or may
not hold: it never counts as a holder, nor excuses anything.

Double holders. Two holds of one lock conflict unless both are ``shared`` or both
``limited``; ``limited`` holds conflict when more than ``limit`` of them are held at once.
A conflict's window runs from the start of the hold that completes it to the first end;
it is reported as (first matching rule):

- ``overlap_after_pause``: a process pause of an earlier holder began between its
  acquire's ``start`` and the window's start. A stopped process renews nothing, so its
  lease may have run out while it still believed it held: the lease limit fencing covers.
- ``overlap_after_expiry``: an earlier holder's lease had run out by the window's start
  (the same limit, without a pause).
- ``overlap_after_failover``: an earlier holder was granted its hold before a fault that
  may lose what the server granted (``data_loss``: a failover, a primary's crash, a
  restart without its data) and the window starts between that fault's start and its end
  plus the earlier hold's lease (when its holder learns it at the latest): Redis
  replication is asynchronous, the limit ``MIN_REPLICAS`` narrows and fencing covers.
- ``overlap``: mutual exclusion broken while every lease was valid.

Leases. Renewals are not recorded, so a hold's lease is valid until its interval ends,
unless its records say otherwise: ``extra["lease_until"]`` on any of them (a time; the
latest wins), or ``extra["renewed"] = False`` on the acquire (nothing renews it: the lease
ends ``lease`` seconds after the acquire's ``start``, the earliest the server can have
set it).

Pauses and kills. ``extra["paused"]`` on any record of a client lists pauses of its
process as ``[start, end]`` pairs; they apply to every hold of that client by time. A
``lost`` record with ``detail="killed"`` says its client was killed at its ``end``: every
hold of the client then open ends there, whatever the record's ``hold`` (the killer need
not know it).

Fences. ``fences_not_increasing``: an ``ok`` acquire whose fence is not above that of an
``ok`` acquire of the same lock that ended before it started. ``stale_fence_accepted``: a
write's register is ``extra["register"]``, else its lock; the ``ok`` fenced writes of a
register are ordered by ``extra["seq"]`` (the row's version after the write: the database's
own order) when all of them carry it, else by real time (one ended before the other
started); a write is stale if its fence is below an earlier one's, or equal to one of
another hold (a hold may write many times with its fence: ``fenced_update`` accepts an equal
fence).

Lost updates. Writes store the value read plus one, from 0. The final value is that of the
last ``ok`` read marked ``extra["final"] = True`` (the checker client's read after the
run), else the highest value an ``ok`` write stored; ``ok`` writes minus the final value is
a lower bound on the increments lost (an ``info`` write taking effect only raises it). A
register whose writes are all fenced is fenced: a lost update there is a ``lost_update``
violation, and its reads and writes must be linearizable (:mod:`.linearizability`;
``not_linearizable``, or listed in :attr:`Report.unchecked` if too long to check).
Elsewhere lost updates are counted in :attr:`Report.lost_updates`: the case for fencing.

Waits and ends. ``long_wait``: an ``ok`` or ``fail`` acquire with a ``blocking_timeout`` that
lasted longer than it plus ``wait_bound`` plus the time its client was paused meanwhile.
``never_ended``: an ``ok`` acquire whose hold was never released, lost nor killed.
``spent_lease``: an ``ok`` acquire whose ``extra["granted_until"]`` (the lease end its
client was given with it) is not after the acquire returned: a hold that was never valid.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tests.support.history import Operation
from tests.support.linearizability import Verdict, check_register

__all__ = ["WAIT_BOUND", "Report", "Violation", "ViolationType", "check", "describe"]

WAIT_BOUND = 1.0
"""Seconds an acquire may run past its ``blocking_timeout`` on a loaded machine."""


class ViolationType(StrEnum):
    """What a :class:`Violation` is (see the module docstring for each)."""

    OVERLAP = "overlap"
    OVERLAP_AFTER_PAUSE = "overlap_after_pause"
    OVERLAP_AFTER_EXPIRY = "overlap_after_expiry"
    OVERLAP_AFTER_FAILOVER = "overlap_after_failover"
    STALE_FENCE_ACCEPTED = "stale_fence_accepted"
    FENCES_NOT_INCREASING = "fences_not_increasing"
    LOST_UPDATE = "lost_update"
    NOT_LINEARIZABLE = "not_linearizable"
    LONG_WAIT = "long_wait"
    NEVER_ENDED = "never_ended"
    SPENT_LEASE = "spent_lease"


@dataclass(frozen=True)
class Violation:
    """One finding: its type, a message naming the operations, and those operations."""

    type: ViolationType
    message: str
    operations: tuple[Operation, ...]


@dataclass
class Report:
    """What :func:`check` found in a history."""

    violations: list[Violation] = field(default_factory=list)
    operations: int = 0
    holds: int = 0
    """``ok`` acquires."""
    lost_updates: int = 0
    """Increments lost on unfenced registers (on fenced ones they are violations)."""
    double_holder_windows: int = 0
    """Windows of every ``overlap*`` type."""
    longest_double_holder_window: float = 0.0
    unchecked: list[str] = field(default_factory=list)
    """Fenced registers whose linearizability was too long to check, and why."""

    @property
    def ok(self) -> bool:
        """No violation (``unchecked`` registers aside)."""
        return not self.violations

    def of_type(self, kind: ViolationType) -> list[Violation]:
        """The violations of one type."""
        return [violation for violation in self.violations if violation.type == kind]

    def add(self, kind: ViolationType, message: str, operations: Iterable[Operation]) -> None:
        """Record a violation whose message is ``message`` followed by ``operations``."""
        ops = tuple(operations)
        described = "; ".join(describe(op) for op in ops)
        self.violations.append(Violation(kind, f"{message}: {described}", ops))


def describe(op: Operation) -> str:
    """``op`` in a violation's message, e.g. ``p1#3 acquire ok [1.000, 1.200] fence 7``."""
    text = f"{op.client}#{op.hold} {op.kind} {op.outcome} [{op.start:.3f}, {op.end:.3f}]"
    if op.fence is not None:
        text += f" fence {op.fence}"
    if op.value is not None:
        text += f" value {op.value}"
    return text


def check(
    history: list[Operation],
    *,
    wait_bound: float = WAIT_BOUND,
    data_loss: Sequence[tuple[float, float]] = (),
) -> Report:
    """Check ``history`` against the rules of the module docstring; ``data_loss`` lists
    the ``(start, end)`` of faults that may lose what the server had granted (a failover,
    a primary's crash, a restart without its data)."""
    report = Report(operations=len(history))
    horizon = max((op.end for op in history), default=0.0)
    pauses = _pauses(history)
    holds = _holds(history, horizon, pauses)
    report.holds = len(holds)
    by_lock: dict[str, list[_Hold]] = defaultdict(list)
    for hold in holds:
        by_lock[hold.acquire.lock].append(hold)
    for lock_holds in by_lock.values():
        _check_overlaps(lock_holds, report, data_loss)
    acquires = [op for op in history if op.kind == "acquire" and op.outcome == "ok"]
    _check_acquire_fences(acquires, report)
    _check_registers(history, report)
    _check_waits(history, wait_bound, pauses, report)
    for op in acquires:
        granted = op.extra.get("granted_until")
        if granted is not None and granted <= op.end:
            report.add(
                ViolationType.SPENT_LEASE,
                "an acquire returned a hold whose lease was already over",
                [op],
            )
    for hold in holds:
        if hold.ended_by is None:
            report.add(
                ViolationType.NEVER_ENDED, "a hold never released, lost nor killed", [hold.acquire]
            )
    return report


Pause = tuple[float, float]


@dataclass
class _Hold:
    acquire: Operation
    end: float
    ended_by: Operation | None
    lease_until: float
    pauses: list[Pause]

    @property
    def start(self) -> float:
        return self.acquire.end

    def paused_before(self, moment: float) -> bool:
        return any(start < moment and end > self.acquire.start for start, end in self.pauses)


def _hold_of(op: Operation) -> tuple[str, int]:
    return op.client, op.hold


def _pauses(history: list[Operation]) -> dict[str, list[Pause]]:
    # A set: one pause may be recorded on several records of its client.
    pauses: dict[str, set[Pause]] = defaultdict(set)
    for op in history:
        for start, end in op.extra.get("paused", ()):
            pauses[op.client].add((start, end))
    return defaultdict(list, {client: sorted(found) for client, found in pauses.items()})


def _holds(history: list[Operation], horizon: float, pauses: dict[str, list[Pause]]) -> list[_Hold]:
    records: dict[tuple[str, int], list[Operation]] = defaultdict(list)
    kills: dict[str, list[Operation]] = defaultdict(list)
    for op in history:
        records[_hold_of(op)].append(op)
        if op.kind == "lost" and op.detail == "killed":
            kills[op.client].append(op)
    holds = []
    for op in history:
        if op.kind != "acquire" or op.outcome != "ok":
            continue
        ends = [(r.start, r) for r in records[_hold_of(op)] if r.kind == "release"]
        ends += [(r.end, r) for r in records[_hold_of(op)] if r.kind == "lost"]
        ends += [(kill.end, kill) for kill in kills[op.client] if kill.end >= op.start]
        end, ended_by = min(ends, key=lambda pair: pair[0], default=(horizon, None))
        lease_until = max(
            (r.extra["lease_until"] for r in records[_hold_of(op)] if "lease_until" in r.extra),
            default=math.inf,
        )
        if op.extra.get("renewed", True) is False and op.lease is not None:
            lease_until = min(lease_until, op.start + op.lease)
        holds.append(_Hold(op, end, ended_by, lease_until, pauses[op.client]))
    return holds


def _conflict(a: Operation, b: Operation) -> bool:
    """Whether two holds of one lock may not overlap at all (limited ones count instead)."""
    return not (a.mode == b.mode and a.mode in ("shared", "limited"))


Losses = Sequence[tuple[float, float]]


def _check_overlaps(holds: list[_Hold], report: Report, losses: Losses) -> None:
    holds = sorted(holds, key=lambda hold: hold.start)
    active: list[_Hold] = []
    for hold in holds:
        active = [other for other in active if other.end > hold.start]
        for other in active:
            if _conflict(other.acquire, hold.acquire):
                end = min(other.end, hold.end)
                _window(report, [other], [other, hold], hold.start, end, losses=losses)
        active.append(hold)
    limited = [hold for hold in holds if hold.acquire.mode == "limited"]
    if limited:
        _check_limit(limited, limited[0].acquire.limit, report, losses)


def _after_data_loss(hold: _Hold, start: float, losses: Losses) -> bool:
    """Whether ``hold``, granted before a data loss, may have been forgotten by the
    server by ``start``: its holder learns it at its next renewal, by its lease end."""
    lease = hold.acquire.lease or 0.0
    return any(hold.acquire.start < end and began <= start <= end + lease for began, end in losses)


def _check_limit(holds: list[_Hold], limit: int, report: Report, losses: Losses) -> None:
    # Ends sort before starts at one instant: intervals are half-open.
    events = sorted(
        [(hold.start, 1, index) for index, hold in enumerate(holds)]
        + [(hold.end, 0, index) for index, hold in enumerate(holds)]
    )
    active: set[int] = set()
    window: tuple[float, list[int], list[int]] | None = None  # start, earlier, involved
    for moment, starts, index in events:
        if starts:
            active.add(index)
            if window is not None:
                window[2].append(index)
            elif len(active) > limit:
                earlier = sorted(active - {index})
                window = (moment, earlier, [*earlier, index])
        else:
            active.discard(index)
            if window is not None and len(active) <= limit:
                start, earlier, involved = window
                _window(
                    report,
                    [holds[i] for i in earlier],
                    [holds[i] for i in involved],
                    start,
                    moment,
                    limit=limit,
                    losses=losses,
                )
                window = None


def _window(
    report: Report,
    earlier: list[_Hold],
    involved: list[_Hold],
    start: float,
    end: float,
    *,
    limit: int | None = None,
    losses: Losses = (),
) -> None:
    if any(hold.paused_before(start) for hold in earlier):
        kind = ViolationType.OVERLAP_AFTER_PAUSE
    elif any(hold.lease_until <= start for hold in earlier):
        kind = ViolationType.OVERLAP_AFTER_EXPIRY
    elif any(_after_data_loss(hold, start, losses) for hold in earlier):
        kind = ViolationType.OVERLAP_AFTER_FAILOVER
    else:
        kind = ViolationType.OVERLAP
    held = f"{len(involved)} holds of limit {limit}" if limit else "two conflicting holds"
    lock = involved[0].acquire.lock
    report.add(
        kind,
        f"{held} of {lock!r} overlap for {end - start:.3f} s from {start:.3f}",
        [hold.acquire for hold in involved],
    )
    report.double_holder_windows += 1
    report.longest_double_holder_window = max(report.longest_double_holder_window, end - start)


def _check_acquire_fences(acquires: list[Operation], report: Report) -> None:
    by_lock: dict[str, list[Operation]] = defaultdict(list)
    for op in acquires:
        if op.fence is not None:
            by_lock[op.lock].append(op)
    for ops in by_lock.values():
        for earlier, later in _fence_regressions(ops, done=_end, begins=_start):
            report.add(
                ViolationType.FENCES_NOT_INCREASING,
                "an acquire got a fence not above that of an earlier one",
                [earlier, later],
            )


def _start(op: Operation) -> float:
    return op.start


def _end(op: Operation) -> float:
    return op.end


def _seq(op: Operation) -> float:
    return op.extra["seq"]


def _fence_regressions(
    ops: list[Operation],
    *,
    done: Callable[[Operation], float],
    begins: Callable[[Operation], float],
) -> list[tuple[Operation, Operation]]:
    """``(earlier, later)`` pairs where ``later`` came after ``earlier`` (``done(earlier)
    < begins(later)``) with a lower fence, or the same one from another hold."""
    finished = sorted(ops, key=done)
    regressions = []
    best: Operation | None = None  # the highest fence among the finished
    rival: Operation | None = None  # another hold's operation with that fence
    taken = 0
    for op in sorted(ops, key=begins):
        while taken < len(finished) and done(finished[taken]) < begins(op):
            candidate = finished[taken]
            taken += 1
            if best is None or _fence(candidate) > _fence(best):
                best, rival = candidate, None
            elif _fence(candidate) == _fence(best) and _hold_of(candidate) != _hold_of(best):
                rival = rival or candidate
        if best is None:
            continue
        if _fence(op) < _fence(best) or (
            _fence(op) == _fence(best) and _hold_of(op) != _hold_of(best)
        ):
            regressions.append((best, op))
        elif _fence(op) == _fence(best) and rival is not None:
            regressions.append((rival, op))
    return regressions


def _fence(op: Operation) -> int:
    assert op.fence is not None  # operations without a fence are left out before
    return op.fence


def _register(op: Operation) -> str:
    return op.extra.get("register", op.lock)


def _check_registers(history: list[Operation], report: Report) -> None:
    registers: dict[str, list[Operation]] = defaultdict(list)
    for op in history:
        if op.kind in ("read", "write"):
            registers[_register(op)].append(op)
    for name, ops in registers.items():
        writes = [op for op in ops if op.kind == "write"]
        fenced = bool(writes) and all(op.fenced for op in writes)
        accepted = [op for op in writes if op.outcome == "ok"]
        if fenced:
            _check_write_fences(accepted, report)
            _check_linearizable(name, ops, report)
        lost = _lost_updates(ops, accepted)
        if lost and fenced:
            _report_lost(name, lost, ops, accepted, report)
        elif lost:
            report.lost_updates += lost


def _check_write_fences(accepted: list[Operation], report: Report) -> None:
    accepted = [op for op in accepted if op.fence is not None]
    ordered = _seq if all("seq" in op.extra for op in accepted) else None
    regressions = _fence_regressions(accepted, done=ordered or _end, begins=ordered or _start)
    for earlier, later in regressions:
        report.add(
            ViolationType.STALE_FENCE_ACCEPTED,
            "a write was accepted after one with a newer fence",
            [earlier, later],
        )


def _check_linearizable(name: str, ops: list[Operation], report: Report) -> None:
    found = check_register(ops)
    if found.verdict is Verdict.NOT_LINEARIZABLE:
        report.add(
            ViolationType.NOT_LINEARIZABLE,
            f"register {name!r} is not linearizable: none of these could come next, "
            f"the register holding {found.value}",
            found.operations,
        )
    elif found.verdict is Verdict.TOO_LONG:
        report.unchecked.append(
            f"register {name!r}: too long to check ({len(found.operations)} operations "
            f"from {found.operations[0].start:.3f} in flight together)"
        )


def _final_read(ops: list[Operation]) -> Operation | None:
    finals = [
        op for op in ops if op.kind == "read" and op.outcome == "ok" and op.extra.get("final")
    ]
    return max(finals, key=_end, default=None)


def _lost_updates(ops: list[Operation], accepted: list[Operation]) -> int:
    final = _final_read(ops)
    if final is not None and final.value is not None:
        value = final.value
    else:
        value = max((op.value for op in accepted if op.value is not None), default=0)
    return max(0, len(accepted) - value)


def _report_lost(
    name: str, lost: int, ops: list[Operation], accepted: list[Operation], report: Report
) -> None:
    # The writes that stored a value another accepted write stored too are the usual
    # culprits: both read the same value.
    stored: dict[int | None, int] = defaultdict(int)
    for op in accepted:
        stored[op.value] += 1
    culprits = [op for op in accepted if stored[op.value] > 1]
    final = _final_read(ops)
    report.add(
        ViolationType.LOST_UPDATE,
        f"register {name!r} lost {lost} of {len(accepted)} accepted increments",
        [*culprits, *([final] if final is not None else [])],
    )


def _check_waits(
    history: list[Operation], wait_bound: float, pauses: dict[str, list[Pause]], report: Report
) -> None:
    for op in history:
        if op.kind != "acquire" or op.outcome == "info" or op.blocking_timeout is None:
            continue
        paused = sum(
            max(0.0, min(end, op.end) - max(start, op.start)) for start, end in pauses[op.client]
        )
        allowed = op.blocking_timeout + wait_bound + paused
        if op.end - op.start > allowed:
            report.add(
                ViolationType.LONG_WAIT,
                f"an acquire took {op.end - op.start:.3f} s, over {allowed:.3f} s "
                f"(blocking_timeout {op.blocking_timeout} + {wait_bound} s)",
                [op],
            )
