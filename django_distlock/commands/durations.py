"""Durations as people write and read them: ``30d``, ``12h``, ``90m``, ``45s``.

:func:`parse_duration` reads them (``--older-than 30d``), :func:`format_duration` writes
them (``held for 3m 12s``), :func:`format_milliseconds` writes the wait and hold times of
lock events (recorded in milliseconds), and :func:`seconds_type` and :func:`duration_type` put the
parser behind argparse options. Shared by the management commands and the admin; no
Django import.
"""

from __future__ import annotations

import argparse
import datetime
import math
import re
from collections.abc import Callable

from ..engine import MAX_SECONDS

__all__ = [
    "duration_type",
    "format_duration",
    "format_milliseconds",
    "parse_duration",
    "seconds_type",
]

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<unit>[a-zA-Z]*)")
_DURATION_EXAMPLES = "30d, 12h, 90m, 45s or a number of seconds"


def parse_duration(text: str) -> datetime.timedelta:
    """Parse ``30d``, ``12h``, ``90m``, ``45s`` or a plain number of seconds (``3600``,
    ``1.5``) into a ``timedelta``; ``ValueError`` with a readable message otherwise.

    >>> parse_duration("90m")
    datetime.timedelta(seconds=5400)
    """
    if not isinstance(text, str):
        raise TypeError(f"a duration must be a str, not {type(text).__name__}")
    value = text.strip()
    if not value:
        raise ValueError(f"empty duration; expected {_DURATION_EXAMPLES}")
    if value.startswith("-"):
        raise ValueError(f"duration {text!r} must not be negative")
    match = _DURATION.fullmatch(value)
    if match is None:
        raise ValueError(f"invalid duration {text!r}; expected {_DURATION_EXAMPLES}")
    unit = match["unit"]
    if unit and unit not in _UNITS:
        raise ValueError(f"unknown unit {unit!r} in duration {text!r}; use d, h, m or s")
    if len(match["number"]) > 30:
        raise ValueError(f"duration {text!r} is too large")
    seconds = float(match["number"]) * _UNITS.get(unit, 1)
    try:
        return datetime.timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(
            f"duration {text!r} is too large (at most {datetime.timedelta.max.days} days)"
        ) from None


def format_duration(seconds: float) -> str:
    """A short human reading of ``seconds``: ``4.2s``, ``45s``, ``3m 12s``, ``2h 5m``,
    ``3d 4h`` (negative values, from clock skew between hosts, read as ``0s``).

    >>> format_duration(192)
    '3m 12s'
    """
    if math.isnan(seconds):
        return "?"
    if seconds <= 0:
        return "0s"
    if math.isinf(seconds):
        return "forever"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m {secs}s" if secs else f"{minutes}m"
    return f"{secs}s"


def format_milliseconds(milliseconds: float | None) -> str:
    """A wait or hold time recorded in milliseconds, rounded to what people read:
    ``0.3ms``, ``412ms``, ``1.2s``, then as :func:`format_duration` (``30s``, ``3m 12s``)
    but rounded to the second, not cut (29.98 s is ``30s``); ``-`` for none.

    >>> format_milliseconds(29981.065)
    '30s'
    """
    if milliseconds is None:
        return "-"
    if math.isnan(milliseconds):
        return "?"
    if milliseconds <= 0:
        return "0ms"
    if milliseconds < 9.95:
        return f"{milliseconds:.1f}ms"
    if milliseconds < 999.5:
        return f"{milliseconds:.0f}ms"
    seconds = milliseconds / 1000
    if seconds < 9.95:
        return f"{seconds:.1f}s"
    return format_duration(round(seconds))


def duration_type(text: str) -> datetime.timedelta:
    """An argparse ``type`` accepting what :func:`parse_duration` accepts, as a
    ``timedelta`` (``--older-than 30d``)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds_type(*, allow_zero: bool) -> Callable[[str], float]:
    """An argparse ``type`` accepting durations (``90``, ``1.5``, ``5m``) as float seconds,
    at most a year (the engine's limit on leases and waits)."""

    def seconds(text: str) -> float:
        try:
            value = parse_duration(text).total_seconds()
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not allow_zero and value < 0.001:
            raise argparse.ArgumentTypeError(f"{text!r} must be more than zero seconds")
        if value > MAX_SECONDS:
            raise argparse.ArgumentTypeError(
                f"{text!r} must be at most {MAX_SECONDS} seconds (365 days)"
            )
        return value

    return seconds
