"""The nemesis' schedule (``tests/support/chaos/nemesis.py``) and how the long runs seed it
(``bench/chaos.py``): a pure function of the seed, in which a run can be made to meet its
topology's own faults whatever the seed draws (issue 27: the replicated topology's long run
of 2026-11-28 drew no failover at all, since every kind of a topology shared one seed)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shlex
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO_ROOT
from tests.support.chaos.nemesis import CALLER_FAULTS, CLIENT_FAULTS, Fault, schedule
from tests.support.chaos.runner import RunConfig, load_result, replay_command
from tests.support.chaos.sites import SITES
from tests.support.chaos.workloads import KINDS
from tests.support.history import Operation, write_history
from tests.support.liveness import Sample

SENTINEL_KINDS = [*CLIENT_FAULTS, *SITES["sentinel"].fault_kinds, *CALLER_FAULTS]


def kinds_of(plan) -> Counter[str]:
    return Counter(planned.kind for planned in plan)


def seed_drawing_no(kind: str, kinds: list[str], seconds: float) -> int:
    """The first seed whose schedule draws no ``kind``."""
    return next(seed for seed in range(1000) if not kinds_of(schedule(seed, kinds, seconds))[kind])


def test_a_schedule_is_a_function_of_its_seed() -> None:
    assert schedule(7, SENTINEL_KINDS, 30) == schedule(7, SENTINEL_KINDS, 30)
    assert schedule(7, SENTINEL_KINDS, 30) != schedule(8, SENTINEL_KINDS, 30)


def test_a_topologys_own_faults_are_met_whatever_the_seed_draws() -> None:
    seed = seed_drawing_no("failover", SENTINEL_KINDS, 15)
    drawn = schedule(seed, SENTINEL_KINDS, 15)
    plan = schedule(seed, SENTINEL_KINDS, 15, at_least_once=["failover"])
    assert kinds_of(plan)["failover"] == 1
    # One fault changed kind, in its place (its start and target seed kept).
    changed = [(a, b) for a, b in zip(drawn, plan, strict=True) if a != b]
    assert len(changed) == 1
    before, after = changed[0]
    assert (after.at, after.seed) == (before.at, before.seed)
    assert plan == schedule(seed, SENTINEL_KINDS, 15, at_least_once=["failover"])


def test_every_own_fault_of_cluster_is_met_and_a_kind_not_drawn_from_is_not_forced() -> None:
    kinds = [*CLIENT_FAULTS, *SITES["cluster"].fault_kinds]
    for seed in range(20):
        plan = schedule(seed, kinds, 8, at_least_once=SITES["cluster"].own_kinds)
        assert kinds_of(plan)["failover"] >= 1
        assert kinds_of(plan)["slot-migration"] >= 1
    assert not kinds_of(schedule(3, CLIENT_FAULTS, 8, at_least_once=["failover"]))["failover"]


def test_a_replay_keeps_the_own_faults_flag() -> None:
    config = RunConfig("cluster", "many", seed=1234, seconds=66.7, each_own_fault=True)
    command = shlex.split(replay_command(config))
    assert command[command.index("--seed") + 1] == "1234"
    assert "--each-own-fault" in command


@pytest.fixture(scope="module")
def bench_chaos() -> ModuleType:
    """``bench/chaos.py``, imported from its file (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_chaos", REPO_ROOT / "bench" / "chaos.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_chaos", module)
    spec.loader.exec_module(module)
    return module


def test_the_long_run_seeds_each_kind_on_its_own(bench_chaos: ModuleType) -> None:
    seeds = {
        (topology, kind): bench_chaos.run_seed(2711, topology, kind)
        for topology in SITES
        for kind in KINDS
    }
    assert len(set(seeds.values())) == len(seeds)  # no two runs share a schedule
    assert bench_chaos.run_seed(2711, "sentinel", "many") == seeds["sentinel", "many"]
    assert bench_chaos.run_seed(2711, "sentinel", "many") == 1898968697  # CRC-32: stable


def test_the_summary_flags_a_topology_that_drew_none_of_its_own_faults(
    bench_chaos: ModuleType,
) -> None:
    def figures(kind: str, faults: dict[str, int]):
        return bench_chaos.Figures(
            **{
                **dict.fromkeys(bench_chaos.Figures.__dataclass_fields__),
                "topology": "cluster",
                "kind": kind,
                "fenced": True,
                "seconds": 60.0,
                "operations": {},
                "holds": 0,
                "faults": faults,
                "unexcused": {},
                "excused": {},
                "windows": 0,
                "longest_window": 0.0,
                "takeovers": [],
                "holds_seen": 0,
                "holds_after_owner": 0,
                "longest_hold_after_owner": 0.0,
                "longest_free_wait": 0.0,
                "messages": [],
            }
        )

    runs = [figures("mutex", {"failover": 2}), figures("many", {"client-pause": 3})]
    assert bench_chaos.missing_own_faults("cluster", runs) == ["slot-migration"]
    assert "**drew no slot-migration**" in bench_chaos.summary(runs)
    runs.append(figures("fair", {"slot-migration": 1}))
    assert bench_chaos.missing_own_faults("cluster", runs) == []
    assert "drew no" not in bench_chaos.summary(runs)


def test_a_saved_run_is_loaded_to_be_judged_again(tmp_path: Path) -> None:
    """``load_result``: what a run left in its directory, its processes read from
    ``processes.json`` or, for a run saved before it existed, rebuilt from its records."""
    history = [
        Operation("c1", 1, "acquire", "lock", 1.0, 1.1, "ok", token="t1"),
        Operation("c1", 1, "release", "lock", 1.5, 1.6, "ok", token="t1"),
        Operation("final", 0, "read", "lock", 9.0, 9.0, "ok", value=1, extra={"final": True}),
    ]
    write_history(tmp_path / "merged.history", history)
    faults = [
        Fault("client-pause", "c1", 2.0, 2.5, reaches=("c1",)),
        Fault("client-kill", "c1", 3.0, 3.1, reaches=("c1",)),
    ]
    (tmp_path / "faults.json").write_text(json.dumps([fault.to_dict() for fault in faults]))
    samples = [Sample("lock", 1.2, 1.21, (("t1", 77),)), Sample("lock", 1.7, 1.71, ())]
    (tmp_path / "samples.json").write_text(json.dumps([dataclasses.asdict(s) for s in samples]))
    config = RunConfig("single", "mutex", seed=1)

    rebuilt = load_result(tmp_path, config, ["an error"])
    assert rebuilt.history == history
    assert rebuilt.samples == samples
    assert rebuilt.final == {"lock": 1}
    assert rebuilt.errors == ["an error"]
    assert (rebuilt.pids, rebuilt.killed, rebuilt.paused) == (
        {77: "c1"},
        {"c1": 3.0},
        {"c1": [(2.0, 2.5)]},
    )
    processes = {"pids": {"77": "c1"}, "killed": {"c1": 3.05}, "paused": {"c1": [[2.01, 2.49]]}}
    (tmp_path / "processes.json").write_text(json.dumps(processes))
    saved = load_result(tmp_path, config)
    assert (saved.pids, saved.killed, saved.paused) == (
        {77: "c1"},
        {"c1": 3.05},
        {"c1": [(2.01, 2.49)]},
    )
