"""``manage.py distlock release NAME --force [--fence F]``: a compare-and-delete on the
token just read, of one hold (with fence ``F`` when the lock has several)."""

from __future__ import annotations

import socket

from django.core.management.base import CommandError

from ..models import Mode
from .holders import holds_of, redis_errors
from .terminal import escape_for_terminal, utc_timestamp

__all__ = ["force_release"]


def force_release(name: str, *, fence: int | None = None) -> str:
    """Force-release the hold of lock ``name`` (the one with ``fence``, or its only one)
    and return what to tell the operator; ``CommandError`` when nothing was released."""
    holds = holds_of(name)
    if fence is not None:
        chosen = [held for held in holds if held.fence == fence]
        if not chosen:
            raise CommandError(f"lock {name!r} has no hold with fence {fence}")
        holds = chosen
    if len(holds) > 1:
        fences = ", ".join(f"{held.fence} ({escape_for_terminal(held.owner)})" for held in holds)
        raise CommandError(
            f"lock {name!r} has {len(holds)} holds ({holds[0].mode_label}); pass --fence "
            f"to say which one to release: {fences}"
        )
    held = holds[0]
    with redis_errors():
        released = held.release(
            force=True, by=f"manage.py distlock release on {socket.gethostname()}"
        )
    if not released:
        raise CommandError(
            f"lock {name!r} changed hands or was released before it could be "
            "force-released; nothing was done"
        )
    what = "lock" if held.mode == Mode.EXCLUSIVE else f"a {held.mode} hold of lock"
    return (
        f"Released {what} {name!r} (held by {escape_for_terminal(held.owner)} since "
        f"{utc_timestamp(held.acquired_at)}, fence {held.fence})."
    )
