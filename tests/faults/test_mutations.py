"""Mutation runs (issue 27): the checker of the randomized fault runs must be able to fail.
Each run is a short seeded chaos run (``tests/support/chaos/``) whose clients use a
deliberately broken lock (``tests/support/chaos/mutants.py``); the checker must report
an unexcused violation for each, and the same run with the real lock must show none
(so that what is caught is the mutant, not the harness).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.chaos.mutants import MUTANTS
from tests.support.chaos.runner import RunConfig, run
from tests.support.checker import ViolationType

SECONDS = 8.0
CLIENTS = 2
MEAN_GAP = 0.3
# Its schedule pauses a holder four times for 1.7 to 2.4 s: past the lease (1 s) and
# past the next holder's work, whatever the interleaving.
SEED = 2938


# What each mutant's bug shows as, unexcused.
SHOWS = {
    "half-lease": ViolationType.OVERLAP,
    "release-any-token": ViolationType.OVERLAP,
    "skipped-renewals": ViolationType.OVERLAP,
    "fence-not-stored": ViolationType.STALE_FENCE_ACCEPTED,
}

# The control run: every mutant's faults, holds as long as any of theirs.
CONTROL_FAULTS = ("holder-pause",)
CONTROL_HOLD_SECONDS = (0.2, 2.0)


def _config(
    mutant: str | None, seed: int, faults: tuple[str, ...], hold_seconds: tuple[float, float]
) -> RunConfig:
    return RunConfig(
        "single",
        "mutex",
        seed=seed,
        seconds=SECONDS,
        clients=CLIENTS,
        mean_gap=MEAN_GAP,
        faults=faults,
        mutant=mutant,
        hold_seconds=hold_seconds,
    )


def test_every_mutant_says_what_it_shows() -> None:
    assert set(SHOWS) == set(MUTANTS)


@pytest.mark.parametrize(("mutant", "seed"), [(name, SEED) for name in MUTANTS])
def test_a_broken_lock_is_caught(mutant: str, seed: int, tmp_path: Path) -> None:
    broken = MUTANTS[mutant]
    result = run(_config(mutant, seed, broken.faults, broken.hold_seconds), tmp_path)
    report = result.check()
    where = f"{MUTANTS[mutant].broken}; replay: {result.replay()}; history in {tmp_path}"

    assert not result.errors, f"{result.errors}\n{where}"
    found = {violation.type for violation in report.unexcused}
    assert SHOWS[mutant] in found, (
        f"the checker let a broken lock pass ({len(report.excused)} excused, "
        f"unexcused: {sorted(found)})\n{where}"
    )


def test_the_same_run_with_the_real_lock_passes(tmp_path: Path) -> None:
    assert {f for mutant in MUTANTS.values() for f in mutant.faults} == set(CONTROL_FAULTS)
    result = run(_config(None, SEED, CONTROL_FAULTS, CONTROL_HOLD_SECONDS), tmp_path)
    report = result.check()

    assert not result.errors, result.errors
    assert report.holds >= 5, report.holds
    assert not report.unexcused, "\n".join(v.message for v in report.unexcused[:5])
    # The pauses did take locks from their holders: the excuses were put to work.
    assert report.excused, "no overlap to excuse: the control run tested nothing"
