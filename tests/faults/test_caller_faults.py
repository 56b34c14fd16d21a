"""Short seeded chaos runs with the caller's own faults (issue 27): client processes
interrupted at random points (``KeyboardInterrupt`` from a signal handler; an
``asyncio.timeout``, a failing ``TaskGroup`` sibling, ``cancel()`` twice), servers
answering ``BUSY`` and ``LOADING``, live slot migrations (``ASK``, ``TRYAGAIN``) under
traffic from both drivers, and planned Sentinel failovers. Judged by the checker and by
the liveness invariants (``tests/support/liveness.py``): holds end within a lease of
their owner letting go, a free lock is taken, and a slot migration or a planned failover
raises nothing.

Fixed seeds: a run that fails prints its seed and the command that replays it (same
schedule of faults and the same choices in each client; the interleaving differs). Each
run is built to catch one class of holds that outlive their owners (the comment above it
says which).

The long runs are ``bench/chaos.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chaos.runner import RunConfig, RunResult, run

CALLER_RUNS = [
    # A group released by distlock_many / LockGroup.arelease() cancelled at its first name
    # must still release the others; a slot migration's ASK/TRYAGAIN is ridden out (async).
    RunConfig(
        "cluster",
        "many-async",
        seed=2701,
        seconds=8,
        mean_gap=0.4,
        faults=("client-interrupt", "client-interrupt", "slot-migration"),
    ),
    # The same with KeyboardInterrupt in the sync driver (LockGroup.release()).
    RunConfig(
        "cluster",
        "many",
        seed=2702,
        seconds=8,
        mean_gap=0.3,
        faults=("client-interrupt", "client-interrupt", "client-interrupt", "slot-migration"),
    ),
    # A fair waiter cancelled in its first round trip must not keep its place in the
    # queue: the free lock goes to the next waiter.
    RunConfig(
        "single", "fair-async", seed=2703, seconds=8, mean_gap=0.2, faults=("client-interrupt",)
    ),
    # A release refused by a busy or loading server must not be followed by renewals
    # (a lease long enough for renewals to succeed again after the fault).
    RunConfig(
        "single",
        "mutex",
        seed=2704,
        seconds=8,
        lease=3.0,
        mean_gap=0.5,
        faults=("server-busy", "server-loading"),
    ),
    # Planned Sentinel failovers: a request meeting the demoted primary on a connection
    # still open to it (READONLY) is sent again to the new one; a waiting acquire raises
    # nothing (it raised "The previous master is now a slave" within milliseconds).
    RunConfig("sentinel", "mutex", seed=31, seconds=5, faults=("failover",), min_replicas="auto"),
]


def _id(config: RunConfig) -> str:
    return f"{config.topology}-{config.kind}-{config.seed}"


@pytest.mark.parametrize("config", CALLER_RUNS, ids=_id)
def test_a_seeded_run_with_the_callers_faults_shows_no_violation(
    config: RunConfig, tmp_path: Path
) -> None:
    result = run(config, tmp_path)
    where = f"seed {config.seed}; replay: {result.replay()}; history in {result.directory}"
    assert not result.errors, f"{result.errors}\n{where}"
    _assert_faults_landed(result, where)
    acquired = sum(1 for op in result.history if op.kind == "acquire" and op.outcome == "ok")
    assert acquired >= 10, f"{acquired} holds only\n{where}"
    liveness = result.liveness()
    assert liveness.holds_seen > 0, f"the probe saw no hold\n{where}"
    report = result.check()
    unsafe = report.unexcused
    found = [f"{v.type}: {v.message}" for v in [*unsafe, *liveness.violations]]
    assert not found, "\n".join([where, *found[:8]])


def _assert_faults_landed(result: RunResult, where: str) -> None:
    """The faults the run is for happened: interruptions landed in lock calls, servers
    refused requests, slot migrations answered ASK and TRYAGAIN."""
    kinds = set(result.config.faults or ())
    if "client-interrupt" in kinds:
        interrupted = [op for op in result.history if "interrupted" in op.extra]
        assert interrupted, f"no interruption landed\n{where}"
    if kinds & {"server-busy", "server-loading"}:
        refused = [
            op
            for op in result.history
            if op.outcome == "info" and ("BUSY" in op.detail or "loading" in op.detail)
        ]
        assert refused, f"no request refused BUSY or LOADING\n{where}"
    if "failover" in kinds:
        assert any(f.kind == "failover" for f in result.faults), f"no failover\n{where}"
        assert result.liveness().ridden_out, f"no waiting acquire met a failover\n{where}"
    if "slot-migration" in kinds:
        migrations = [f.detail for f in result.faults if f.kind == "slot-migration"]
        assert migrations, f"no slot migration\n{where}"
        assert any(" 0 ASK" not in d and " 0 TRYAGAIN" not in d for d in migrations), (
            f"no migration answered both ASK and TRYAGAIN: {migrations}\n{where}"
        )
