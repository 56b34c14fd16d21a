"""Deliberately broken locks, to prove the checker can fail (issue 27): a chaos run with
``RunConfig(mutant=NAME)`` starts its clients with the mutant :data:`MUTANTS` ``[NAME]``
applied in the client processes only (:func:`apply`: a script swapped, an engine function
patched); the package's code is untouched. Each mutant says which faults bring its bug
out and how long holds should last (``RunConfig.hold_seconds``), and
``tests/faults/test_mutations.py`` fails unless the checker reports an unexcused
violation for each.

- ``half-lease``: an acquire takes a lock with less than half its lease left as free;
- ``release-any-token``: a release deletes the lock without checking the token;
- ``skipped-renewals``: the watchdog skips three renewals in four, believing each done;
- ``fence-not-stored``: a fenced write stores its data but not its fence.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MUTANTS", "Mutant", "apply"]


@dataclass(frozen=True)
class Mutant:
    """A broken lock: what is broken, how to break it, and the run that shows it."""

    name: str
    broken: str
    patch: Callable[[], None]
    faults: tuple[str, ...]
    """The fault kinds of its run (``holder-pause``: a holder's lease runs out unrenewed
    while it still believes it holds)."""
    hold_seconds: tuple[float, float]
    """How long a hold of its run works before its write (long enough for the bug to
    bite: past half a lease, past renewals)."""


def _replaced(source: str, old: str, new: str) -> str:
    if old not in source:
        raise RuntimeError(f"a mutant no longer applies: {old!r} is not in the script")
    return source.replace(old, new)


def _half_lease() -> None:
    from django_distlock.engine.protocol import steps as lock_steps
    from django_distlock.engine.protocol.ops import Script

    original = lock_steps.ACQUIRE
    # A lock held by another counts as free once its PTTL is below half the lease asked:
    # taken then, and waiters told that its obstacle ends then.
    source = _replaced(
        original.source,
        "    pttl = redis.call('PTTL', KEYS[1])\n  end",
        "    pttl = redis.call('PTTL', KEYS[1]) - math.floor(tonumber(ARGV[2]) / 2)\n"
        "    if pttl <= 0 then pttl = -2 end\n  end",
    )
    lock_steps.ACQUIRE = Script(original.name, source)


def _release_any_token() -> None:
    from django_distlock.engine.protocol import steps as core
    from django_distlock.engine.protocol.ops import Script

    original = core.RELEASE
    source = _replaced(
        original.source,
        "if type(value) ~= 'string' or string.sub(value, 1, #ARGV[1] + 1) ~= ARGV[1] .. '\\n' then",
        "if type(value) ~= 'string' then",
    )
    core.RELEASE = Script(original.name, source)


_SKIPPED = """-- a renewal answered as if done, the lease left alone
-- returns ARGV[2], the milliseconds asked for
return tonumber(ARGV[2])
"""

_SKIPPED_MANY = """-- renewals of several locks answered as if done, the leases left alone
-- returns ARGV[3i-1] for each lock, the milliseconds asked for
local leases = {}
for i = 1, #KEYS / 2 do leases[i] = tonumber(ARGV[3 * i - 1]) end
return leases
"""


def _skipped_renewals() -> None:
    from django_distlock.engine.protocol.ops import Call, Script
    from django_distlock.engine.renewal import decisions as renewal

    original, original_many = renewal.renewal_call, renewal.extend_many_call
    skipped = Script("skipped_renewal", _SKIPPED)
    skipped_many = Script("skipped_renewals", _SKIPPED_MANY)
    counter = itertools.count()

    # Renewals come every third of a lease: three skipped in a row let it run out. Those
    # due together share a call (``extend_many_call``): skipped together.
    def renewal_call(hold: Any) -> Call:
        call = original(hold)
        if next(counter) % 4:
            return Call(skipped, call.keys, call.args)
        return call

    def extend_many_call(holds: Any) -> Call:
        call = original_many(holds)
        if next(counter) % 4:
            return Call(skipped_many, call.keys, call.args)
        return call

    renewal.renewal_call = renewal_call
    renewal.extend_many_call = extend_many_call


def _fence_not_stored() -> None:
    from django.db import transaction

    from django_distlock.fencing import FencedQuerySet, FenceField

    def fenced_update(self: FencedQuerySet, lock_or_fence: Any, /, **fields: Any) -> int:
        (field,) = (f for f in self.model._meta.get_fields() if isinstance(f, FenceField))
        with transaction.atomic(using=self.db):
            # The stored fence is still checked, but never raised: it stays 0.
            return self.filter(**{f"{field.name}__lte": int(lock_or_fence)}).update(**fields)

    FencedQuerySet.fenced_update = fenced_update  # type: ignore[method-assign]


MUTANTS: dict[str, Mutant] = {
    mutant.name: mutant
    for mutant in (
        Mutant(
            "half-lease",
            "an acquire takes a lock with less than half its lease left as free",
            _half_lease,
            faults=("holder-pause",),
            hold_seconds=(0.4, 1.0),
        ),
        Mutant(
            "release-any-token",
            "a release deletes the lock without checking its token",
            _release_any_token,
            faults=("holder-pause",),
            hold_seconds=(0.2, 0.6),
        ),
        Mutant(
            "skipped-renewals",
            "the watchdog skips three renewals in four, as if done",
            _skipped_renewals,
            faults=("holder-pause",),
            hold_seconds=(1.2, 2.0),
        ),
        Mutant(
            "fence-not-stored",
            "a fenced write stores its data but not its fence",
            _fence_not_stored,
            faults=("holder-pause",),
            hold_seconds=(0.4, 0.8),
        ),
    )
}


def apply(name: str) -> None:
    """Break this process's lock as mutant ``name`` says (Django set up)."""
    MUTANTS[name].patch()
