"""The liveness invariants of the randomized fault runs (issue 27): holds always end, a
free lock is taken, and the faults the docs say are ridden out raise nothing. The safety
checker (:mod:`tests.support.checker`) judges what the clients recorded; this module also
judges what Redis showed, read by a :class:`Probe` beside the clients.

:func:`check_liveness` reads a merged history (:mod:`tests.support.history`), the probe's
:class:`Sample` s and the nemesis' fault log, and returns a :class:`LivenessReport`. Each
violation names its operations, samples and the bound it broke:

- ``hold_outlived_owner``: a hold was still in Redis more than :attr:`Bounds.hold_gone`
  (one lease, plus the probe's slack) after its owner stopped believing it held it. An
  owner stops believing at the end of its hold's release record (whatever its outcome:
  released, failed, interrupted), of a ``lost`` record, of an acquire that returned no
  hold (an error, an interruption), or when its process was killed. A hold the probe sees
  is matched to its owner by token (a hold the history knows) or else by the owner's pid
  (an acquire that never returned a hold): such a hold is an orphan unless its client has
  an acquire of that lock in progress, recorded or not (a client killed after its last
  record may have been killed inside an acquire, which left no record: its owner stops
  believing at the kill). A request delayed by a fault (a paused server, a
  stalled or slow proxy) may renew a lease after its owner let go: the time such faults
  overlapped the lease after the owner stopped is added to the bound.
- ``free_lock_not_taken``: the probe saw a lock free, and a live waiter wait for it, both
  for longer than :attr:`Bounds.free_taken` (docs/how-it-works.md, "Waiting is not
  polling"): a single-lock acquire with a ``blocking_timeout``, its client neither paused
  nor killed meanwhile. Not judged near a fault other than the caller's own interruptions
  (:attr:`Bounds.settle` after a server or network fault, :attr:`Bounds.client_settle`
  after a client was paused or killed: a fair waiter queued by a dead process holds the
  queue until its place lapses).
- ``ridden_out_fault_raised``: an error reached the caller (an acquire or release with an
  error; a hold lost, when its lease was longer than the fault: a migration's keys may be
  split, and renewals answered ``TRYAGAIN``, longer than a short lease) while a fault
  ran that the docs say is ridden out within a budget:
  a slot migration on Cluster (``ASK``/``TRYAGAIN``, 3 s: docs/architecture.md), or,
  for an acquire waiting with a ``blocking_timeout`` the failover fit in, a planned
  Sentinel failover (docs/architecture.md, "A failover ending a wait"). Not judged when
  another fault ran shortly before, nor for an operation that ended after the next fault
  began (the nemesis starts one as the last ends; a client's fault counts for that
  client's operations only): that fault may be what it met.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from tests.support.history import PENDING, Operation

__all__ = [
    "Bounds",
    "LivenessReport",
    "LivenessType",
    "LivenessViolation",
    "Probe",
    "Sample",
    "check_liveness",
]

Holders = tuple[tuple[str, int | None], ...]


@dataclass(frozen=True)
class Sample:
    """One read of a lock's holders by the probe, between ``start`` and ``end``
    (``time.monotonic()``); ``holders`` are ``(token, owner pid)`` pairs, ``None`` when
    the read failed."""

    lock: str
    start: float
    end: float
    holders: Holders | None


class FaultLike(Protocol):
    """A fault of the nemesis' log (:class:`tests.support.chaos.nemesis.Fault`)."""

    kind: str
    target: str
    start: float
    end: float


class Probe:
    """Reads the holders of ``names`` every ``interval`` seconds in a thread, from
    :meth:`start` to :meth:`stop`, with ``read(name)`` (a plain client: see
    ``ChaosSite.lock_holders``); a read that raises is a sample with ``holders=None``."""

    def __init__(
        self,
        read: Callable[[str], Iterable[tuple[str, int | None]]],
        names: Sequence[str],
        interval: float = 0.05,
    ) -> None:
        self.read = read
        self.names = list(names)
        self.interval = interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness-probe", daemon=True)

    def start(self) -> Probe:
        """Start reading."""
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        """Stop reading; every sample taken."""
        self._stop.set()
        self._thread.join(10.0)
        return self.samples

    def _run(self) -> None:
        while not self._stop.is_set():
            for name in self.names:
                start = time.monotonic()
                try:
                    holders: Holders | None = tuple(self.read(name))
                except Exception:
                    holders = None
                self.samples.append(Sample(name, start, time.monotonic(), holders))
            self._stop.wait(self.interval)


class LivenessType(StrEnum):
    """What a :class:`LivenessViolation` is (see the module docstring)."""

    HOLD_OUTLIVED_OWNER = "hold_outlived_owner"
    FREE_LOCK_NOT_TAKEN = "free_lock_not_taken"
    RIDDEN_OUT_FAULT_RAISED = "ridden_out_fault_raised"


@dataclass(frozen=True)
class LivenessViolation:
    """One finding: its type, a message, and the operations involved."""

    type: LivenessType
    message: str
    operations: tuple[Operation, ...] = ()


@dataclass
class LivenessReport:
    """What :func:`check_liveness` found, and how much it judged."""

    violations: list[LivenessViolation] = field(default_factory=list)
    holds_seen: int = 0
    """Holds (or orphans) the probe saw and matched to an owner."""
    unmatched: int = 0
    """Tokens the probe saw that neither the history nor a client's pid explains."""
    free_waits: int = 0
    """Free spans the probe saw while a live waiter waited (judged or not)."""
    ridden_out: int = 0
    """Operations judged against a ridden-out fault."""
    holds_after_owner: int = 0
    """Holds the probe still saw after their owner stopped believing it held them."""
    longest_hold_after_owner: float = 0.0
    """The longest such a hold was still seen (seconds from its owner letting go to the
    start of the last read that saw it; a hold is gone by the next read)."""
    longest_free_wait: float = 0.0
    """The longest a live waiter waited while the probe saw its lock free, outside the
    faults' settle times: what :attr:`Bounds.free_taken` judges (seconds)."""

    @property
    def ok(self) -> bool:
        """No violation."""
        return not self.violations

    def of_type(self, kind: LivenessType) -> list[LivenessViolation]:
        """The violations of one type."""
        return [v for v in self.violations if v.type == kind]

    def add(self, kind: LivenessType, message: str, operations: Iterable[Operation] = ()) -> None:
        """Record a violation."""
        self.violations.append(LivenessViolation(kind, message, tuple(operations)))


@dataclass(frozen=True)
class Bounds:
    """The bounds judged (seconds), from docs/how-it-works.md and docs/architecture.md."""

    lease: float = 1.0
    slack: float = 0.3
    """The probe's interval, a renewal in flight as its owner let go, a loaded machine."""
    free_taken: float = 1.0
    """A free lock with a live waiter is taken within this (docs/how-it-works.md)."""
    probe_gap: float = 0.25
    """Probe reads further apart than this do not make one free span."""
    settle: float = 2.0
    """After a server or network fault, free spans are not judged for this long."""
    client_settle: float = 3.5
    """After a client pause or kill: a fair queue drops a dead waiter within 3 s."""
    tryagain_budget: float = 3.0
    """A slot migration's ``ASK``/``TRYAGAIN`` are ridden out this long (``TRYAGAIN_BUDGET``)."""
    quiet_before: float = 2.0
    """A ridden-out fault is judged only when no other fault ran this long before it."""

    @property
    def hold_gone(self) -> float:
        """A hold is gone within this after its owner stopped believing it."""
        return self.lease + self.slack


# Faults that may hold a request back and deliver it late (a renewal sent before its
# owner let go, run after).
DELAYING_FAULTS = frozenset({"server-pause", "proxy-delay", "proxy-stall"})
CALLER_FAULT_KINDS = frozenset({"client-interrupt"})
CLIENT_FAULT_KINDS = frozenset({"client-pause", "client-kill"})


def check_liveness(
    history: Sequence[Operation],
    samples: Sequence[Sample],
    faults: Sequence[FaultLike],
    *,
    bounds: Bounds,
    topology: str,
    pids: dict[int, str],
    killed: dict[str, float] | None = None,
    paused: dict[str, list[tuple[float, float]]] | None = None,
) -> LivenessReport:
    """Judge ``history`` and ``samples`` (see the module docstring). ``pids`` names the
    client of each process pid, ``killed`` when a client was killed, ``paused`` each
    client's pauses."""
    report = LivenessReport()
    killed = killed or {}
    paused = paused or {}
    _check_holds_end(history, samples, faults, bounds, pids, killed, report)
    _check_free_taken(history, samples, faults, bounds, killed, paused, report)
    _check_ridden_out(history, faults, bounds, topology, report)
    return report


@dataclass
class _Owned:
    """A hold the history knows: its acquire, and when its owner stopped believing."""

    acquire: Operation
    stopped: float | None
    by: Operation | None


def _owned_holds(
    history: Sequence[Operation], killed: dict[str, float]
) -> dict[tuple[str, str], list[_Owned]]:
    """The holds the history knows, by ``(lock, token)`` (a group's names share a token;
    an acquire may take back, with its token, a hold whose release failed), in the order
    of their acquires."""
    records: dict[tuple[str, int, str], list[Operation]] = defaultdict(list)
    for op in history:
        records[(op.client, op.hold, op.lock)].append(op)
    owned: dict[tuple[str, str], list[_Owned]] = defaultdict(list)
    for op in history:
        if op.kind != "acquire" or op.outcome != "ok" or op.token is None:
            continue
        ends = [
            (r.end, r)
            for r in records[(op.client, op.hold, op.lock)]
            if (r.kind == "release" and r.detail != PENDING) or r.kind == "lost"
        ]
        kill = killed.get(op.client)
        stopped, by = min(ends, key=lambda pair: pair[0], default=(None, None))
        if kill is not None and kill >= op.start and (stopped is None or kill < stopped):
            stopped, by = kill, None
        owned[(op.lock, op.token)].append(_Owned(op, stopped, by))
    return owned


def _delayed(faults: Sequence[FaultLike], start: float, end: float) -> float:
    """How long delaying faults overlapped ``[start, end]``."""
    return sum(
        max(0.0, min(end, f.end) - max(start, f.start)) for f in faults if f.kind in DELAYING_FAULTS
    )


def _check_holds_end(
    history: Sequence[Operation],
    samples: Sequence[Sample],
    faults: Sequence[FaultLike],
    bounds: Bounds,
    pids: dict[int, str],
    killed: dict[str, float],
    report: LivenessReport,
) -> None:
    owned = _owned_holds(history, killed)
    acquires: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    last_record: dict[str, float] = {}
    for op in history:
        if op.kind == "acquire":
            acquires[(op.client, op.lock)].append(op)
        if op.detail != "killed":  # the runner's records of a kill are not the client's
            last_record[op.client] = max(op.end, last_record.get(op.client, op.end))
    reported: set[tuple[str, str]] = set()
    seen: set[tuple[str, str]] = set()
    after: dict[tuple[str, str], float] = {}
    for sample in samples:
        for token, pid in sample.holders or ():
            hold = _current(owned.get((sample.lock, token), ()), sample)
            if hold is not None:
                stopped, what = hold.stopped, _describe(hold.by) if hold.by else "killed"
                operations: tuple[Operation, ...] = (hold.acquire,) + (
                    (hold.by,) if hold.by else ()
                )
            else:
                client = pids.get(pid) if pid is not None else None
                if client is None:
                    if (sample.lock, token) not in seen:
                        report.unmatched += 1
                        seen.add((sample.lock, token))
                    continue
                stopped, operations = _orphan_stop(
                    acquires[(client, sample.lock)],
                    killed.get(client),
                    sample,
                    last_record.get(client),
                )
                what = (
                    f"{client} was killed"
                    if stopped is not None and stopped == killed.get(client)
                    else f"the last acquire of {sample.lock!r} by {client} returned no hold"
                )
            if (sample.lock, token) not in seen:
                report.holds_seen += 1
                seen.add((sample.lock, token))
            if stopped is None:
                continue
            if sample.start > stopped:
                after[(sample.lock, token)] = sample.start - stopped
            if (sample.lock, token) in reported:
                continue
            bound = bounds.hold_gone + _delayed(faults, stopped - bounds.lease, sample.start)
            if sample.start > stopped + bound:
                reported.add((sample.lock, token))
                report.add(
                    LivenessType.HOLD_OUTLIVED_OWNER,
                    f"{sample.lock!r} still held by token {token} (pid {pid}) at "
                    f"{sample.start:.3f}, {sample.start - stopped:.2f} s after its owner "
                    f"stopped believing it held it ({what}; bound {bound:.2f} s)",
                    operations,
                )
    report.holds_after_owner = len(after)
    report.longest_hold_after_owner = max(after.values(), default=0.0)


def _current(holds: Iterable[_Owned], sample: Sample) -> _Owned | None:
    """The hold of a token that ``sample`` saw: the last one acquired before it."""
    return max(
        (hold for hold in holds if hold.acquire.start <= sample.end),
        key=lambda hold: hold.acquire.start,
        default=None,
    )


def _orphan_stop(
    acquires: list[Operation], kill: float | None, sample: Sample, last_record: float | None
) -> tuple[float | None, tuple[Operation, ...]]:
    """When the client of a hold the history does not know stopped believing it may
    hold it: ``None`` while one of its acquires of the lock is in progress, or may be
    (``sample`` falls between the client's ``last_record`` and its ``kill``: an acquire
    the kill cut short records nothing)."""
    if any(op.start <= sample.end and op.end >= sample.start for op in acquires):
        return None, ()
    if kill is not None and sample.start < kill and (last_record or 0.0) <= sample.start:
        return None, ()
    before = [op for op in acquires if op.end < sample.start]
    last = max(before, key=lambda op: op.end, default=None)
    stops = [op.end for op in ([last] if last else [])]
    if kill is not None and kill < sample.start:
        stops.append(kill)
    if not stops:
        return None, ()
    return max(stops), ((last,) if last else ())


def _free_spans(samples: Sequence[Sample], max_gap: float) -> Iterable[tuple[str, float, float]]:
    """``(lock, from, to)``: the probe saw the lock free at every sample from ``from`` to
    ``to`` (the end of the first free read, the start of the last), none more than
    ``max_gap`` apart (a probe held up may have missed a hold)."""
    by_lock: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_lock[sample.lock].append(sample)
    for lock, reads in by_lock.items():
        first: Sample | None = None
        last: Sample | None = None
        for sample in sorted(reads, key=lambda s: s.start):
            if sample.holders == () and (last is None or sample.start - last.end <= max_gap):
                first = first or sample
                last = sample
                continue
            if first is not None and last is not None:
                yield lock, first.end, last.start
            first = last = sample if sample.holders == () else None
        if first is not None and last is not None:
            yield lock, first.end, last.start


def _check_free_taken(
    history: Sequence[Operation],
    samples: Sequence[Sample],
    faults: Sequence[FaultLike],
    bounds: Bounds,
    killed: dict[str, float],
    paused: dict[str, list[tuple[float, float]]],
    report: LivenessReport,
) -> None:
    waiters: dict[str, list[Operation]] = defaultdict(list)
    for op in history:
        if (
            op.kind == "acquire"
            and "group" not in op.extra
            and (op.blocking_timeout is None or op.blocking_timeout > 0)
        ):
            waiters[op.lock].append(op)
    starts: dict[str, list[float]] = {}
    longest: dict[str, float] = {}
    for lock, ops in waiters.items():
        ops.sort(key=lambda op: op.start)
        starts[lock] = [op.start for op in ops]
        longest[lock] = max(op.end - op.start for op in ops)
    for lock, free_from, free_to in _free_spans(samples, bounds.probe_gap):
        if free_to <= free_from or lock not in waiters:
            continue
        # Only waiters that started in time to still wait within the span.
        first = bisect.bisect_left(starts[lock], free_from - longest[lock])
        last = bisect.bisect_left(starts[lock], free_to)
        found = False
        for op in waiters[lock][first:last]:
            # The lock was free, and the waiter waited, from begin to end.
            begin, end = max(free_from, op.start), min(free_to, op.end)
            waited = end - begin
            over = waited > bounds.free_taken
            if waited <= 0 or not (over or waited > report.longest_free_wait):
                continue
            if _stopped(op.client, begin, end, killed, paused):
                continue
            near = _near_fault(faults, begin, end, bounds)
            if not near:
                report.longest_free_wait = max(report.longest_free_wait, waited)
            if not over or found:
                continue
            report.free_waits += 1
            if near:
                continue
            report.add(
                LivenessType.FREE_LOCK_NOT_TAKEN,
                f"{lock!r} free from {free_from:.3f} to {free_to:.3f} while a live waiter "
                f"waited for it {waited:.2f} s of that time (bound "
                f"{bounds.free_taken:.2f} s): {_describe(op)}",
                [op],
            )
            found = True  # one violation per free span


def _stopped(
    client: str,
    start: float,
    end: float,
    killed: dict[str, float],
    paused: dict[str, list[tuple[float, float]]],
) -> bool:
    kill = killed.get(client)
    if kill is not None and kill <= end:
        return True
    return any(s < end and e > start for s, e in paused.get(client, ()))


def _near_fault(faults: Sequence[FaultLike], begin: float, end: float, bounds: Bounds) -> bool:
    for f in faults:
        if f.kind in CALLER_FAULT_KINDS:
            continue
        settle = bounds.client_settle if f.kind in CLIENT_FAULT_KINDS else bounds.settle
        if f.start <= end and f.end + settle >= begin:
            return True
    return False


def _error(op: Operation) -> bool:
    """Whether ``op`` told its caller of an error (not of a busy lock, nor of an
    interruption the caller made)."""
    if "interrupted" in op.extra or op.detail == PENDING or op.detail == "killed":
        return False
    if op.kind in ("acquire", "release"):
        return op.outcome == "info" or (op.kind == "release" and op.outcome == "fail")
    return op.kind == "lost"


def _check_ridden_out(
    history: Sequence[Operation],
    faults: Sequence[FaultLike],
    bounds: Bounds,
    topology: str,
    report: LivenessReport,
) -> None:
    ordered = sorted(faults, key=lambda f: f.start)
    for index, fault in enumerate(ordered):
        if not _ridden_out(fault, topology, bounds):
            continue
        earlier = ordered[:index]
        if any(
            f.end >= fault.start - bounds.quiet_before
            for f in earlier
            if f.kind not in CALLER_FAULT_KINDS
        ):
            continue
        later = [f for f in ordered[index + 1 :] if f.kind not in CALLER_FAULT_KINDS]
        for op in history:
            if not (fault.start <= op.end <= fault.end + bounds.slack):
                continue
            if any(_met(f, op) for f in later):
                continue  # the next fault began before it ended: it may be what it met
            if fault.kind == "failover":  # a wait rides it out, nothing else is promised
                if op.kind != "acquire" or op.blocking_timeout == 0:
                    continue
                if op.blocking_timeout is not None and fault.end > op.start + op.blocking_timeout:
                    continue
            if op.kind not in ("acquire", "release", "lost"):
                continue
            if _lost(op) and (op.lease or 0.0) < fault.end - fault.start + bounds.slack:
                continue  # renewals refused (TRYAGAIN) longer than the lease lose it
            report.ridden_out += 1
            if _error(op):
                report.add(
                    LivenessType.RIDDEN_OUT_FAULT_RAISED,
                    f"{fault.kind} ({fault.start:.3f}-{fault.end:.3f}, "
                    f"{fault.end - fault.start:.2f} s) reached the caller: {_describe(op)}",
                    [op],
                )


def _met(fault: FaultLike, op: Operation) -> bool:
    """Whether ``fault`` began before ``op`` ended and may have reached it (a client's
    fault reaches that client's operations only)."""
    if fault.start > op.end:
        return False
    return fault.kind not in CLIENT_FAULT_KINDS or fault.target == op.client


def _lost(op: Operation) -> bool:
    return op.kind == "lost" or (op.kind == "release" and op.outcome == "fail")


def _ridden_out(fault: FaultLike, topology: str, bounds: Bounds) -> bool:
    if fault.kind == "slot-migration":
        return fault.end - fault.start <= bounds.tryagain_budget
    return fault.kind == "failover" and topology == "sentinel"


def _describe(op: Operation) -> str:
    detail = f" {op.detail}" if op.detail else ""
    return (
        f"{op.client} hold {op.hold} {op.kind} {op.lock!r} {op.outcome}{detail} "
        f"[{op.start:.3f}-{op.end:.3f}]"
    )
