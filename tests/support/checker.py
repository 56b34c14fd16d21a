"""The checker of the randomized fault runs (issues 20, 27): :func:`check` reads a history
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
A conflict's window runs from the start of the hold that completes it to the first end.
It is excused only by a recorded fault (``faults``: :class:`~tests.support.chaos.nemesis.
Fault` records) that covers it for one of the earlier holds, and the excuse names that
fault (:attr:`Violation.cause`); the first matching rule gives its type:

- ``overlap_after_pause``: a pause (:data:`PAUSE_FAULTS`) of the earlier holder's client
  was going on when the window began, and the hold's lease (from its own records, below)
  had ended by then. A stopped process renews nothing: the limit fencing covers. Also
  when the hold that completes the window was spent during its own acquire by a pause
  (``spent_lease`` below, excused): its holder took it for a hold only after the pause,
  when its lease on the server was already over.
- ``overlap_after_expiry``: the hold's lease had ended by the window's start, a fault
  reached its connections, its client or a node serving its lock during its last lease
  (the ``lease`` seconds before that end), and its holder was told it lost the lock
  (``lost`` record, a failed release, a kill) by the lease end plus :data:`NOTICE_BOUND`
  plus the time its client was paused meanwhile.
- ``overlap_after_failover``: a fault that may lose what a node granted
  (:data:`DATA_LOSS_FAULTS`: a failover, a primary's crash, a restart without its data)
  hit the node serving the lock's key when it began; the hold's acquire started before
  the fault began, while that node served the key; the window began after the fault
  began; and nothing the holder did afterwards succeeded on the lock (an ``ok`` release
  ending after the fault began proves the grant was still there). Redis replication is
  asynchronous: ``MIN_REPLICAS`` narrows this and fencing covers it.
- ``overlap``: anything else: mutual exclusion broken.

Which node served a key when is read from the faults: each records the node serving every
lock name when it began (``serving``) and ended (``serving_after``); between faults it
does not change, during one it may be either.

Leases. Renewals are not recorded, so a hold's lease is valid until its interval ends,
unless its records say otherwise: ``extra["lease_until"]`` on any of them (the lease end
as its holder knew it when told of a loss; the latest wins), or ``extra["renewed"] =
False`` on the acquire (nothing renews it: the lease ends ``lease`` seconds after the
acquire's ``start``, the earliest the server can have set it).

Pauses and kills. A client's pauses are the pause faults on it and the
``extra["paused"]`` pairs (``[start, end]``) on its records. A ``lost`` record with
``detail="killed"`` says its client was killed at its ``end``: every hold of the client
then open ends there, whatever the record's ``hold`` (the killer need not know it).

Fences. ``fences_not_increasing``: an ``ok`` acquire whose fence is not above that of an
``ok`` acquire of the same lock that ended before it started. ``stale_fence_accepted``: a
write's register is ``extra["register"]``, else its lock; the ``ok`` fenced writes of a
register are ordered by ``extra["seq"]`` (the row's version after the write: the database's
own order) when all of them carry it, else by real time (one ended before the other
started); a write is stale if its fence is below an earlier one's, or equal to one of
another hold (a hold may write many times with its fence: ``fenced_update`` accepts an equal
fence).

Lost updates. Writes store the value read plus one, from 0. The final value is that of the
last ``ok`` read marked ``extra["final"] = True`` (the runner's read after the run), else
the highest value an ``ok`` write stored. The increments accepted are the database's own
count of them, ``extra["accepted"]`` on that final read (``info`` writes that took effect
included), and at least the ``ok`` writes; that count minus the final value is the
increments lost. A register whose writes are all fenced is fenced: a lost update there is
a ``lost_update`` violation, and its reads and writes must be linearizable
(:mod:`.linearizability`; ``not_linearizable``, or listed in :attr:`Report.unchecked` if
too long to check). Elsewhere lost updates are counted in :attr:`Report.lost_updates`:
the case for fencing.

Waits and ends. ``long_wait``: an ``ok`` or ``fail`` acquire with a ``blocking_timeout`` that
lasted longer than it plus ``wait_bound`` (:data:`WAIT_BOUND`, the 1 s docs/how-it-works.md
promises) plus the time its client was paused meanwhile; excused, naming the fault, only
when a fault reached its client's connections or its lock's node while it ran, and it
ran over by no more than that fault lasted during it (a server or network that does not
answer holds every request; nothing bounds a request but the client's socket timeout) or,
for a slot migration, than :data:`MIGRATION_RIDE_OUT` (the budget docs/architecture.md
gives ``TRYAGAIN``).
``never_ended``: an ``ok`` acquire whose hold was never released, lost nor killed.
``spent_lease``: an ``ok`` acquire whose ``extra["granted_until"]`` (the lease end its
client was given with it) is not after the acquire returned: a hold that was never valid.
Excused only by a pause of its client that began during the acquire, before that lease
end, and lasted past it: the process was stopped after the grant (after the lock's last
check of its validity), which no lock can prevent; the holder is told of the loss
afterwards, and fencing covers it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from django_distlock.engine.transport.requests import TRYAGAIN_BUDGET
from tests.support.chaos.nemesis import Fault
from tests.support.history import Operation
from tests.support.linearizability import Verdict, check_register

__all__ = [
    "DATA_LOSS_FAULTS",
    "MIGRATION_RIDE_OUT",
    "NOTICE_BOUND",
    "PAUSE_FAULTS",
    "WAIT_BOUND",
    "Report",
    "Violation",
    "ViolationType",
    "check",
    "describe",
    "describe_fault",
]

WAIT_BOUND = 1.0
"""Seconds an acquire may run past its ``blocking_timeout``: docs/how-it-works.md promises
1 s."""

NOTICE_BOUND = 1.0
"""Seconds past its lease end by which a holder is told of a loss. The docs promise the
lease end itself (``on_lost`` a few milliseconds later); the same 1 s as for waits covers
a loaded machine."""

MIGRATION_RIDE_OUT = TRYAGAIN_BUDGET
"""Seconds a request refused with ``TRYAGAIN`` while its slot migrates is retried
(docs/architecture.md): an acquire may run that much longer while a migration reaches
its lock's node."""

PAUSE_FAULTS = frozenset({"client-pause", "holder-pause"})
"""Faults that stop a client process (SIGSTOP), their ``target`` the client."""

DATA_LOSS_FAULTS = frozenset({"failover", "primary-crash", "server-restart"})
"""Faults after which a node may no longer have a lock it granted: Redis replication is
asynchronous, and a server restarted without persistence comes back empty."""


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
    """One finding: its type, a message naming the operations, those operations, and,
    when a recorded fault excuses it (an overlap, a wait), that fault."""

    type: ViolationType
    message: str
    operations: tuple[Operation, ...]
    cause: Fault | None = None

    @property
    def excused(self) -> bool:
        """A finding a recorded fault covers (see the module docstring)."""
        return self.cause is not None


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

    @property
    def excused(self) -> list[Violation]:
        """The findings a recorded fault excuses."""
        return [violation for violation in self.violations if violation.excused]

    @property
    def unexcused(self) -> list[Violation]:
        """Every other violation: a bug of the lock or of the harness."""
        return [violation for violation in self.violations if not violation.excused]

    def of_type(self, kind: ViolationType) -> list[Violation]:
        """The violations of one type."""
        return [violation for violation in self.violations if violation.type == kind]

    def add(
        self,
        kind: ViolationType,
        message: str,
        operations: Iterable[Operation],
        cause: Fault | None = None,
    ) -> None:
        """Record a violation whose message is ``message`` followed by ``operations``
        (and, excused, by its ``cause``)."""
        ops = tuple(operations)
        described = "; ".join(describe(op) for op in ops)
        if cause is not None:
            described += f"; excused by {describe_fault(cause)}"
        self.violations.append(Violation(kind, f"{message}: {described}", ops, cause))


def describe(op: Operation) -> str:
    """``op`` in a violation's message, e.g. ``p1#3 acquire ok [1.000, 1.200] fence 7``."""
    text = f"{op.client}#{op.hold} {op.kind} {op.outcome} [{op.start:.3f}, {op.end:.3f}]"
    if op.fence is not None:
        text += f" fence {op.fence}"
    if op.value is not None:
        text += f" value {op.value}"
    return text


def describe_fault(fault: Fault) -> str:
    """``fault`` in an excuse, e.g. ``client-pause of c1 [1.000, 2.500]``."""
    return f"{fault.kind} of {fault.target} [{fault.start:.3f}, {fault.end:.3f}]"


def check(
    history: list[Operation],
    *,
    wait_bound: float = WAIT_BOUND,
    faults: Sequence[Fault] = (),
) -> Report:
    """Check ``history`` against the rules of the module docstring; ``faults`` are the
    faults the nemesis carried out during it, the only excuses an overlap can have."""
    report = Report(operations=len(history))
    horizon = max((op.end for op in history), default=0.0)
    faults = sorted(faults, key=lambda fault: fault.start)
    pauses = _pauses(history, faults)
    holds = _holds(history, horizon)
    report.holds = len(holds)
    by_lock: dict[str, list[_Hold]] = defaultdict(list)
    for hold in holds:
        by_lock[hold.acquire.lock].append(hold)
    causes = _Causes(faults, pauses)
    for lock_holds in by_lock.values():
        _check_overlaps(lock_holds, report, causes)
    acquires = [op for op in history if op.kind == "acquire" and op.outcome == "ok"]
    _check_acquire_fences(acquires, report)
    _check_registers(history, report)
    _check_waits(history, wait_bound, causes, report)
    for op in acquires:
        granted = op.extra.get("granted_until")
        if granted is not None and granted <= op.end:
            report.add(
                ViolationType.SPENT_LEASE,
                "an acquire returned a hold whose lease was already over",
                [op],
                causes.spent_while_stopped(op),
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
    records: list[Operation]
    end: float
    ended_by: Operation | None
    lease_until: float

    @property
    def start(self) -> float:
        return self.acquire.end

    @property
    def told(self) -> float | None:
        """When its holder learned (or, killed, stopped believing) that it lost the hold."""
        ended_by = self.ended_by
        if ended_by is None or (ended_by.kind == "release" and ended_by.outcome != "fail"):
            return None
        return self.end


def _hold_of(op: Operation) -> tuple[str, int]:
    return op.client, op.hold


def _pauses(history: list[Operation], faults: Sequence[Fault]) -> dict[str, list[Pause]]:
    # A set: one pause may be recorded on several records of its client.
    pauses: dict[str, set[Pause]] = defaultdict(set)
    for op in history:
        for start, end in op.extra.get("paused", ()):
            pauses[op.client].add((start, end))
    for fault in faults:
        if fault.kind in PAUSE_FAULTS:
            pauses[fault.target].add((fault.start, fault.end))
    return defaultdict(list, {client: sorted(found) for client, found in pauses.items()})


def _paused_for(pauses: list[Pause], start: float, end: float) -> float:
    return sum(max(0.0, min(stop, end) - max(began, start)) for began, stop in pauses)


def _holds(history: list[Operation], horizon: float) -> list[_Hold]:
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
        own = records[_hold_of(op)]
        ends = [(r.start, r) for r in own if r.kind == "release"]
        ends += [(r.end, r) for r in own if r.kind == "lost"]
        ends += [(kill.end, kill) for kill in kills[op.client] if kill.end >= op.start]
        end, ended_by = min(ends, key=lambda pair: pair[0], default=(horizon, None))
        lease_until = max(
            (r.extra["lease_until"] for r in own if "lease_until" in r.extra), default=math.inf
        )
        if op.extra.get("renewed", True) is False and op.lease is not None:
            lease_until = min(lease_until, op.start + op.lease)
        holds.append(_Hold(op, own, end, ended_by, lease_until))
    return holds


def _conflict(a: Operation, b: Operation) -> bool:
    """Whether two holds of one lock may not overlap at all (limited ones count instead)."""
    return not (a.mode == b.mode and a.mode in ("shared", "limited"))


class _Causes:
    """The recorded faults of a run, as excuses of an overlap (module docstring)."""

    def __init__(self, faults: list[Fault], pauses: dict[str, list[Pause]]) -> None:
        self.faults = faults
        self.pauses = pauses

    def serving(self, lock: str, start: float, end: float) -> set[str]:
        """The nodes that may have served ``lock``'s key at some time in [start, end]."""
        nodes: set[str] = set()
        before: Fault | None = None
        for fault in self.faults:
            if fault.start > end:
                nodes.add(fault.serving.get(lock, ""))
                break
            if fault.end >= start:
                nodes.update((fault.serving.get(lock, ""), fault.serving_after.get(lock, "")))
            before = fault
        if before is not None and before.end < end:
            nodes.add(before.serving_after.get(lock, ""))
        nodes.discard("")
        return nodes

    def excuse(self, hold: _Hold, start: float) -> tuple[ViolationType, Fault] | None:
        """Why ``hold`` may have overlapped a later one from ``start``, if a fault covers it."""
        client = hold.acquire.client
        lease_over = hold.lease_until <= start
        if lease_over:
            for fault in self.faults:
                if (
                    fault.kind in PAUSE_FAULTS
                    and fault.target == client
                    and fault.start <= start < fault.end
                ):
                    return ViolationType.OVERLAP_AFTER_PAUSE, fault
            fault = self._expiry(hold)
            if fault is not None:
                return ViolationType.OVERLAP_AFTER_EXPIRY, fault
        fault = self._failover(hold, start)
        if fault is not None:
            return ViolationType.OVERLAP_AFTER_FAILOVER, fault
        return None

    def spent_while_stopped(self, acquire: Operation) -> Fault | None:
        """The pause that spent the lease ``acquire`` returned (``spent_lease``): one of
        its client that began during the acquire, before the lease it was granted ended,
        and lasted past that end; ``None`` if the lease was not spent or no pause did."""
        granted = acquire.extra.get("granted_until")
        if granted is None or granted > acquire.end:
            return None
        return next(
            (
                fault
                for fault in self.faults
                if fault.kind in PAUSE_FAULTS
                and fault.target == acquire.client
                and acquire.start <= fault.start < granted <= fault.end <= acquire.end
            ),
            None,
        )

    def _expiry(self, hold: _Hold) -> Fault | None:
        told = hold.told
        if told is None:
            return None
        lease_end = hold.lease_until
        paused = _paused_for(self.pauses[hold.acquire.client], lease_end, told)
        if told > lease_end + NOTICE_BOUND + paused:
            return None
        lease_start = lease_end - (hold.acquire.lease or 0.0)
        lock = hold.acquire.lock
        reached = {"connections", hold.acquire.client, *self.serving(lock, lease_start, lease_end)}
        during = [f for f in self.faults if f.start <= lease_end and f.end >= lease_start]
        return next((fault for fault in during if reached & set(fault.reaches)), None)

    def delay(self, op: Operation, excess: float) -> Fault | None:
        """A fault that kept ``op``'s requests unanswered for ``excess`` seconds: one that
        reached its client's connections or its lock's node while it ran, for as long
        (a slot migration: for its ``TRYAGAIN`` budget). A group's acquire waits on every
        name of its group (``extra["group"]``)."""
        names = op.extra.get("group") or [op.lock]
        nodes = (node for name in names for node in self.serving(name, op.start, op.end))
        reached = {"connections", op.client, *nodes}
        for fault in self.faults:
            during = min(fault.end, op.end) - max(fault.start, op.start)
            if during <= 0 or not reached & set(fault.reaches):
                continue
            budget = MIGRATION_RIDE_OUT if fault.kind == "slot-migration" else during
            if excess <= budget:
                return fault
        return None

    def _failover(self, hold: _Hold, start: float) -> Fault | None:
        acquire = hold.acquire
        for fault in self.faults:
            if fault.kind not in DATA_LOSS_FAULTS or not acquire.start < fault.start <= start:
                continue
            if fault.serving.get(acquire.lock) != fault.target:
                continue
            if fault.target not in self.serving(acquire.lock, acquire.start, acquire.end):
                continue
            if any(
                r.kind in ("release", "extend") and r.outcome == "ok" and r.end > fault.start
                for r in hold.records
            ):
                continue
            return fault
        return None


def _check_overlaps(holds: list[_Hold], report: Report, causes: _Causes) -> None:
    holds = sorted(holds, key=lambda hold: hold.start)
    active: list[_Hold] = []
    for hold in holds:
        active = [other for other in active if other.end > hold.start]
        for other in active:
            if _conflict(other.acquire, hold.acquire):
                end = min(other.end, hold.end)
                _window(report, [other], [other, hold], hold.start, end, causes)
        active.append(hold)
    limited = [hold for hold in holds if hold.acquire.mode == "limited"]
    if limited:
        _check_limit(limited, limited[0].acquire.limit, report, causes)


def _check_limit(holds: list[_Hold], limit: int, report: Report, causes: _Causes) -> None:
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
                    causes,
                    limit=limit,
                )
                window = None


def _window(
    report: Report,
    earlier: list[_Hold],
    involved: list[_Hold],
    start: float,
    end: float,
    causes: _Causes,
    *,
    limit: int | None = None,
) -> None:
    kind, cause = ViolationType.OVERLAP, None
    for hold in earlier:
        excuse = causes.excuse(hold, start)
        if excuse is not None:
            kind, cause = excuse
            break
    else:
        # The hold completing the window, taken for a hold only once a pause had spent it.
        completing = next((hold for hold in involved if hold.start == start), None)
        if completing is not None and completing not in earlier:
            cause = causes.spent_while_stopped(completing.acquire)
            if cause is not None:
                kind = ViolationType.OVERLAP_AFTER_PAUSE
    held = f"{len(involved)} holds of limit {limit}" if limit else "two conflicting holds"
    lock = involved[0].acquire.lock
    report.add(
        kind,
        f"{held} of {lock!r} overlap for {end - start:.3f} s from {start:.3f}",
        [hold.acquire for hold in involved],
        cause,
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
    count = len(accepted)
    if final is not None and final.value is not None:
        value = final.value
        count = max(count, final.extra.get("accepted", 0))
    else:
        value = max((op.value for op in accepted if op.value is not None), default=0)
    return max(0, count - value)


def _report_lost(
    name: str, lost: int, ops: list[Operation], accepted: list[Operation], report: Report
) -> None:
    # The writes that stored a value another accepted write stored too are the usual
    # culprits: both read the same value.
    stored: dict[int | None, int] = defaultdict(int)
    for op in accepted:
        stored[op.value] += 1
    culprits = [op for op in accepted if stored[op.value] > 1]
    # Writes of unknown outcome the database counted may hide the loss behind them.
    culprits += [op for op in ops if op.kind == "write" and op.outcome == "info"]
    final = _final_read(ops)
    count = max(len(accepted), final.extra.get("accepted", 0) if final is not None else 0)
    report.add(
        ViolationType.LOST_UPDATE,
        f"register {name!r} lost {lost} of {count} accepted increments",
        [*culprits, *([final] if final is not None else [])],
    )


def _check_waits(
    history: list[Operation], wait_bound: float, causes: _Causes, report: Report
) -> None:
    for op in history:
        if op.kind != "acquire" or op.outcome == "info" or op.blocking_timeout is None:
            continue
        paused = _paused_for(causes.pauses[op.client], op.start, op.end)
        allowed = op.blocking_timeout + wait_bound + paused
        took = op.end - op.start
        if took > allowed:
            report.add(
                ViolationType.LONG_WAIT,
                f"an acquire took {took:.3f} s, over {allowed:.3f} s "
                f"(blocking_timeout {op.blocking_timeout} + {wait_bound} s)",
                [op],
                causes.delay(op, took - allowed),
            )
