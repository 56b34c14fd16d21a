"""What a chaos run's history shows besides the checker's report: how long a holder's
death kept its lock from the next client (double-holder windows are the checker's:
``Report.double_holder_windows``)."""

from __future__ import annotations

from tests.support.history import Operation

__all__ = ["takeover_times"]


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
