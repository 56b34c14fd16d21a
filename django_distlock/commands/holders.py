"""The holds of one lock as the commands read and name them: :func:`holds_of` (a
``CommandError`` when there is none), :func:`holder_description` (its holders, for a
message), and :func:`redis_errors` (an unreachable or misconfigured Redis as a
``CommandError``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError

from ..engine import LockBackendUnavailable, LockError
from ..models import HeldLock
from .terminal import escape_for_terminal, timestamp_and_age

__all__ = ["SHOWN_HOLDERS", "holder_description", "holds_of", "redis_errors"]


SHOWN_HOLDERS = 3
"""Holders of a shared or limited lock a message names (the others are counted)."""


def holder_description(name: str) -> str | None:
    """``web-3:4242 MainThread since 2026-11-22 10:01:02 UTC (12s ago)`` for the current
    holder of lock ``name``, or ``None`` if nobody holds it (or it cannot be read). The
    holders of a shared or limited lock are named one after the other (the first three,
    then how many more), after its mode: ``3 holders (limited 3/3): web-3:4242 MainThread
    since ...; ...``."""
    try:
        holds = list(HeldLock.objects.filter(name=name)[: SHOWN_HOLDERS + 1])
    except (LockError, ImproperlyConfigured):
        return None
    if not holds:
        return None
    described = "; ".join(
        f"{escape_for_terminal(held.owner)} since {timestamp_and_age(held.acquired_at)}"
        for held in holds[:SHOWN_HOLDERS]
    )
    first = holds[0]
    if len(holds) == 1 and first.holders <= 1:
        return described
    more = first.holders - SHOWN_HOLDERS
    if more > 0:
        described += f"; and {more} more"
    return f"{first.holders} holders ({first.mode_label}): {described}"


@contextlib.contextmanager
def redis_errors() -> Iterator[None]:
    """Turn an unreachable or misconfigured Redis into a ``CommandError``."""
    try:
        yield
    except LockBackendUnavailable as exc:
        cause = exc.__cause__
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
        raise CommandError(f"cannot reach Redis: {detail}") from exc
    except ImproperlyConfigured as exc:
        raise CommandError(f"django-distlock is misconfigured: {exc}") from exc


def holds_of(name: str) -> list[HeldLock]:
    """The holds of lock ``name`` (one unless it is shared or limited); ``CommandError``
    when it is not held."""
    with redis_errors():
        holds = list(HeldLock.objects.filter(name=name))
    if not holds:
        raise CommandError(f"lock {name!r} is not held")
    return holds
