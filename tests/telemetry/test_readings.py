"""django_distlock.telemetry.readings: the ``lock`` label of each mode, what each event kind
counts as, and the live holds (each ends once)."""

from __future__ import annotations

import pytest

from django_distlock.engine import Event
from django_distlock.telemetry.readings import (
    ACQUIRE_RESULTS,
    LABEL_MODES,
    RENEW_RESULTS,
    LiveHolds,
    acquire_result,
    labeller,
    renew_result,
)


def event(kind: str = "acquired", name: str = "report:2026-11-23", **fields) -> Event:
    return Event(kind, name, fields.pop("fence", 7), "", "host", 1, "MainThread", **fields)


@pytest.mark.parametrize(
    ("mode", "name", "template", "label"),
    [
        ("template", "report:2026-11-23", "report:{day}", "report:{day}"),
        ("template", "invoice:42", "", "invoice"),
        ("template", "nightly-cleanup", "", "nightly-cleanup"),
        ("template", "{tenant}:x", "", "{tenant}"),
        ("prefix", "report:2026-11-23", "report:{day}", "report"),
        ("prefix", "7:report", "{tenant}:report", "{tenant}"),
        ("prefix", "invoice:42", "", "invoice"),
        ("none", "report:2026-11-23", "report:{day}", ""),
    ],
)
def test_labels(mode, name, template, label):
    assert labeller(mode)(event(name=name, template=template)) == label


def test_every_mode_has_a_labeller_and_others_are_refused():
    assert all(callable(labeller(mode)) for mode in LABEL_MODES)
    with pytest.raises(ValueError, match="unknown label mode 'name'"):
        labeller("name")


@pytest.mark.parametrize(
    ("kind", "cause", "result"),
    [
        ("acquired", "", "acquired"),
        ("contended", "busy", "busy"),
        ("contended", "timeout", "timeout"),
        ("error", "LockBackendUnavailable", "error"),
        ("not_replicated", "", "error"),
        ("released", "", None),
        ("lost", "gone", None),
        ("renewed", "", None),
    ],
)
def test_acquire_results(kind, cause, result):
    assert acquire_result(event(kind, cause=cause)) == result
    assert result is None or result in ACQUIRE_RESULTS


@pytest.mark.parametrize(
    ("kind", "cause", "result"),
    [
        ("renewed", "", "ok"),
        ("renew_failed", "error", "error"),
        ("renew_failed", "gone", "lost"),
        ("lost", "gone", None),
        ("acquired", "", None),
    ],
)
def test_renew_results(kind, cause, result):
    assert renew_result(event(kind, cause=cause)) == result
    assert result is None or result in RENEW_RESULTS


def test_a_live_hold_ends_once_and_unknown_holds_end_nothing():
    live: LiveHolds[str] = LiveHolds()
    live.start(event(fence=1), "first")
    live.start(event(fence=2), "second")
    assert sorted(live.values()) == ["first", "second"]
    assert live.end(event("release_failed", fence=1)) == "first"
    assert live.end(event("lost", fence=1)) is None  # the loss that follows a failed release
    assert live.end(event("released", fence=3)) is None  # taken before anyone observed
    assert len(live) == 1
