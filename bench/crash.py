"""Scenario 3: a holder is SIGKILLed while holding; how late does a waiter get the lock?

A holder process acquires with a short lease and renewal off, a waiter process then
blocks on the same lock, and the holder is killed well before its lease ends. Lateness
is the waiter's acquire time minus the lease end. The lease end is taken as (the moment
the holder *sent* its acquire) + lease: the lock was set no earlier than that, so the
reported lateness is an upper bound, too high by at most the holder's acquire call
(``holder call`` column, typically a fraction of a millisecond).

A waiter that gets the lock *before* the lease end (by more than that call) would be a
mutual-exclusion violation and is reported as such.

Trials run on one server or a local cluster (``impls.Target``), interleaved.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import impls
from stats import median
from timing import rotated

KILL_AFTER = 0.25  # seconds the waiter waits before the holder is killed


def _warm(key: str, target: impls.Target, name: str, lease: float) -> impls.Handle:
    """A handle of lock ``name`` whose connections are open and scripts loaded: two
    cycles of the same handle on the same name first (only the holder can: the waiter's
    lock is held by then), so that timing the holder's acquire measures one round trip.
    The handle's own backend is warmed: our engine talks on connections of its own,
    and on a cluster to the node of the lock's slot, which another name may not reach."""
    handle = impls.make(key, target, name, lease, renew=False)
    for _ in range(2):
        if handle.acquire():
            handle.release()
    return handle


def _warm_elsewhere(key: str, target: impls.Target, name: str, lease: float) -> impls.Handle:
    """A handle of lock ``name`` whose client is connected: one cycle on another name
    with the same client first (the waiter's own lock is held meanwhile)."""
    client = impls.make_client(target)
    warm = impls.make(key, target, f"{name}:warm-up", lease, renew=False, client=client)
    for _ in range(2):
        if warm.acquire():
            warm.release()
    return impls.make(key, target, name, lease, renew=False, client=client)


def holder(key: str, target: impls.Target, name: str, lease: float, conn: Any) -> None:
    try:
        handle = _warm(key, target, name, lease)
        before = time.monotonic_ns()
        ok = handle.acquire()
        after = time.monotonic_ns()
        conn.send(("acquired", ok, before, after))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    time.sleep(lease + 60)  # holding until SIGKILLed


def waiter(key: str, target: impls.Target, name: str, lease: float, conn: Any) -> None:
    try:
        handle = _warm_elsewhere(key, target, name, lease)
        conn.send(("waiting", time.monotonic_ns()))
        ok = handle.acquire()
        got = time.monotonic_ns()
        conn.send(("acquired", ok, got))
        handle.release()
    except BaseException:
        conn.send(("error", traceback.format_exc()))


@dataclass
class Result:
    key: str
    lateness_ms: list[float] = field(default_factory=list)
    holder_call_ms: list[float] = field(default_factory=list)
    early: int = 0
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        return {
            "median": median(self.lateness_ms),
            "max": max(self.lateness_ms, default=float("nan")),
            "min": min(self.lateness_ms, default=float("nan")),
            "holder_call_max": max(self.holder_call_ms, default=float("nan")),
        }


def _recv(conn: Any, timeout: float, what: str) -> tuple[Any, ...]:
    if not conn.poll(timeout):
        raise TimeoutError(f"no '{what}' message within {timeout:.0f}s")
    message = conn.recv()
    if message[0] == "error":
        raise RuntimeError(message[1])
    return message


def trial(
    ctx: Any, key: str, target: impls.Target, lease: float, name: str, result: Result
) -> None:
    holder_conn, holder_end = ctx.Pipe()
    waiter_conn, waiter_end = ctx.Pipe()
    h = ctx.Process(target=holder, args=(key, target, name, lease, holder_end), name="holder")
    w = ctx.Process(target=waiter, args=(key, target, name, lease, waiter_end), name="waiter")
    try:
        h.start()
        _, ok, before, after = _recv(holder_conn, 30, "holder acquired")
        if not ok:
            raise RuntimeError("holder could not acquire a free lock")
        expiry = before + int(lease * 1e9)
        w.start()
        _recv(waiter_conn, 30, "waiter waiting")
        time.sleep(KILL_AFTER)
        if time.monotonic_ns() > expiry - int(0.1 * 1e9):
            raise RuntimeError("too slow to kill the holder before its lease ends; skipped")
        assert h.pid is not None
        os.kill(h.pid, signal.SIGKILL)
        _, ok, got = _recv(waiter_conn, lease + 30, "waiter acquired")
        if not ok:
            raise RuntimeError("waiter's blocking acquire returned False")
        lateness = (got - expiry) / 1e6
        result.holder_call_ms.append((after - before) / 1e6)
        if got < expiry:  # the lock was still held by the (dead) holder: a violation
            result.early += 1
        result.lateness_ms.append(lateness)
    except Exception as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        for process in (h, w):
            if process.pid is not None and process.is_alive():
                # It may end between the check and the kill (a holder that failed
                # returns): not an error of the benchmark.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
            if process.pid is not None:
                process.join(timeout=10)


def run(
    ctx: Any, entries: list[tuple[str, impls.Target]], *, trials: int, lease: float
) -> dict[tuple[str, str], Result]:
    """``trials`` crashed holders per (implementation, target), interleaved across them;
    results keyed by (target kind, implementation)."""
    results = {(target.kind, key): Result(key) for key, target in entries}
    for t in range(trials):
        for key, target in rotated(entries, t):
            name = f"crash:{target.kind}:{key}:{t}"
            trial(ctx, key, target, lease, name, results[(target.kind, key)])
    return results
