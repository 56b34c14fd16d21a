"""The checks of a lock's and a group's options that are not names, contexts or durations
(those are :mod:`.keys`): flags, callbacks, the kind, the backend, and the waiting
options of one acquire."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..keys import EXCLUSIVE, LIMITED, SHARED, validate_seconds
from ..transport.backend import Backend

__all__ = [
    "UNSET",
    "BackendSource",
    "backend_of",
    "check_backend_source",
    "check_bool",
    "check_callable",
    "mode_of",
    "waiting_options",
]

BackendSource = Backend | Callable[[], Backend]


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()
"""The default of an argument whose ``None`` means something (``blocking_timeout=None``:
wait forever)."""


def check_callable(value: Any, argument: str) -> Any:
    """``value``, if it is callable or ``None``."""
    if value is not None and not callable(value):
        raise TypeError(f"{argument} must be callable or None, not {type(value).__name__}")
    return value


def check_bool(value: Any, argument: str, *, optional: bool = False) -> Any:
    """``value``, if it is a bool (or ``None``, when ``optional``)."""
    if (value is None and optional) or isinstance(value, bool):
        return value
    raise TypeError(f"{argument} must be a bool, not {type(value).__name__}")


def mode_of(limit: int | None, shared: bool, reentrant: bool) -> str:
    """The mode a lock of these (checked) kind options is held in; at most one kind is
    chosen (``limit=1`` is the plain exclusive lock)."""
    kinds = {"limit": limit is not None, "shared": shared, "reentrant": reentrant}
    chosen = [option for option, on in kinds.items() if on]
    if len(chosen) > 1:
        raise ValueError(
            f"{' and '.join(chosen)} cannot be combined: a lock is limited, shared or "
            "re-entrant, or none of these"
        )
    if shared:
        return SHARED
    if limit is not None and limit > 1:
        return LIMITED
    return EXCLUSIVE


def check_backend_source(source: Any) -> BackendSource:
    """``source``, if it is a :class:`Backend` or a callable that returns one."""
    if not isinstance(source, Backend) and not callable(source):
        raise TypeError(
            f"backend must be a Backend or a callable returning one, not {type(source).__name__}"
        )
    return source


def backend_of(source: BackendSource) -> Backend:
    """The backend ``source`` names (called now if it is a callable)."""
    backend = source if isinstance(source, Backend) else source()
    if not isinstance(backend, Backend):
        raise TypeError(f"backend callable returned {type(backend).__name__}, not Backend")
    return backend


def waiting_options(
    blocking: Any, blocking_timeout: Any, default_blocking: bool, default_timeout: float | None
) -> tuple[bool, float | None]:
    """An acquire's ``blocking`` and ``blocking_timeout`` arguments, checked, with the
    defaults of its lock (or group) filled in; a zero timeout does not wait."""
    if blocking is None:
        blocking = default_blocking
    else:
        check_bool(blocking, "blocking")
    if blocking_timeout is UNSET:
        blocking_timeout = default_timeout
    elif blocking_timeout is not None:
        blocking_timeout = validate_seconds(blocking_timeout, "blocking_timeout", allow_zero=True)
    if blocking_timeout == 0:
        blocking = False
    return blocking, blocking_timeout
