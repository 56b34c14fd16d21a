"""One chaos run: start a topology (:mod:`.sites`), the register database and ``clients``
client processes of one lock kind (:mod:`.workloads`) for ``seconds``, with the
nemesis (:mod:`.nemesis`) injecting faults from the seeded schedule; stop everything;
merge the clients' histories.

    result = run(RunConfig(topology="single", kind="mutex", seed=7, seconds=10))
    report = result.check()  # check(result.history, faults=result.faults)

Merging marks what only the runner knows: the records of a hold during which the
nemesis SIGSTOPped its client get ``extra["paused"]``, those pauses as ``[start, end]``
pairs; a client the nemesis
SIGKILLed gets a ``lost`` record (detail ``"killed"``, ``extra["killed"] = True``) for the
hold it had open; each register's value at the end is a ``read`` by client ``final``
(``extra["final"] = True``; on fenced runs ``extra["accepted"]``, the database's count of
the writes it accepted). The faults (:class:`~.nemesis.Fault`) record what each reached
and which node served each lock's key around it: the checker's only excuses.

A probe (:class:`tests.support.liveness.Probe`) reads the holders of every lock from
Redis every 50 ms while the clients run; :meth:`RunResult.liveness` judges those reads
and the history against the liveness invariants (:mod:`tests.support.liveness`), and
:meth:`RunResult.findings` merges both reports.

``python -m tests.support.chaos.runner --topology T --kind K --seed S --seconds N
[--unfenced] [--caller-faults] [--faults F,...] [--min-replicas auto|N] [--mutant NAME]
[--hold-seconds LOW,HIGH]`` replays a run (:func:`replay_command` prints that line);
``mutant`` runs the clients with a deliberately broken lock (:mod:`.mutants`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import REPO_ROOT
from tests.support.chaos.nemesis import Fault, Nemesis, fault_kinds, schedule
from tests.support.chaos.registers import accepted_writes, final_values
from tests.support.chaos.sites import SITES, ChaosSite
from tests.support.chaos.workloads import client_spec, register_names
from tests.support.checker import PAUSE_FAULTS, Report, check
from tests.support.history import PENDING, Operation, read_history, write_history
from tests.support.liveness import Bounds, LivenessReport, Probe, Sample, check_liveness

__all__ = [
    "RunConfig",
    "RunResult",
    "load_result",
    "min_replicas_option",
    "replay_command",
    "run",
]

_START_SECONDS = 30.0  # a client process importing Django and connecting
_FINISH_SECONDS = 30.0  # past the run's end, for a client's last hold


@dataclass(frozen=True)
class RunConfig:
    """What a run does; the same config and seed give the same fault schedule."""

    topology: str
    kind: str
    seed: int
    seconds: float = 10.0
    clients: int = 4
    lease: float = 1.0
    fenced: bool = True
    mean_gap: float = 1.0
    faults: tuple[str, ...] | None = None
    """Fault kinds to draw from (default: every kind the topology has)."""
    caller_faults: bool = False
    """Draw the caller's own faults and the transient server errors too (default
    kinds only; see :func:`~tests.support.chaos.nemesis.fault_kinds`)."""
    min_replicas: int | str | None = None
    """The clients' ``min_replicas`` (``"auto"`` or a count; default: the topology's)."""
    mutant: str | None = None
    """A deliberately broken lock the clients run with (:data:`.mutants.MUTANTS`)."""
    hold_seconds: tuple[float, float] | None = None
    """How long a hold works before its write (default: :data:`.workloads.HOLD_SECONDS`)."""
    each_own_fault: bool = False
    """Meet each of the topology's own faults (``ChaosSite.own_kinds``: a failover, a
    slot migration) at least once, whatever the seed draws (``schedule(at_least_once=)``)."""


@dataclass
class RunResult:
    """A run's merged history, its fault log and what went wrong around it."""

    config: RunConfig
    history: list[Operation]
    faults: list[Fault]
    final: dict[str, int]
    directory: Path
    errors: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    """What the liveness probe read from Redis."""
    pids: dict[int, str] = field(default_factory=dict)
    """The client of each process pid."""
    killed: dict[str, float] = field(default_factory=dict)
    paused: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def replay(self) -> str:
        """The command that replays this run."""
        return replay_command(self.config)

    def check(self) -> Report:
        """The checker's report on this run's history, its faults the only excuses."""
        return check(self.history, faults=self.faults)

    def liveness(self) -> LivenessReport:
        """The liveness report on this run (:mod:`tests.support.liveness`)."""
        return check_liveness(
            self.history,
            self.samples,
            self.faults,
            bounds=Bounds(lease=self.config.lease),
            topology=self.config.topology,
            pids=self.pids,
            killed=self.killed,
            paused=self.paused,
        )

    def findings(self) -> list[str]:
        """Every violation of both reports that no recorded fault excuses (the checker's,
        then the liveness one's), as ``"type: message"`` lines."""
        return [f"{v.type}: {v.message}" for v in self.check().unexcused] + [
            f"{v.type}: {v.message}" for v in self.liveness().violations
        ]


def replay_command(config: RunConfig) -> str:
    """The shell command that replays ``config`` (same seed, same schedule)."""
    command = [
        "python",
        "-m",
        "tests.support.chaos.runner",
        "--topology",
        config.topology,
        "--kind",
        config.kind,
        "--seed",
        str(config.seed),
        "--seconds",
        str(config.seconds),
        "--clients",
        str(config.clients),
    ]
    if not config.fenced:
        command.append("--unfenced")
    if config.faults is not None:
        command += ["--faults", ",".join(config.faults)]
    if config.caller_faults:
        command.append("--caller-faults")
    if config.min_replicas is not None:
        command += ["--min-replicas", str(config.min_replicas)]
    if config.mutant is not None:
        command += ["--mutant", config.mutant]
    if config.hold_seconds is not None:
        command += ["--hold-seconds", ",".join(map(str, config.hold_seconds))]
    if config.each_own_fault:
        command.append("--each-own-fault")
    return shlex.join(command)


class _ClientPool:
    """The client processes of a run (the nemesis' :class:`~.nemesis.Clients`): a
    killed client is replaced by a new one (``c2`` -> ``c2.1``)."""

    def __init__(self, config: RunConfig, site: ChaosSite, directory: Path) -> None:
        self.config = config
        self.site = site
        self.directory = directory
        self.until = float("inf")
        self.processes: dict[str, subprocess.Popen[str]] = {}
        self.killed: dict[str, float] = {}
        self.paused: dict[str, list[tuple[float, float]]] = {}
        self.pids: dict[int, str] = {}
        self._stopped_at: dict[str, float] = {}
        self._guard = threading.Lock()
        self._serial = 0

    def spawn(self, name: str) -> subprocess.Popen[str]:
        """Start client ``name`` (it connects, then waits for :meth:`go`)."""
        self._serial += 1
        spec = client_spec(
            target=self.site.target,
            kind=self.config.kind,
            database=self.directory / "registers.sqlite3",
            history=self.directory / f"{name}.jsonl",
            client=name,
            seed=self.config.seed * 1000 + self._serial,
            lease=self.config.lease,
            fenced=self.config.fenced,
            min_replicas=self.site.min_replicas,
            mutant=self.config.mutant,
            hold_seconds=self.config.hold_seconds,
        )
        with (self.directory / f"{name}.stderr").open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.chaos.workloads", json.dumps(spec)],
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        with self._guard:
            self.processes[name] = process
            self.pids[process.pid] = name
        return process

    def wait_ready(self, process: subprocess.Popen[str]) -> None:
        """Wait until ``process`` says it is connected."""
        assert process.stdout is not None
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a chaos client failed to start: see {self.directory}/*.stderr")

    def go(self, process: subprocess.Popen[str]) -> None:
        """Tell a ready ``process`` when the run ends: it starts its loop."""
        assert process.stdin is not None
        process.stdin.write(f"{self.until!r}\n")
        process.stdin.flush()

    def live(self) -> list[str]:
        with self._guard:
            return [name for name, process in self.processes.items() if process.poll() is None]

    def pid(self, name: str) -> int:
        return self.processes[name].pid

    def pause(self, name: str) -> None:
        self._stopped_at[name] = time.monotonic()
        self.processes[name].send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGCONT)
        began = self._stopped_at.pop(name, None)
        if began is not None:
            self.paused.setdefault(name, []).append((began, time.monotonic()))

    def interrupt(self, name: str) -> None:
        self.processes[name].send_signal(signal.SIGUSR1)

    def kill(self, name: str) -> None:
        process = self.processes[name]
        # The time of the signal, not of the reaping: the client stops there (its last
        # operation, say a release, may have reached Redis unrecorded just before).
        self.killed[name] = time.monotonic()
        process.kill()
        process.wait()
        if time.monotonic() < self.until - 1.0:
            base, _, generation = name.partition(".")
            process = self.spawn(f"{base}.{int(generation or 0) + 1}")
            self.wait_ready(process)
            self.go(process)

    def finish(self) -> list[str]:
        """Wait for every client to end (killing those that overrun); their errors."""
        errors = []
        deadline = self.until + _FINISH_SECONDS
        for name, process in list(self.processes.items()):
            process.send_signal(signal.SIGCONT)
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                errors.append(f"client {name} did not finish its last hold in time")
            if process.returncode not in (0, -signal.SIGKILL):
                stderr = (self.directory / f"{name}.stderr").read_text()[-3000:]
                errors.append(f"client {name} exited {process.returncode}:\n{stderr}")
        return errors

    def close(self) -> None:
        """Kill whatever still runs and close the pipes."""
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()


def run(config: RunConfig, directory: Path | None = None) -> RunResult:
    """Carry out one run (see the module docstring); every process it started is gone
    when it returns or raises."""
    directory = directory or Path(tempfile.mkdtemp(prefix="distlock-chaos-"))
    names = register_names(config.kind)
    # The site knows what the clients wait for: a replica's fault reaches the primaries
    # of locks that wait for a replica.
    site = SITES[config.topology](names, min_replicas=config.min_replicas)
    kinds = (
        list(config.faults)
        if config.faults is not None
        else fault_kinds(site, caller=config.caller_faults)
    )
    plan = schedule(
        config.seed,
        kinds,
        config.seconds,
        mean_gap=config.mean_gap,
        at_least_once=site.own_kinds if config.each_own_fault else (),
    )
    database = directory / "registers.sqlite3"
    pool = _ClientPool(config, site, directory)
    nemesis: Nemesis | None = None
    probe: Probe | None = None
    errors: list[str] = []
    site.start()
    try:
        subprocess.run(
            [sys.executable, "-m", "tests.support.chaos.registers", str(database), *names],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            check=True,
            timeout=_START_SECONDS,
        )
        processes = [pool.spawn(f"c{index}") for index in range(config.clients)]
        # The run's clock starts once every client is connected: starting them (a
        # second or more each on a loaded machine) must not eat the run.
        for process in processes:
            pool.wait_ready(process)
        pool.until = time.monotonic() + config.seconds
        for process in processes:
            pool.go(process)
        probe = Probe(site.lock_holders, names).start()
        nemesis = Nemesis(plan, site, pool)
        nemesis.start()
        time.sleep(max(0.0, pool.until - time.monotonic()))
        nemesis.stop()
        errors += pool.finish()
        errors += nemesis.errors
    finally:
        if nemesis is not None:
            nemesis.stop()
        if probe is not None:
            probe.stop()
        pool.close()
        site.stop()
    final = final_values(database)
    accepted = accepted_writes(database) if config.fenced else {}
    history = _merge(read_history(sorted(directory.glob("*.jsonl"))), pool, final, accepted)
    write_history(directory / "merged.history", history)  # what the checker judged
    faults = nemesis.faults if nemesis is not None else []
    (directory / "faults.json").write_text(json.dumps([fault.to_dict() for fault in faults]))
    samples = probe.samples if probe is not None else []
    (directory / "samples.json").write_text(json.dumps([dataclasses.asdict(s) for s in samples]))
    processes = {"pids": pool.pids, "killed": pool.killed, "paused": pool.paused}
    (directory / "processes.json").write_text(json.dumps(processes))
    return RunResult(
        config,
        history,
        faults,
        final,
        directory,
        errors,
        samples=samples,
        pids=dict(pool.pids),
        killed=dict(pool.killed),
        paused={name: list(pauses) for name, pauses in pool.paused.items()},
    )


def _merge(
    history: list[Operation], pool: _ClientPool, final: dict[str, int], accepted: dict[str, int]
) -> list[Operation]:
    """``history`` with what the runner knows added (see the module docstring)."""
    done = {(op.client, op.hold, op.kind, op.value) for op in history if op.detail != PENDING}
    # A write recorded before its commit is superseded by its outcome; one left alone is
    # a write its client was killed in: it may or may not have taken effect (info).
    history = [
        op
        for op in history
        if op.detail != PENDING or (op.client, op.hold, op.kind, op.value) not in done
    ]
    holds: dict[tuple[str, int], list[Operation]] = {}
    for operation in history:
        holds.setdefault((operation.client, operation.hold), []).append(operation)
    # A client's last hold, open when it was killed (a group's names are holds that
    # began together).
    last_began: dict[str, float] = {}
    for (client, _hold), operations in holds.items():
        began = min(operation.start for operation in operations)
        last_began[client] = max(began, last_began.get(client, began))
    merged: list[Operation] = []
    for (client, _hold), operations in holds.items():
        begin = min(operation.start for operation in operations)
        end = max(operation.end for operation in operations)
        paused = [
            [stopped, resumed]
            for stopped, resumed in pool.paused.get(client, [])
            if stopped < end and resumed > begin
        ]
        if paused:
            operations = [
                dataclasses.replace(operation, extra={**operation.extra, "paused": paused})
                for operation in operations
            ]
        merged += operations
        killed_at = pool.killed.get(client)
        if killed_at is not None and begin == last_began[client]:
            merged += _killed(operations, killed_at)
    now = time.monotonic()
    for name, value in sorted(final.items()):
        merged.append(
            Operation(
                client="final",
                hold=0,
                kind="read",
                lock=name,
                start=now,
                end=now,
                outcome="ok",
                value=value,
                detail="the register after the run",
                extra={"final": True, **({"accepted": accepted[name]} if name in accepted else {})},
            )
        )
    merged.sort(key=lambda operation: (operation.start, operation.end))
    return merged


def load_result(directory: Path, config: RunConfig, errors: Sequence[str] = ()) -> RunResult:
    """The :class:`RunResult` a run left in ``directory``, to judge it again with the
    checker and liveness invariants of today. Its client processes (pids, kills, pauses)
    are read from ``processes.json``; a run saved before that file existed has them
    rebuilt: each pid's client from the tokens the probe saw and the clients recorded,
    kills and pauses from the nemesis' faults (their start, a moment before the signal)."""
    history = read_history([directory / "merged.history"])
    faults = [Fault(**fault) for fault in json.loads((directory / "faults.json").read_text())]
    samples = [
        dataclasses.replace(
            Sample(**sample),
            holders=None if sample["holders"] is None else tuple(map(tuple, sample["holders"])),
        )
        for sample in json.loads((directory / "samples.json").read_text())
    ]
    final = {op.lock: op.value for op in history if op.client == "final" and op.value is not None}
    saved = directory / "processes.json"
    if saved.exists():
        processes = json.loads(saved.read_text())
        pids = {int(pid): client for pid, client in processes["pids"].items()}
        killed = processes["killed"]
        paused = {name: [(a, b) for a, b in spans] for name, spans in processes["paused"].items()}
    else:
        client_of = {op.token: op.client for op in history if op.token}
        pids = {
            pid: client_of[token]
            for sample in samples
            for token, pid in sample.holders or ()
            if token in client_of and pid is not None
        }
        killed = {fault.target: fault.start for fault in faults if fault.kind == "client-kill"}
        paused: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)
        for fault in faults:
            if fault.kind in PAUSE_FAULTS:
                paused[fault.target].append((fault.start, fault.end))
    return RunResult(
        config,
        history,
        faults,
        final,
        directory,
        list(errors),
        samples=samples,
        pids=pids,
        killed=killed,
        paused=dict(paused),
    )


def _killed(operations: list[Operation], killed_at: float) -> list[Operation]:
    """The ``lost`` records of a killed client's last hold, if it was open: one per lock
    its acquire took or may have taken."""
    if any(operation.kind in ("release", "lost") for operation in operations):
        return []
    return [
        dataclasses.replace(
            acquire,
            kind="lost",
            start=killed_at,
            end=killed_at,
            outcome="ok",
            blocking_timeout=None,
            detail="killed",
            extra={**acquire.extra, "killed": True},
        )
        for acquire in operations
        if acquire.kind == "acquire" and acquire.outcome != "fail"
    ]


def min_replicas_option(value: str) -> int | str:
    """``--min-replicas``: ``auto`` or a count."""
    return value if value == "auto" else int(value)


def _seconds_range(text: str) -> tuple[float, float]:
    low, high = text.split(",")
    return float(low), float(high)


def main(argv: list[str] | None = None) -> None:
    """Replay one run and print its faults and a summary of its history."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", choices=sorted(SITES), required=True)
    parser.add_argument("--kind", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--unfenced", action="store_true")
    parser.add_argument("--faults", help="comma-separated fault kinds (default: all)")
    parser.add_argument("--caller-faults", action="store_true", help="draw the caller's faults too")
    parser.add_argument(
        "--min-replicas", type=min_replicas_option, help="'auto' or a count (default: the site's)"
    )
    parser.add_argument("--mutant", help="a broken lock (tests/support/chaos/mutants.py)")
    parser.add_argument("--hold-seconds", help="LOW,HIGH: how long a hold works")
    parser.add_argument(
        "--each-own-fault",
        action="store_true",
        help="meet each of the topology's own faults (failover, slot migration) at least once",
    )
    options = parser.parse_args(argv)
    config = RunConfig(
        topology=options.topology,
        kind=options.kind,
        seed=options.seed,
        seconds=options.seconds,
        clients=options.clients,
        fenced=not options.unfenced,
        faults=tuple(options.faults.split(",")) if options.faults else None,
        caller_faults=options.caller_faults,
        min_replicas=options.min_replicas,
        mutant=options.mutant,
        hold_seconds=_seconds_range(options.hold_seconds) if options.hold_seconds else None,
        each_own_fault=options.each_own_fault,
    )
    result = run(config)
    for fault in result.faults:
        print(json.dumps(fault.to_dict()))
    counts: dict[str, int] = {}
    for operation in result.history:
        key = f"{operation.kind} {operation.outcome}"
        counts[key] = counts.get(key, 0) + 1
    print(json.dumps({"operations": counts, "final": result.final, "errors": result.errors}))
    for finding in result.findings():
        print(finding)
    print(f"history: {result.directory}")


if __name__ == "__main__":
    main()
