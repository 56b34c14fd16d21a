"""The long randomized fault run (issues 20, 27): every lock kind on every topology while
the nemesis injects faults, the caller's own among them, judged by the checker and the
liveness invariants; one table per run, one per topology (a row per kind) and a summary.

    .venv/bin/python bench/chaos.py --minutes-per-topology 10 --seed 1
    .venv/bin/python bench/chaos.py --minutes 0.3 --seed 7 --topology single --kind mutex

``--minutes-per-topology`` is split evenly over a topology's runs (one per kind, and per
fenced/unfenced register with ``--unfenced``); ``--minutes`` is the length of each run
instead. ``--topology`` and ``--kind`` (repeatable) narrow it. The nemesis draws the
caller's faults too (``client-interrupt``; ``server-busy`` and ``server-loading`` where
the topology has them) unless ``--no-caller-faults``; clients run with
``--min-replicas`` (default ``auto``, the package's default: acknowledged by a replica
wherever one is connected). Runs are ``tests/support/chaos/runner.py``; each run has a
seed of its own, derived from ``--seed``, the topology and the kind (:func:`run_seed`:
CRC-32 of ``"SEED/TOPOLOGY/KIND"``), so that the kinds of a topology meet different
schedules; and each run meets its topology's own faults (a failover on the replicated,
Sentinel and Cluster topologies, a slot migration on Cluster, a restart on the single
server) at least once (``--each-own-fault`` of the runner). The replay command, with the
run's own seed, is printed with each table; the summary flags a topology whose runs drew
none of one of its own faults. ``--json FILE`` appends each run's figures to FILE, one
JSON object a line, and ``--summarize FILE`` prints the summary tables of such a file
(runs made by several invocations, say one per topology). ``--rejudge FILE`` judges the
runs of such a file again from the directories they left (the checker and liveness
invariants of the current tree; ``tests.support.chaos.runner.load_result``), prints each
run's table and the summary, and with ``--json OUT`` writes their figures to OUT.

Per run: operations by kind and outcome, faults by kind, unexcused violations by type
(the checker's, ``tests/support/checker.py``, and the liveness invariants',
``tests/support/liveness.py``), what a recorded fault excused (by excuse and fault kind),
double-holder windows as the clients saw them (count, longest), the time to takeover
after a holder's death (a client SIGKILLed while holding: until another client's acquire
returned), how long the probe still saw a hold after its owner let go (bound: one lease
plus 0.3 s, more when a fault held requests back), and the longest a live waiter waited
on a lock the probe saw free, outside the faults' settle times (bound: 1 s). Every
unexcused violation is printed in full. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT)):
    if path not in sys.path:
        sys.path.insert(0, path)

from run import cpu_model, engine_digest, git_commit, load  # noqa: E402
from stats import fmt, percentile, table  # noqa: E402

from tests.support.chaos.measures import takeover_times  # noqa: E402
from tests.support.chaos.runner import (  # noqa: E402
    RunConfig,
    RunResult,
    load_result,
    min_replicas_option,
    run,
)
from tests.support.chaos.sites import SITES  # noqa: E402
from tests.support.chaos.workloads import KINDS  # noqa: E402
from tests.support.redis_servers import find_server_binary  # noqa: E402
from tests.support.servers import install_termination_cleanup  # noqa: E402

SHOWN_EXCUSED = 3
"""Excused violations printed in full per run (every unexcused one is)."""


@dataclass
class Figures:
    """What one run showed: the numbers of its table, kept for the summaries (``--json``)."""

    topology: str
    kind: str
    fenced: bool
    seed: int
    seconds: float
    min_replicas: int | str
    caller_faults: bool
    replay: str
    operations: dict[str, int]
    holds: int
    faults: dict[str, int]
    unexcused: dict[str, int]
    """By type: the checker's, then the liveness invariants' (``liveness:`` prefixed)."""
    excused: dict[str, int]
    """By ``"<excuse> by <fault kind>"``."""
    windows: int
    longest_window: float
    lost_updates: int
    unchecked: list[str]
    takeovers: list[float]
    holds_seen: int
    holds_after_owner: int
    longest_hold_after_owner: float
    free_waits_over_bound: int
    longest_free_wait: float
    ridden_out_judged: int
    final: dict[str, int]
    errors: list[str]
    messages: list[str] = field(default_factory=list)
    """Every unexcused violation, then the first few excused ones."""
    directory: str = ""
    """Where the run left its history, faults and probe reads (to judge them again)."""


def figures(result: RunResult) -> Figures:
    """Judge ``result`` (checker and liveness) and count what its tables show."""
    config = result.config
    checked = result.check()
    alive = result.liveness()
    operations = Counter(f"{op.kind} {op.outcome}" for op in result.history if op.client != "final")
    unexcused = Counter(str(v.type) for v in checked.unexcused)
    unexcused.update(f"liveness: {v.type}" for v in alive.violations)
    # Each excuse names its fault: counted by excuse and fault kind.
    excused = Counter(f"{v.type} by {v.cause.kind}" for v in checked.excused if v.cause is not None)
    messages = [f"UNEXCUSED {v.type}: {v.message}" for v in checked.unexcused]
    messages += [f"UNEXCUSED {v.type}: {v.message}" for v in alive.violations]
    messages += [f"excused {v.type}: {v.message}" for v in checked.excused[:SHOWN_EXCUSED]]
    return Figures(
        topology=config.topology,
        kind=config.kind,
        fenced=config.fenced,
        seed=config.seed,
        seconds=config.seconds,
        min_replicas=config.min_replicas if config.min_replicas is not None else "site",
        caller_faults=config.caller_faults,
        replay=result.replay(),
        operations=dict(operations),
        holds=checked.holds,
        faults=dict(Counter(fault.kind for fault in result.faults)),
        unexcused=dict(unexcused),
        excused=dict(excused),
        windows=checked.double_holder_windows,
        longest_window=checked.longest_double_holder_window,
        lost_updates=checked.lost_updates,
        unchecked=list(checked.unchecked),
        takeovers=takeover_times(result.history),
        holds_seen=alive.holds_seen,
        holds_after_owner=alive.holds_after_owner,
        longest_hold_after_owner=alive.longest_hold_after_owner,
        free_waits_over_bound=alive.free_waits,
        longest_free_wait=alive.longest_free_wait,
        ridden_out_judged=alive.ridden_out,
        final=dict(result.final),
        errors=[error.splitlines()[0] for error in result.errors],
        messages=messages,
        directory=str(result.directory),
    )


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counter.items())) or "none"


def _ms(seconds: float) -> str:
    return f"{fmt(seconds * 1000, 0)} ms"


def _takeovers(times: list[float]) -> str:
    if not times:
        return "-"
    return f"{len(times)}: p50 {_ms(percentile(times, 50))}, max {_ms(max(times))}"


def report(run_figures: Figures, lease: float) -> str:
    """The table of one run."""
    f = run_figures
    rows = [
        ["operations", f"{sum(f.operations.values()):,}: {_counts(f.operations)}"],
        ["holds", f"{f.holds:,}"],
        ["faults injected", f"{sum(f.faults.values())}: {_counts(f.faults)}"],
        ["violations (unexcused)", _counts(f.unexcused)],
        ["excused by a recorded fault", _counts(f.excused)],
        [
            "double-holder windows",
            f"{f.windows}, longest " + (_ms(f.longest_window) if f.windows else "-"),
        ],
        [
            "lost updates (unfenced registers)",
            f"{f.lost_updates}" if not f.fenced else "- (fenced)",
        ],
        ["histories too long to check", ", ".join(f.unchecked) or "none"],
        [
            "takeover after a holder's death",
            _takeovers(f.takeovers) + f" (lease {lease:g} s)"
            if f.takeovers
            else "no holder killed while holding",
        ],
        [
            "holds seen after their owner let go",
            f"{f.holds_after_owner} of {f.holds_seen:,} seen, longest "
            + (_ms(f.longest_hold_after_owner) if f.holds_after_owner else "-"),
        ],
        [
            "free lock, live waiter (outside faults)",
            f"longest {_ms(f.longest_free_wait)}; over 1 s near a fault: {f.free_waits_over_bound}",
        ],
        ["judged against a ridden-out fault", f"{f.ridden_out_judged} operations"],
        ["final registers", ", ".join(f"{k}={v}" for k, v in sorted(f.final.items()))],
        ["errors", "; ".join(f.errors) or "none"],
    ]
    fenced = "fenced" if f.fenced else "unfenced"
    title = (
        f"### {f.topology} / {f.kind} / {fenced} (seed {f.seed}, {f.seconds:g} s, "
        f"min_replicas {f.min_replicas}, caller faults {'on' if f.caller_faults else 'off'})"
    )
    shown = [f"- {message}" for message in f.messages]
    where = [f"replay: `{f.replay}`", f"history: {f.directory}", ""]
    return "\n".join([title, "", table(["", ""], rows), "", *shown, *where])


def _sum(counters: list[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for counter in counters:
        total.update(counter)
    return dict(total)


def _max_ms(values: list[float]) -> str:
    return _ms(max(values)) if values else "-"


def _row(label: str, runs: list[Figures]) -> list[str]:
    """A summary row of ``runs``."""
    unexcused = _sum([f.unexcused for f in runs])
    takeovers = [t for f in runs for t in f.takeovers]
    windows = sum(f.windows for f in runs)
    return [
        label,
        f"{len(runs)}",
        fmt(sum(f.seconds for f in runs) / 60, 1),
        f"{sum(sum(f.operations.values()) for f in runs):,}",
        f"{sum(f.holds for f in runs):,}",
        f"{sum(sum(f.faults.values()) for f in runs):,}",
        f"{sum(v for k, v in unexcused.items() if not k.startswith('liveness'))}",
        f"{sum(v for k, v in unexcused.items() if k.startswith('liveness'))}",
        f"{sum(sum(f.excused.values()) for f in runs)}",
        f"{windows} ({_max_ms([f.longest_window for f in runs if f.windows])})",
        _max_ms(takeovers),
        _max_ms([f.longest_hold_after_owner for f in runs if f.holds_after_owner]),
        _max_ms([f.longest_free_wait for f in runs if f.longest_free_wait]),
    ]


HEADERS = [
    "",
    "runs",
    "minutes",
    "operations",
    "holds",
    "faults",
    "unexcused (checker)",
    "unexcused (liveness)",
    "excused",
    "double holders (longest)",
    "takeover max",
    "hold after owner, max",
    "free lock + waiter, max",
]


def summary(all_runs: list[Figures]) -> str:
    """A table per topology (a row per run) and one of the topologies, with what the
    excuses named and the faults drawn."""
    parts = []
    topologies = list(dict.fromkeys(f.topology for f in all_runs))
    for topology in topologies:
        runs = [f for f in all_runs if f.topology == topology]
        rows = [_row(f"{f.kind}" + ("" if f.fenced else " (unfenced)"), [f]) for f in runs] + [
            _row("all", runs)
        ]
        parts += [
            f"### {topology}",
            "",
            table(HEADERS, rows),
            "",
            f"- faults: {_counts(_sum([f.faults for f in runs]))}",
            f"- excused, by excuse and fault: {_counts(_sum([f.excused for f in runs]))}",
            f"- unexcused, by type: {_counts(_sum([f.unexcused for f in runs]))}",
            *[
                f"- **drew no {kind}**: this topology's own fault was not met"
                for kind in missing_own_faults(topology, runs)
            ],
            "",
        ]
    rows = [_row(t, [f for f in all_runs if f.topology == t]) for t in topologies]
    parts += ["### Summary", "", table(["topology", *HEADERS[1:]], rows), ""]
    for topology in topologies:
        runs = [f for f in all_runs if f.topology == topology]
        parts.append(f"- {topology}, excused: {_counts(_sum([f.excused for f in runs]))}")
    return "\n".join(parts)


def run_seed(seed: int, topology: str, kind: str) -> int:
    """The seed of one run: CRC-32 of ``"SEED/TOPOLOGY/KIND"`` (stable across Python
    versions and processes, unlike ``hash``), so the same ``--seed`` replays the same runs
    and no two kinds of a topology share a schedule."""
    return zlib.crc32(f"{seed}/{topology}/{kind}".encode())


def missing_own_faults(topology: str, runs: list[Figures]) -> list[str]:
    """The topology's own faults (``ChaosSite.own_kinds``) that none of ``runs`` drew."""
    drawn = _sum([f.faults for f in runs])
    return [kind for kind in SITES[topology].own_kinds if not drawn.get(kind)]


def header(argv: list[str]) -> str:
    """Date, machine, commit, server and command of the run."""
    binary = find_server_binary()
    try:
        server = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10
        ).stdout.split(" ")[:3]
    except (OSError, subprocess.SubprocessError):
        server = ["?"]
    return "\n".join(
        [
            f"- Date: {time.strftime('%Y-%m-%d %H:%M %Z', time.gmtime())}; django-distlock "
            f"{git_commit()} (source digest {engine_digest()})",
            f"- Machine: {cpu_model()}; {os.cpu_count()} logical CPUs; {platform.system()} "
            f"{platform.release()}; Python {platform.python_version()}",
            f"- Server: {' '.join(server)} ({Path(binary).name}), loopback",
            f"- Load average at the start: {load()}",
            f"- Command: `{shlex.join(['.venv/bin/python', 'bench/chaos.py', *argv])}`",
            "",
        ]
    )


def rejudge(source: Path, out: Path | None) -> None:
    """Judge the runs of ``source`` (a ``--json`` file) again from their directories."""
    all_runs = []
    for line in source.read_text().splitlines():
        if not line:
            continue
        old = Figures(**json.loads(line))
        config = RunConfig(
            old.topology,
            old.kind,
            seed=old.seed,
            seconds=old.seconds,
            fenced=old.fenced,
            caller_faults=old.caller_faults,
            min_replicas=old.min_replicas,
            each_own_fault="--each-own-fault" in old.replay,
        )
        run_figures = figures(load_result(Path(old.directory), config, old.errors))
        all_runs.append(run_figures)
        print(report(run_figures, config.lease), flush=True)
        if out is not None:
            with out.open("a") as file:
                file.write(json.dumps(asdict(run_figures)) + "\n")
    print(summary(all_runs), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--minutes", type=float, help="length of each run")
    length.add_argument(
        "--minutes-per-topology", type=float, help="split evenly over each topology's runs"
    )
    length.add_argument(
        "--summarize", type=Path, metavar="FILE", help="print the summary of a --json file only"
    )
    length.add_argument(
        "--rejudge",
        type=Path,
        metavar="FILE",
        help="judge the runs of a --json file again from their saved directories",
    )
    parser.add_argument("--seed", type=int)
    parser.add_argument("--topology", action="append", choices=sorted(SITES))
    parser.add_argument("--kind", action="append", choices=KINDS)
    parser.add_argument("--unfenced", action="store_true", help="also run unfenced registers")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--no-caller-faults",
        dest="caller_faults",
        action="store_false",
        help="leave out the caller's faults and the transient server errors",
    )
    parser.add_argument(
        "--min-replicas",
        type=min_replicas_option,
        default="auto",
        help="the clients' min_replicas: 'auto' (default, the package's) or a count",
    )
    parser.add_argument("--json", type=Path, help="append each run's figures to this file")
    options = parser.parse_args()
    if options.summarize is not None:
        lines = options.summarize.read_text().splitlines()
        print(summary([Figures(**json.loads(line)) for line in lines if line]))
        return
    if options.rejudge is not None:
        rejudge(options.rejudge, options.json)
        return
    if options.seed is None:
        parser.error("--seed is required")
    install_termination_cleanup()  # a run stopped with SIGTERM leaves no server behind
    topologies = options.topology or list(SITES)
    kinds = options.kind or list(KINDS)
    registers = [True, False] if options.unfenced else [True]
    if options.minutes is not None:
        seconds = options.minutes * 60
    else:
        seconds = options.minutes_per_topology * 60 / (len(kinds) * len(registers))
    print(header(sys.argv[1:]), flush=True)
    all_runs = []
    for topology in topologies:
        for kind in kinds:
            for fenced in registers:
                config = RunConfig(
                    topology,
                    kind,
                    seed=run_seed(options.seed, topology, kind),
                    seconds=round(seconds, 1),
                    clients=options.clients,
                    fenced=fenced,
                    caller_faults=options.caller_faults,
                    min_replicas=options.min_replicas,
                    each_own_fault=True,
                )
                run_figures = figures(run(config))
                all_runs.append(run_figures)
                print(report(run_figures, config.lease), flush=True)
                if options.json is not None:
                    with options.json.open("a") as out:
                        out.write(json.dumps(asdict(run_figures)) + "\n")
    print(summary(all_runs), flush=True)


if __name__ == "__main__":
    main()
