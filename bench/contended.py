"""Scenario 2: N processes contending on one lock name.

Every worker loops for a fixed time: acquire -> critical section -> release. The
critical section is a deliberately non-atomic read-modify-write of a shared counter
(``GET`` then ``SET value+1``), bracketed by ``SET owner NX`` / ``DEL owner``, so a
mutual-exclusion violation shows up three ways: a lost update (final counter !=
acquisitions), an owner key already set on entry, or two holding intervals that overlap
on the system-wide monotonic clock (``CLOCK_MONOTONIC`` is shared by all processes).

Timestamps per acquisition (``time.monotonic_ns``): ``call`` (acquire called), ``got``
(acquire returned), ``leave`` (critical section done, release about to be called) and
``done`` (release returned). The *handoff gap* is ``got`` of an acquisition minus
``leave`` of the previous one: how long the lock sat unused between the holder deciding
to give it back and the next holder running. Only acquisitions that started inside the
measurement window count for throughput and fairness (a process starved for the whole
window still gets the lock once the others stop, but that does not count).

The same scenario runs on one server or on a local cluster (``impls.Target``): there the
critical section's counter and owner keys are plain keys wherever the cluster puts them,
read and written through a ``RedisCluster`` client.
"""

from __future__ import annotations

import faulthandler
import os
import queue
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import impls
from stats import percentile

HANG_GRACE = 30.0  # seconds past the window before a worker is declared hung


def worker(
    key: str,
    target: impls.Target,
    wid: int,
    duration: float,
    lock_name: str,
    barrier: Any,
    results: Any,
) -> None:
    """One contending process; puts a summary (or a traceback) on ``results``."""
    # A hang in a lock implementation dumps every thread's stack to stderr and exits.
    faulthandler.dump_traceback_later(duration + HANG_GRACE + 30, exit=True)
    records: list[tuple[int, int, int, int]] = []
    errors: list[str] = []
    overlaps = 0
    try:
        handle = impls.make(key, target, lock_name)
        plain = impls.plain_client(target)  # critical section; not counted
        plain.ping()
        counter_key, owner_key = f"bench:counter:{lock_name}", f"bench:owner:{lock_name}"
        barrier.wait(timeout=120)
        clock = time.monotonic_ns
        start = clock()
        end = start + int(duration * 1e9)
        requests_before = impls.requests_sent()
        while clock() < end:
            call = clock()
            try:
                if not handle.acquire():
                    errors.append("acquire returned False")
                    continue
            except Exception:
                errors.append(traceback.format_exc())
                if len(errors) > 20:
                    break
                continue
            got = clock()
            mine = bool(plain.set(owner_key, wid, nx=True))
            if not mine:
                overlaps += 1
            value = int(plain.get(counter_key) or 0)
            plain.set(counter_key, value + 1)
            if mine:
                plain.delete(owner_key)
            leave = clock()
            try:
                handle.release()
            except Exception:
                errors.append(traceback.format_exc())
            records.append((call, got, leave, clock()))
        requests = impls.requests_sent() - requests_before
        results.put(("ok", wid, os.getpid(), start, end, records, overlaps, errors, requests))
    except BaseException:
        results.put(("error", wid, os.getpid(), traceback.format_exc()))
    finally:
        faulthandler.cancel_dump_traceback_later()


@dataclass
class Run:
    """The merged outcome of one contended run of one implementation."""

    key: str
    workers: int
    duration: float
    acquisitions: int = 0  # in the window
    total_acquisitions: int = 0  # including the ones after the window
    per_worker: list[int] = field(default_factory=list)
    gaps_other_ms: list[float] = field(default_factory=list)
    gaps_other_done_ms: list[float] = field(default_factory=list)
    gaps_all_ms: list[float] = field(default_factory=list)
    waits_ms: list[float] = field(default_factory=list)
    same_process_handoffs: int = 0
    handoffs: int = 0
    counter: int = 0
    lost_updates: int = 0
    owner_overlaps: int = 0
    interval_overlaps: int = 0
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    hung: list[int] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return self.lost_updates + self.owner_overlaps + self.interval_overlaps

    @property
    def throughput(self) -> float:
        return self.acquisitions / self.duration

    @property
    def spread(self) -> float:
        """(busiest - idlest) / busiest, in percent."""
        busiest = max(self.per_worker, default=0)
        return 100 * (busiest - min(self.per_worker)) / busiest if busiest else float("nan")


def run(
    ctx: Any, key: str, target: impls.Target, *, workers: int, duration: float, tag: str
) -> Run:
    """Start ``workers`` processes on one lock and merge what they measured."""
    lock_name = f"contended:{key}:{tag}"
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    processes = [
        ctx.Process(
            target=worker,
            args=(key, target, wid, duration, lock_name, barrier, results),
            name=f"bench-{key}-{wid}",
        )
        for wid in range(workers)
    ]
    for process in processes:
        process.start()
    outcome = Run(key, workers, duration)
    replies: dict[int, tuple[Any, ...]] = {}
    deadline = time.monotonic() + duration + HANG_GRACE + 60  # + start-up time
    while len(replies) < workers:
        try:
            reply = results.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        replies[reply[1]] = reply
    for wid, process in enumerate(processes):
        if wid not in replies:
            outcome.hung.append(wid)
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, 9)
        process.join(timeout=10)

    records: list[tuple[int, int, int, int, int]] = []  # (got, leave, wid, call, done)
    window_start, window_end = None, None
    for wid in range(workers):
        reply = replies.get(wid)
        if reply is None:
            outcome.per_worker.append(0)
            continue
        if reply[0] == "error":
            outcome.errors.append(f"worker {wid} (pid {reply[2]}):\n{reply[3]}")
            outcome.per_worker.append(0)
            continue
        _, _, pid, start, end, recs, overlaps, errors, requests = reply
        window_start = start if window_start is None else min(window_start, start)
        window_end = end if window_end is None else max(window_end, end)
        outcome.owner_overlaps += overlaps
        outcome.requests += requests
        outcome.errors.extend(f"worker {wid} (pid {pid}):\n{e}" for e in errors)
        outcome.per_worker.append(sum(1 for call, _, _, _ in recs if call < end))
        records.extend((got, leave, wid, call, done) for call, got, leave, done in recs)

    records.sort()
    outcome.total_acquisitions = len(records)
    outcome.acquisitions = sum(outcome.per_worker)
    reader = impls.plain_client(target)
    outcome.counter = int(reader.get(f"bench:counter:{lock_name}") or 0)
    reader.close()
    outcome.lost_updates = max(0, outcome.total_acquisitions - outcome.counter)
    latest_leave = 0
    for (got, _, wid, call, _), (_, p_leave, p_wid, _, p_done) in zip(
        records[1:], records, strict=False
    ):
        latest_leave = max(latest_leave, p_leave)
        if got < latest_leave:  # acquired before an earlier holder began to release
            outcome.interval_overlaps += 1
        if window_end is not None and call >= window_end:
            continue
        gap = (got - p_leave) / 1e6
        outcome.handoffs += 1
        outcome.gaps_all_ms.append(gap)
        if wid == p_wid:
            outcome.same_process_handoffs += 1
        else:
            outcome.gaps_other_ms.append(gap)
            outcome.gaps_other_done_ms.append((got - p_done) / 1e6)
    outcome.waits_ms = [
        (got - call) / 1e6
        for got, _, _, call, _ in records
        if window_end is None or call < window_end
    ]
    return outcome


def summary(runs: list[Run]) -> dict[str, float]:
    """Pool several runs of one implementation: gaps pooled, fairness from the worst run."""
    gaps_other = [g for r in runs for g in r.gaps_other_ms]
    gaps_all = [g for r in runs for g in r.gaps_all_ms]
    gaps_done = [g for r in runs for g in r.gaps_other_done_ms]
    waits = [w for r in runs for w in r.waits_ms]
    handoffs = sum(r.handoffs for r in runs)
    return {
        "throughput": sum(r.acquisitions for r in runs) / sum(r.duration for r in runs),
        "gap_other_p50": percentile(gaps_other, 50),
        "gap_other_p99": percentile(gaps_other, 99),
        "gap_other_done_p50": percentile(gaps_done, 50),
        "gap_other_done_p99": percentile(gaps_done, 99),
        "gap_all_p50": percentile(gaps_all, 50),
        "gap_all_p99": percentile(gaps_all, 99),
        "same_process_pct": 100 * sum(r.same_process_handoffs for r in runs) / handoffs
        if handoffs
        else float("nan"),
        "wait_p99": percentile(waits, 99),
        "wait_max": max(waits, default=float("nan")),
        "min_acq": min(min(r.per_worker) for r in runs),
        "max_acq": max(max(r.per_worker) for r in runs),
        "worst_spread": max(r.spread for r in runs),
        "starved": max(sum(1 for n in r.per_worker if n == 0) for r in runs),
        "violations": sum(r.violations for r in runs),
        "lost_updates": sum(r.lost_updates for r in runs),
        "owner_overlaps": sum(r.owner_overlaps for r in runs),
        "interval_overlaps": sum(r.interval_overlaps for r in runs),
        "errors": sum(len(r.errors) for r in runs),
        "hung": sum(len(r.hung) for r in runs),
        "requests_per_acq": sum(r.requests for r in runs)
        / max(1, sum(r.total_acquisitions for r in runs)),
    }
