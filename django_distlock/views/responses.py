"""What a guarded view answers instead of running: 423 while its lock is busy, 503 while
Redis cannot be reached, or the callables the settings name for those
(``DISTLOCK["VIEW_ON_BUSY"]``, ``DISTLOCK["VIEW_ON_UNAVAILABLE"]``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

from ..settings import configured_hook

__all__ = [
    "UNAVAILABLE_RETRY_AFTER",
    "locked_response",
    "settings_on_busy",
    "settings_on_unavailable",
    "unavailable_response",
]

UNAVAILABLE_RETRY_AFTER = 5
"""``Retry-After`` seconds of the 503 answered while Redis cannot be reached."""


def locked_response(request: HttpRequest, name: str, retry_after: float | None) -> HttpResponse:
    """The default answer of a guarded view whose lock is busy: ``423 Locked`` with
    ``Retry-After`` (the holder's remaining lease, rounded up, at least one second).

    Custom ``on_busy`` callables can delegate to it and adjust the response::

        def on_busy(request, name, retry_after):
            response = locked_response(request, name, retry_after)
            response["Cache-Control"] = "no-store"
            return response
    """
    seconds = _retry_after_seconds(retry_after)
    return _plain_response(f"Locked: {name!r} is in use; retry in {seconds} s.", 423, seconds)


def _retry_after_seconds(retry_after: float | None) -> int:
    if retry_after is None or not math.isfinite(retry_after):
        return 1
    return max(1, math.ceil(retry_after))


def unavailable_response(request: HttpRequest, name: str) -> HttpResponse:
    """The default answer of a guarded view when Redis cannot be reached: ``503`` with
    ``Retry-After`` (``UNAVAILABLE_RETRY_AFTER`` seconds). Custom ``on_unavailable``
    callables can delegate to it."""
    return _plain_response(
        f"Service unavailable: the lock service for {name!r} cannot be reached.",
        503,
        UNAVAILABLE_RETRY_AFTER,
    )


def _plain_response(text: str, status: int, retry_after: int) -> HttpResponse:
    """A ``text/plain`` answer with ``status`` and ``Retry-After`` seconds."""
    response = HttpResponse(f"{text}\n", status=status, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(retry_after)
    return response


def _configured_hook(key: str, default: Callable[..., Any]) -> Callable[..., Any]:
    """The callable ``DISTLOCK[key]`` names, else ``default``. Read at request time, so
    that ``override_settings`` applies."""
    hook = configured_hook(key)
    return default if hook is None else hook


def settings_on_busy(request: HttpRequest, name: str, retry_after: float | None) -> Any:
    return _configured_hook("VIEW_ON_BUSY", locked_response)(request, name, retry_after)


def settings_on_unavailable(request: HttpRequest, name: str) -> Any:
    return _configured_hook("VIEW_ON_UNAVAILABLE", unavailable_response)(request, name)
