"""What a chaos run's history shows besides violations: the windows during which a lock
had more holders than its kind allows (as the clients saw them, whatever the cause: a
pause past the lease, a server restarted empty, a failover) and how long a holder's
death kept its lock from the next client.

A hold lasts, as the client saw it, from its acquire's end to the start of its release,
or to when it learned of the loss (its ``lost`` record), or to its last operation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tests.support.history import Operation

__all__ = ["Hold", "Window", "double_holder_windows", "holds", "takeover_times"]


@dataclass(frozen=True)
class Hold:
    """One client's hold of one lock, as it saw it."""

    client: str
    hold: int
    lock: str
    mode: str
    limit: int
    start: float
    end: float


@dataclass(frozen=True)
class Window:
    """A time during which ``lock`` had more holders than allowed."""

    lock: str
    start: float
    end: float
    holders: int

    @property
    def seconds(self) -> float:
        """The window's length."""
        return self.end - self.start


def holds(history: Iterable[Operation]) -> list[Hold]:
    """Every hold that began (acquire ``ok``), with the time the client believed it held."""
    by_hold: dict[tuple[str, int, str], list[Operation]] = {}
    for operation in history:
        by_hold.setdefault((operation.client, operation.hold, operation.lock), []).append(operation)
    found = []
    for (client, hold, lock), operations in by_hold.items():
        acquire = next(
            (op for op in operations if op.kind == "acquire" and op.outcome == "ok"), None
        )
        if acquire is None:
            continue
        ends = [op.start for op in operations if op.kind == "release"]
        ends += [op.end for op in operations if op.kind == "lost"]
        end = min(ends) if ends else max(op.end for op in operations)
        found.append(
            Hold(
                client, hold, lock, acquire.mode, acquire.limit, acquire.end, max(end, acquire.end)
            )
        )
    return found


def _too_many(exclusive: int, shared: int, limited: int, limit: int) -> bool:
    return exclusive > 1 or (exclusive and shared) or limited > limit or (exclusive and limited)


def double_holder_windows(history: Iterable[Operation]) -> list[Window]:
    """The windows during which a lock had more holders than its kind allows: two
    exclusive holders, an exclusive and a shared one, more than ``limit`` limited ones."""
    by_lock: dict[str, list[Hold]] = {}
    for hold in holds(history):
        by_lock.setdefault(hold.lock, []).append(hold)
    windows = []
    for lock, lock_holds in by_lock.items():
        events = sorted(
            [(hold.start, 1, hold) for hold in lock_holds]
            + [(hold.end, -1, hold) for hold in lock_holds],
            key=lambda event: (event[0], event[1]),  # an end before a start at one instant
        )
        counts = {"exclusive": 0, "shared": 0, "limited": 0}
        limit = max((hold.limit for hold in lock_holds), default=1)
        opened: float | None = None
        most = 0
        for at, step, hold in events:
            counts[hold.mode] = counts.get(hold.mode, 0) + step
            holders = sum(counts.values())
            bad = _too_many(counts["exclusive"], counts["shared"], counts["limited"], limit)
            if bad and opened is None:
                opened, most = at, holders
            elif bad:
                most = max(most, holders)
            elif opened is not None:
                windows.append(Window(lock, opened, at, most))
                opened = None
    return sorted(windows, key=lambda window: window.start)


def takeover_times(history: list[Operation]) -> list[float]:
    """For each holder killed while holding (a ``lost`` record with detail ``killed``):
    seconds from its death until another client's acquire of that lock returned."""
    times = []
    acquires = [op for op in history if op.kind == "acquire" and op.outcome == "ok"]
    for death in (op for op in history if op.kind == "lost" and op.detail == "killed"):
        later = [
            op.end
            for op in acquires
            if op.lock == death.lock and op.client != death.client and op.end > death.end
        ]
        if later:
            times.append(min(later) - death.end)
    return times
