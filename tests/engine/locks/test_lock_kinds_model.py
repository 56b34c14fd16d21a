"""Lock kinds against a model: Hypothesis runs random sequences of acquire, release,
extend and "the lease runs out" on several ``Lock`` objects of one name on a real
server, across the kinds that may share a name or must refuse each other (``limit=3``,
shared and exclusive holds, re-entrant holds), and checks every answer, every
exception, ``held`` and what Redis stores against a Python model of who holds what.

All calls come from one thread and never wait (``blocking=False``), so each step has
one right answer. The model states the promises:

- a name is held by one kind at a time; shared and exclusive holds are the one pair
  that wait for each other instead of raising ``LockError``;
- a limited lock admits 3 holders, shared holds any number, an exclusive hold one;
- a re-entrant lock taken again by its owner (through any of its ``Lock`` objects) is
  freed after as many releases; only the last release talks to Redis, so only it can
  raise ``LockLost``;
- a hold whose lease ran out is lost: ``held`` is false, ``extend`` and the release
  raise ``LockLost``, what it held is free for others, and the next acquire of the same
  object starts afresh;
- fences increase with every acquisition, whatever its kind.

A second machine takes groups of names (``LockGroup``, random subsets in random orders)
among single exclusive and shared holds of the same names: a group takes every name or
none, and only when no other hold of any of them is live.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from django_distlock.engine import Backend, Lock, LockError, LockGroup, LockLost, LockNotOwned
from tests.support.engine import keys_of
from tests.support.kind_workers import Topology, account_names

NAME = "model"
LIMIT = 3
# (label, options): four objects of the limited lock (one more than it admits), two
# shared, one exclusive, two re-entrant.
OBJECTS = [
    *((f"limited{i}", {"limit": LIMIT}) for i in range(4)),
    *((f"shared{i}", {"shared": True}) for i in range(2)),
    ("exclusive", {}),
    *((f"reentrant{i}", {"reentrant": True}) for i in range(2)),
]
LABELS = [label for label, _options in OBJECTS]


@dataclass(eq=False)
class ModelHold:
    """One acquisition, as the model sees it."""

    kind: str  # "limited", "shared" or "exclusive" (re-entrant holds are exclusive)
    depth: int = 1
    live: bool = True  # False once its lease ran out
    released: bool = False


def _kind(label: str) -> str:
    return (
        "limited"
        if label.startswith("limited")
        else "shared"
        if label.startswith("shared")
        else "exclusive"
    )


class KindsModel(RuleBasedStateMachine):
    """Several ``Lock`` objects of one name, checked against the model."""

    def __init__(self, backend: Backend, client: Any) -> None:
        super().__init__()
        self.client = client
        self.locks = {
            label: Lock(NAME, backend=backend, timeout=30, auto_renew=False, **options)
            for label, options in OBJECTS
        }
        self.holds: dict[str, ModelHold] = {}  # each object's last acquisition
        self.reentered: ModelHold | None = None  # the owner's re-entrant hold
        self.last_fence = 0

    # -- the model -------------------------------------------------------------------

    def _current(self, label: str) -> ModelHold | None:
        hold = self.holds.get(label)
        return None if hold is None or hold.released else hold

    def _live(self) -> list[ModelHold]:
        unique = {id(hold): hold for hold in self.holds.values()}
        return [hold for hold in unique.values() if hold.live and not hold.released]

    def _redis_answer(self, kind: str) -> bool | type[LockError]:
        """What Redis answers a new acquisition of ``kind``: taken, busy, or LockError."""
        live = self._live()
        held_as = {hold.kind for hold in live}
        if not held_as:
            return True
        if "limited" in held_as:
            return len(live) < LIMIT if kind == "limited" else LockError
        if kind == "limited":
            return LockError
        return kind == "shared" and held_as == {"shared"}

    # -- rules -----------------------------------------------------------------------

    @rule(label=st.sampled_from(LABELS))
    def acquire(self, label: str) -> None:
        lock = self.locks[label]
        reentered = self.reentered
        if label.startswith("reentrant") and reentered is not None:
            if reentered.live and not reentered.released:
                assert lock.acquire(blocking=False) is True
                reentered.depth += 1
                self.holds[label] = reentered
                return
            self.reentered = None
        current = self._current(label)
        if current is not None and current.live:
            with pytest.raises(LockError, match="already held"):
                lock.acquire(blocking=False)
            return
        if current is not None:
            current.released = True  # lost: the new acquisition replaces it
        expected = self._redis_answer(_kind(label))
        if expected is LockError:
            with pytest.raises(LockError, match="cannot be taken"):
                lock.acquire(blocking=False)
            return
        assert lock.acquire(blocking=False) is expected, label
        if expected:
            assert lock.fence > self.last_fence
            self.last_fence = lock.fence
            hold = ModelHold(_kind(label))
            self.holds[label] = hold
            if label.startswith("reentrant"):
                self.reentered = hold

    @rule(label=st.sampled_from(LABELS))
    def release(self, label: str) -> None:
        lock = self.locks[label]
        hold = self._current(label)
        if hold is None:
            with pytest.raises(LockNotOwned):
                lock.release()
            return
        if hold.depth > 1:
            lock.release()  # an inner level: never LockLost, even if the lease ran out
            hold.depth -= 1
            return
        hold.released = True
        if hold.live:
            lock.release()
            return
        with pytest.raises(LockLost):
            lock.release()

    @rule(label=st.sampled_from(LABELS), seconds=st.sampled_from([1, 30]))
    def extend(self, label: str, seconds: int) -> None:
        lock = self.locks[label]
        hold = self._current(label)
        if hold is None:
            with pytest.raises(LockNotOwned):
                lock.extend(seconds)
            return
        if not hold.live:
            with pytest.raises(LockLost):
                lock.extend(seconds)
            return
        assert lock.extend(seconds) > time.time()

    @rule(label=st.sampled_from(LABELS))
    def lease_runs_out(self, label: str) -> None:
        hold = self._current(label)
        if hold is None or not hold.live:
            return
        self.locks[label].extend(0.001, replace_ttl=True)
        time.sleep(0.005)
        hold.live = False

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def held_is_what_the_model_says(self) -> None:
        for label, lock in self.locks.items():
            hold = self._current(label)
            assert lock.held is (hold is not None and hold.live), label

    @invariant()
    def redis_stores_the_live_holds(self) -> None:
        live = self._live()
        key = keys_of(NAME).lock
        stored_as = self.client.type(key)
        if any(hold.kind == "exclusive" for hold in live):
            owner = next(
                lock
                for label, lock in self.locks.items()
                if self._current(label) in live and _kind(label) == "exclusive"
            )
            assert stored_as == b"string"
            assert self.client.get(key).split(b"\n", 1)[0] == owner.token.encode()
            return
        if stored_as == b"none":
            assert live == []
            return
        assert stored_as == b"zset"  # an exclusive hold that ran out went with its key
        seconds, micros = self.client.time()
        now_ms = seconds * 1000 + micros // 1000
        # Holds that ran out stay in the sorted set until a script passes by.
        assert self.client.zcount(key, now_ms, "+inf") == len(live)

    def teardown(self) -> None:
        # Every hold given back (a re-entrant one stays the thread's until then, and the
        # next example's re-entrant objects would take it again).
        for label in self.locks:
            while self._current(label) is not None:
                self.release(label)
        self.client.delete(*keys_of(NAME).all(), keys_of(NAME).holder_index)


GROUP_NAMES = account_names(4)  # two in one bucket: one script on a cluster


class GroupsModel(RuleBasedStateMachine):
    """Groups of names, single exclusive holds and shared holds of the same names."""

    def __init__(self, backend: Backend, client: Any) -> None:
        super().__init__()
        self.backend = backend
        self.client = client
        self.groups: dict[tuple[str, ...], LockGroup] = {}
        self.singles = {
            (name, kind): Lock(name, backend=backend, timeout=30, shared=kind == "shared")
            for name in GROUP_NAMES
            for kind in ("exclusive", "shared")
        }
        # What holds each name: "group", "exclusive", "shared" (a count of shared holds).
        self.held_by: dict[str, dict[str, Any]] = {name: {} for name in GROUP_NAMES}
        self.group_holds: set[tuple[str, ...]] = set()

    def _free(self, name: str) -> bool:
        return not self.held_by[name]

    @rule(names=st.lists(st.sampled_from(GROUP_NAMES), min_size=1, max_size=4, unique=True))
    def acquire_group(self, names: list[str]) -> None:
        key = tuple(sorted(names))
        if key in self.group_holds:
            return  # the same group object again: covered by the kinds machine
        if key not in self.groups:
            self.groups[key] = LockGroup(names, backend=self.backend, timeout=30)
        group = self.groups[key]
        taken = group.acquire(blocking=False)
        assert taken is all(self._free(name) for name in names), names
        for name in names:
            # All or none: a refused group left nothing behind.
            assert self.client.exists(keys_of(name).lock) == (not self._free(name) or taken)
        if taken:
            self.group_holds.add(key)
            for name in names:
                self.held_by[name] = {"group": key}
            assert set(group.fences) == set(names)

    @rule(data=st.data())
    def release_group(self, data: st.DataObject) -> None:
        if not self.group_holds:
            return
        key = data.draw(st.sampled_from(sorted(self.group_holds)))
        self.groups[key].release()
        self.group_holds.discard(key)
        for name in key:
            self.held_by[name] = {}

    @rule(name=st.sampled_from(GROUP_NAMES), kind=st.sampled_from(["exclusive", "shared"]))
    def acquire_single(self, name: str, kind: str) -> None:
        lock = self.singles[(name, kind)]
        if lock.held:
            return
        held = self.held_by[name]
        expected = not held or (kind == "shared" and "shared" in held)
        assert lock.acquire(blocking=False) is expected, (name, kind, held)
        if expected:
            held[kind] = held.get(kind, 0) + 1

    @rule(name=st.sampled_from(GROUP_NAMES), kind=st.sampled_from(["exclusive", "shared"]))
    def release_single(self, name: str, kind: str) -> None:
        lock = self.singles[(name, kind)]
        if not lock.held:
            return
        lock.release()
        held = self.held_by[name]
        held[kind] -= 1
        if not held[kind]:
            del held[kind]

    @invariant()
    def redis_stores_what_holds_each_name(self) -> None:
        for name in GROUP_NAMES:
            held, key = self.held_by[name], keys_of(name).lock
            stored_as = self.client.type(key)
            if "shared" in held:
                assert stored_as == b"zset"
                assert self.client.zcard(key) == held["shared"]
            elif held:
                assert stored_as == b"string"
            else:
                assert stored_as == b"none"

    def teardown(self) -> None:
        for key in list(self.group_holds):
            self.groups[key].release()
        for lock in self.singles.values():
            if lock.held:
                lock.release()


def test_groups_follow_the_model(backend_on: Backend, kind_topology: Topology) -> None:
    """On a cluster the names are in three buckets, taken by one script each, and a busy
    later bucket gives back the earlier ones."""

    def machine() -> Any:
        return GroupsModel(backend_on, kind_topology.client)

    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_kinds_follow_the_model(backend_on: Backend, kind_topology: Topology) -> None:
    def machine() -> Any:
        return KindsModel(backend_on, kind_topology.client)

    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=150,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
