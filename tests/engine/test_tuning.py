"""The timing knobs: what they accept, and what they refuse before any lock uses them."""

from __future__ import annotations

import math

import pytest

from django_distlock.engine import MAX_SECONDS, Tuning
from django_distlock.engine.tuning import ms


def test_the_defaults_and_their_milliseconds():
    tuning = Tuning()
    assert tuning.wait_cap < tuning.waiter_liveness
    assert tuning.waiter_liveness_ms == 3000
    assert tuning.fence_memory_ms == 3_600_000
    assert ms(0.0001) == 1


@pytest.mark.parametrize(
    "field",
    [
        "wait_cap",
        "waiter_liveness",
        "server_wait",
        "renewal_attempt",
        "connection_wait",
        "failover_pause",
        "replica_check",
    ],
)
@pytest.mark.parametrize("value", [0, -1.0, MAX_SECONDS + 1, math.inf, math.nan])
def test_a_knob_that_times_something_must_be_a_positive_number(field, value):
    with pytest.raises(ValueError, match=field):
        Tuning(**{field: value})


@pytest.mark.parametrize("field", ["fence_memory", "failover_ride_out", "replica_grace"])
def test_a_knob_that_can_be_off_takes_zero_but_nothing_below(field):
    assert getattr(Tuning(**{field: 0}), field) == 0
    with pytest.raises(ValueError, match=field):
        Tuning(**{field: -0.5})
    with pytest.raises(ValueError, match=field):
        Tuning(**{field: math.inf})


@pytest.mark.parametrize("value", ["1", None, True])
def test_a_knob_is_a_number(value):
    with pytest.raises(TypeError, match="wait_cap"):
        Tuning(wait_cap=value)


@pytest.mark.parametrize("wait_cap", [3.0, 5.0])
def test_a_fair_waiter_confirms_its_place_before_it_lapses(wait_cap):
    # A fair waiter confirms its place at least every wait_cap seconds: a place that
    # lapses sooner is lost between two confirmations.
    with pytest.raises(ValueError, match="waiter_liveness"):
        Tuning(wait_cap=wait_cap, waiter_liveness=3.0)
    assert Tuning(wait_cap=wait_cap, waiter_liveness=wait_cap + 1).wait_cap == wait_cap
