"""Replicas under failover (issue 27): double holders per failover, for each topology
with replicas and each ``MIN_REPLICAS``, in chaos runs whose only fault is a failover.

    .venv/bin/python bench/failover.py --seconds 45 --seed 27
    .venv/bin/python bench/failover.py --seconds 60 --seed 27 --topology sentinel \\
        --min-replicas 0 --min-replicas auto

Each run is ``tests/support/chaos/runner.py`` (kind ``mutex``, 4 client processes, lease
1 s, fenced registers, a failover every 2 s on average after the last one ended) with
``faults=("failover",)``: on ``replicated`` a replica promoted with ``REPLICAOF NO ONE``,
new connections sent to it, open ones cut 0.2-1 s later; on ``sentinel``
``SENTINEL FAILOVER``; on ``cluster`` ``CLUSTER FAILOVER`` of a lock's shard, or with
``--crash`` its primary SIGKILLed (``primary-crash``: the replica promoted after the node
timeout, the old primary restarted as its replica). Per run:
the failovers carried out, the double-holder windows the checker found (two clients
holding the lock at once, as their own records say), per failover, the acquires that
succeeded, those refused with ``LockNotReplicated``, and the successful acquires per
second inside the failovers (from a failover's start to 1 s after its end) and outside
them. The same seed gives the same schedule; each run prints its replay command.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

from stats import table  # noqa: E402

from tests.support.chaos.runner import RunConfig, RunResult, min_replicas_option, run  # noqa: E402
from tests.support.servers import install_termination_cleanup  # noqa: E402

TOPOLOGIES = ("replicated", "sentinel", "cluster")
FAILOVERS = ("failover", "primary-crash")
SETTLE = 1.0  # seconds after a failover still counted as "during" it


def _during(at: float, windows: list[tuple[float, float]]) -> bool:
    return any(start <= at <= end + SETTLE for start, end in windows)


def row(result: RunResult) -> list[str]:
    """One line of the table for ``result``."""
    config = result.config
    report = result.check()
    failovers = [f for f in result.faults if f.kind in FAILOVERS and "error" not in f.detail]
    windows = [(f.start, f.end) for f in failovers]
    acquires = [op for op in result.history if op.kind == "acquire"]
    taken = [op for op in acquires if op.outcome == "ok"]
    refused = [op for op in acquires if op.detail.startswith("LockNotReplicated")]
    inside = sum(min(end + SETTLE, result.history[-1].end) - start for start, end in windows)
    outside = config.seconds - inside
    taken_inside = sum(1 for op in taken if _during(op.end, windows))
    per_failover = report.double_holder_windows / len(failovers) if failovers else 0.0
    return [
        config.topology,
        str(config.min_replicas),
        str(len(failovers)),
        str(report.double_holder_windows),
        f"{per_failover:.2f}",
        f"{len(taken):,}",
        f"{len(refused):,}",
        f"{taken_inside / inside:.0f}" if inside > 0 else "-",
        f"{(len(taken) - taken_inside) / outside:.0f}" if outside > 0 else "-",
    ]


HEADERS = [
    "topology",
    "MIN_REPLICAS",
    "failovers",
    "double holders",
    "per failover",
    "acquires ok",
    "LockNotReplicated",
    "acquires/s during failovers",
    "acquires/s otherwise",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=45.0, help="length of each run")
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--topology", action="append", choices=TOPOLOGIES)
    parser.add_argument("--min-replicas", action="append", type=min_replicas_option)
    parser.add_argument(
        "--crash",
        action="store_true",
        help="cluster: SIGKILL the primary (primary-crash) instead of CLUSTER FAILOVER",
    )
    options = parser.parse_args()
    install_termination_cleanup()  # a run stopped with SIGTERM leaves no server behind
    rows = []
    for topology in options.topology or TOPOLOGIES:
        crash = options.crash and topology == "cluster"
        for min_replicas in options.min_replicas or [0, 1, "auto"]:
            config = RunConfig(
                topology,
                "mutex",
                seed=options.seed,
                seconds=options.seconds,
                faults=("primary-crash",) if crash else ("failover",),
                min_replicas=min_replicas,
                mean_gap=2.0,
            )
            load = os.getloadavg()[0]
            result = run(config)
            rows.append(row(result))
            errors = [error.splitlines()[0] for error in result.errors]
            print(
                f"{topology} MIN_REPLICAS={min_replicas}: load {load:.1f} -> "
                f"{os.getloadavg()[0]:.1f}; history in {result.directory}; replay: "
                f"{result.replay()}; errors: {errors or 'none'}",
                flush=True,
            )
    print()
    print(table(HEADERS, rows))


if __name__ == "__main__":
    main()
