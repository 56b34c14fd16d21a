"""The long randomized fault run (issue 20): every lock kind on every topology while the
nemesis injects faults, judged by the checker, one table per topology and kind.

    .venv/bin/python bench/chaos.py --minutes 30 --seed 1
    .venv/bin/python bench/chaos.py --minutes 1 --seed 7 --topology single --kind mutex

``--minutes`` is the length of each run (one per topology, kind and fenced/unfenced
register); ``--topology`` and ``--kind`` (repeatable) narrow it, ``--unfenced`` adds the
unfenced runs. Runs are ``tests/support/chaos/runner.py`` with the same seeds as
``python -m tests.support.chaos.runner`` (the replay command is printed with each
table). Per run: operations by kind and outcome, faults injected by type, unexcused
violations by type (``tests/support/checker.py``), what a recorded fault excused (by
excuse and fault kind), double-holder windows as the clients saw them
(count, longest: expected under faults that lose a lock, such as a pause past the lease
or a server restarted empty), and the time to takeover after a holder's death (a client
SIGKILLed while holding: until another client's acquire returned). See bench/README.md.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

from stats import fmt, percentile, table  # noqa: E402

from tests.support.chaos.measures import takeover_times  # noqa: E402
from tests.support.chaos.runner import RunConfig, RunResult, run  # noqa: E402
from tests.support.chaos.sites import SITES  # noqa: E402
from tests.support.chaos.workloads import KINDS  # noqa: E402
from tests.support.checker import Report  # noqa: E402
from tests.support.servers import install_termination_cleanup  # noqa: E402


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counter.items())) or "none"


def report(result: RunResult) -> str:
    """The table of one run."""
    history = result.history
    checked: Report = result.check()
    operations = Counter(f"{op.kind} {op.outcome}" for op in history if op.client != "final")
    faults = Counter(fault.kind for fault in result.faults)
    unexcused = Counter(str(violation.type) for violation in checked.unexcused)
    # Each excuse names its fault: counted by excuse and fault kind.
    excused = Counter(
        f"{violation.type} by {violation.cause.kind}"
        for violation in checked.excused
        if violation.cause is not None
    )
    takeovers = takeover_times(history)
    config = result.config
    windows = checked.double_holder_windows
    rows = [
        ["operations", f"{sum(operations.values()):,}: {_counts(operations)}"],
        ["faults injected", f"{sum(faults.values())}: {_counts(faults)}"],
        ["violations (unexcused)", _counts(unexcused)],
        ["excused by a recorded fault", _counts(excused)],
        [
            "double-holder windows",
            f"{windows}, longest "
            + (fmt(checked.longest_double_holder_window * 1000) + " ms" if windows else "-"),
        ],
        [
            "lost updates (unfenced registers)",
            f"{checked.lost_updates}" if not config.fenced else "- (fenced)",
        ],
        ["histories too long to check", ", ".join(checked.unchecked) or "none"],
        [
            "takeover after a holder's death",
            (
                f"{len(takeovers)}: p50 {fmt(percentile(takeovers, 50) * 1000)} ms, "
                f"max {fmt(max(takeovers) * 1000)} ms (lease {config.lease:g} s)"
                if takeovers
                else "no holder killed while holding"
            ),
        ],
        ["final registers", ", ".join(f"{k}={v}" for k, v in sorted(result.final.items()))],
        ["errors", "; ".join(error.splitlines()[0] for error in result.errors) or "none"],
    ]
    fenced = "fenced" if config.fenced else "unfenced"
    title = f"### {config.topology} / {config.kind} / {fenced} (seed {config.seed})"
    shown = [f"- {violation.message}" for violation in [*checked.unexcused, *checked.excused][:3]]
    return "\n".join(
        [title, "", table(["", ""], rows), "", *shown, f"replay: `{result.replay()}`", ""]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True, help="length of each run")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--topology", action="append", choices=sorted(SITES))
    parser.add_argument("--kind", action="append", choices=KINDS)
    parser.add_argument("--unfenced", action="store_true", help="also run unfenced registers")
    parser.add_argument("--clients", type=int, default=4)
    options = parser.parse_args()
    install_termination_cleanup()  # a run stopped with SIGTERM leaves no server behind
    topologies = options.topology or list(SITES)
    kinds = options.kind or list(KINDS)
    registers = [True, False] if options.unfenced else [True]
    for topology in topologies:
        for kind in kinds:
            for fenced in registers:
                config = RunConfig(
                    topology,
                    kind,
                    seed=options.seed,
                    seconds=options.minutes * 60,
                    clients=options.clients,
                    fenced=fenced,
                )
                print(report(run(config)), flush=True)


if __name__ == "__main__":
    main()
