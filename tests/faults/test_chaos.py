"""Short seeded chaos runs (issue 20): client processes of one lock kind against a real
topology while the nemesis injects faults (``tests/support/chaos/``), the merged history
judged by the checker. Fixed seeds: a run that fails prints its seed and the command that
replays it (same schedule of faults; the interleaving of the clients differs).

The long run is ``bench/chaos.py``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos.runner import RunConfig, RunResult, run
from tests.support.history import Operation

try:
    from tests.support.checker import check
except ImportError:  # the checker is built on another branch; until it lands:
    check = None

# Violations of safety (as opposed to liveness counters and lost updates, which an
# unfenced workload is expected to show under faults).
SAFETY = {"double-holder", "fence-order", "fence-regression", "stale-write"}

RUNS = [
    RunConfig("single", "mutex", seed=101, seconds=8),
    RunConfig("single", "mutex", seed=102, seconds=8, fenced=False),
    RunConfig("single", "limited", seed=103, seconds=8),
    pytest.param(
        RunConfig("single", "reentrant", seed=104, seconds=8),
        marks=pytest.mark.xfail(
            reason="a re-entrant hold whose release failed (Redis unreachable) is re-entered "
            "by the next acquire: same token and fence, and the next release only counts "
            "down, so the lock is never given back (Lock._reenter ignores release_failed)",
            strict=False,
        ),
    ),
    RunConfig("replicated", "mutex-async", seed=201, seconds=8),
    RunConfig("replicated", "shared", seed=202, seconds=8),
    RunConfig("sentinel", "mutex", seed=301, seconds=10),
    RunConfig("sentinel", "fair", seed=302, seconds=10),
    RunConfig("cluster", "many", seed=401, seconds=10),
    RunConfig("cluster", "mutex-async", seed=402, seconds=10),
]


def _id(config: RunConfig) -> str:
    fenced = "fenced" if config.fenced else "unfenced"
    return f"{config.topology}-{config.kind}-{fenced}-{config.seed}"


@pytest.mark.parametrize("config", RUNS, ids=_id)
def test_a_seeded_chaos_run_shows_no_safety_violation(config: RunConfig, tmp_path: Path) -> None:
    result = run(config, tmp_path)
    report = _check(result)
    where = f"seed {config.seed}; replay: {result.replay()}; history in {result.directory}"
    assert not result.errors, f"{result.errors}\n{where}"
    assert result.faults, f"no fault injected\n{where}"
    acquired = sum(1 for op in result.history if op.kind == "acquire" and op.outcome == "ok")
    assert acquired >= 10, f"{acquired} holds only\n{where}"
    unsafe = [violation for violation in report.violations if violation.type in SAFETY]
    assert not unsafe, "\n".join([where, *(str(violation) for violation in unsafe[:5])])


def _check(result: RunResult) -> Any:
    if check is not None:
        return check(result.history, wait_bound=result.config.wait_bound)
    return _stand_in_check(result.history)


# -- a stand-in for tests/support/checker.py, until it lands --------------------------


@dataclass
class _Violation:
    type: str
    operations: list[Operation]

    def __str__(self) -> str:
        return f"{self.type}: " + "; ".join(op.to_json() for op in self.operations)


@dataclass
class _Report:
    violations: list[_Violation] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)


def _stand_in_check(history: list[Operation]) -> _Report:
    """The safety checks that need nothing but the history: holds the server confirmed
    (acquire and release both ``ok``) overlapping beyond the kind's limit; fences of
    acquires that follow one another not increasing; accepted fenced writes whose fences
    do not increase in the row's version order; lost updates counted."""
    report = _Report()
    _confirmed_overlaps(history, report)
    _fence_regressions(history, report)
    _fenced_write_order(history, report)
    writes = sum(1 for op in history if op.kind == "write" and op.outcome == "ok")
    final = sum(op.value or 0 for op in history if op.client == "final")
    report.counters["lost-updates"] = max(0, writes - final)
    return report


def _by_hold(history: Iterable[Operation]) -> dict[tuple[str, int, str], list[Operation]]:
    holds: dict[tuple[str, int, str], list[Operation]] = {}
    for op in history:
        holds.setdefault((op.client, op.hold, op.lock), []).append(op)
    return holds


def _confirmed_overlaps(history: list[Operation], report: _Report) -> None:
    confirmed: dict[str, list[tuple[Operation, Operation]]] = {}
    for operations in _by_hold(history).values():
        acquire = next((op for op in operations if op.kind == "acquire"), None)
        release = next((op for op in operations if op.kind == "release"), None)
        if acquire and release and acquire.outcome == "ok" and release.outcome == "ok":
            confirmed.setdefault(acquire.lock, []).append((acquire, release))
    for pairs in confirmed.values():
        pairs.sort(key=lambda pair: pair[0].end)
        for index, (acquire, release) in enumerate(pairs):
            for other, other_release in pairs[index + 1 :]:
                if other.end >= release.start:
                    break
                both_shared = acquire.mode == other.mode == "shared"
                both_limited = acquire.mode == other.mode == "limited"
                if not (both_shared or both_limited):
                    report.violations.append(
                        _Violation("double-holder", [acquire, release, other, other_release])
                    )


def _fence_regressions(history: list[Operation], report: _Report) -> None:
    acquires = [op for op in history if op.kind == "acquire" and op.outcome == "ok"]
    by_lock: dict[str, list[Operation]] = {}
    for op in acquires:
        by_lock.setdefault(op.lock, []).append(op)
    for ops in by_lock.values():
        ended = sorted(ops, key=lambda op: op.end)
        best: Operation | None = None
        position = 0
        for op in sorted(ops, key=lambda op: op.start):
            while position < len(ended) and ended[position].end < op.start:
                candidate = ended[position]
                if best is None or (candidate.fence or 0) > (best.fence or 0):
                    best = candidate
                position += 1
            if best is not None and (op.fence or 0) <= (best.fence or 0):
                report.violations.append(_Violation("fence-regression", [best, op]))


def _fenced_write_order(history: list[Operation], report: _Report) -> None:
    writes = [op for op in history if op.kind == "write" and op.outcome == "ok" and op.fenced]
    by_register: dict[str, list[Operation]] = {}
    for op in writes:
        by_register.setdefault(op.extra.get("register", op.lock), []).append(op)
    for ops in by_register.values():
        ops.sort(key=lambda op: op.extra["seq"])
        for before, after in itertools.pairwise(ops):
            if (after.fence or 0) < (before.fence or 0) or after.extra["seq"] == before.extra[
                "seq"
            ]:
                report.violations.append(_Violation("fence-order", [before, after]))
