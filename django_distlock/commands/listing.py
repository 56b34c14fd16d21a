"""``manage.py distlock list`` and ``show``: the held locks as a table (a row per hold),
and every field of each hold of one lock. Text that came from Redis is escaped for the
terminal."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..managers import lock_server_eviction_policy
from ..models import HeldLock
from .durations import format_duration
from .holders import redis_errors
from .terminal import escape_for_terminal, render_table, timestamp_and_age

__all__ = ["eviction_warning", "held_locks", "hold_lines", "listing_lines"]

_LIST_HEADERS = ["NAME", "MODE", "HOLDER", "CONTEXT", "FENCE", "HELD FOR", "TTL", "AUTO-RENEW"]
_LIST_COLUMN_LIMITS = {"NAME": 48, "HOLDER": 40, "CONTEXT": 32}
_LIST_RIGHT_ALIGNED = frozenset({"FENCE", "HELD FOR", "TTL"})


def held_locks(prefix: str) -> list[HeldLock]:
    """The holds of every lock whose name starts with ``prefix``, ordered by name."""
    with redis_errors():
        queryset = HeldLock.objects.all()
        if prefix:
            queryset = queryset.filter(name__startswith=prefix)
        return list(queryset.order_by("name"))


def eviction_warning() -> str | None:
    """The warning ``list`` writes when the lock server evicts keys, else ``None``."""
    policy = lock_server_eviction_policy()
    if policy is None:
        return None
    return (
        f"Warning: the lock server evicts keys (maxmemory-policy {policy}): held "
        "locks can vanish. Use noeviction."
    )


def listing_lines(locks: Sequence[HeldLock], *, now: float | None = None) -> list[str]:
    """The table ``list`` prints (a row per hold) and its summary line."""
    if not locks:
        return ["No locks held."]
    now = time.time() if now is None else now
    rows = [
        [
            escape_for_terminal(held.name),
            held.mode_label,
            escape_for_terminal(held.owner),
            escape_for_terminal(held.context),
            str(held.fence),
            format_duration(now - held.acquired_at.timestamp()),
            format_duration(held.ttl),
            "yes" if held.auto_renew else "no",
        ]
        for held in locks
    ]
    table = render_table(
        _LIST_HEADERS,
        rows,
        column_limits=_LIST_COLUMN_LIMITS,
        right_aligned=_LIST_RIGHT_ALIGNED,
    )
    names = len({held.name for held in locks})
    summary = f"{names} lock{'s' if names != 1 else ''} held"
    if len(locks) != names:
        summary += f" ({len(locks)} holds)"
    return [*table, f"{summary}."]


def hold_lines(held: HeldLock) -> list[str]:
    """Every field of one hold, a ``label: value`` line each, as ``show`` prints it."""
    fields = [
        ("name", escape_for_terminal(held.name)),
        ("mode", held.mode_label),
        ("host", escape_for_terminal(held.host)),
        ("pid", str(held.pid)),
        ("thread", escape_for_terminal(held.thread)),
        ("context", escape_for_terminal(held.context)),
        ("fence", str(held.fence)),
        ("acquired at", timestamp_and_age(held.acquired_at)),
        ("lease", format_duration(held.lease)),
        ("TTL remaining", format_duration(held.ttl)),
        ("auto-renew", "yes" if held.auto_renew else "no"),
    ]
    width = max(len(label) for label, _ in fields) + 1
    return [f"{label + ':':<{width}} {value}" for label, value in fields]
